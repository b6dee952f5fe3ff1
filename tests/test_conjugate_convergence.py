"""conjugate_convergence on a Gaussian SVGP: XiNat contracts the distance to θ* by |1 − γ| (0 < γ < 2), distances at
the rounding level δ of the distance count as converged, and large means (κ_η) widen the bound; wrong or diverging
steps still fail. The oracle is GPflow's own ``NaturalGradient`` on a ``gpflow.utilities.deepcopy`` of the model, and
SGPR's collapsed bound (Titsias 2009) for the optimum itself."""

from __future__ import annotations

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import NaturalGradient, XiNat, XiSqrtMeanVar
from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

from natgrad_diag.checks.api import check_natgrad
from natgrad_diag.checks.evaluator import Evaluator

EPS = np.finfo(np.float64).eps


def _svgp(N, M, *, seed=0, scale=1.0, whiten=True, pre=(), Z_first=False):
    """Gaussian SVGP on sin data times ``scale`` with GPflow's default q(u), then GPflow's steps with γ in ``pre``."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (N, 1))
    Y = scale * (np.sin(X) + 0.1 * rng.normal(size=X.shape))
    Z = X[:M].copy() if Z_first else X[rng.choice(N, M, replace=False)].copy()
    m = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(), Z, num_data=N,
                           whiten=whiten)
    for g in pre:
        NaturalGradient(g).minimize(lambda: m.training_loss((X, Y)), [(m.q_mu, m.q_sqrt)])
    return m, (X, Y)


def _report(m, data, **kwargs):
    return check_natgrad(m, data, progress=False, gamma_search=False, **kwargs)  # no γ search: not needed here


def _check(m, data, **kwargs):
    return _report(m, data, **kwargs).check("conjugate_convergence")


def _naturals(m):
    return np.concatenate([t.numpy().ravel() for t in meanvarsqrt_to_natural(m.q_mu, m.q_sqrt)])


def _gpflow(m, data, gamma, xi=None, k=5):
    """GPflow's own optimizer on a copy: the losses, the distances in natural parameters to GPflow's XiNat γ = 1
    step (θ*), and the copy; raises where GPflow's step raises."""
    star, walk = gpflow.utilities.deepcopy(m), gpflow.utilities.deepcopy(m)
    NaturalGradient(1.0).minimize(lambda: star.training_loss(data), [(star.q_mu, star.q_sqrt)])
    opt, loss = NaturalGradient(gamma, xi or XiNat()), lambda: walk.training_loss(data)
    losses, d = [float(loss())], [np.linalg.norm(_naturals(walk) - _naturals(star))]
    for _ in range(k):
        opt.minimize(loss, [(walk.q_mu, walk.q_sqrt)])
        losses.append(float(loss()))
        d.append(np.linalg.norm(_naturals(walk) - _naturals(star)))
    return np.array(losses), np.array(d), walk


def _non_increasing(losses):
    return bool(np.all(np.diff(losses) <= np.sqrt(EPS) * np.abs(losses[:-1])))


def _sgpr(m, data):
    noise = m.likelihood.variance.numpy()
    return float(gpflow.models.SGPR(data, m.kernel, m.inducing_variable.Z.numpy(), noise_variance=noise).elbo())


def _wrong_walk(monkeypatch, change):
    """natgrad-diag's walk with the user's γ and ξ replaced by ``change(gamma, xi)``; θ* (XiNat γ = 1) untouched."""
    walk = Evaluator.walk

    def wrong(self, steps, gamma, xi):
        own = isinstance(xi, XiNat) and gamma == 1.0
        return walk(self, steps, *((gamma, xi) if own else change(gamma, xi)))

    monkeypatch.setattr(Evaluator, "walk", wrong)


# 1. XiNat: the distance ratio is |1 − γ|, a contraction for 0 < γ < 2 only


@pytest.mark.parametrize("gamma", [pytest.param(1.2, marks=pytest.mark.slow), pytest.param(1.5, marks=pytest.mark.slow)])
def test_xinat_gamma_between_1_and_2_contracts_by_abs_1_minus_gamma_like_gpflows_optimizer(gamma):
    m, data = _svgp(40, 6, Z_first=True)
    c = _check(m, data, gamma=gamma)
    assert c.status == "pass", str(c)
    assert f"|1 − γ| = {abs(1 - gamma):g}" in c.claim
    losses, d, _ = _gpflow(m, data, gamma)
    assert _non_increasing(losses) and losses[-1] < losses[0]  # GPflow trains with this γ
    np.testing.assert_allclose(d[1:] / d[:-1], abs(1 - gamma), rtol=1e-8)  # ... contracting by |1 − γ|


