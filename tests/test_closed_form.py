"""natgrad_diag.step.closed_form against GPflow's step, a 40-digit oracle, autodiff and central differences.

Tolerances (float64 unless said otherwise), all of the form ``atol + rtol·max|want|`` plus a rounding term:

* against GPflow: GPflow's path inverts S (C⁻¹, S⁻¹ = C⁻ᵀC⁻¹) and recovers S as η₂ − η₁η₁ᵀ, so its result
  carries an error of order ε·κ with κ = κ(S)·(1 + max m²/‖S‖₂) (Higham 2002, §8 and §10 for triangular
  systems and Cholesky); the bound is the policy's "exact" tolerance plus ``rounding_bound(κ)``
  (100·ε·κ·scale). Measured: ≤ 0.2·ε·κ.
* against the 40-digit oracle: the closed form inverts nothing but B = I + γ(P + Pᵀ) (XiNat), so its error
  is a few dot products of length M: ≤ 4(M + 1)·ε·κ(B)·scale (Higham's γ_M per product, four in a row).
* float32: the same rule with ε = 2⁻²³, against GPflow's step in float64 on the same float32 inputs.
"""

from __future__ import annotations

import doctest

import gpflow
import mpmath
import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import NaturalGradient as GPflowNaturalGradient
from gpflow.optimizers import XiNat, XiSqrtMeanVar
from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation

from natgrad_diag import tolerance
from natgrad_diag.exceptions import DTypeMismatchError, InputError, ShapeMismatchError
from natgrad_diag.step import closed_form
from natgrad_diag.step.closed_form import cholesky_vjp, expectation_gradients, natgrad_step_closed_form, natural_gradient_xi

XIS = {"nat": XiNat(), "sqrtmeanvar": XiSqrtMeanVar()}
CONDITION = {"well": 4.0, "ill": 1e6}
# (M, L, γ): M = 1..50, L = 1..3 and both step lengths, each at least once
SIZES = [(1, 1, 1.0), (2, 3, 0.1), (7, 2, 1.0), (30, 1, 0.1), (50, 3, 1.0)]


# ------------------------------------------------------------------------------------------------
# inputs and oracles
# ------------------------------------------------------------------------------------------------


