"""natgrad_trace's inputs: the checks before either path runs, and the fast paths' view of them (tensors, transforms, arrays)."""

from __future__ import annotations

from typing import Any

import numpy as np

from natgrad_diag._validate import dtype_name, input_error, shape_str
from natgrad_diag.exceptions import DTypeMismatchError, InputError, ShapeMismatchError
from natgrad_diag.step.backend import is_lower_triangular_transform
from natgrad_diag.typing import FloatArray

__all__ = ["constrained_arrays", "fast_parts", "precheck", "require_lower_triangular", "transform_key"]


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


def transform_key(transform: Any) -> Any:
    """A hashable key for a parameter transform that depends only on what it computes, or ``None``
    when it cannot be keyed (then the transform is applied eagerly, outside the compiled step).

    ``None`` (identity) gives ``"identity"``; a TFP bijector whose constructor parameters are all
    plain values (``FillTriangular(upper=False)``, GPflow's ``triangular()``) gives its class and
    those parameters.
    """
    if transform is None:
        return "identity"
    params = getattr(transform, "parameters", None)
    if not isinstance(params, dict):
        return None
    items = []
    for k, v in sorted(params.items()):
        if v is not None and not isinstance(v, (bool, int, float, str)):
            return None
        items.append((k, v))
    return (type(transform), tuple(items))


def fast_parts(x: Any) -> tuple[Any, Any] | None:
    """(the tensor the step reads, its transform) without running the transform; None if unusual."""
    import gpflow
    import tensorflow as tf

    if isinstance(x, gpflow.Parameter):
        return x.unconstrained_variable, x.transform
    if isinstance(x, (tf.Variable, tf.Tensor)):
        return x, None
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return tf.convert_to_tensor(x), None
    return None


_FILL_INDEX: dict[int, tuple[Any, Any, Any]] = {}  # M -> (rows, cols, source) of FillTriangular(upper=False)


def _is_identity(transform: Any) -> bool:
    import tensorflow_probability as tfp

    return transform is None or type(transform) is tfp.bijectors.Identity


def _forward(x: Any, transform: Any) -> FloatArray:
    """``transform.forward(x)`` as a numpy array. The identity (``None`` or TFP's ``Identity``) is x; GPflow's ``triangular()`` (FillTriangular, lower) moves data and
    computes nothing, so it is reproduced exactly by a numpy gather: the positions are those the bijector itself
    gives 1, 2, ..., n (learnt once per M); this skips TFP's bijector cache, which costs milliseconds a call.
    Any other transform runs in TensorFlow, eagerly."""
    a = x if _is_identity(transform) else None
    if a is None and not is_lower_triangular_transform(transform):
        a = transform.forward(x)
    if a is not None:
        return np.asarray(a.numpy() if hasattr(a, "numpy") else a)
    v = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
    n = v.shape[-1]
    M = int(round((np.sqrt(8 * n + 1) - 1) / 2))
    if M * (M + 1) // 2 != n:
        return np.asarray(transform.forward(x).numpy())  # the bijector names the shape error on the eager path
    if M not in _FILL_INDEX:
        probe = np.asarray(transform.forward(np.arange(1.0, n + 1.0)))  # [M, M]: k + 1 where entry k goes, else 0
        rows, cols = np.nonzero(probe)
        _FILL_INDEX[M] = (rows, cols, probe[rows, cols].astype(np.intp) - 1)
    rows, cols, source = _FILL_INDEX[M]
    out = np.zeros(v.shape[:-1] + (M, M), dtype=v.dtype)
    out[..., rows, cols] = v[..., source]
    return out


def constrained_arrays(tensors: tuple[Any, ...], t_mu: Any, t_sq: Any) -> tuple[FloatArray, ...] | None:
    """(q_mu [M, L], q_sqrt [L, M, M], ∂L/∂m, ∂L/∂L_S) as numpy arrays, for the LAPACK path, from ``tensors`` =
    (the unconstrained q_mu, q_sqrt, and their gradients) and the parameters' transforms.

    The transforms are the eager path's (``transform.forward`` of the unconstrained values, and of the
    gradients: GPflow's ``_to_constrained``), bit for bit (:func:`_forward`). ``None`` when the eager
    reference path must decide (and name the problem): an input that is not finite, a zero on q_sqrt's
    diagonal, shapes that do not fit.
    """
    mu_in, sq_in, g_mu, g_sq = tensors
    q_mu, q_sqrt, d_mu, d_sq = (_forward(x, t) for x, t in ((mu_in, t_mu), (sq_in, t_sq), (g_mu, t_mu), (g_sq, t_sq)))
    if q_mu.ndim != 2 or q_sqrt.shape != (q_mu.shape[1], q_mu.shape[0], q_mu.shape[0]):
        return None
    if d_mu.shape != q_mu.shape or d_sq.shape != q_sqrt.shape:
        return None
    raw = [np.asarray(x.numpy() if hasattr(x, "numpy") else x) for x in (g_mu, g_sq)]  # as the eager path checks them
    if not all(np.all(np.isfinite(a)) for a in (q_mu, q_sqrt, d_mu, d_sq, *raw)):
        return None
    if np.any(np.diagonal(q_sqrt, axis1=1, axis2=2) == 0):
        return None
    return q_mu, q_sqrt, d_mu, d_sq