@pytest.mark.parametrize("gamma", [pytest.param(2.0, marks=pytest.mark.slow), pytest.param(2.5, marks=pytest.mark.slow)])
def test_xinat_gamma_2_or_more_never_contracts_and_fails_as_gpflows_optimizer_oscillates_or_diverges(gamma):
    m, data = _svgp(40, 6, Z_first=True)
    r = _report(m, data, gamma=gamma)  # |1 − γ| ≥ 1: no contraction
    assert r.check("conjugate_convergence").status == "fail", str(r.check("conjugate_convergence"))
    assert any(c.name == "step_too_long" and "conjugate_convergence" in c.checks for c in r.causes)
    if gamma > 2.0:
        with pytest.raises(tf.errors.InvalidArgumentError):  # GPflow's step leaves the positive-definite cone
            _gpflow(m, data, gamma)
        return
    losses, d, _ = _gpflow(m, data, gamma)  # γ = 2 reflects through θ*: the loss returns to where it started
    np.testing.assert_allclose(d, d[0], rtol=1e-8)
    np.testing.assert_allclose(losses[::2], losses[0], rtol=1e-10)


# 2. Distances at the rounding level δ = 100·ε·(κ(F) + κ_η)·‖θ‖ of the distance are θ*


@pytest.mark.slow
def test_xisqrtmeanvar_reaching_rounding_level_is_converged():
    m, data = _svgp(20, 5, seed=1, pre=[0.3] * 7)  # distances 0.8 … 2e-9, 3e-15, 5e-15
    c = _check(m, data, xi_transform=XiSqrtMeanVar())
    assert c.status == "pass", str(c)
    losses, d, walk = _gpflow(m, data, 1.0, XiSqrtMeanVar())
    assert _non_increasing(losses) and d[-1] < 1e-12 * np.linalg.norm(_naturals(m))  # GPflow reaches θ* too,
    assert float(walk.elbo(data)) == pytest.approx(_sgpr(m, data), rel=1e-12)  # ... SGPR's optimum


@pytest.mark.slow
def test_xisqrtmeanvar_reaching_rounding_level_is_converged_on_a_repeated_call():
    m, data = _svgp(20, 5, seed=1, pre=[0.3] * 7)
    assert [_check(m, data, xi_transform=XiSqrtMeanVar()).status for _ in range(2)] == ["pass", "pass"]


@pytest.mark.slow
def test_q_u_already_at_the_optimum_is_converged():
    m, data = _svgp(40, 6, seed=1, whiten=False, pre=[1.0] * 3)  # unwhitened: distances 9e-8, 3e-7, 3e-7, ... noise
    assert float(m.elbo(data)) == pytest.approx(_sgpr(m, data), rel=1e-12)  # at θ*: SGPR's bound
    c = _check(m, data, xi_transform=XiSqrtMeanVar())
    assert c.status == "pass", str(c)
    losses, _, _ = _gpflow(m, data, 1.0, XiSqrtMeanVar())
    np.testing.assert_allclose(losses, losses[0], rtol=np.sqrt(EPS))  # GPflow's optimizer holds the loss


@pytest.mark.slow
def test_xisqrtmeanvar_gamma_so_large_that_gpflows_optimizer_diverges_still_fails():
    m, data = _svgp(30, 6, pre=[0.3] * 8)
    r = _report(m, data, gamma=3.0, xi_transform=XiSqrtMeanVar())
    assert r.check("conjugate_convergence").status == "fail", str(r.check("conjugate_convergence"))
    losses, d, _ = _gpflow(m, data, 3.0, XiSqrtMeanVar())
    assert losses[-1] > losses[0] and d[-1] > 10 * d[0]  # GPflow's optimizer moves away from θ*


