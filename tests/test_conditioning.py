"""Condition numbers: λ(S) from the factor (LAPACK's lauum) against numpy on C Cᵀ, and the rounding model of GPflow's
step (κ_η) against a 40-digit evaluation of the step on GPflow's #767 state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from natgrad_diag.step.closed_form import natgrad_step_closed_form
from natgrad_diag.checks.bounds import factor_extremes, kappa, measure_conditioning
from natgrad_diag.tolerance import rounding_bound


@settings(max_examples=25, deadline=None)
@given(M=st.integers(1, 12), L=st.integers(1, 3), seed=st.integers(0, 2**31 - 1), triangular=st.booleans())
def test_factor_extremes__equal_numpys_eigenvalues_of_c_ct(M, L, seed, triangular):
    rng = np.random.default_rng(seed)
    C = rng.normal(size=(L, M, M)) + 2.0 * np.eye(M) * rng.choice([-1.0, 1.0], size=(L, 1, M))
    if triangular:
        C = np.tril(C)
    lo, hi = factor_extremes(C)
    for i in range(L):
        ev = np.linalg.eigvalsh(C[i] @ C[i].T)
        # both are backward stable on matrices with rounding ε·‖C‖²: the extremes agree to ~M·ε·λmax
        tol = 100 * M * np.finfo(float).eps * ev[-1]
        assert abs(lo[i] - ev[0]) <= tol and abs(hi[i] - ev[-1]) <= tol


def test_factor_extremes__non_finite_factor_gives_nan_and_kappa_inf():
    C = np.eye(3)[None].copy()
    C[0, 1, 0] = np.nan
    lo, hi = factor_extremes(C)
    assert np.isnan(lo[0]) and np.isnan(hi[0])
    assert kappa(np.full((1, 2, 2), np.inf))[0] == np.inf


def test_kappa__reads_the_lower_triangle_of_a_symmetric_matrix():
    K = np.array([[4.0, 1.0], [1.0, 3.0]])
    assert kappa(K[None])[0] == pytest.approx(np.linalg.cond(K), rel=1e-13)


def _state_767(seed):
    """GPflow's test_small_q_sqrt state (#767): S = 1e-6·I, ‖m‖ of order 1, and gradients from the VGP's loss."""
    import gpflow

    from natgrad_diag._gpflow import to_constrained
    from natgrad_diag.checks.evaluator import loss_and_grads

    rng = np.random.RandomState(0)
    X, Y = rng.randn(4, 1), rng.randn(4, 1)
    m = gpflow.models.VGP((X, Y), gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(variance=0.1))
    m.q_mu.assign(np.random.RandomState(seed).randn(4, 1))
    m.q_sqrt.assign(1e-3 * np.eye(4)[None])
    _, (g_mu, g_sq) = loss_and_grads(m, None)
    return m, to_constrained(g_mu, m.q_mu.transform).numpy(), to_constrained(g_sq, m.q_sqrt.transform).numpy()


@pytest.mark.parametrize("seed", [0, 3])
def test_step_condition__bounds_gpflows_error_on_the_767_state_and_kappa_S_alone_does_not(seed):
    # Oracle: the step evaluated in 40-digit arithmetic (tests/test_closed_form.py's mp_step). GPflow forms
    # S = η₂ − η₁η₁ᵀ with η₂ = S + m mᵀ, losing ‖η₂‖/λmin(S) ≈ 10⁶ digits' worth of relative accuracy.
    from test_closed_form import gpflow_step, mp_step

    m, dL_dmean, dL_dvarsqrt = _state_767(seed)
    q_mu, q_sqrt = m.q_mu.numpy(), m.q_sqrt.numpy()
    exact = mp_step(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, 1.0, "nat")
    gp = gpflow_step(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, 1.0, "nat")
    ours = [t.numpy() for t in natgrad_step_closed_form(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, 1.0, "nat")]
    err_gp = max(np.max(np.abs(gp[0] - exact[0])), np.max(np.abs(gp[1] - exact[1])))
    err_ours = max(np.max(np.abs(ours[0] - exact[0])), np.max(np.abs(ours[1] - exact[1])))
    cond = measure_conditioning(m, q_mu, q_sqrt, gp[1])
    scale = max(np.max(np.abs(exact[0])), np.max(np.abs(exact[1])))
    assert cond.kappa_eta == pytest.approx((1e-6 + float(np.sum(q_mu**2))) / 1e-6, rel=1e-6)
    assert err_gp <= rounding_bound("float64", condition=cond.step_condition, scale=scale)
    without_eta = cond.kappa_S * cond.kappa_S_new * cond.cancellation
    assert err_gp > rounding_bound("float64", condition=without_eta, scale=scale)  # the old model was too small
    assert err_ours < 1e-3 * err_gp  # the closed form does not take that route



def _fisher_vech(q_mu, q_sqrt):
    """F = ∂η'/∂θ by TensorFlow's Jacobian of GPflow's natural_to_expectation, θ = (θ₁, vech θ₂) and η' = (η₁,
    dual-vech η₂) (diagonal, twice the strict lower triangle), the coordinates of the explicit Fisher check; one
    block [n, n] per latent GP (F is block-diagonal)."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural, natural_to_expectation

    M = q_sqrt.shape[1]
    rows, cols = np.tril_indices(M)
    idx, weights = np.stack([rows, cols], 1), np.where(rows == cols, 1.0, 2.0)
    blocks = []
    for mu, sq in zip(q_mu.T, q_sqrt):
        nat1, nat2 = meanvarsqrt_to_natural(tf.constant(mu[:, None]), tf.constant(sq[None]))
        theta = tf.concat([nat1[:, 0], tf.gather_nd(nat2[0], idx)], axis=0)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(theta)
            low = tf.scatter_nd(idx, theta[M:], [M, M])
            full = low + tf.transpose(low) - tf.linalg.diag(tf.linalg.diag_part(low))
            eta1, eta2 = natural_to_expectation(theta[:M, None], full[None])
            out = tf.concat([eta1[:, 0], tf.gather_nd(eta2[0], idx) * weights], axis=0)
        blocks.append(tape.jacobian(out, theta, experimental_use_pfor=False).numpy())
    return blocks


