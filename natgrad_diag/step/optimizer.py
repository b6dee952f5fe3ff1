"""``NaturalGradient``: GPflow's optimizer with the closed-form step for XiNat and XiSqrtMeanVar, GPflow's own for other ξ."""

from __future__ import annotations

from typing import Any

import gpflow
import tensorflow as tf

from natgrad_diag._gpflow import natgrad_apply_gradients, override_natgrad_apply_gradients, to_constrained
from natgrad_diag.exceptions import raised_as_is
from natgrad_diag.step.backend import step_backend
from natgrad_diag.step.closed_form import natgrad_step_closed_form

__all__ = ["NaturalGradient"]


class NaturalGradient(gpflow.optimizers.NaturalGradient):  # type: ignore[misc, unused-ignore]  # untyped where GPflow is absent (nox typecheck)
    """GPflow's ``NaturalGradient`` whose update is the closed form of :mod:`natgrad_diag.step.closed_form`.

    A drop-in replacement (same constructor, same ``minimize``, eagerly and inside ``tf.function``) whose
    :meth:`apply_natgrad` takes one Cholesky and one triangular solve for ``XiNat``, two triangular products for
    ``XiSqrtMeanVar``, instead of GPflow's autodiff through three Choleskys (same result to ε·κ(S) relative);
    GPflow's own update runs where :func:`~natgrad_diag.step.backend.step_backend` finds no closed form.

    Examples:
        >>> import gpflow, numpy as np, tensorflow as tf
        >>> X = np.linspace(0, 1, 20)[:, None]; Y = np.sin(6 * X)
        >>> model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(0.1),
        ...                            inducing_variable=X[::4].copy(), num_data=20)
        >>> gpflow.set_trainable(model.inducing_variable, False)
        >>> opt = NaturalGradient(gamma=1.0)
        >>> opt.minimize(model.training_loss_closure((X, Y)), [(model.q_mu, model.q_sqrt)])
        >>> model.q_sqrt.shape
        TensorShape([1, 5, 5])
    """

    @raised_as_is  # a user's tf.function calls it unconverted (it holds no control flow on tensors)
    def apply_natgrad(self, q_mu_grad: Any, q_sqrt_grad: Any, q_mu: Any, q_sqrt: Any, xi_transform: Any = None) -> None:
        """One natural-gradient update of ``q_mu`` [M, L] and ``q_sqrt`` [L, M, M], assigned in place: the public form
        of GPflow's ``_natgrad_apply_gradients`` (same arguments, same assignments), which this class routes here.

        Args:
            q_mu_grad, q_sqrt_grad: ∂L/∂ q_mu's and q_sqrt's unconstrained variables, [M, L] and [L, M(M+1)/2] (or
                [L, M, M] without a transform).
            q_mu, q_sqrt: the ``gpflow.Parameter`` s q_mu [M, L] and q_sqrt [L, M, M].
            xi_transform: the ξ transform (``self.xi_transform`` when ``None``).
        """
        if (xi := step_backend(xi_transform or self.xi_transform, q_sqrt.transform, q_sqrt).xi) is None:
            natgrad_apply_gradients(self, q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform)  # GPflow: None is self.xi_transform
            return
        grads = to_constrained(q_mu_grad, q_mu.transform), to_constrained(q_sqrt_grad, q_sqrt.transform)
        with tf.name_scope(f"{self.natgrad_name}/closed_form_step"):
            new_q_mu, new_q_sqrt = natgrad_step_closed_form(q_mu, q_sqrt, *grads, self.gamma, xi)
        q_mu.assign(new_q_mu)
        q_sqrt.assign(new_q_sqrt)


override_natgrad_apply_gradients(NaturalGradient, NaturalGradient.apply_natgrad)
