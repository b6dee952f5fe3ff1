"""GPflow's natural-gradient step in closed form: no autodiff, one Cholesky for XiNat and none for XiSqrtMeanVar.

GPflow's ``NaturalGradient._natgrad_apply_gradients`` (GPflow 2.11, ``gpflow/optimizers/natgrad.py``)
implements equation [10] of Salimbeni, Eleftheriadis & Hensman, "Natural Gradients in Practice:
Non-Conjugate Variational Inference in Gaussian Process Models", AISTATS 2018:

    ξ_new = ξ − γ · (∂ξ/∂θ) · ∂L/∂η,

with m = q_mu [M, L], L_S = q_sqrt [L, M, M], S = L_S L_Sᵀ, the expectation parameters
η = (η₁, η₂) = (m, S + m mᵀ) and the natural parameters θ = (θ₁, θ₂) = (S⁻¹m, −½S⁻¹). It gets ∂L/∂η by
autodiff through ``expectation_to_meanvarsqrt`` (a Cholesky it already has), the XiSqrtMeanVar factor
(∂ξ/∂θ)·v by a double-backward JVP, and maps θ back with two Choleskys. Every piece has a closed form.

**Notation.** Φ(X) is the lower triangle of X with its diagonal halved; G = ∂L/∂L_S; C = chol(S), the
Cholesky factor with a positive diagonal. GPflow recomputes C = chol(η₂ − η₁η₁ᵀ); q_sqrt may have
negative diagonal entries (GPflow does not constrain them), and then C = L_S·D with D = diag(sign L_S,ii),
which is what :func:`natgrad_step_closed_form` uses wherever GPflow's step uses C.

**1. The VJP through the Cholesky** (Murray 2016, "Differentiation of the Cholesky decomposition",
arXiv:1602.07527, §3; TensorFlow's registered ``Cholesky`` gradient, ``linalg_grad._CholeskyGrad``):

    P = Φ(Cᵀ G),    ∂L/∂S = ½ · C⁻ᵀ (P + Pᵀ) C⁻¹.

Only the lower triangle of G enters P (for i ≥ j, (CᵀG)_ij = Σ_{k≥i} C_ki G_kj reads G_kj with k ≥ j), so
entries of ∂L/∂L_S above the diagonal are ignored, exactly as in GPflow (:func:`cholesky_vjp`).

**2. The expectation-parameter gradient.** S = η₂ − η₁η₁ᵀ and mean = η₁, so by the chain rule

    ∂L/∂η₂ = ∂L/∂S,    ∂L/∂η₁ = ∂L/∂m − 2 · ∂L/∂S · m         (:func:`expectation_gradients`).

**3. XiNat** (ξ = θ, the natural gradient is ∂L/∂η). With V = ∂L/∂η₂ and Λ = S⁻¹ = C⁻ᵀC⁻¹, the new
precision is −2θ₂_new = Λ + 2γV = C⁻ᵀ B C⁻¹ with B = I + γ(P + Pᵀ) [M, M]. Write B = U Uᵀ with U upper
triangular: U = J K J for K = chol(J B J), J the exchange (reversal) matrix. Then
S_new = C B⁻¹ Cᵀ = (C U⁻ᵀ)(C U⁻ᵀ)ᵀ and C U⁻ᵀ is lower triangular with a positive diagonal, so

    q_sqrt_new = C U⁻ᵀ,    q_mu_new = S_new θ₁_new = m − γ · S_new · ∂L/∂m,

the last because θ₁_new = Λm − γ(∂L/∂m − 2Vm) = (Λ + 2γV)m − γ∂L/∂m. One Cholesky of an M×M matrix
and one triangular solve, against GPflow's three Choleskys and three triangular inverses. The same
reversed Cholesky maps any natural parameters back (:func:`natural_to_meanvarsqrt_closed_form`):
with Λ = −2θ₂ and K = chol(JΛJ), the lower factor of S = Λ⁻¹ is J K⁻ᵀ J.

**4. XiSqrtMeanVar** (ξ = (m, L_S)). The JVP of θ ↦ (m, chol(S)) in the direction (v₁, V) uses
dS = −S dΛ S = 2 S V S and the Cholesky derivative dC = C Φ(C⁻¹ dS C⁻ᵀ) (Murray 2016, eq. 10):

    dm = S (v₁ + 2 V m),    dL_S = 2 C Φ(Cᵀ V C)                (:func:`natural_to_meanvarsqrt_jvp`).

At (v₁, V) = ∂L/∂η these collapse: v₁ + 2Vm = ∂L/∂m and Cᵀ V C = ½(P + Pᵀ), whose Φ is ½P, so the
natural gradient in ξ coordinates is (S·∂L/∂m, C·Φ(CᵀG)) = (L_S L_Sᵀ ∂L/∂m, L_S Φ(L_Sᵀ G)) (the signs D
cancel) and

    q_mu_new = m − γ · S · ∂L/∂m,    q_sqrt_new = L_S − γ · L_S Φ(L_Sᵀ G):

two triangular products, no Cholesky and no inverse.

**Rounding.** GPflow forms S⁻¹ through triangular inverses and recovers S as η₂ − η₁η₁ᵀ, so its step
carries an error of order ε·κ(S) relative to the result; the closed forms above invert nothing for
XiSqrtMeanVar and only the well-scaled B for XiNat, so they agree with GPflow to that bound and are at
least as accurate.
"""

