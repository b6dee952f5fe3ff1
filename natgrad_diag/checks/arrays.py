"""Small numpy helpers of the checks: the largest magnitude, the scale of a block, finiteness."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["finite", "maxabs", "scale"]


def maxabs(a: Any) -> float:
    """max |a| as a float: 0 for an empty array, inf when anything is not finite.

    Examples:
        >>> maxabs([1.0, -3.0]), maxabs([]), maxabs([1.0, float("nan")])
        (3.0, 0.0, inf)
    """
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0:
        return 0.0
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.max(np.abs(a)))


def scale(arrays: Sequence[Any]) -> float:
    """The largest :func:`maxabs` of several arrays (the scale a relative tolerance multiplies).

    Examples:
        >>> scale([[1.0], [-2.0, 0.5]])
        2.0
    """
    return max(maxabs(a) for a in arrays)


def finite(*arrays: Any) -> bool:
    """Whether every entry of every array is finite.

    Examples:
        >>> finite([1.0], 2.0), finite([1.0, float("inf")])
        (True, False)
    """
    return all(np.all(np.isfinite(np.asarray(a))) for a in arrays)
