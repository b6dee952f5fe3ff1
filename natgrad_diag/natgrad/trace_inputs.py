"""natgrad_trace's inputs before either path runs: eager mode, float32/float64, M, L ≥ 1, a lower-triangular q_sqrt."""

from __future__ import annotations

from typing import Any

import numpy as np

from natgrad_diag._validate import dtype_name, input_error, shape_str
from natgrad_diag.exceptions import DTypeMismatchError, InputError, ShapeMismatchError

__all__ = ["precheck", "require_lower_triangular"]


def precheck(q_mu: Any, q_sqrt: Any) -> None:
    """What both paths need before any work: eager mode, float32/float64, M ≥ 1 and L ≥ 1, a lower-triangular
    q_sqrt (or a triangular transform, which makes it one)."""
    import tensorflow as tf

    if not tf.executing_eagerly():
        raise input_error(
            "natgrad_trace was called inside a tf.function (or a graph): it records numpy values, which need eager mode.",
            "q_mu", "eager tensors (natgrad_trace called outside tf.function)", "symbolic tensors",
            "call natgrad_trace eagerly, outside tf.function; it compiles its own step from the second call.",
        )  # fmt: skip
    for name, x in (("q_mu", q_mu), ("q_sqrt", q_sqrt)):
        if dtype_name(x) in ("float16", "bfloat16"):
            raise DTypeMismatchError(
                f"{name} is {dtype_name(x)}: GPflow's natural-gradient step needs float32 or float64 "
                "(its Cholesky and triangular solves have no half-precision kernels).",
                context=[("Argument", name), ("Expected", "float64 (or float32)"), ("Got", dtype_name(x))],
                remedy="build the model in float64 (GPflow's default: gpflow.config.set_default_float(np.float64)).",
            )
    for name, x, dims in (("q_mu", q_mu, "[M, L]"), ("q_sqrt", q_sqrt, "[L, M, M]")):
        shape = getattr(x, "shape", None)
        if shape is not None and 0 in tuple(shape):
            raise ShapeMismatchError(
                f"{name} is empty (M = 0 inducing points or L = 0 latent GPs): there is no step to trace.",
                context=[("Argument", name), ("Expected", f"{dims} with M ≥ 1 and L ≥ 1"), ("Actual", shape_str(shape))],
                remedy="pass the q_mu and q_sqrt of a model with at least one inducing point and one latent GP.",
            )
    require_lower_triangular(q_sqrt)


def require_lower_triangular(q_sqrt: Any) -> None:
    """A q_sqrt without a triangular transform must be lower-triangular: GPflow's step reads the full matrix in
    one place and its lower triangle in another, so entries above the diagonal make it mix two matrices."""
    import gpflow

    transform = getattr(q_sqrt, "transform", None) if isinstance(q_sqrt, gpflow.Parameter) else None
    if transform is not None and "Triangular" in type(transform).__name__:
        return  # the transform builds a lower-triangular matrix
    try:
        a = np.asarray(q_sqrt.numpy() if hasattr(q_sqrt, "numpy") else q_sqrt)
    except (TypeError, ValueError):
        return  # param_parts names what is wrong with it
    if a.ndim != 3 or a.shape[-1] != a.shape[-2] or a.dtype.kind != "f":
        return  # validate_q names the shape or dtype
    upper = np.triu(a, 1)
    if np.any(upper != 0):
        l_idx, i, j = (int(k) for k in np.argwhere(upper != 0)[0])
        raise InputError(
            "q_sqrt has non-zero entries above the diagonal; GPflow's step would mix the full matrix (in "
            "S = q_sqrt q_sqrtᵀ) with its lower triangle (in the triangular solves).",
            context=[("Argument", "q_sqrt"), ("Expected", "lower-triangular [L, M, M] (zeros above the diagonal)"),
                     ("Got", f"{shape_str(a.shape)} with q_sqrt[{l_idx}, {i}, {j}] = {a[l_idx, i, j]:.6g}")],
            remedy="pass np.tril(q_sqrt) (the Cholesky factor), or a gpflow.Parameter with transform=gpflow.utilities.triangular().",
        )
