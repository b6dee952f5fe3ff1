"""Models as GPflow users build them in the reports the guard is for (GPflow's heteroskedastic notebook, GPflow #820)."""

from __future__ import annotations

import gpflow
import numpy as np
import tensorflow as tf


def heteroskedastic_svgp(num_data: int = 60, num_inducing: int = 8, seed: int = 0):
    """GPflow's heteroskedastic notebook in small: a Normal whose mean and log-scale are two latent GPs (L = 2).

    At γ = 1 a NaturalGradient step lowers the loss (409 → 115), the next one raises it 50× (→ 5746).
    """
    import tensorflow_probability as tfp

    rng = np.random.default_rng(seed)
    X = np.linspace(0.0, 4.0 * np.pi, num_data)[:, None]
    Y = np.sin(X) + 0.3 * np.exp(np.cos(X)) * rng.normal(size=X.shape)
    likelihood = gpflow.likelihoods.HeteroskedasticTFPConditional(
        distribution_class=tfp.distributions.Normal, scale_transform=tfp.bijectors.Exp()
    )
    kernel = gpflow.kernels.SeparateIndependent(
        [gpflow.kernels.SquaredExponential(), gpflow.kernels.SquaredExponential()]
    )
    Z = np.linspace(X.min(), X.max(), num_inducing)[:, None]
    inducing = gpflow.inducing_variables.SeparateIndependentInducingVariables(
        [gpflow.inducing_variables.InducingPoints(Z), gpflow.inducing_variables.InducingPoints(Z.copy())]
    )
    model = gpflow.models.SVGP(kernel, likelihood, inducing, num_latent_gps=likelihood.latent_dim)
    return model, (tf.constant(X), tf.constant(Y))


def multiclass_svgp(num_data: int = 100, num_inducing: int = 10):
    """GPflow #820: an SVGP with a MultiClass likelihood, 3 classes; GPflow's first NaturalGradient(0.1) step raises."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0.0, 1.0, (num_data, 1))
    Y = np.floor(3.0 * X) % 3
    kernel = gpflow.kernels.SquaredExponential(lengthscales=0.1)
    Z = np.linspace(0.0, 1.0, num_inducing)[:, None]
    model = gpflow.models.SVGP(kernel, gpflow.likelihoods.MultiClass(3), Z, num_latent_gps=3, num_data=num_data)
    return model, (tf.constant(X), tf.constant(Y))


def gpflow_loss_after(model, data, gamma: float) -> float | None:
    """The loss after GPflow's own NaturalGradient(gamma) step on a deep copy (None when the step raises or is not finite)."""
    copy_ = gpflow.utilities.deepcopy(model)
    try:
        gpflow.optimizers.NaturalGradient(gamma).minimize(
            lambda: copy_.training_loss(data), [(copy_.q_mu, copy_.q_sqrt)]
        )
    except tf.errors.InvalidArgumentError:
        return None
    loss = float(copy_.training_loss(data).numpy())
    return loss if np.isfinite(loss) else None


def gpflow_losses(model, data, gamma: float, steps: int, *, compiled: bool = False) -> list[float]:
    """The oracle for a γ over the steps that follow: the loss before and after each of ``steps`` steps of GPflow's own
    NaturalGradient(gamma) on a deep copy (step and loss each in a tf.function when ``compiled``), ending in NaN at a
    step that raises."""
    copy_ = gpflow.utilities.deepcopy(model)
    loss, optimizer = copy_.training_loss_closure(data, compile=False), gpflow.optimizers.NaturalGradient(gamma)
    step = lambda: optimizer.minimize(loss, [(copy_.q_mu, copy_.q_sqrt)])  # noqa: E731
    step, value = (tf.function(step), tf.function(loss)) if compiled else (step, loss)
    losses = [float(value())]
    for _ in range(steps):
        try:
            step()
        except tf.errors.InvalidArgumentError:
            return losses + [np.nan]
        losses.append(float(value()))
    return losses


class BranchySVGP(gpflow.models.SVGP):
    """An SVGP whose objective has Python control flow on a tensor, as a user's own model may: inside
    ``tf.function`` only AutoGraph can trace it. Both branches give the ELBO, so a plain SVGP is its oracle."""

    def maximum_log_likelihood_objective(self, data):
        elbo = self.elbo(data)
        if elbo < 0.0:
            return elbo + 0.0
        return elbo


def branchy_copy(model: gpflow.models.SVGP) -> BranchySVGP:
    """A :class:`BranchySVGP` with ``model``'s kernel, likelihood, inducing points and (copied) q(u)."""
    return BranchySVGP(model.kernel, model.likelihood, model.inducing_variable, q_mu=model.q_mu.numpy(),
                       q_sqrt=model.q_sqrt.numpy(), whiten=model.whiten, num_data=model.num_data)


def variables_of(model) -> list[np.ndarray]:
    """Copies of every variable's value (to compare bit for bit)."""
    return [v.numpy().copy() for v in model.variables]


def same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b))
