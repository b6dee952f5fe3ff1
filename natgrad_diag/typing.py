"""Type aliases, named once (as GPJax's typing.py): numpy arrays typed precisely."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Array", "FloatArray"]

#: A numpy array of floats (float16, float32 or float64), e.g. ``q_mu [M, L]``.
FloatArray = npt.NDArray[np.floating[Any]]
#: A numpy array of any dtype.
Array = npt.NDArray[Any]
