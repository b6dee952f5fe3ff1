"""natgrad-diag: what ``output_gradients`` really computes, and checks for GPflow's natural gradients.

The public API is ``__all__`` below and the submodules ``demo`` (seeded demo models), ``keras``
(``NatGradCallback``), ``pictures`` (Jacobian heatmaps and report pictures), ``strict`` (``strict_gradients``,
its pytest plugin and script runner), ``testing`` (assertions for pytest) and ``torch_bridge`` (PyTorch's side
of the lesson). Every other module is internal. Names and submodules load on first use, so
``import natgrad_diag`` and ``natgrad-diag --help`` import no TensorFlow, GPflow, matplotlib or torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from natgrad_diag.exceptions import (
    InputError, JacobianMismatchError, MemoryLimitError, NatGradCheckError, NatGradDiagError, OutputGradientsError,
    StepFailedError, UnsupportedModelError,
)  # fmt: skip

__version__ = "0.1.0"

__all__ = [
    "BlockJacobian", "Check", "Explanation", "GradientCheckReport", "InputError", "JacobianMismatchError",
    "MemoryLimitError", "NatGradCheckError", "NatGradDiagError", "NatGradMonitor", "NatGradReport", "NatGradTrace",
    "NaturalGradient", "OuterExample", "OutputGradientsError", "SeedScenario", "StepFailedError",
    "UnsupportedModelError", "assert_gradients", "assert_natgrad", "check_gradients", "check_natgrad",
    "checked_gradient", "explain_output_gradients", "jacobian", "natgrad_map_jacobian", "natgrad_trace",
    "outer_example", "seed_scenario", "strict_gradients", "to_terminal", "vjp", "write_report",
]  # fmt: skip

# module -> the names it defines (each imported on first access)
_LAZY = {
    name: module
    for module, names in {
        "autodiff.blocks": ("BlockJacobian",),
        "autodiff.dense": ("jacobian",),
        "autodiff.seeded": ("checked_gradient", "vjp"),
        "checks.api": ("NatGradReport", "assert_natgrad", "check_natgrad"),
        "gradcheck.api": ("GradientCheckReport", "assert_gradients", "check_gradients"),
        "lessons.explain": ("Explanation", "SeedScenario", "explain_output_gradients", "seed_scenario"),
        "lessons.outer": ("OuterExample", "outer_example"),
        "report.files": ("write_report",),
        "report.records": ("Check",),
        "report.emit": ("to_terminal",),
        "step.jacobian": ("natgrad_map_jacobian",),
        "step.optimizer": ("NaturalGradient",),
        "step.trace": ("NatGradTrace", "natgrad_trace"),
        "strict.context": ("strict_gradients",),
        "training.monitor": ("NatGradMonitor",),
    }.items()
    for name in names
}
#: The public submodules, imported on first attribute access (``nd.testing``).
_SUBMODULES = ("demo", "keras", "pictures", "strict", "testing", "torch_bridge")
# modules whose import (and whose names' use) never needs TensorFlow: no quiet TensorFlow import for them
_LIGHT = frozenset({"report.records", "report.files", "report.emit", "pictures", "testing"})


def __getattr__(name: str) -> Any:
    if (module := _LAZY.get(name, name if name in _SUBMODULES else None)) is None:
        raise AttributeError(f"module 'natgrad_diag' has no attribute {name!r}")
    if module not in _LIGHT:
        from natgrad_diag._tf import import_tensorflow_quietly

        import_tensorflow_quietly()
    value = importlib.import_module(f".{module}", __name__)
    if name in _LAZY:
        value = globals()[name] = getattr(value, name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))


if TYPE_CHECKING:  # pragma: no cover
    from natgrad_diag.autodiff.blocks import BlockJacobian
    from natgrad_diag.autodiff.dense import jacobian
    from natgrad_diag.autodiff.seeded import checked_gradient, vjp
    from natgrad_diag.gradcheck.api import GradientCheckReport, assert_gradients, check_gradients
    from natgrad_diag.lessons.explain import Explanation, SeedScenario, explain_output_gradients, seed_scenario
    from natgrad_diag.lessons.outer import OuterExample, outer_example
    from natgrad_diag.checks.api import NatGradReport, assert_natgrad, check_natgrad
    from natgrad_diag.training.monitor import NatGradMonitor
    from natgrad_diag.step.optimizer import NaturalGradient
    from natgrad_diag.step.trace import NatGradTrace, natgrad_trace
    from natgrad_diag.report.files import write_report
    from natgrad_diag.report.records import Check
    from natgrad_diag.strict.context import strict_gradients
    from natgrad_diag.report.emit import to_terminal
    from natgrad_diag.step.jacobian import natgrad_map_jacobian