@pytest.mark.slow  # 60 explicit Jacobians by TensorFlow (~1 s each)
@settings(max_examples=60, deadline=None)
@given(M=st.integers(1, 4), L=st.integers(1, 2), seed=st.integers(0, 2**31 - 1), mean_scale=st.floats(-2.0, 2.0),
       diag_scale=st.floats(-3.0, 1.0), spread=st.floats(0.0, 2.0))
def test_fisher_condition_estimate__bounds_the_condition_of_the_explicit_fisher_matrix(M, L, seed, mean_scale, diag_scale, spread):
    # the oracle: TensorFlow's Jacobian of GPflow's natural_to_expectation, its condition over all L blocks together
    from natgrad_diag.checks.bounds import fisher_condition_estimate

    rng = np.random.default_rng(seed)
    q_mu = 10.0**mean_scale * rng.normal(size=(M, L))
    diag = 10.0 ** (diag_scale + spread * rng.uniform(-1.0, 1.0, size=(L, M)))
    q_sqrt = np.tril(0.3 * rng.normal(size=(L, M, M)) * diag[:, None, :], -1) + np.stack([np.diag(d) for d in diag])
    eigs = np.concatenate([np.linalg.eigvalsh((F + F.T) / 2) for F in _fisher_vech(q_mu, q_sqrt)])
    # eigvalsh is backward stable (each eigenvalue to ~n·ε·λmax, n ≤ 14) and F carries the rounding of its own
    # evaluation: the measured condition means something while λmin is well above 1e4·ε·λmax
    assume(eigs.min() > 1e4 * np.finfo(float).eps * eigs.max())
    measured = eigs.max() / eigs.min()  # F is symmetric positive definite: its 2-norm condition number
    assert measured <= fisher_condition_estimate(q_mu, q_sqrt) * (1 + 1e-3)


def test_fisher_condition_estimate__is_within_a_small_factor_on_a_concentrated_posterior():
    # a q(u) that much data has concentrated (κ(S) = 1e3, ‖m‖ = 5, λmin(S) = 1e-4): the bound stays within 2 orders
    # of the explicit Fisher matrix's condition (the earlier estimate hi²/lo³ was about κ(S) looser, 1e6 here)
    from natgrad_diag.checks.bounds import fisher_condition_estimate

    q_mu = np.full((3, 1), 5.0 / np.sqrt(3.0))
    q_sqrt = np.diag(np.sqrt([1e-4, 1e-2, 1e-1]))[None]
    (F,) = _fisher_vech(q_mu, q_sqrt)
    eigs = np.linalg.eigvalsh((F + F.T) / 2)
    measured, bound = eigs.max() / eigs.min(), fisher_condition_estimate(q_mu, q_sqrt)
    assert measured <= bound <= 100 * measured


def test_fisher_identity__a_void_first_order_bound_is_inconclusive_not_a_false_failure():
    """GPflow's own Poisson SVGP (whiten=False) at S = Kuu, M = 25: the Fisher block S⊗S alone has κ = κ(S)², and
    100·ε·κ(S)² ≥ 1 (numpy's κ(S), the oracle), where a first-order rounding bound holds nothing. The check failed this
    healthy model (error 441 > bound 79); it is now inconclusive. At S = I the same check passes."""
    import gpflow
    import tensorflow as tf

    from natgrad_diag import check_natgrad

    rng = np.random.default_rng(11)
    X = rng.uniform(-3, 3, (100, 1))
    data = (tf.constant(X), tf.constant(rng.poisson(np.exp(2 * np.sin(2 * X))).astype(float)))
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Poisson(), np.linspace(-3, 3, 25)[:, None], whiten=False, num_data=100)
    S = gpflow.covariances.Kuu(model.inducing_variable, model.kernel, jitter=1e-6).numpy()
    assert 100 * np.finfo(float).eps * np.linalg.cond(S) ** 2 >= 1
    kw = dict(gamma=1.0, progress=False, mode="full", gamma_search=False)
    assert check_natgrad(model, data, **kw).check("fisher_identity").status == "pass"
    model.q_sqrt.assign(np.linalg.cholesky(S)[None])
    check = check_natgrad(model, data, **kw).check("fisher_identity")
    assert check.status == "warn" and "inconclusive" in check.detail, str(check)