@pytest.mark.slow
def test_a_wrong_step_moving_away_from_the_optimum_still_fails(monkeypatch):
    m, data = _svgp(20, 5, pre=[1.0] * 3)  # whitened, at θ*
    losses, _, _ = _gpflow(m, data, 1.0, XiSqrtMeanVar())
    np.testing.assert_allclose(losses, losses[0], rtol=np.sqrt(EPS))  # the right step stays at θ*
    walk = Evaluator.walk

    def overshoot(self, steps, gamma, xi):  # every XiSqrtMeanVar step lands 0.1% beyond its mean
        for k, s in enumerate(walk(self, steps, gamma, xi)):
            if k and isinstance(xi, XiSqrtMeanVar):
                s.q_mu.assign(s.q_mu * 1.001)
            yield s

    monkeypatch.setattr(Evaluator, "walk", overshoot)
    c = _check(m, data, xi_transform=XiSqrtMeanVar())
    assert c.status == "fail", str(c)


# 3. Large means: GPflow's S = η₂ − η₁η₁ᵀ loses κ_η = (λmax(S) + ‖m‖²)/λmin(S) digits


@pytest.mark.slow  # 5-6 s each
@pytest.mark.parametrize("gamma", [0.3, 0.5])
def test_large_targets_contract_by_1_minus_gamma_within_the_kappa_eta_bound(gamma):
    m, data = _svgp(40, 6, scale=1e4, Z_first=True)  # ‖m‖ ~ 1e4 along the walk, noise variance 1
    c = _check(m, data, gamma=gamma)
    assert c.status == "pass" and c.tolerance < 1e-2, str(c)  # a conclusive pass, not a warning
    losses, d, _ = _gpflow(m, data, gamma)
    assert _non_increasing(losses) and losses[-1] < losses[0]
    np.testing.assert_allclose(d[1:] / d[:-1], 1 - gamma, rtol=1e-6)


@pytest.mark.parametrize(("scale", "off"), [pytest.param(1.0, 1e-6, marks=pytest.mark.slow), pytest.param(100.0, 1e-6, marks=pytest.mark.slow), (1e4, 1e-2)])
def test_a_step_off_by_a_small_relative_amount_still_fails(monkeypatch, scale, off):
    m, data = _svgp(40, 6, scale=scale, Z_first=True)
    _, d, _ = _gpflow(m, data, 0.5)
    np.testing.assert_allclose(d[1:] / d[:-1], 0.5, rtol=1e-6)  # GPflow's own γ = 0.5 contracts by 0.5
    _wrong_walk(monkeypatch, lambda gamma, xi: (gamma * (1 + off), xi))
    c = _check(m, data, gamma=0.5)
    assert c.status == "fail", str(c)


@pytest.mark.slow
def test_a_wrong_xi_still_fails(monkeypatch):
    m, data = _svgp(40, 6, scale=100.0, Z_first=True)
    _, d, _ = _gpflow(m, data, 0.1)
    np.testing.assert_allclose(d[1:] / d[:-1], 0.9, rtol=1e-6)  # GPflow's XiNat contracts by 0.9 ...
    _, d, _ = _gpflow(m, data, 0.1, XiSqrtMeanVar())
    assert np.all(np.abs(d[1:] / d[:-1] - 0.9) > 1e-3)  # ... its XiSqrtMeanVar at another rate
    _wrong_walk(monkeypatch, lambda gamma, xi: (gamma, XiSqrtMeanVar()))
    c = _check(m, data, gamma=0.1)
    assert c.status == "fail" and "walk failed" not in c.detail and "optimum failed" not in c.detail, str(c)


def test_fisher_condition_estimate__of_a_q_far_out_is_infinite_not_an_overflow():
    """conjugate_convergence measures κ along a diverging walk (q_sqrt entries of 1e61 at GPflow's fourth XiSqrtMeanVar
    step at γ = 1): the estimate's Python-float powers raised OverflowError out of check_natgrad."""
    from natgrad_diag.checks.bounds import fisher_condition_estimate

    q_sqrt = np.diag([1e61, 1e-3])[None]
    assert fisher_condition_estimate(np.array([[1e200], [0.0]]), q_sqrt) == np.inf
    # κ(S) = 1e200 is finite, its square is not: the old Python-float k**2 raised OverflowError here
    assert fisher_condition_estimate(np.zeros((2, 1)), np.diag([1e50, 1e-50])[None]) == np.inf