from __future__ import annotations

from typing import Any

from natgrad_diag._validate import shape_str
from natgrad_diag.exceptions import DTypeMismatchError, InputError, ShapeMismatchError

__all__ = [
    "XI_NAMES",
    "cholesky_jvp",
    "cholesky_vjp",
    "default_seed_gradient",
    "expectation_gradients",
    "natgrad_step_closed_form",
    "natural_gradient_xi",
    "natural_to_meanvarsqrt_closed_form",
    "natgrad_tensors_closed_form",
    "natural_to_meanvarsqrt_jvp",
]

#: The ξ transforms with a closed form: ``"nat"`` (GPflow's XiNat) and ``"sqrtmeanvar"`` (XiSqrtMeanVar).
XI_NAMES = ("nat", "sqrtmeanvar")


# ------------------------------------------------------------------------------------------------
# small matrix helpers, batched over leading dimensions
# ------------------------------------------------------------------------------------------------


def _phi(x: Any) -> Any:
    """Φ(X): the lower triangle of X with its diagonal halved."""
    import tensorflow as tf

    return tf.linalg.set_diag(tf.linalg.band_part(x, -1, 0), 0.5 * tf.linalg.diag_part(x))


def _positive_diagonal(q_sqrt: Any) -> Any:
    """chol(q_sqrt q_sqrtᵀ) = q_sqrt·D, D = diag(sign q_sqrt_ii): the factor GPflow's autodiff path sees."""
    import tensorflow as tf

    diag = tf.linalg.diag_part(q_sqrt)
    signs = tf.where(diag < 0, -tf.ones_like(diag), tf.ones_like(diag))
    return q_sqrt * signs[..., None, :]


def _columns(q_mu: Any) -> Any:
    """[M, L] -> [L, M, 1], GPflow's layout to TensorFlow's batched matrices."""
    import tensorflow as tf

    return tf.transpose(q_mu)[:, :, None]


def _rows(x: Any) -> Any:
    """[L, M, 1] -> [M, L]."""
    import tensorflow as tf

    return tf.transpose(x[:, :, 0])


def _cov_times(sqrt: Any, v: Any) -> Any:
    """(sqrt sqrtᵀ) v for sqrt [L, M, M] and v [L, M, 1]."""
    import tensorflow as tf

    return tf.linalg.matmul(sqrt, tf.linalg.matmul(sqrt, v, transpose_a=True))


def _sym(x: Any) -> Any:
    import tensorflow as tf

    return 0.5 * (x + tf.linalg.matrix_transpose(x))


