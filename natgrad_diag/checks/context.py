"""What every natural-gradient check shares: the validated model and data, the settings, GPflow's dtype context."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.exceptions import InputError, UnsupportedModelError
from natgrad_diag.checks.tolerances import Tolerances

__all__ = ["Context", "dtype_context", "float_dtype", "validate_data", "validate_model"]


_DTYPES = {"float64": np.float64, "float32": np.float32}


def float_dtype(dtype: Any) -> type:
    """``np.float64`` or ``np.float32`` for a dtype given by name, numpy or TensorFlow; InputError otherwise.

    Examples:
        >>> float_dtype("float32")
        <class 'numpy.float32'>
    """
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    if name not in _DTYPES:
        raise InputError(
            "dtype must be float64 or float32.",
            context=[("Argument", "dtype"), ("Expected", "'float64' | 'float32'"), ("Got", repr(dtype))],
            remedy="pass dtype='float64' (recommended) or dtype='float32'.",
        )
    return _DTYPES[name]


@contextlib.contextmanager
def dtype_context(dtype: Any) -> Iterator[None]:
    """GPflow's config with ``default_float`` set to ``dtype`` inside the block, restored afterwards."""
    import dataclasses

    import gpflow

    cfg = dataclasses.replace(gpflow.config.config(), float=float_dtype(dtype))
    with gpflow.config.as_context(cfg):
        yield


@dataclass(frozen=True)
class Context:
    """The validated inputs of one run of the checks (read only: stages return what they find).

    Attributes:
        model: the SVGP or VGP (never changed).
        data: (X [N, D], Y [N, P]) tensors, or None for models that hold their data.
        xi: the ``gpflow.optimizers.XiTransform`` instance.
        gamma: the step length γ > 0.
        mode: "full" or "fast".
        tol: the tolerances.
        np_dtype: the model's numpy dtype.
        M, L: inducing points (N for a VGP) and latent GPs.
        fisher: whether the Fisher identity is checked.
        requested_mode: the mode the user asked for ("auto", "full" or "fast"; "" when not known).
        gamma_steps: k, the γ search measures each γ by the loss after k steps (1: after one step).
    """

    model: Any
    data: Any
    xi: Any
    gamma: float
    mode: str
    tol: Tolerances
    np_dtype: Any
    M: int
    L: int
    fisher: bool = True
    requested_mode: str = ""
    gamma_steps: int = 1

    def loss_fn(self, model: Any) -> Any:
        """``model``'s training loss on this context's data."""
        return model.training_loss() if self.data is None else model.training_loss(self.data)


def validate_model(model: Any) -> None:
    import gpflow

    q_mu = getattr(model, "q_mu", None)
    q_sqrt = getattr(model, "q_sqrt", None)
    if not isinstance(model, gpflow.models.GPModel) or not isinstance(q_mu, gpflow.Parameter) or not isinstance(q_sqrt, gpflow.Parameter):
        raise UnsupportedModelError(
            "natural gradients need a GPflow model with a variational q(u) = N(q_mu, q_sqrt q_sqrtᵀ).",
            context=[("Argument", "model"), ("Expected", "gpflow.models.SVGP or gpflow.models.VGP (q_mu and q_sqrt Parameters)"), ("Got", type(model).__name__)],
            remedy="pass an SVGP or VGP model; GPR and SGPR have no variational parameters to take natural steps on.",
        )
    if getattr(model, "q_diag", False) or len(q_sqrt.shape) == 2:
        raise UnsupportedModelError(
            "q_sqrt is diagonal (q_diag=True); GPflow's NaturalGradient supports only the full covariance "
            "parametrisation q_sqrt [L, M, M].",
            context=[("Argument", "model.q_sqrt"), ("Expected", "[L, M, M] (q_diag=False)"), ("Actual", f"{list(q_sqrt.shape)} (q_diag=True)")],
            remedy="build the model with q_diag=False (the default) to use natural gradients.",
        )
    if len(q_mu.shape) != 2 or len(q_sqrt.shape) != 3 or tuple(q_sqrt.shape) != (q_mu.shape[1], q_mu.shape[0], q_mu.shape[0]):
        raise UnsupportedModelError(
            "q_mu and q_sqrt do not have GPflow's shapes q_mu [M, L], q_sqrt [L, M, M].",
            context=[("Argument", "model.q_mu / model.q_sqrt"), ("Expected", "[M, L] and [L, M, M]"), ("Actual", f"{list(q_mu.shape)} and {list(q_sqrt.shape)}")],
            remedy="natural gradients need one full-covariance q(u) per latent GP, as SVGP and VGP build them.",
        )
    if q_mu.dtype not in (np.float64, np.float32) and getattr(q_mu.dtype, "name", "") not in ("float64", "float32"):
        raise InputError(
            "the model's variational parameters must be float64 or float32.",
            context=[("Argument", "model.q_mu"), ("Expected", "float64 (or float32)"), ("Got", str(q_mu.dtype))],
            remedy="build the model under gpflow.config.set_default_float(np.float64).",
        )


def validate_data(model: Any, data: Any, dtype: Any) -> Any:
    import gpflow
    import tensorflow as tf

    internal = isinstance(model, gpflow.models.InternalDataTrainingLossMixin)
    if internal:
        if data is not None:
            raise InputError(
                f"{type(model).__name__} holds its own data; data must be None.",
                context=[("Argument", "data"), ("Expected", "None (the data are in model.data)"), ("Got", type(data).__name__)],
                remedy="call check_natgrad(model) without data.",
            )
        return None
    if data is None:
        raise InputError(
            f"{type(model).__name__}'s training loss needs data.",
            context=[("Argument", "data"), ("Expected", "a tuple (X [N, D], Y [N, P])"), ("Got", "None")],
            remedy="pass the full batch, check_natgrad(model, (X, Y)), as you pass it to model.training_loss.",
        )
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise InputError(
            "data must be a pair (X, Y).",
            context=[("Argument", "data"), ("Expected", "a tuple (X [N, D], Y [N, P])"), ("Got", type(data).__name__ + (f" of length {len(data)}" if hasattr(data, "__len__") else ""))],
            remedy="pass data=(X, Y).",
        )
    X, Y = (np.asarray(d) for d in data)
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise InputError(
            "X and Y must be matrices with the same number of rows.",
            context=[("Argument", "data"), ("Expected", "X [N, D] and Y [N, P]"), ("Got", f"X {list(X.shape)} and Y {list(Y.shape)}")],
            remedy="reshape with X[:, None] / Y[:, None] for one-dimensional arrays.",
        )
    for name, arr in (("X", X), ("Y", Y)):
        if not np.issubdtype(arr.dtype, np.number) or not np.all(np.isfinite(arr)):
            raise InputError(
                f"data {name} must be finite numbers.",
                context=[("Argument", f"data[{0 if name == 'X' else 1}] ({name})"), ("Expected", "finite floats"), ("Got", f"dtype {arr.dtype}, {int(np.sum(~np.isfinite(arr.astype(float))))} non-finite" if np.issubdtype(arr.dtype, np.number) else f"dtype {arr.dtype}")],
                remedy=f"drop or impute the non-finite rows of {name}.",
            )
    return tf.constant(X.astype(dtype)), tf.constant(Y.astype(dtype))
