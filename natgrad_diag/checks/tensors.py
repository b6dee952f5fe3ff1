"""The TensorFlow maths of the checks, on tensors: loss and gradients, the step, ∂L/∂η, F·u, (∂ξ/∂θ)·u.

Each function runs eagerly in full mode and inside a ``tf.function`` of :mod:`natgrad_diag.checks.engine` in fast
mode. TensorFlow and GPflow are imported inside the functions.
"""

from __future__ import annotations

from typing import Any

__all__ = ["direction_tensors", "fisher_matrix_free_tensors", "loss_and_grads", "step_tensors", "xi_jvp_tensors"]


def loss_and_grads(model: Any, data: Any) -> tuple[Any, Any, Any]:
    """The training loss and its gradients w.r.t. q_mu's and q_sqrt's unconstrained variables (GPflow's tape)."""
    import tensorflow as tf

    q_mu_v, q_sqrt_v = model.q_mu.unconstrained_variable, model.q_sqrt.unconstrained_variable
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch([q_mu_v, q_sqrt_v])
        loss = model.training_loss() if data is None else model.training_loss(data)
    g_mu, g_sq = tape.gradient(loss, [q_mu_v, q_sqrt_v], unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return loss, g_mu, g_sq


def step_tensors(model: Any, g_mu: Any, g_sq: Any, gamma: Any, xi: Any, *, closed_form: bool = False) -> dict[str, Any]:
    """natgrad_diag.step.trace.natgrad_tensors on the model's current q(u): the step, not assigned.

    ``closed_form=True`` (the fast engine) computes the same record by
    :func:`~natgrad_diag.step.closed_form.natgrad_tensors_closed_form` where it applies (GPflow's XiNat or
    XiSqrtMeanVar with a lower-triangular q_sqrt): the reproduction check then compares two different computations
    of the step, the closed form and GPflow's autodiff, instead of the same graph twice.
    """
    import tensorflow as tf

    from natgrad_diag._gpflow import to_constrained
    from natgrad_diag.step.backend import step_backend
    from natgrad_diag.step.closed_form import natgrad_tensors_closed_form
    from natgrad_diag.step.trace import natgrad_tensors

    dL_dmean = to_constrained(g_mu, model.q_mu.transform)
    dL_dvarsqrt = to_constrained(g_sq, model.q_sqrt.transform)
    q_mu, q_sqrt = tf.identity(tf.convert_to_tensor(model.q_mu)), tf.identity(tf.convert_to_tensor(model.q_sqrt))
    name = step_backend(xi, model.q_sqrt.transform).xi if closed_form else None
    if name is not None:
        out = natgrad_tensors_closed_form(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, gamma, xi, name)
    else:
        out = natgrad_tensors(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, gamma, xi)
    out["dL_dmean"], out["dL_dvarsqrt"] = dL_dmean, dL_dvarsqrt
    return out


def direction_tensors(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any) -> tuple[Any, Any]:
    """∂L/∂η by the vector-Jacobian product of GPflow's expectation_to_meanvarsqrt (no step taken)."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation

    eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch([eta1, eta2])
        mean, varsqrt = expectation_to_meanvarsqrt(eta1, eta2)
    return tuple(tape.gradient([mean, varsqrt], [eta1, eta2], output_gradients=[dL_dmean, dL_dvarsqrt]))  # type: ignore[return-value, unused-ignore]


def fisher_matrix_free_tensors(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, dL_deta1: Any, dL_deta2: Any) -> dict[str, Any]:
    """F·∇ηL in closed form and ∇θL by reverse mode through GPflow's natural_to_meanvarsqrt, at the current q(u).

    For η(θ) = (m, S + m mᵀ) with S = (−2θ₂)⁻¹ and m = Sθ₁, the product of F = ∂η/∂θ with u = (u₁, U₂) is

        dS = 2·S U₂ S,   dη₁ = dS θ₁ + S u₁ = 2·S U₂ m + S u₁,   dη₂ = dS + dη₁ mᵀ + m dη₁ᵀ,

    a few matrix products (no Jacobian, no forward-mode pass through a Cholesky factorisation).
    """
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural, natural_to_meanvarsqrt

    S = tf.linalg.matmul(q_sqrt, q_sqrt, transpose_b=True)  # [L, M, M]
    m = tf.linalg.adjoint(q_mu)[:, :, None]  # [L, M, 1]
    u1 = tf.linalg.adjoint(dL_deta1)[:, :, None]
    SU2 = tf.linalg.matmul(S, dL_deta2)
    dS = 2.0 * tf.linalg.matmul(SU2, S)
    d1 = 2.0 * tf.linalg.matmul(SU2, m) + tf.linalg.matmul(S, u1)
    d2 = dS + tf.linalg.matmul(d1, m, transpose_b=True) + tf.linalg.matmul(m, d1, transpose_b=True)
    nat1, nat2 = meanvarsqrt_to_natural(q_mu, q_sqrt)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch([nat1, nat2])
        mean, varsqrt = natural_to_meanvarsqrt(nat1, nat2)
    g1, g2 = tape.gradient([mean, varsqrt], [nat1, nat2], output_gradients=[dL_dmean, dL_dvarsqrt])
    g2 = 0.5 * (g2 + tf.linalg.matrix_transpose(g2))  # the gradient along symmetric θ₂
    return dict(F_u1=tf.linalg.adjoint(d1[:, :, 0]), F_u2=d2, grad_theta1=g1, grad_theta2=g2)


def xi_jvp_tensors(q_mu: Any, q_sqrt: Any, dL_deta1: Any, dL_deta2: Any, xi: Any) -> tuple[Any, Any]:
    """(∂ξ/∂θ)·∇ηL by forward mode (tf.autodiff.ForwardAccumulator) through xi.naturals_to_xi."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

    nat1, nat2 = meanvarsqrt_to_natural(q_mu, q_sqrt)
    with tf.autodiff.ForwardAccumulator(primals=[nat1, nat2], tangents=[dL_deta1, dL_deta2]) as acc:
        x1, x2 = xi.naturals_to_xi(nat1, nat2)
    return tuple(acc.jvp([x1, x2], unconnected_gradients=tf.UnconnectedGradients.ZERO))  # type: ignore[return-value, unused-ignore]
