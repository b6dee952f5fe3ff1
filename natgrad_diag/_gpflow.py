"""The only module that uses GPflow's private names: ``gpflow.base._to_constrained`` (the map of unconstrained to
constrained gradients), ``NaturalGradient._natgrad_apply_gradients`` (the update), which natgrad-diag reproduces and
checks, and a ``gpflow.Parameter``'s tensor conversion (TensorFlow Probability's ``DeferredTensor._value``); a GPflow
upgrade that moves them breaks this one module. GPflow is imported inside each function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = [
    "constrained_array", "is_lower_triangular_transform", "natgrad_apply_gradients", "override_natgrad_apply_gradients",
    "read_once", "to_constrained",
]

_FILL_INDEX: dict[int, tuple[Any, Any, Any]] = {}  # M -> (rows, cols, source) of a lower FillTriangular's gather


def to_constrained(grad: Any, transform: Any) -> Any:
    """GPflow's map of a gradient w.r.t. an unconstrained variable to the constrained parameter.

    ``gpflow.base._to_constrained(grad, transform)`` is ``transform.forward(grad)`` (the identity for
    ``transform=None``): the chain rule only for linear isometric transforms (the ``gradient_mapping`` check).
    A parameter's value is the same map of its unconstrained variable. Works inside ``tf.function``.

    Examples:
        >>> to_constrained(3.0, None)
        3.0
    """
    if transform is None:  # what GPflow does, without importing it for the common case
        return grad
    from gpflow.base import _to_constrained

    return _to_constrained(grad, transform)


def is_lower_triangular_transform(transform: Any) -> bool:
    """Whether ``transform`` is a lower ``tfp.bijectors.FillTriangular`` (GPflow's ``triangular()``), or a subclass.

    Examples:
        >>> import gpflow
        >>> is_lower_triangular_transform(gpflow.utilities.triangular()), is_lower_triangular_transform(None)
        (True, False)
    """
    import tensorflow_probability as tfp

    return isinstance(transform, tfp.bijectors.FillTriangular) and not transform.parameters.get("upper", False)


def constrained_array(x: Any, transform: Any) -> Any:
    """:func:`to_constrained` as a numpy array, the same numbers bit for bit (the LAPACK path's input): the identity
    is the array itself and a lower ``FillTriangular`` (GPflow's ``triangular()``) a gather at the positions the
    bijector gives 1, 2, ..., n (learnt once per M), skipping TFP's bijector cache (13 µs against 0.66 ms at M = 50).
    Any other transform runs TFP's forward."""
    import numpy as np
    import tensorflow_probability as tfp

    v = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
    if transform is None or isinstance(transform, tfp.bijectors.Identity):
        return v
    n = v.shape[-1] if v.ndim else 0
    M = int(round((np.sqrt(8 * n + 1) - 1) / 2))
    if n == 0 or M * (M + 1) // 2 != n or not is_lower_triangular_transform(transform):
        return np.asarray(to_constrained(x, transform))  # TFP's forward (and its shape error)
    if M not in _FILL_INDEX:
        probe = np.asarray(transform.forward(np.arange(1.0, n + 1.0)))  # [M, M]: k + 1 where entry k goes, else 0
        rows, cols = np.nonzero(probe)
        _FILL_INDEX[M] = (rows, cols, probe[rows, cols].astype(np.intp) - 1)
    rows, cols, source = _FILL_INDEX[M]
    out = np.zeros(v.shape[:-1] + (M, M), dtype=v.dtype)
    out[..., rows, cols] = v[..., source]
    return out


def natgrad_apply_gradients(optimizer: Any, q_mu_grad: Any, q_sqrt_grad: Any, q_mu: Any, q_sqrt: Any, xi_transform: Any) -> None:
    """GPflow's own ``NaturalGradient._natgrad_apply_gradients`` (even on a subclass that overrides it, such as
    natgrad_diag.NaturalGradient: the oracle of the checks and the benchmark), assigned to the ``gpflow.Parameter`` s
    q_mu [M, L] and q_sqrt [L, M, M] from the gradients w.r.t. their unconstrained variables."""
    from gpflow.optimizers import NaturalGradient

    NaturalGradient._natgrad_apply_gradients(optimizer, q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform)


def override_natgrad_apply_gradients(cls: type, method: Any) -> None:
    """Make ``method`` the update of the ``NaturalGradient`` subclass ``cls`` (``minimize`` calls
    ``_natgrad_apply_gradients`` for each (q_mu, q_sqrt) pair)."""
    setattr(cls, "_natgrad_apply_gradients", method)


@contextlib.contextmanager
def read_once(module: Any, *, skip: tuple[Any, ...] = ()) -> Iterator[None]:
    """While a ``tf.function`` is traced: every ``gpflow.Parameter`` of ``module`` but ``skip`` converts to one tensor,
    read on entry, wherever the body uses it (its class's conversion comes back on exit).

    Each use of a Parameter otherwise reads its variable again, and reads are stateful ops that Grappler's
    common-subexpression pass never merges, so three losses in one graph compute Kuu, its Cholesky factor and
    Kuu⁻¹Kuf three times. With one read the copies are identical and merged: at M = 1000, GPflow's update, the loss
    after it and two more losses take 0.57 s instead of 0.75 s on 2 cores. The values, and so the losses, are the
    same bit for bit. Variables assigned inside the body (``skip``) must keep being read."""
    import tensorflow as tf

    params = [p for p in module.parameters if not any(p is s for s in skip)]
    for p, value in zip(params, [tf.convert_to_tensor(p) for p in params]):
        # DeferredTensor's tensor conversion calls self._value(dtype, name, as_ref)
        object.__setattr__(p, "_value", lambda dtype=None, name=None, as_ref=False, v=value: tf.convert_to_tensor(v, dtype=dtype, name=name))
    try:
        yield
    finally:
        for p in params:
            vars(p).pop("_value", None)
