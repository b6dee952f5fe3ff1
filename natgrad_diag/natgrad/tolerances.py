"""The natural-gradient checks' tolerances, read from the package's one policy (natgrad_diag.tolerance)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.tolerance import default_tolerance

__all__ = ["FISHER_WIDENING", "Tolerances", "natgrad_tolerances", "with_overrides"]

#: fisher_rtol = FISHER_WIDENING[dtype] · rtol: the Fisher identity compares a solve (or a closed-form product)
#: with an independent vector-Jacobian product, two routes with more rounding between them than an exact
#: reproduction; its condition-number term (100·ε·cond(F)) is added by the check itself.
FISHER_WIDENING = {"float64": 100.0, "float32": 10.0}


@dataclass(frozen=True)
class Tolerances:
    """Tolerances of the checks for one dtype (all relative ones scale the largest reference value).

    Attributes:
        rtol, atol: reproduction and gradient mapping: |a − b| ≤ atol + rtol·max|b|.
        fisher_rtol: Fisher identity: |a − b| ≤ max|b| · (fisher_rtol + 100·ε·cond(F)).
        conjugate_rtol: conjugate optimality and fixed point: |ELBO − bound| ≤ conjugate_rtol · |bound|.
    """

    rtol: float
    atol: float
    fisher_rtol: float
    conjugate_rtol: float


def natgrad_tolerances(dtype: Any) -> Tolerances:
    """Default :class:`Tolerances` for ``dtype``, from ``default_tolerance(dtype, "exact")``.

    rtol is the policy's exact rtol (10⁴·ε-ish: only rounding separates two exact routes). atol is the same
    number, an absolute floor at the unit scale of q(u)'s entries (the policy's atol is for references that
    are exactly zero; the step's entries are O(1), and these checks have always used rtol as their floor).
    Any dtype other than float64 gets the float32 values (the models are float64 or float32).

    Examples:
        >>> natgrad_tolerances("float64")
        Tolerances(rtol=1e-10, atol=1e-10, fisher_rtol=1e-08, conjugate_rtol=1e-10)
        >>> natgrad_tolerances("float32").fisher_rtol
        0.001
    """
    name = "float64" if np.dtype(dtype) == np.float64 else "float32"
    rtol = default_tolerance(name, "exact").rtol
    return Tolerances(rtol=rtol, atol=rtol, fisher_rtol=FISHER_WIDENING[name] * rtol, conjugate_rtol=rtol)


def with_overrides(base: Tolerances, **overrides: float | None) -> Tolerances:
    """``base`` with every override that is not None (as a float).

    Examples:
        >>> with_overrides(natgrad_tolerances("float64"), rtol=1e-6, atol=None).rtol
        1e-06
    """
    values = {k: (getattr(base, k) if v is None else float(v)) for k, v in overrides.items()}
    return Tolerances(**{**base.__dict__, **values})