def _check(q_mu: Any, q_sqrt: Any, others: dict[str, Any]) -> None:
    """Static shape and dtype checks: q_mu [M, L], q_sqrt [L, M, M], each other argument like its partner."""
    qm, qs = q_mu.shape, q_sqrt.shape
    if qm.rank != 2 or qs.rank != 3:
        bad, want, got = ("q_mu", "[M, L]", qm) if qm.rank != 2 else ("q_sqrt", "[L, M, M]", qs)
        raise ShapeMismatchError(
            f"{bad} has the wrong rank.",
            context=[("Argument", bad), ("Expected", want), ("Actual", shape_str(got))],
            remedy="pass q_mu [M, L] and the full-covariance q_sqrt [L, M, M] (q_diag=True has no natural gradient).",
        )
    want_qs = [qm[1], qm[0], qm[0]]
    if not qs.is_compatible_with(want_qs):
        raise ShapeMismatchError(
            "q_sqrt does not match q_mu.",
            context=[("Argument", "q_sqrt"), ("Expected", f"[L, M, M] = {shape_str(want_qs)}"), ("Actual", shape_str(qs))],
            remedy="pass the q_mu [M, L] and q_sqrt [L, M, M] of the same q(u).",
        )
    for name, value in others.items():
        like, like_name = (q_mu, "q_mu") if name in ("dL_dmean", "dnat1") else (q_sqrt, "q_sqrt")
        if not value.shape.is_compatible_with(like.shape):
            raise ShapeMismatchError(
                f"{name} must have the shape of {like_name}.",
                context=[("Argument", name), ("Expected", shape_str(like.shape)), ("Actual", shape_str(value.shape))],
                remedy=f"pass the gradient with respect to the constrained {like_name} (GPflow's _to_constrained of the tape's gradient).",
            )
    for name, value in {"q_sqrt": q_sqrt, **others}.items():
        if value.dtype != q_mu.dtype:
            raise DTypeMismatchError(
                f"{name} must have the dtype of q_mu.",
                context=[("Argument", name), ("Expected", q_mu.dtype.name), ("Got", value.dtype.name)],
                remedy=f"cast {name} with tf.cast({name}, {q_mu.dtype.name}).",
            )
    if not q_mu.dtype.is_floating:
        raise DTypeMismatchError(
            "q_mu must be a floating-point tensor.",
            context=[("Argument", "q_mu"), ("Expected", "float64 (or float32)"), ("Got", q_mu.dtype.name)],
            remedy="cast the inputs with tf.cast(x, tf.float64) (GPflow's default float).",
        )


def _tensors(**named: Any) -> list[Any]:
    import tensorflow as tf

    return [v if isinstance(v, (tf.Tensor, tf.Variable)) else tf.convert_to_tensor(v) for v in named.values()]


# ------------------------------------------------------------------------------------------------
# the pieces
# ------------------------------------------------------------------------------------------------


