"""natgrad-diag: what ``output_gradients`` really computes, and checks for GPflow's natural gradients.

Heavy dependencies (TensorFlow, GPflow, matplotlib, torch) load on first use: the names below are
imported lazily, so ``import natgrad_diag`` and ``natgrad-diag --help`` are instant.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from natgrad_diag.exceptions import (
    InputError,
    JacobianMismatchError,
    MemoryLimitError,
    NatGradCheckError,
    NatGradDiagError,
    OutputGradientsError,
    StepFailedError,
    UnsupportedModelError,
)

__version__ = "0.1.0"

__all__ = [
    "BlockJacobian",
    "Check",
    "Explanation",
    "GradientCheckReport",
    "InputError",
    "JacobianMismatchError",
    "MemoryLimitError",
    "NatGradCheckError",
    "NatGradDiagError",
    "NatGradMonitor",
    "NatGradReport",
    "NatGradTrace",
    "NaturalGradient",
    "OuterExample",
    "OutputGradientsError",
    "SeedScenario",
    "StepFailedError",
    "UnsupportedModelError",
    "assert_gradients",
    "assert_natgrad",
    "check_gradients",
    "check_natgrad",
    "checked_gradient",
    "explain_output_gradients",
    "jacobian",
    "natgrad_trace",
    "outer_example",
    "seed_scenario",
    "strict_gradients",
    "vjp",
    "write_report",
]

# name -> module that defines it (imported on first access)
_LAZY = {
    "jacobian": "autodiff.dense",
    "BlockJacobian": "autodiff.blocks",
    "Check": "report.records",
    "Explanation": "lessons.explain",
    "GradientCheckReport": "gradcheck.api",
    "NatGradMonitor": "training.monitor",
    "NatGradReport": "checks.api",
    "NatGradTrace": "step.trace",
    "NaturalGradient": "step.optimizer",
    "OuterExample": "lessons.outer",
    "SeedScenario": "lessons.scenario",
    "assert_gradients": "gradcheck.api",
    "assert_natgrad": "checks.api",
    "check_gradients": "gradcheck.api",
    "check_natgrad": "checks.api",
    "checked_gradient": "autodiff.seeded",
    "explain_output_gradients": "lessons.explain",
    "natgrad_trace": "step.trace",
    "outer_example": "lessons.outer",
    "seed_scenario": "lessons.scenario",
    "strict_gradients": "strict.context",
    "vjp": "autodiff.seeded",
    "write_report": "report.files",
}
# modules whose import (and whose names' use) never needs TensorFlow: no quiet TensorFlow import for them
_LIGHT = frozenset({"report.records", "report.files", "testing"})
_SUBMODULES = {"testing": "testing", "torch_bridge": "lessons.torch_bridge"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        if _LAZY[name] not in _LIGHT:
            from natgrad_diag._tf import import_tensorflow_quietly

            import_tensorflow_quietly()
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        if _SUBMODULES[name] not in _LIGHT:
            from natgrad_diag._tf import import_tensorflow_quietly

            import_tensorflow_quietly()
        return importlib.import_module(f".{_SUBMODULES[name]}", __name__)
    raise AttributeError(f"module 'natgrad_diag' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))


if TYPE_CHECKING:  # pragma: no cover
    from natgrad_diag.autodiff.blocks import BlockJacobian
    from natgrad_diag.autodiff.dense import jacobian
    from natgrad_diag.autodiff.seeded import checked_gradient, vjp
    from natgrad_diag.gradcheck.api import GradientCheckReport, assert_gradients, check_gradients
    from natgrad_diag.lessons.explain import Explanation, explain_output_gradients
    from natgrad_diag.lessons.outer import OuterExample, outer_example
    from natgrad_diag.lessons.scenario import SeedScenario, seed_scenario
    from natgrad_diag.checks.api import NatGradReport, assert_natgrad, check_natgrad
    from natgrad_diag.training.monitor import NatGradMonitor
    from natgrad_diag.step.optimizer import NaturalGradient
    from natgrad_diag.step.trace import NatGradTrace, natgrad_trace
    from natgrad_diag.report.files import write_report
    from natgrad_diag.report.records import Check
    from natgrad_diag.strict.context import strict_gradients
