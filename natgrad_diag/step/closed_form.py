"""GPflow's natural-gradient step in closed form, in TensorFlow: one Cholesky for XiNat and none for XiSqrtMeanVar.

In the notation of :mod:`natgrad_diag.step`. GPflow gets ∂L/∂η by autodiff through ``expectation_to_meanvarsqrt``
(recomputing C = chol(η₂ − η₁η₁ᵀ)), XiSqrtMeanVar's (∂ξ/∂θ)·v by a double-backward JVP, and maps θ back with two
Choleskys. Every piece has a closed form:

**1. The VJP through the Cholesky** (Murray 2016, "Differentiation of the Cholesky decomposition",
arXiv:1602.07527, §3; TensorFlow's ``linalg_grad._CholeskyGrad``): P = Φ(CᵀG), ∂L/∂S = ½ C⁻ᵀ(P + Pᵀ)C⁻¹.
Only the lower triangle of G enters P (for i ≥ j, (CᵀG)_ij = Σ_{k≥i} C_ki G_kj reads G_kj with k ≥ j), so
entries of ∂L/∂L_S above the diagonal are ignored, exactly as in GPflow (:func:`cholesky_vjp`).

**2. The expectation-parameter gradient.** S = η₂ − η₁η₁ᵀ and m = η₁, so ∂L/∂η₂ = ∂L/∂S and
∂L/∂η₁ = ∂L/∂m − 2 · ∂L/∂S · m (:func:`expectation_gradients`).

**3. XiNat** (the natural gradient is ∂L/∂η). With V = ∂L/∂η₂ and Λ = S⁻¹ = C⁻ᵀC⁻¹, the new precision is
−2θ₂_new = Λ + 2γV = C⁻ᵀ B C⁻¹ with B = I + γ(P + Pᵀ). Write B = U Uᵀ with U = J·chol(JBJ)·J upper triangular;
then S_new = C B⁻¹ Cᵀ = (C U⁻ᵀ)(C U⁻ᵀ)ᵀ with C U⁻ᵀ lower triangular with a positive diagonal, so

    q_sqrt_new = C U⁻ᵀ,    q_mu_new = S_new θ₁_new = m − γ · S_new · ∂L/∂m,

the last because θ₁_new = Λm − γ(∂L/∂m − 2Vm) = (Λ + 2γV)m − γ∂L/∂m. One Cholesky of an M×M matrix and one
triangular solve, against GPflow's three Choleskys and three triangular inverses.

**4. XiSqrtMeanVar** (ξ = (m, L_S)). The JVP of θ ↦ (m, chol(S)) in the direction (v₁, V) is, with
dS = −S dΛ S = 2SVS and dC = C Φ(C⁻¹ dS C⁻ᵀ) (Murray 2016, eq. 10), dm = S(v₁ + 2Vm), dL_S = 2C Φ(CᵀVC).
At (v₁, V) = ∂L/∂η, v₁ + 2Vm = ∂L/∂m and CᵀVC = ½(P + Pᵀ), whose Φ is ½P, so the natural gradient in ξ is
(S·∂L/∂m, L_S Φ(L_Sᵀ G)) (the signs D cancel) and

    q_mu_new = m − γ · S · ∂L/∂m,    q_sqrt_new = L_S − γ · L_S Φ(L_Sᵀ G):

two triangular products, no Cholesky and no inverse.

**5. The default seed** Jᵀ·1 (``tape.gradient(meanvarsqrt, [eta1, eta2])``, :func:`default_seed_gradient`): item 1
with Ḡ = ones, where Cᵀ Ḡ = s 1ᵀ (s the column sums of C), so Φ(s 1ᵀ) C⁻¹ = diag(s)(cumsum₋(C⁻¹) + ½C⁻¹) (an
exclusive cumulative sum over rows): Σ̄ = sym(C⁻ᵀ diag(s)(cumsum₋(C⁻¹) + ½C⁻¹)), sym(A) = ½(A + Aᵀ); then
∂/∂η₂ = Σ̄ and ∂/∂η₁ = 1 − 2Σ̄η₁. One matrix product instead of a second backward pass.

**Rounding.** GPflow inverts S and recovers it as η₂ − η₁η₁ᵀ: an error of order ε·κ(S) relative. The closed forms
invert nothing for XiSqrtMeanVar and only the well-scaled B for XiNat: they agree with GPflow to that bound.
"""

from __future__ import annotations

from typing import Any

from natgrad_diag._validate import input_error, shape_str
from natgrad_diag.exceptions import DTypeMismatchError, ShapeMismatchError

