"""Type aliases for the public API, named once (as GPJax's typing.py): numpy arrays typed precisely, and
:data:`TensorLike` (``Any`` with a name: TensorFlow and GPflow ship no type information) for tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Array", "ArrayLike", "FloatArray", "TensorLike"]

#: A numpy array of floats (float16, float32 or float64), e.g. ``q_mu [M, L]``.
FloatArray = npt.NDArray[np.floating[Any]]
#: A numpy array of any dtype.
Array = npt.NDArray[Any]
#: Anything numpy turns into an array.
ArrayLike = npt.ArrayLike
#: A TensorFlow tensor or variable, a ``gpflow.Parameter``, or anything ``tf.convert_to_tensor`` accepts.
TensorLike = Any