def cholesky_vjp(chol: Any, grad: Any) -> Any:
    """∂L/∂S from ∂L/∂C for C = chol(S): TensorFlow's registered Cholesky gradient, by triangular solves.

    ∂L/∂S = ½ · C⁻ᵀ (P + Pᵀ) C⁻¹ with P = Φ(Cᵀ G), Φ = lower triangle with halved diagonal (Murray 2016,
    arXiv:1602.07527, §3; ``tensorflow/python/ops/linalg_grad.py``, ``_CholeskyGrad``). Symmetric; the
    entries of G above the diagonal do not enter.

    Args:
        chol: [..., M, M], lower-triangular C with a positive diagonal.
        grad: [..., M, M], G = ∂L/∂C.

    Returns:
        [..., M, M], ∂L/∂S, symmetric.

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
    return _sym(x)  # exactly symmetric, as TensorFlow's (X + Xᵀ)/2


def cholesky_jvp(chol: Any, tangent: Any) -> Any:
    """dC for C = chol(S) in the symmetric direction dS: dC = C · Φ(C⁻¹ dS C⁻ᵀ) (Murray 2016, eq. 10).

    Args:
        chol: [..., M, M], lower-triangular C with a positive diagonal.
        tangent: [..., M, M], dS (symmetrised first, as TensorFlow's Cholesky reads a symmetric input).

    Returns:
        [..., M, M], dC, lower triangular.
    """
    import tensorflow as tf

    x = tf.linalg.triangular_solve(chol, _sym(tangent), lower=True)  # C⁻¹ dS
    x = tf.linalg.triangular_solve(chol, tf.linalg.matrix_transpose(x), lower=True)  # C⁻¹ (C⁻¹ dS)ᵀ = C⁻¹ dS C⁻ᵀ
    return tf.linalg.matmul(chol, _phi(x))


def expectation_gradients(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any) -> tuple[Any, Any]:
    """∂L/∂η from ∂L/∂(m, L_S): GPflow's ``tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=...)``.

    ∂L/∂η₂ = ∂L/∂S = ``cholesky_vjp(C, G)`` and ∂L/∂η₁ = ∂L/∂m − 2 · ∂L/∂S · m, with C = chol(S) = L_S·D
    (the module docstring derives both).

    Args:
        q_mu: [M, L], m.
        q_sqrt: [L, M, M], L_S, lower triangular.
        dL_dmean: [M, L], ∂L/∂m.
        dL_dvarsqrt: [L, M, M], G = ∂L/∂L_S (entries above the diagonal are ignored, as in GPflow).

    Returns:
        (dL_deta1 [M, L], dL_deta2 [L, M, M]).
    """
    q_mu, q_sqrt, dL_dmean, dL_dvarsqrt = _tensors(q_mu=q_mu, q_sqrt=q_sqrt, dL_dmean=dL_dmean, dL_dvarsqrt=dL_dvarsqrt)
    _check(q_mu, q_sqrt, {"dL_dmean": dL_dmean, "dL_dvarsqrt": dL_dvarsqrt})
    import tensorflow as tf

    dL_dS = cholesky_vjp(_positive_diagonal(q_sqrt), dL_dvarsqrt)
    dL_deta1 = _columns(dL_dmean) - 2.0 * tf.linalg.matmul(dL_dS, _columns(q_mu))
    return _rows(dL_deta1), dL_dS


def natural_to_meanvarsqrt_closed_form(nat1: Any, nat2: Any) -> tuple[Any, Any]:
    """(m, L_S) from the natural parameters θ₁ = S⁻¹m [M, L], θ₂ = −½S⁻¹ [L, M, M], with one Cholesky.

    With Λ = −2θ₂ and K = chol(JΛJ) (J reverses rows and columns), Λ = (JKJ)(JKJ)ᵀ with JKJ upper
    triangular, so S = Λ⁻¹ = (J K⁻ᵀ J)(J K⁻ᵀ J)ᵀ and L_S = J K⁻ᵀ J is the lower factor with a positive
    diagonal; m = S θ₁ by two triangular solves. GPflow's ``natural_to_meanvarsqrt`` needs two Choleskys.

    Returns:
        (mean [M, L], varsqrt [L, M, M]), varsqrt lower triangular.

    Raises:
        tf.errors.InvalidArgumentError: when −2θ₂ is not positive definite (as GPflow's function does).
    """
    nat1, nat2 = _tensors(nat1=nat1, nat2=nat2)
    _check(nat1, nat2, {})
    import tensorflow as tf

    k = tf.linalg.cholesky(tf.reverse(-2.0 * nat2, axis=[-2, -1]))  # JΛJ = K Kᵀ
    eye = tf.eye(tf.shape(k)[-1], batch_shape=tf.shape(k)[:-2], dtype=k.dtype)
    varsqrt = tf.reverse(tf.linalg.triangular_solve(k, eye, lower=True, adjoint=True), axis=[-2, -1])  # J K⁻ᵀ J
    varsqrt = tf.linalg.band_part(varsqrt, -1, 0)
    j_nat1 = tf.reverse(_columns(nat1), axis=[-2])
    x = tf.linalg.triangular_solve(k, j_nat1, lower=True)  # K⁻¹ J θ₁
    mean = tf.reverse(tf.linalg.triangular_solve(k, x, lower=True, adjoint=True), axis=[-2])  # J K⁻ᵀ K⁻¹ J θ₁ = Λ⁻¹θ₁
    return _rows(mean), varsqrt


def natural_to_meanvarsqrt_jvp(q_mu: Any, q_sqrt: Any, dnat1: Any, dnat2: Any) -> tuple[Any, Any]:
    """The JVP of θ ↦ (m, chol(S)) at θ = θ(q_mu, q_sqrt), in the direction (dθ₁, dθ₂).

    dm = S (dθ₁ + 2 dθ₂ m), dL_S = 2 C Φ(Cᵀ dθ₂ C), C = chol(S) = L_S·D (module docstring, item 4). This is
    what GPflow's XiSqrtMeanVar step gets from ``naturals_to_xi`` by a double-backward JVP; dθ₂ is
    symmetrised first, as TensorFlow's Cholesky gradient is.

    Args:
        q_mu: [M, L], m at which the JVP is taken.
        q_sqrt: [L, M, M], L_S at which the JVP is taken, lower triangular.
        dnat1: [M, L], dθ₁.
        dnat2: [L, M, M], dθ₂.

    Returns:
        (dmean [M, L], dvarsqrt [L, M, M]), dvarsqrt lower triangular.
    """
    q_mu, q_sqrt, dnat1, dnat2 = _tensors(q_mu=q_mu, q_sqrt=q_sqrt, dnat1=dnat1, dnat2=dnat2)
    _check(q_mu, q_sqrt, {"dnat1": dnat1, "dnat2": dnat2})
    import tensorflow as tf

    c = _positive_diagonal(q_sqrt)
    v = _sym(dnat2)
    dmean = _cov_times(q_sqrt, _columns(dnat1) + 2.0 * tf.linalg.matmul(v, _columns(q_mu)))
    ctvc = tf.linalg.matmul(c, tf.linalg.matmul(v, c), transpose_a=True)
    return _rows(dmean), 2.0 * tf.linalg.matmul(c, _phi(ctvc))


def _xi_name(xi: Any) -> str:
    if xi not in XI_NAMES:
        raise InputError(
            "No closed form for this ξ transform.",
            context=[("Argument", "xi"), ("Expected", " or ".join(repr(n) for n in XI_NAMES)), ("Got", repr(xi))],
            remedy="use GPflow's NaturalGradient (or natgrad_diag.NaturalGradient, which falls back to it) for other ξ.",
        )
    return str(xi)


def natural_gradient_xi(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, xi: str = "nat") -> tuple[Any, Any]:
    """The natural gradient in ξ coordinates, GPflow's ``(nat_dL_xi1, nat_dL_xi2)``.

    ``"nat"``: ∂L/∂η (:func:`expectation_gradients`). ``"sqrtmeanvar"``: (S·∂L/∂m, L_S Φ(L_Sᵀ G)).

    Returns:
        ([M, L], [L, M, M]).
    """
    if _xi_name(xi) == "nat":
        return expectation_gradients(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt)
    q_mu, q_sqrt, dL_dmean, dL_dvarsqrt = _tensors(q_mu=q_mu, q_sqrt=q_sqrt, dL_dmean=dL_dmean, dL_dvarsqrt=dL_dvarsqrt)
    _check(q_mu, q_sqrt, {"dL_dmean": dL_dmean, "dL_dvarsqrt": dL_dvarsqrt})
    import tensorflow as tf

    nat_dL_xi2 = tf.linalg.matmul(q_sqrt, _phi(tf.linalg.matmul(q_sqrt, dL_dvarsqrt, transpose_a=True)))
    return _rows(_cov_times(q_sqrt, _columns(dL_dmean))), nat_dL_xi2


def natgrad_step_closed_form(
    q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, gamma: Any, xi: str = "nat"
) -> tuple[Any, Any]:
    """The (q_mu, q_sqrt) that GPflow's natural-gradient step assigns, in closed form.

    ``"nat"`` (XiNat): P = Φ(CᵀG), B = I + γ(P + Pᵀ), U = J·chol(JBJ)·J (B = UUᵀ),
    q_sqrt_new = C U⁻ᵀ, q_mu_new = m − γ·q_sqrt_new q_sqrt_newᵀ·∂L/∂m. ``"sqrtmeanvar"`` (XiSqrtMeanVar):
    q_mu_new = m − γ·S·∂L/∂m, q_sqrt_new = L_S − γ·L_S Φ(L_Sᵀ G). The module docstring derives both.
    Works eagerly and inside ``tf.function``; batched over the L latent GPs.

    Args:
        q_mu: [M, L], m.
        q_sqrt: [L, M, M], L_S, lower triangular (GPflow's ``triangular()`` parameter).
        dL_dmean: [M, L], ∂L/∂m (GPflow's ``_to_constrained(q_mu_grad, q_mu.transform)``).
        dL_dvarsqrt: [L, M, M], G = ∂L/∂L_S; only its lower triangle enters, as in GPflow.
        gamma: the step length γ (a float or a scalar tensor or variable).
        xi: ``"nat"`` or ``"sqrtmeanvar"``.

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
    q_mu, q_sqrt, dL_dmean, dL_dvarsqrt = _tensors(q_mu=q_mu, q_sqrt=q_sqrt, dL_dmean=dL_dmean, dL_dvarsqrt=dL_dvarsqrt)
    _check(q_mu, q_sqrt, {"dL_dmean": dL_dmean, "dL_dvarsqrt": dL_dvarsqrt})
    import tensorflow as tf

    gamma = tf.cast(tf.convert_to_tensor(gamma, dtype_hint=q_mu.dtype), q_mu.dtype)  # a float stays float64
    if _xi_name(xi) == "sqrtmeanvar":
        nat_dL_xi1, nat_dL_xi2 = natural_gradient_xi(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, "sqrtmeanvar")
        return q_mu - gamma * nat_dL_xi1, q_sqrt - gamma * nat_dL_xi2
    c = _positive_diagonal(q_sqrt)
    p = _phi(tf.linalg.matmul(c, dL_dvarsqrt, transpose_a=True))
    eye = tf.eye(tf.shape(p)[-1], batch_shape=tf.shape(p)[:-2], dtype=p.dtype)
    b = eye + gamma * (p + tf.linalg.matrix_transpose(p))
    u = tf.reverse(tf.linalg.cholesky(tf.reverse(b, axis=[-2, -1])), axis=[-2, -1])  # B = U Uᵀ, U upper
    new_sqrt_t = tf.linalg.triangular_solve(u, tf.linalg.matrix_transpose(c), lower=False)  # U⁻¹Cᵀ = (C U⁻ᵀ)ᵀ
    new_sqrt = tf.linalg.band_part(tf.linalg.matrix_transpose(new_sqrt_t), -1, 0)
    new_mu = _columns(q_mu) - gamma * _cov_times(new_sqrt, _columns(dL_dmean))
    return _rows(new_mu), new_sqrt


def default_seed_gradient(eta1: Any, varsqrt: Any) -> tuple[Any, Any]:
    """Jᵀ·1 of ``expectation_to_meanvarsqrt`` at η in closed form: TensorFlow's gradient for a seed of ones.

    With Σ = η₂ − η₁η₁ᵀ = L_S L_Sᵀ (per latent GP), TensorFlow's Cholesky gradient for a seed Ḡ is
    ``Σ̄ = sym(L⁻ᵀ Φ(L_Sᵀ Ḡ) L⁻¹)`` (Φ: lower triangle, halved diagonal; sym(A) = ½(A + Aᵀ); Murray 2016,
    "Differentiation of the Cholesky decomposition", and TF's ``_CholeskyGrad``). For Ḡ = ones,
    L_Sᵀ Ḡ = s 1ᵀ with s the column sums of L_S, so Φ(s 1ᵀ) L⁻¹ = diag(s) (cumsum₋(L⁻¹) + ½L⁻¹)
    (an exclusive cumulative sum over rows): one matrix product instead of three. Then
    ∂/∂η₂ = Σ̄ and ∂/∂η₁ = 1 − 2 Σ̄ η₁ (the mean path seeded with ones plus the path through Σ).

    Args:
        eta1: [M, L]; varsqrt: [L, M, M], the Cholesky factor of η₂ − η₁η₁ᵀ.

    Returns:
        ``(dtheta_deta1 [M, L], dtheta_deta2 [L, M, M])``, equal to ``tape.gradient(meanvarsqrt,
        [eta1, eta2])`` to rounding (tested against it).
    """
    import tensorflow as tf

    M = tf.shape(varsqrt)[-1]
    l_inv = tf.linalg.triangular_solve(varsqrt, tf.eye(M, batch_shape=tf.shape(varsqrt)[:-2], dtype=varsqrt.dtype))
    s = tf.reduce_sum(varsqrt, axis=-2)  # [L, M], column sums
    C = tf.cumsum(l_inv, axis=-2, exclusive=True) + 0.5 * l_inv
    A = tf.linalg.matmul(l_inv, s[..., :, None] * C, transpose_a=True)
    sigma_bar = 0.5 * (A + tf.linalg.adjoint(A))  # [L, M, M]
    m = tf.linalg.adjoint(eta1)[:, :, None]  # [L, M, 1]
    d1 = tf.ones_like(eta1) - 2.0 * tf.linalg.adjoint(tf.linalg.matmul(sigma_bar, m)[:, :, 0])
    return d1, sigma_bar


def natgrad_tensors_closed_form(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, gamma: Any, xi_transform: Any, xi: str) -> dict[str, Any]:
    """``natgrad_tensors`` (natgrad_diag.step.trace) by the closed forms above (XiNat, XiSqrtMeanVar).

    The same record, without differentiating through ``expectation_to_meanvarsqrt``: ∂L/∂η by the
    Cholesky VJP (Murray 2016), the step by one Cholesky of a well-scaled matrix (XiNat) or none
    (XiSqrtMeanVar), Jᵀ·1 by :func:`default_seed_gradient`. ``q_sqrt`` must be lower triangular (the
    compiled path uses this only behind GPflow's ``triangular()`` transform). Equal to the autodiff
    record to rounding, ε·κ(S) (tested against GPflow's step and the autodiff path).
    """
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_expectation

    eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt)
    dL_deta1, dL_deta2 = expectation_gradients(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt)
    diag = tf.linalg.diag_part(q_sqrt)
    chol = q_sqrt * tf.where(diag < 0, -tf.ones_like(diag), tf.ones_like(diag))[..., None, :]  # chol(S) = q_sqrt·D
    dtheta_deta1, dtheta_deta2 = default_seed_gradient(eta1, chol)
    nat_dL_xi1, nat_dL_xi2 = natural_gradient_xi(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, xi)
    xi1, xi2 = xi_transform.meanvarsqrt_to_xi(q_mu, q_sqrt)
    new_q_mu, new_q_sqrt = natgrad_step_closed_form(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, gamma, xi)
    return dict(
        eta1=eta1, eta2=eta2, dL_deta1=dL_deta1, dL_deta2=dL_deta2,
        dtheta_deta1=dtheta_deta1, dtheta_deta2=dtheta_deta2,
        xi1=xi1, xi2=xi2, nat_dL_xi1=nat_dL_xi1, nat_dL_xi2=nat_dL_xi2,
        new_q_mu=new_q_mu, new_q_sqrt=new_q_sqrt,
    )  # fmt: skip
