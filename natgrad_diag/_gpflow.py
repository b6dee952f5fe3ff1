"""The only module that uses GPflow's private names; every other module calls these wrappers.

GPflow (2.11) keeps two pieces of its natural-gradient step private: the map from unconstrained to
constrained gradients, ``gpflow.base._to_constrained``, and the update itself,
``NaturalGradient._natgrad_apply_gradients``. natgrad-diag reproduces and checks exactly these, so it
names them here, in one place, where a GPflow upgrade that moves them breaks one module. GPflow is
imported inside each function, so importing this module imports neither GPflow nor TensorFlow.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_lower_triangular_transform", "natgrad_apply_gradients", "override_natgrad_apply_gradients", "to_constrained"]

_FILL_INDEX: dict[int, tuple[Any, Any, Any]] = {}  # M -> (rows, cols, source) of a lower FillTriangular's gather


def to_constrained(grad: Any, transform: Any, *, as_array: bool = False) -> Any:
    """GPflow's map of a gradient w.r.t. an unconstrained variable to the constrained parameter.

    ``gpflow.base._to_constrained(grad, transform)`` is ``transform.forward(grad)`` (the identity for
    ``transform=None``): the chain rule only for linear isometric transforms (see the ``gradient_mapping``
    check). A parameter's value is the same map of its unconstrained variable. Works inside ``tf.function``.

    ``as_array=True`` returns the same numbers, bit for bit, as a numpy array (the LAPACK path's input), and
    there the two transforms of natgrad-diag's fast path run in numpy, because that is measurably faster: the
    identity (``None`` or TFP's ``Identity``) is the array itself, and a lower ``FillTriangular`` (GPflow's
    ``triangular()``), which only moves entries, is a gather at the positions the bijector itself gives
    1, 2, ..., n (learnt once per M). That skips TFP's bijector cache: 13 µs against 0.66 ms at M = 50,
    3.1 ms against 3.6 ms at M = 1000. Any other transform runs TFP's forward.

    Examples:
        >>> to_constrained(3.0, None)
        3.0
    """
    if as_array:
        return _to_array(grad, transform)
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


def _to_array(x: Any, transform: Any) -> Any:
    import numpy as np
    import tensorflow_probability as tfp

    def array(a: Any) -> Any:
        return np.asarray(a.numpy() if hasattr(a, "numpy") else a)

    if transform is None or isinstance(transform, tfp.bijectors.Identity):
        return array(x)
    v = array(x) if is_lower_triangular_transform(transform) else np.zeros(0)
    n = v.shape[-1] if v.ndim else 0
    M = int(round((np.sqrt(8 * n + 1) - 1) / 2))
    if n == 0 or M * (M + 1) // 2 != n:
        return array(to_constrained(x, transform))  # TFP's forward (and its shape error)
    if M not in _FILL_INDEX:
        probe = np.asarray(transform.forward(np.arange(1.0, n + 1.0)))  # [M, M]: k + 1 where entry k goes, else 0
        rows, cols = np.nonzero(probe)
        _FILL_INDEX[M] = (rows, cols, probe[rows, cols].astype(np.intp) - 1)
    rows, cols, source = _FILL_INDEX[M]
    out = np.zeros(v.shape[:-1] + (M, M), dtype=v.dtype)
    out[..., rows, cols] = v[..., source]
    return out


def natgrad_apply_gradients(optimizer: Any, q_mu_grad: Any, q_sqrt_grad: Any, q_mu: Any, q_sqrt: Any, xi_transform: Any) -> None:
    """``optimizer._natgrad_apply_gradients(...)``: GPflow's natural-gradient update, assigned to q_mu, q_sqrt.

    Args:
        optimizer: a ``gpflow.optimizers.NaturalGradient``.
        q_mu_grad, q_sqrt_grad: gradients w.r.t. the unconstrained variables of q_mu [M, L] and q_sqrt [L, M, M].
        q_mu, q_sqrt: the ``gpflow.Parameter`` s to update.
        xi_transform: a ``gpflow.optimizers.XiTransform`` instance.
    """
    from gpflow.optimizers import NaturalGradient

    # GPflow's own method, even when ``optimizer`` is a subclass that overrides it (natgrad_diag.NaturalGradient):
    # this is the oracle the checks and the benchmark compare against.
    NaturalGradient._natgrad_apply_gradients(optimizer, q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform)


def override_natgrad_apply_gradients(cls: type, method: Any) -> None:
    """Make ``method`` the update of the ``NaturalGradient`` subclass ``cls``.

    GPflow's ``minimize`` calls ``_natgrad_steps``, which calls ``_natgrad_apply_gradients`` for each
    (q_mu, q_sqrt) pair: the one hook through which a subclass changes the update.
    """
    setattr(cls, "_natgrad_apply_gradients", method)
