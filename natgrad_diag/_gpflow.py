"""The only module that uses GPflow's private names; every other module calls these wrappers.

GPflow (2.11) keeps two pieces of its natural-gradient step private: the map from unconstrained to
constrained gradients, ``gpflow.base._to_constrained``, and the update itself,
``NaturalGradient._natgrad_apply_gradients``. natgrad-diag reproduces and checks exactly these, so it
names them here, in one place, where a GPflow upgrade that moves them breaks one module. GPflow is
imported inside each function, so importing this module imports neither GPflow nor TensorFlow.
"""

from __future__ import annotations

from typing import Any

__all__ = ["natgrad_apply_gradients", "override_natgrad_apply_gradients", "to_constrained"]


def to_constrained(grad: Any, transform: Any) -> Any:
    """GPflow's map of a gradient w.r.t. an unconstrained variable to the constrained parameter.

    ``gpflow.base._to_constrained(grad, transform)`` is ``transform.forward(grad)`` (the identity for
    ``transform=None``): the chain rule only for linear isometric transforms (see the
    ``gradient_mapping`` check).

    Examples:
        >>> to_constrained(3.0, None)
        3.0
    """
    if transform is None:  # what GPflow does, without importing it for the common case
        return grad
    from gpflow.base import _to_constrained

    return _to_constrained(grad, transform)


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