__all__ = [
    "cholesky_vjp", "default_seed_gradient", "expectation_gradients", "natgrad_step_closed_form",
    "natgrad_tensors_closed_form", "natural_gradient_xi",
]


def _phi(x: Any) -> Any:
    """Φ(X): the lower triangle of X with its diagonal halved."""
    import tensorflow as tf

    return tf.linalg.set_diag(tf.linalg.band_part(x, -1, 0), 0.5 * tf.linalg.diag_part(x))


def _positive_diagonal(q_sqrt: Any) -> Any:
    """chol(q_sqrt q_sqrtᵀ) = q_sqrt·D, D = diag(sign q_sqrt_ii): the factor GPflow's autodiff path sees."""
    import tensorflow as tf

    diag = tf.linalg.diag_part(q_sqrt)
    return q_sqrt * tf.where(diag < 0, -tf.ones_like(diag), tf.ones_like(diag))[..., None, :]


def _cov_times(sqrt: Any, v: Any) -> Any:
    """[M, L]: (sqrt sqrtᵀ) v per latent GP, for sqrt [L, M, M] and v [M, L]."""
    import tensorflow as tf

    return tf.transpose(tf.linalg.matvec(sqrt, tf.linalg.matvec(sqrt, tf.transpose(v), transpose_a=True)))


def _inputs(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any) -> list[Any]:
    """The four inputs as tensors, after static shape and dtype checks."""
    import tensorflow as tf

    tensors = [tf.convert_to_tensor(x) for x in (q_mu, q_sqrt, dL_dmean, dL_dvarsqrt)]
    q_mu, q_sqrt, dL_dmean, dL_dvarsqrt = tensors
    qm, qs = q_mu.shape, q_sqrt.shape
    if qm.rank != 2 or qs.rank != 3:
        bad, want, got = ("q_mu", "[M, L]", qm) if qm.rank != 2 else ("q_sqrt", "[L, M, M]", qs)
        raise input_error(f"{bad} has the wrong rank.", bad, want, shape_str(got), "pass q_mu [M, L] and the "
                          "full-covariance q_sqrt [L, M, M] (q_diag=True has no natural gradient).",
                          kind=ShapeMismatchError)
    want_qs = [qm[1], qm[0], qm[0]]
    if not qs.is_compatible_with(want_qs):
        raise input_error("q_sqrt does not match q_mu.", "q_sqrt", f"[L, M, M] = {shape_str(want_qs)}", shape_str(qs),
                          "pass the q_mu [M, L] and q_sqrt [L, M, M] of the same q(u).", kind=ShapeMismatchError)
    for name, value, like, want in (("dL_dmean", dL_dmean, "q_mu", qm), ("dL_dvarsqrt", dL_dvarsqrt, "q_sqrt", qs)):
        if not value.shape.is_compatible_with(want):
            raise input_error(f"{name} must have the shape of {like}.", name, shape_str(want), shape_str(value.shape),
                              f"pass the gradient with respect to the constrained {like} (GPflow's _to_constrained "
                              "of the tape's gradient).", kind=ShapeMismatchError)
    for name, value in (("q_sqrt", q_sqrt), ("dL_dmean", dL_dmean), ("dL_dvarsqrt", dL_dvarsqrt)):
        if value.dtype != q_mu.dtype:
            raise input_error(f"{name} must have the dtype of q_mu.", name, q_mu.dtype.name, value.dtype.name,
                              f"cast {name} with tf.cast({name}, {q_mu.dtype.name}).", kind=DTypeMismatchError)
    if not q_mu.dtype.is_floating:
        raise input_error("q_mu must be a floating-point tensor.", "q_mu", "float64 (or float32)", q_mu.dtype.name,
                          "cast the inputs with tf.cast(x, tf.float64) (GPflow's default float).",
                          kind=DTypeMismatchError)
    return tensors


