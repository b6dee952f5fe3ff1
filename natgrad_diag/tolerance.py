"""One tolerance policy for every check: a table keyed by dtype and one rule for what rtol means
(as ``jax._src.public_test_util``). Every comparison in the package reads this module.

The rule (norm-wise, per compared block):

    |got − want| ≤ atol + rtol · max|want|      for every element,

so rtol is relative to the *scale* of the reference block, not to each element. This is the error model
of floating-point rounding: a computed vector y = f(x) carries an error bounded by a multiple of
ε·‖y‖ (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.5 and §10.1 for Cholesky),
so small entries of a large block are not held to a tighter absolute error than the block's large entries.

The kinds of comparison:

* ``"exact"``: two exact routes to the same number (a VJP against the explicit Jacobian contracted by
  hand, GPflow's step against ours). Only rounding separates them: rtol ≈ 10⁴·ε absorbs the
  accumulation over O(M²) terms for M up to a few hundred.
* ``"finite_difference"``: analytic against central differences with step eps ≈ ∛ε, which balances the
  O(eps²) truncation error against the O(ε/eps) rounding error (Nocedal & Wright, *Numerical
  Optimization*, 2nd ed., §8.1); each is about ε^(2/3), so rtol leaves a margin of ~10² above that for
  |f| and |x| of order one. The gradient check adds the rounding term at other sizes, 100·ε·(|f| + |x|·|f'|)/eps,
  and f's measured noise.

Condition-number terms for ill-conditioned problems (κ(S), κ(F)) are added on top by the checks that
measure them: :func:`rounding_bound` gives the ``c · ε · κ · scale`` term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from natgrad_diag._validate import input_error

__all__ = ["Tolerance", "default_tolerance", "eps", "resolve", "rounding_bound", "validate_tolerance"]


@dataclass(frozen=True)
class Tolerance:
    """Tolerances of one comparison: ``|got − want| ≤ atol + rtol · max|want|``.

    Attributes:
        rtol: relative to the largest |want| of the compared block.
        atol: absolute floor, for blocks whose reference is zero.
        eps: the finite-difference step (``None`` for exact comparisons).
    """

    rtol: float
    atol: float
    eps: float | None = None

    def bound(self, want: npt.ArrayLike) -> float:
        """``atol + rtol · max|want|`` over every element of ``want`` (an array or a sequence of arrays).

        Examples:
            >>> Tolerance(rtol=0.5, atol=0.25).bound([1.0, -4.0])
            2.25
        """
        wants = want if isinstance(want, (tuple, list)) else [want]
        scale = max((float(np.max(np.abs(np.asarray(w, np.float64)), initial=0.0)) for w in wants), default=0.0)
        return self.atol + self.rtol * scale


# Tolerance(rtol, atol, eps = the fd step) by dtype and kind; see the module docstring for where each number comes from.
_TABLE: dict[str, dict[str, Tolerance]] = {
    "float64": {"exact": Tolerance(1e-10, 1e-12), "finite_difference": Tolerance(1e-5, 1e-7, eps=1e-6)},
    "float32": {"exact": Tolerance(1e-4, 1e-5), "finite_difference": Tolerance(2e-2, 2e-3, eps=1e-3)},
    "float16": {"exact": Tolerance(1e-2, 1e-3), "finite_difference": Tolerance(1e-1, 5e-2, eps=1e-2)},
}  # fmt: skip


def _dtype_name(dtype: Any) -> str:
    try:
        return np.dtype(getattr(dtype, "as_numpy_dtype", dtype)).name
    except TypeError:
        return str(dtype)


def default_tolerance(dtype: Any, kind: str = "exact") -> Tolerance:
    """The default :class:`Tolerance` for comparisons of ``kind`` (``"exact"`` or ``"finite_difference"``) in
    ``dtype`` (a numpy or TensorFlow float16, float32 or float64).

    Raises:
        InputError: for a dtype or kind without a default.

    Examples:
        >>> default_tolerance("float64")
        Tolerance(rtol=1e-10, atol=1e-12, eps=None)
        >>> default_tolerance("float32", "finite_difference").eps
        0.001
    """
    name = _dtype_name(dtype)
    if kind not in ("exact", "finite_difference"):
        raise input_error("Unknown kind of comparison.", "kind", "exact or finite_difference", repr(kind),
                          "use one of the kinds listed.")
    if name not in _TABLE:
        raise input_error("No default tolerance for this dtype.", "dtype", "float16, float32 or float64", name,
                          "cast the inputs to a floating dtype (GPflow's default is float64).")
    return _TABLE[name][kind]


def eps(dtype: Any) -> float:
    """Machine epsilon of ``dtype`` (2.2e-16 for float64)."""
    return float(np.finfo(np.dtype(_dtype_name(dtype))).eps)


def rounding_bound(dtype: Any, *, condition: float, scale: float, factor: float = 100.0) -> float:
    """The rounding term ``factor · ε · κ · scale`` of a computation with condition number κ.

    A backward-stable computation of a quantity of size ``scale`` with condition number κ has a forward error
    of order ε·κ·scale (Higham 2002, §1.6); ``factor`` absorbs the constants that grow with the problem size.
    """
    return factor * eps(dtype) * float(condition) * float(scale)


def resolve(dtype: Any, kind: str = "exact", *, rtol: float | None = None, atol: float | None = None) -> Tolerance:
    """The default tolerance for ``dtype`` and ``kind``, with the user's ``rtol``/``atol`` where given.

    Raises:
        InputError: when rtol or atol is not a finite number ≥ 0.
    """
    base = default_tolerance(dtype, kind)
    rtol = base.rtol if rtol is None else validate_tolerance("rtol", rtol)
    atol = base.atol if atol is None else validate_tolerance("atol", atol)
    return Tolerance(rtol=rtol, atol=atol, eps=base.eps)


def validate_tolerance(name: str, value: Any) -> float:
    """``value`` as a float, when it is a finite number ≥ 0 (a tolerance named ``name``).

    Raises:
        InputError: for anything else (a string, a bool, NaN, ∞, a negative number), naming ``name``.

    Examples:
        >>> validate_tolerance("rtol", 1e-6)
        1e-06
    """
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not ok or not np.isfinite(value) or value < 0:
        raise input_error(f"{name} must be a finite number ≥ 0.", name, "a finite number ≥ 0, e.g. 1e-10", repr(value),
                          f"pass {name}= a non-negative float, or leave it out for the dtype's default.")
    return float(value)
