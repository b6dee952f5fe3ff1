"""The natural-gradient checks' tolerances, read from the package's one policy (natgrad_diag.tolerance)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from natgrad_diag.report.records import Check, format_number
from natgrad_diag.tolerance import default_tolerance, eps, rounding_bound

__all__ = ["FISHER_WIDENING", "MEANINGFUL", "ROUNDING_FACTOR", "Bound", "Tolerances", "bounded_check", "natgrad_bound", "natgrad_tolerances", "with_overrides"]

#: The constant c of every rounding term c·ε·κ·scale. A Cholesky factorisation, a triangular solve or a product of
#: M×M matrices has a backward error of at most about M·ε per entry (Higham 2002, Theorems 8.5 and 10.3); the
#: checks chain a handful of them at M up to a few hundred, and the norm-wise κ already takes the worst direction,
#: so c = 100 is the margin of a few such steps. Measured on GPflow's #767 state (VGP, q_sqrt = 1e-3·I, 20 seeds,
#: κ(F) up to 1e9): the Fisher check's error stays below 1.1e-3 of its bound; GPflow's compiled step differs from
#: its eager step by up to 9.5e-11 there, well within the reproduction bound (4.7e-9 on seed 0), although the
#: check compares eager with eager (full mode) and compiled with compiled (fast mode).
ROUNDING_FACTOR = 100.0

#: A bound whose rounding term alone exceeds this fraction of the compared quantity's scale cannot tell a right
#: answer from a wrong one: the check is then "warn" (inconclusive), not "pass".
MEANINGFUL = 1e-2

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


@dataclass(frozen=True)
class Bound:
    """The bound a check compares its error with: a rounding term plus the user's (or the policy's) tolerance.

    ``total = rounding + user``, ``rounding = ROUNDING_FACTOR · ε · condition · scale`` and
    ``user = atol + rtol · scale``.

    Attributes:
        rounding: the rounding term.
        user: the tolerance term atol + rtol·scale.
        scale: the size of the compared quantity.
        condition: the condition number κ in the rounding term.
        condition_name: how κ was formed, e.g. "κ(F)" or "κ(S)·κ(S_new)·cancellation".
        dtype: the dtype's name.
        factor: the constant c of the rounding term (:data:`ROUNDING_FACTOR` unless a check states another).
    """

    rounding: float
    user: float
    scale: float
    condition: float
    condition_name: str
    dtype: str
    factor: float = ROUNDING_FACTOR

    @property
    def total(self) -> float:
        return self.rounding + self.user

    @property
    def inconclusive(self) -> bool:
        """True when the rounding term alone exceeds :data:`MEANINGFUL` of the scale (or is not finite)."""
        tiny = cast(float, np.finfo(np.float64).tiny)
        return not np.isfinite(self.rounding) or self.rounding > MEANINGFUL * max(self.scale, tiny)

    def describe(self) -> str:
        """The bound's parts, as a sentence for a check's detail."""
        return (
            f"bound {format_number(self.total)} = rounding {format_number(self.rounding)} "
            f"({self.factor:g}·ε·κ·scale, {self.condition_name} = {format_number(self.condition)}, ε = "
            f"{format_number(eps(self.dtype))}, scale {format_number(self.scale)}) + tolerance {format_number(self.user)}"
        )

    def needed(self) -> str:
        """What precision a verdict would need, for an inconclusive bound."""
        kappa_max = MEANINGFUL / self.factor
        text = (
            f"inconclusive: the rounding term alone is {format_number(self.rounding / max(self.scale, 1e-300))} of the "
            f"scale (more than {MEANINGFUL:g}), so this check cannot tell right from wrong here; a verdict needs "
            f"{self.condition_name}·ε < {kappa_max:g}"
        )
        if self.dtype != "float64" and self.condition * eps("float64") < kappa_max:
            return text + ": use float64."
        return text + ": use float64 with a larger jitter, or start from a better-conditioned q(u) (e.g. q_sqrt = I)."


def natgrad_bound(
    dtype: Any, *, condition: float, condition_name: str, scale: float, rtol: float, atol: float, factor: float = ROUNDING_FACTOR
) -> Bound:
    """:class:`Bound` with rounding term ``rounding_bound(dtype, condition=κ, scale=scale, factor=factor)``.

    Examples:
        >>> b = natgrad_bound("float64", condition=1e14, condition_name="κ(F)", scale=1.0, rtol=1e-10, atol=0.0)
        >>> b.inconclusive, round(b.rounding, 2)
        (True, 2.22)
    """
    name = "float64" if np.dtype(dtype) == np.float64 else "float32"
    condition = float(condition) if np.isfinite(condition) else float("inf")
    rounding = rounding_bound(name, condition=condition, scale=scale, factor=factor) if np.isfinite(condition) else float("inf")
    return Bound(rounding, atol + rtol * scale, float(scale), condition, condition_name, name, factor)


def bounded_check(name: str, claim: str, err: float, bound: Bound, detail: str = "") -> Check:
    """A :class:`Check` of ``err`` against ``bound``: "fail" beyond it, "warn" within an inconclusive bound, else "pass".

    The detail carries the bound's parts, and for "warn" the precision a verdict would need.

    Examples:
        >>> b = natgrad_bound("float64", condition=1.0, condition_name="κ(S)", scale=1.0, rtol=1e-10, atol=0.0)
        >>> bounded_check("c", "claim", 1e-12, b).status, bounded_check("c", "claim", 1e-3, b).status
        ('pass', 'fail')
    """
    within = bool(err <= bound.total)
    status = "fail" if not within else ("warn" if bound.inconclusive else "pass")
    parts = [detail] if detail else []
    parts.append(bound.describe())
    if status == "warn":
        parts.append(bound.needed())
    return Check(name=name, claim=claim, passed=status == "pass", max_abs_error=float(err), tolerance=bound.total, detail="; ".join(parts), status=status)