def cholesky_vjp(chol: Any, grad: Any) -> Any:
    """∂L/∂S [..., M, M] = ½ C⁻ᵀ(P + Pᵀ)C⁻¹, P = Φ(CᵀG), from C = chol(S) [..., M, M] (positive diagonal) and
    G = ∂L/∂C [..., M, M] (item 1): TensorFlow's Cholesky gradient.

    Examples:
        >>> import tensorflow as tf
        >>> C = tf.constant([[2.0, 0.0], [1.0, 1.0]], tf.float64)
        >>> with tf.GradientTape() as tape:
        ...     S = tf.constant([[4.0, 2.0], [2.0, 2.0]], tf.float64)
        ...     tape.watch(S)
        ...     out = tf.linalg.cholesky(S)
        >>> G = tf.constant([[1.0, 0.0], [3.0, -1.0]], tf.float64)
        >>> bool(tf.reduce_all(tf.abs(cholesky_vjp(C, G) - tape.gradient(out, S, output_gradients=G)) < 1e-14))
        True
    """
    import tensorflow as tf

    p = _phi(tf.linalg.matmul(chol, grad, transpose_a=True))
    x = tf.linalg.triangular_solve(chol, p, lower=True, adjoint=True)  # C⁻ᵀ P
    x = tf.linalg.triangular_solve(chol, tf.linalg.matrix_transpose(x), lower=True, adjoint=True)  # (C⁻ᵀ P C⁻¹)ᵀ
    return 0.5 * (x + tf.linalg.matrix_transpose(x))  # exactly symmetric, as TensorFlow's (X + Xᵀ)/2


def expectation_gradients(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any) -> tuple[Any, Any]:
    """(dL_deta1 [M, L], dL_deta2 [L, M, M]) from m = q_mu [M, L], L_S = q_sqrt [L, M, M] (lower triangular),
    ∂L/∂m [M, L] and G = ∂L/∂L_S [L, M, M] (item 2): GPflow's ``tape.gradient(meanvarsqrt, [eta1, eta2],
    output_gradients=...)``."""
    q_mu, q_sqrt, dL_dmean, dL_dvarsqrt = _inputs(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt)
    import tensorflow as tf

    dL_dS = cholesky_vjp(_positive_diagonal(q_sqrt), dL_dvarsqrt)
    return dL_dmean - 2.0 * tf.transpose(tf.linalg.matvec(dL_dS, tf.transpose(q_mu))), dL_dS


def natural_gradient_xi(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, xi: str = "nat") -> tuple[Any, Any]:
    """The natural gradient in ξ, GPflow's ``(nat_dL_xi1 [M, L], nat_dL_xi2 [L, M, M])``: ∂L/∂η for ``"nat"``,
    item 4 for ``"sqrtmeanvar"``."""
    if xi not in ("nat", "sqrtmeanvar"):  # GPflow's XiNat, XiSqrtMeanVar
        raise input_error("No closed form for this ξ transform.", "xi", "'nat' or 'sqrtmeanvar'", repr(xi),
                          "use GPflow's NaturalGradient (or natgrad_diag.NaturalGradient, which falls back to it) "
                          "for other ξ.")
    if xi == "nat":
        return expectation_gradients(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt)
    q_mu, q_sqrt, dL_dmean, dL_dvarsqrt = _inputs(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt)
    import tensorflow as tf

    nat_dL_xi2 = tf.linalg.matmul(q_sqrt, _phi(tf.linalg.matmul(q_sqrt, dL_dvarsqrt, transpose_a=True)))
    return _cov_times(q_sqrt, dL_dmean), nat_dL_xi2