def make_q(M: int, L: int, seed: int, *, condition: float, signs: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """q_mu [M, L] ~ N(0, 1) and q_sqrt [L, M, M] = chol(S), S with eigenvalues log-spaced from 1 to 1/condition."""
    rng = np.random.default_rng(seed)
    q_mu = rng.normal(size=(M, L))
    q_sqrt = []
    for _ in range(L):
        Q, _ = np.linalg.qr(rng.normal(size=(M, M)))
        S = (Q * np.logspace(0.0, -np.log10(condition), M)) @ Q.T
        C = np.linalg.cholesky(0.5 * (S + S.T))
        if signs:  # GPflow does not constrain the diagonal: flip some columns' signs
            C = C * np.where(rng.uniform(size=M) < 0.5, -1.0, 1.0)
        q_sqrt.append(C)
    return q_mu, np.stack(q_sqrt)


def make_grads(q_sqrt: np.ndarray, seed: int, *, upper: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """∂L/∂m ~ N(0, 1) and G = ∂L/∂L_S scaled so that ‖P + Pᵀ‖₂ = 0.5 (P = Φ(CᵀG)): B stays positive for γ ≤ 1."""
    L, M, _ = q_sqrt.shape
    rng = np.random.default_rng(seed)
    dL_dmean = rng.normal(size=(M, L))
    G = rng.normal(size=(L, M, M))
    if not upper:
        G = np.tril(G)
    C = q_sqrt * np.sign(np.diagonal(q_sqrt, axis1=1, axis2=2))[:, None, :]
    X = np.tril(np.swapaxes(C, 1, 2) @ G)
    X = X + np.swapaxes(X, 1, 2) - np.stack([np.diag(np.diag(x)) for x in X])  # P + Pᵀ
    G *= 0.5 / max(np.linalg.norm(X, 2, axis=(1, 2)).max(), 1e-300)
    return dL_dmean, G


def gpflow_step(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, gamma, xi, *, triangular=True):
    """GPflow's own step, through its public ``minimize``: the loss ⟨dL_dmean, q_mu⟩ + ⟨dL_dvarsqrt, q_sqrt⟩.

    With ``triangular=True`` (GPflow's parametrisation) the apply step sees tril(dL_dvarsqrt); without a
    transform it sees dL_dvarsqrt, upper triangle included.
    """
    mu = gpflow.Parameter(q_mu)
    sqrt = gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular() if triangular else None)
    g_mu, g_sqrt = tf.constant(dL_dmean), tf.constant(dL_dvarsqrt)
    GPflowNaturalGradient(gamma).minimize(
        lambda: tf.reduce_sum(g_mu * mu) + tf.reduce_sum(g_sqrt * sqrt), [(mu, sqrt, XIS[xi])]
    )
    return mu.numpy(), sqrt.numpy()


def mp_step(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, gamma, xi):
    """The step by its definition (θ, ∂L/∂η by Murray's formula, inverses, Cholesky) in 40-digit arithmetic."""
    mpmath.mp.dps = 40
    M, L = q_mu.shape
    gamma = mpmath.mpf(gamma)
    new_mu, new_sqrt = np.zeros_like(q_mu), np.zeros_like(q_sqrt)

    def phi(x):
        return mpmath.matrix([[x[i, j] * (0.5 if i == j else 1) if j <= i else 0 for j in range(M)] for i in range(M)])

    for l in range(L):
        Ls, m = mpmath.matrix(q_sqrt[l].tolist()), mpmath.matrix(q_mu[:, l].tolist())
        g, G = mpmath.matrix(dL_dmean[:, l].tolist()), mpmath.matrix(np.tril(dL_dvarsqrt[l]).tolist())
        S = Ls * Ls.T
        C = mpmath.cholesky(S)
        Ci = mpmath.inverse(C)
        P = phi(C.T * G)
        V = Ci.T * (P + P.T) * Ci / 2  # ∂L/∂η₂
        v1 = g - 2 * V * m  # ∂L/∂η₁
        if xi == "nat":
            Lam = Ci.T * Ci
            S_new = mpmath.inverse(Lam + 2 * gamma * V)
            mu, sq = S_new * (Lam * m - gamma * v1), mpmath.cholesky(S_new)
        else:  # the JVP of θ ↦ (m, chol S) by its definition
            mu, sq = m - gamma * S * (v1 + 2 * V * m), Ls - gamma * 2 * C * phi(C.T * V * C)
        new_mu[:, l] = np.array(mu.tolist(), dtype=float)[:, 0]
        new_sqrt[l] = np.array(sq.tolist(), dtype=float)
    return new_mu, new_sqrt


def kappa_gpflow(q_mu: np.ndarray, q_sqrt: np.ndarray) -> float:
    """κ(S)·(1 + max m²/‖S‖₂): what amplifies rounding in GPflow's path (inverse of S, η₂ − η₁η₁ᵀ)."""
    S = q_sqrt @ np.swapaxes(q_sqrt, 1, 2)
    norm = np.linalg.norm(S, 2, axis=(1, 2)).max()
    return float(np.linalg.cond(S).max() * (1.0 + np.max(q_mu**2) / norm))


def kappa_b(q_sqrt: np.ndarray, G: np.ndarray, gamma: float) -> float:
    """κ(B), B = I + γ(P + Pᵀ): the only matrix the XiNat closed form factorises."""
    C = q_sqrt * np.sign(np.diagonal(q_sqrt, axis1=1, axis2=2))[:, None, :]
    X = np.tril(np.swapaxes(C, 1, 2) @ G)
    B = np.eye(G.shape[-1]) + gamma * (X + np.swapaxes(X, 1, 2) - np.stack([np.diag(np.diag(x)) for x in X]))
    return float(np.linalg.cond(B).max())


def assert_close(got, want, bound, what):
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want), initial=0.0))
    assert err <= bound, f"{what}: max|got − want| = {err:.3e} > bound {bound:.3e}"


def bound_vs_gpflow(want, dtype, kappa):
    scale = float(np.max(np.abs(want)))
    return tolerance.resolve(dtype, "exact").bound(want) + tolerance.rounding_bound(dtype, condition=kappa, scale=scale)


