"""natgrad-diag: what ``output_gradients`` really computes, and checks for GPflow's natural gradients.

Heavy dependencies (TensorFlow, GPflow, matplotlib, torch) load on first use: the names below are
imported lazily, so ``import natgrad_diag`` and ``natgrad-diag --help`` are instant.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .exceptions import (
    InputError,
    JacobianMismatchError,
    MemoryLimitError,
    NatGradCheckError,
    NatGradDiagError,
    OutputGradientsError,
    StepFailedError,
    UnsupportedModelError,
)

# The function ``jacobian`` shares its name with the module ``jacobian``: import it eagerly (the module
# is light: numpy only), so that a later ``from .jacobian import ...`` cannot rebind the package
# attribute to the module.
from .jacobian import jacobian

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
    "vjp",
    "write_report",
]

# name -> module that defines it (imported on first access)
_LAZY = {
    "BlockJacobian": "jacobian",
    "Check": "results",
    "Explanation": "explain",
    "GradientCheckReport": "gradcheck",
    "NatGradMonitor": "monitor",
    "NatGradReport": "natgrad_check",
    "NatGradTrace": "trace",
    "OuterExample": "outer",
    "SeedScenario": "scenario",
    "assert_gradients": "gradcheck",
    "assert_natgrad": "natgrad_check",
    "check_gradients": "gradcheck",
    "check_natgrad": "natgrad_check",
    "checked_gradient": "checked",
    "explain_output_gradients": "explain",
    "natgrad_trace": "trace",
    "outer_example": "outer",
    "seed_scenario": "scenario",
    "vjp": "checked",
    "write_report": "render",
}
_SUBMODULES = ("testing", "torch_bridge")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'natgrad_diag' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))


if TYPE_CHECKING:  # pragma: no cover
    from .checked import checked_gradient, vjp
    from .explain import Explanation, explain_output_gradients
    from .gradcheck import GradientCheckReport, assert_gradients, check_gradients
    from .jacobian import BlockJacobian
    from .monitor import NatGradMonitor
    from .natgrad_check import NatGradReport, assert_natgrad, check_natgrad
    from .outer import OuterExample, outer_example
    from .render import write_report
    from .results import Check
    from .scenario import SeedScenario, seed_scenario
    from .trace import NatGradTrace, natgrad_trace