def natgrad_step_closed_form(
    q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, gamma: Any, xi: str = "nat"
) -> tuple[Any, Any]:
    """The (q_mu, q_sqrt) that GPflow's natural-gradient step assigns, in closed form (items 3 and 4).

    Works eagerly and inside ``tf.function``; batched over the L latent GPs.

    Args:
        q_mu, q_sqrt: [M, L], [L, M, M], m and the lower-triangular L_S.
        dL_dmean, dL_dvarsqrt: [M, L], [L, M, M], ∂L/∂m and G = ∂L/∂L_S (only its lower triangle enters).
        gamma, xi: the step length γ (a float or a scalar tensor or variable); ``"nat"`` or ``"sqrtmeanvar"``.

    Returns:
        (new_q_mu [M, L], new_q_sqrt [L, M, M]).

    Raises:
        ShapeMismatchError, DTypeMismatchError, InputError: for inputs that do not fit (at trace time).
        tf.errors.InvalidArgumentError: for XiNat when the new precision is not positive definite (γ too
            large), where GPflow's step fails too.

    Examples:
        >>> import numpy as np
        >>> q_mu, q_sqrt = np.array([[1.0], [2.0]]), np.array([[[1.0, 0.0], [0.5, 2.0]]])
        >>> g_mu, g_sqrt = np.array([[0.1], [0.2]]), np.array([[[0.3, 0.0], [0.1, -0.2]]])
        >>> new_mu, new_sqrt = natgrad_step_closed_form(q_mu, q_sqrt, g_mu, g_sqrt, 0.5)
        >>> new_sqrt.shape, bool(new_sqrt[0, 0, 1] == 0.0)
        (TensorShape([1, 2, 2]), True)
    """
    q_mu, q_sqrt, dL_dmean, dL_dvarsqrt = _inputs(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt)
    import tensorflow as tf

    gamma = tf.cast(tf.convert_to_tensor(gamma, dtype_hint=q_mu.dtype), q_mu.dtype)  # a float stays float64
    if xi != "nat":  # XiSqrtMeanVar (natural_gradient_xi refuses another ξ)
        nat_dL_xi1, nat_dL_xi2 = natural_gradient_xi(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, xi)
        return q_mu - gamma * nat_dL_xi1, q_sqrt - gamma * nat_dL_xi2
    c = _positive_diagonal(q_sqrt)
    p = _phi(tf.linalg.matmul(c, dL_dvarsqrt, transpose_a=True))
    eye = tf.eye(tf.shape(p)[-1], batch_shape=tf.shape(p)[:-2], dtype=p.dtype)
    b = eye + gamma * (p + tf.linalg.matrix_transpose(p))
    u = tf.reverse(tf.linalg.cholesky(tf.reverse(b, axis=[-2, -1])), axis=[-2, -1])  # B = U Uᵀ, U upper
    new_sqrt_t = tf.linalg.triangular_solve(u, tf.linalg.matrix_transpose(c), lower=False)  # U⁻¹Cᵀ = (C U⁻ᵀ)ᵀ
    new_sqrt = tf.linalg.band_part(tf.linalg.matrix_transpose(new_sqrt_t), -1, 0)
    return q_mu - gamma * _cov_times(new_sqrt, dL_dmean), new_sqrt


def default_seed_gradient(eta1: Any, varsqrt: Any) -> tuple[Any, Any]:
    """Jᵀ·1 of ``expectation_to_meanvarsqrt`` at η (item 5): ``(dtheta_deta1 [M, L], dtheta_deta2 [L, M, M])`` from
    eta1 [M, L] and varsqrt [L, M, M] = chol(η₂ − η₁η₁ᵀ), ``tape.gradient(meanvarsqrt, [eta1, eta2])`` to rounding."""
    import tensorflow as tf

    M = tf.shape(varsqrt)[-1]
    l_inv = tf.linalg.triangular_solve(varsqrt, tf.eye(M, batch_shape=tf.shape(varsqrt)[:-2], dtype=varsqrt.dtype))
    s = tf.reduce_sum(varsqrt, axis=-2)  # [L, M], column sums
    C = tf.cumsum(l_inv, axis=-2, exclusive=True) + 0.5 * l_inv
    A = tf.linalg.matmul(l_inv, s[..., :, None] * C, transpose_a=True)
    sigma_bar = 0.5 * (A + tf.linalg.adjoint(A))  # [L, M, M]
    return tf.ones_like(eta1) - 2.0 * tf.transpose(tf.linalg.matvec(sigma_bar, tf.transpose(eta1))), sigma_bar


def natgrad_tensors_closed_form(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, gamma: Any, xi_transform: Any, xi: str) -> dict[str, Any]:
    """``natgrad_tensors`` (:mod:`natgrad_diag.step.trace`) by items 1-5, no autodiff, for a lower-triangular
    ``q_sqrt``: the same record to rounding, ε·κ(S)."""
    from gpflow.optimizers.natgrad import meanvarsqrt_to_expectation

    eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt)
    dL_deta1, dL_deta2 = expectation_gradients(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt)
    dtheta_deta1, dtheta_deta2 = default_seed_gradient(eta1, _positive_diagonal(q_sqrt))
    # for XiNat (ξ = θ) the natural gradient in ξ is ∂L/∂η itself: not computed a second time when eager
    nat_dL_xi1, nat_dL_xi2 = (dL_deta1, dL_deta2) if xi == "nat" else natural_gradient_xi(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, xi)
    xi1, xi2 = xi_transform.meanvarsqrt_to_xi(q_mu, q_sqrt)
    new_q_mu, new_q_sqrt = natgrad_step_closed_form(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, gamma, xi)
    return dict(
        eta1=eta1, eta2=eta2, dL_deta1=dL_deta1, dL_deta2=dL_deta2, dtheta_deta1=dtheta_deta1, dtheta_deta2=dtheta_deta2,
        xi1=xi1, xi2=xi2, nat_dL_xi1=nat_dL_xi1, nat_dL_xi2=nat_dL_xi2, new_q_mu=new_q_mu, new_q_sqrt=new_q_sqrt,
    )  # fmt: skip