def bound_vs_exact(want, dtype, M, kappa):
    scale = float(np.max(np.abs(want)))
    return tolerance.rounding_bound(dtype, condition=kappa, scale=scale, factor=4.0 * (M + 1))


# ------------------------------------------------------------------------------------------------
# the step
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
@pytest.mark.parametrize("cond", ["well", "ill"])
@pytest.mark.parametrize("M, L, gamma", SIZES, ids=[f"M{M}-L{L}-gamma{g}" for M, L, g in SIZES])
def test_natgrad_step_closed_form__matches_gpflows_step(M, L, cond, xi, gamma):
    q_mu, q_sqrt = make_q(M, L, seed=M + 10 * L, condition=CONDITION[cond])
    dL_dmean, G = make_grads(q_sqrt, seed=M + 10 * L + 1)
    want = gpflow_step(q_mu, q_sqrt, dL_dmean, G, gamma, xi)
    got = natgrad_step_closed_form(q_mu, q_sqrt, dL_dmean, G, gamma, xi)
    kappa = kappa_gpflow(q_mu, q_sqrt)
    for name, g, w in zip(("q_mu", "q_sqrt"), got, want):
        assert_close(g, w, bound_vs_gpflow(w, "float64", kappa), f"{name}, M={M}, L={L}, {cond}, {xi}, γ={gamma}")
    assert np.all(np.triu(got[1].numpy(), 1) == 0.0)


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
@pytest.mark.parametrize("cond", ["well", "ill"])
@pytest.mark.parametrize("M", [1, 2, 7])
def test_natgrad_step_closed_form__is_accurate_to_epsilon_against_a_40_digit_oracle(M, cond, xi):
    q_mu, q_sqrt = make_q(M, 2, seed=100 + M, condition=CONDITION[cond])
    dL_dmean, G = make_grads(q_sqrt, seed=200 + M)
    want = mp_step(q_mu, q_sqrt, dL_dmean, G, 0.5, xi)
    got = natgrad_step_closed_form(q_mu, q_sqrt, dL_dmean, G, 0.5, xi)
    kappa = kappa_b(q_sqrt, G, 0.5)
    for name, g, w in zip(("q_mu", "q_sqrt"), got, want):
        assert_close(g, w, bound_vs_exact(w, "float64", M, kappa), f"{name}, M={M}, {cond}, {xi}")


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
@pytest.mark.parametrize("cond", ["well", "ill"])
def test_natgrad_step_closed_form__float32_against_gpflow_in_float64(cond, xi):
    M, L, gamma = 30, 2, float(np.float32(0.3))
    q_mu, q_sqrt = (x.astype(np.float32) for x in make_q(M, L, seed=7, condition=CONDITION[cond]))
    dL_dmean, G = (x.astype(np.float32) for x in make_grads(q_sqrt.astype(np.float64), seed=8))
    want = gpflow_step(*(x.astype(np.float64) for x in (q_mu, q_sqrt, dL_dmean, G)), gamma, xi)
    got = natgrad_step_closed_form(q_mu, q_sqrt, dL_dmean, G, gamma, xi)
    assert got[0].dtype == tf.float32 and got[1].dtype == tf.float32
    kappa = kappa_b(q_sqrt.astype(np.float64), G.astype(np.float64), gamma)
    k64 = kappa_gpflow(q_mu.astype(np.float64), q_sqrt.astype(np.float64))
    for name, g, w in zip(("q_mu", "q_sqrt"), got, want):
        bound = bound_vs_exact(w, "float32", M, kappa) + bound_vs_gpflow(w, "float64", k64)
        assert_close(g, w, bound, f"{name}, float32, {cond}, {xi}")


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
def test_natgrad_step_closed_form__ignores_entries_above_the_diagonal_as_gpflow_does(xi):
    q_mu, q_sqrt = make_q(6, 2, seed=3, condition=100.0)
    dL_dmean, G = make_grads(q_sqrt, seed=4, upper=True)
    assert np.abs(np.triu(G, 1)).max() > 0.01
    want = gpflow_step(q_mu, q_sqrt, dL_dmean, G, 0.7, xi, triangular=False)  # GPflow's apply sees the full G
    got = natgrad_step_closed_form(q_mu, q_sqrt, dL_dmean, G, 0.7, xi)
    for g, w in zip(got, want):
        assert_close(g, w, bound_vs_gpflow(w, "float64", kappa_gpflow(q_mu, q_sqrt)), f"upper G, {xi}")


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
def test_natgrad_step_closed_form__q_sqrt_with_negative_diagonal_entries(xi):
    q_mu, q_sqrt = make_q(8, 2, seed=5, condition=100.0, signs=True)
    assert (np.diagonal(q_sqrt, axis1=1, axis2=2) < 0).any()
    dL_dmean, G = make_grads(q_sqrt, seed=6)
    want = gpflow_step(q_mu, q_sqrt, dL_dmean, G, 0.4, xi)
    got = natgrad_step_closed_form(q_mu, q_sqrt, dL_dmean, G, 0.4, xi)
    for g, w in zip(got, want):
        assert_close(g, w, bound_vs_gpflow(w, "float64", kappa_gpflow(q_mu, q_sqrt)), f"negative diagonal, {xi}")


