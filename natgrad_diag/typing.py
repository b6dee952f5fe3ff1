"""Type aliases for the public API: arrays, array-likes and tensors, named once (in the style of GPJax's typing.py).

TensorFlow and GPflow ship no type information, so a TensorFlow tensor, variable or ``gpflow.Parameter``
is typed :data:`TensorLike` (an alias of ``Any`` with a name that says what is expected). numpy arrays
are typed precisely.

* :data:`FloatArray`: a numpy array of floats, e.g. ``q_mu [M, L]`` or a Jacobian block.
* :data:`Array`: a numpy array of any dtype (labels, indices, masks).
* :data:`ArrayLike`: what numpy accepts as an array (lists, numbers, arrays).
* :data:`TensorLike`: a ``tf.Tensor``, ``tf.Variable``, ``gpflow.Parameter`` or anything
  ``tf.convert_to_tensor`` takes.
"""

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
