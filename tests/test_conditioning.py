"""Condition numbers: λ(S) from the factor (LAPACK's lauum) against numpy on C Cᵀ, and the rounding model of GPflow's
step (κ_η) against a 40-digit evaluation of the step on GPflow's #767 state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
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
    _, g_mu, g_sq = loss_and_grads(m, None)
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