def test_natgrad_step_closed_form__inside_tf_function_with_unknown_shapes_and_a_variable_gamma():
    spec = [tf.TensorSpec([None, None], tf.float64), tf.TensorSpec([None, None, None], tf.float64)] * 2
    gamma = tf.Variable(0.1, dtype=tf.float64)
    compiled = {
        xi: tf.function(lambda a, b, c, d, xi=xi: natgrad_step_closed_form(a, b, c, d, gamma, xi), input_signature=spec)
        for xi in XIS
    }
    for M, L, g in [(5, 2, 0.1), (9, 1, 0.9)]:
        q_mu, q_sqrt = make_q(M, L, seed=M, condition=10.0)
        dL_dmean, G = make_grads(q_sqrt, seed=M + 1)
        gamma.assign(g)
        for xi, step in compiled.items():
            want = gpflow_step(q_mu, q_sqrt, dL_dmean, G, g, xi)
            got = step(*(tf.constant(x) for x in (q_mu, q_sqrt, dL_dmean, G)))
            for a, w in zip(got, want):
                assert_close(a, w, bound_vs_gpflow(w, "float64", kappa_gpflow(q_mu, q_sqrt)), f"compiled {xi}, M={M}")
    assert all(step.experimental_get_tracing_count() == 1 for step in compiled.values())


# ------------------------------------------------------------------------------------------------
# the pieces
# ------------------------------------------------------------------------------------------------


def _sym_basis(M: int) -> list[np.ndarray]:
    out = []
    for i in range(M):
        for j in range(i + 1):
            E = np.zeros((M, M))
            E[i, j] = E[j, i] = 1.0
            out.append(E)
    return out


@pytest.mark.parametrize("M", [1, 5, 30])
def test_cholesky_vjp__matches_tensorflows_cholesky_gradient(M):
    _, C = make_q(M, 2, seed=M, condition=1e3)
    G = np.random.default_rng(M).normal(size=C.shape)  # upper entries too: TensorFlow ignores them, so must we
    S = tf.constant(C @ np.swapaxes(C, 1, 2))
    with tf.GradientTape() as tape:
        tape.watch(S)
        out = tf.linalg.cholesky(S)
    want = tape.gradient(out, S, output_gradients=tf.constant(G)).numpy()
    got = cholesky_vjp(tf.constant(C), tf.constant(G)).numpy()
    assert_close(got, want, bound_vs_gpflow(want, "float64", 1e3), f"cholesky_vjp, M={M}")
    np.testing.assert_array_equal(got, np.swapaxes(got, -1, -2))


def test_cholesky_vjp__against_central_differences():
    M = 4
    _, C = make_q(M, 1, seed=11, condition=20.0)
    S, G = C[0] @ C[0].T, np.random.default_rng(12).normal(size=(M, M))
    tol = tolerance.resolve("float64", "finite_difference")
    h = tol.eps
    vjp = cholesky_vjp(tf.constant(C[0]), tf.constant(G)).numpy()
    for E in _sym_basis(M):
        dC = (np.linalg.cholesky(S + h * E) - np.linalg.cholesky(S - h * E)) / (2 * h)  # numpy, not TensorFlow
        want = float(np.sum(G * dC))  # ⟨G, dC⟩ = ⟨∂L/∂S, E⟩
        assert_close(np.sum(vjp * E), want, tol.bound([want, np.abs(G).max() * np.abs(dC).max()]), "cholesky_vjp")


@pytest.mark.parametrize("cond", ["well", "ill"])
def test_expectation_gradients__match_autodiff_through_gpflows_maps(cond):
    q_mu, q_sqrt = make_q(10, 3, seed=21, condition=CONDITION[cond], signs=True)
    dL_dmean, G = make_grads(q_sqrt, seed=22, upper=True)
    q_mu_t, q_sqrt_t = tf.constant(q_mu), tf.constant(q_sqrt)
    with tf.GradientTape() as tape:  # GPflow's own step 2), on its public maps
        eta1, eta2 = meanvarsqrt_to_expectation(q_mu_t, q_sqrt_t)
        tape.watch([eta1, eta2])
        meanvarsqrt = expectation_to_meanvarsqrt(eta1, eta2)
    want = tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=[tf.constant(dL_dmean), tf.constant(G)])
    got = expectation_gradients(q_mu, q_sqrt, dL_dmean, G)
    kappa = kappa_gpflow(q_mu, q_sqrt)
    for name, g, w in zip(("dL_deta1", "dL_deta2"), got, want):
        assert_close(g, w.numpy(), bound_vs_gpflow(w.numpy(), "float64", kappa), f"{name}, {cond}")
    # XiNat's natural gradient is ∂L/∂η (GPflow's shortcut): against GPflow's tape gradient, not expectation_gradients
    nat = natural_gradient_xi(q_mu, q_sqrt, dL_dmean, G, "nat")
    for name, g, w in zip(("nat_dL_xi1", "nat_dL_xi2"), nat, want):
        assert_close(g, w.numpy(), bound_vs_gpflow(w.numpy(), "float64", kappa), f"{name}, {cond}")


# ------------------------------------------------------------------------------------------------
# bad input, docs
# ------------------------------------------------------------------------------------------------


def test_natgrad_step_closed_form__bad_input_gets_a_clear_error():
    q_mu, q_sqrt = make_q(3, 2, seed=1, condition=2.0)
    with pytest.raises(ShapeMismatchError) as info:
        natgrad_step_closed_form(q_mu, q_sqrt, q_mu, q_sqrt[:, :2, :2], 0.1)
    assert str(info.value) == (
        "Shape mismatch. dL_dvarsqrt must have the shape of q_sqrt.\n"
        "  Argument: dL_dvarsqrt\n"
        "    Expected: [2, 3, 3]\n"
        "    Actual:   [2, 2, 2]\n"
        "  To fix: pass the gradient with respect to the constrained q_sqrt (GPflow's _to_constrained of the tape's gradient)."
    )
    with pytest.raises(ShapeMismatchError, match="q_sqrt does not match q_mu"):
        natgrad_step_closed_form(q_mu, q_sqrt[:1], q_mu, q_sqrt[:1], 0.1)
    with pytest.raises(ShapeMismatchError, match="q_sqrt has the wrong rank"):
        natgrad_step_closed_form(q_mu, q_sqrt[0], q_mu, q_sqrt[0], 0.1)
    with pytest.raises(DTypeMismatchError) as info:
        natgrad_step_closed_form(q_mu, q_sqrt.astype(np.float32), q_mu, q_sqrt, 0.1)
    assert str(info.value) == (
        "Dtype mismatch. q_sqrt must have the dtype of q_mu.\n"
        "  Argument: q_sqrt\n"
        "    Expected: float64\n"
        "    Got:      float32\n"
        "  To fix: cast q_sqrt with tf.cast(q_sqrt, float64)."
    )
    with pytest.raises(InputError) as info:
        natgrad_step_closed_form(q_mu, q_sqrt, q_mu, q_sqrt, 0.1, xi="meanvar")
    assert str(info.value) == (
        "Invalid input. No closed form for this ξ transform.\n"
        "  Argument: xi\n"
        "    Expected: 'nat' or 'sqrtmeanvar'\n"
        "    Got:      'meanvar'\n"
        "  To fix: use GPflow's NaturalGradient (or natgrad_diag.NaturalGradient, which falls back to it) for other ξ."
    )


def test_closed_form__docstring_examples_run():
    result = doctest.testmod(closed_form, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 2 and result.failed == 0
