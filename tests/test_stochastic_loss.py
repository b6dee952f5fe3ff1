"""A stochastic loss: GPflow's Softmax likelihood estimates its variational expectations by Monte Carlo, so every
evaluation of the training loss draws new samples. The checks must not call such a healthy model broken.

The oracle for "healthy" is GPflow's own ``NaturalGradient`` on a copy, judged by the loss with 20,000 Monte Carlo
points (its noise, about 0.02 here, is far below the 15 nats five steps at γ = 1 gain); the oracle for the noise is
the standard deviation of many evaluations of GPflow's ``training_loss``.
"""

from __future__ import annotations

import warnings

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import NaturalGradient
from test_custom_step import gpflow_like

import natgrad_diag as nd
from natgrad_diag import NatGradMonitor


def _softmax(seed: int = 0):
    """An SVGP with GPflow's Softmax likelihood (100 Monte Carlo points), 3 classes, M = 10, N = 60, a random q(u), not
    trainable."""
    tf.random.set_seed(seed)  # the Monte Carlo draws of the run that follows are the same at every run
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(60, 1)), rng.integers(0, 3, size=(60, 1))
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Softmax(3), X[:10].copy(), num_latent_gps=3)
    model.q_mu.assign(0.3 * rng.normal(size=(10, 3)))  # away from q(u) = N(0, I), where the default seed's mistake vanishes
    model.q_sqrt.assign(np.tril(0.1 * rng.normal(size=(3, 10, 10)), -1) + np.eye(10) * rng.uniform(0.5, 1.0, size=(3, 1, 10)))
    for p in (model.q_mu, model.q_sqrt, model.inducing_variable.Z):
        gpflow.set_trainable(p, False)
    return model, (tf.constant(X), tf.constant(Y))


def _accurate_loss(model, data) -> float:
    """The training loss with 20,000 Monte Carlo points, on a copy (standard deviation about 0.02 here)."""
    copy_ = gpflow.utilities.deepcopy(model)
    copy_.likelihood.num_monte_carlo_points = 20_000
    return float(copy_.training_loss(data))


def _gpflow_losses(model, data, gamma: float, steps: int = 5) -> list[float]:
    """The oracle: the accurate loss after each of GPflow's own NaturalGradient(γ) steps on a copy (NaN from a step
    that raises on)."""
    copy_, opt, losses = gpflow.utilities.deepcopy(model), NaturalGradient(gamma), []
    for _ in range(steps):
        try:
            opt.minimize(lambda: copy_.training_loss(data), [(copy_.q_mu, copy_.q_sqrt)])
        except tf.errors.InvalidArgumentError:
            return losses + [float("nan")] * (steps - len(losses))
        losses.append(_accurate_loss(copy_, data))
    return losses


def _values(model) -> list[bytes]:
    return [v.numpy().tobytes() for v in model.variables]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_natgrad__healthy_softmax_model_passes_and_its_gradient_check_says_why_it_cannot_run(mode):
    model, data = _softmax()
    start, before = _accurate_loss(model, data), _values(model)
    report = nd.check_natgrad(model, data, gamma=1.0, mode=mode, progress=False)
    assert report.passed, str(report)
    assert report.check("step_health").passed and report.check("reproduction").passed
    why = dict(report.skipped)["loss_gradient"]
    assert "stochastic" in why and "Softmax" in why
    losses = _gpflow_losses(model, data, 1.0)  # the oracle: GPflow's five steps at γ = 1 train
    assert all(np.isfinite(losses)) and losses[-1] < start - 10.0, losses
    assert _values(model) == before


def test_check_natgrad__softmax_step_too_long_still_fails():
    model, data = _softmax()
    losses = _gpflow_losses(model, data, 10.0)  # the oracle: a step of GPflow's at γ = 10 raises
    assert np.isnan(losses).any(), losses
    report = nd.check_natgrad(model, data, gamma=10.0, progress=False)
    assert not report.check("step_health").passed and report.suggested_gamma is not None and report.suggested_gamma < 10.0


@pytest.mark.slow  # 30 training steps, the check and GPflow's 20-step runs
def test_check_natgrad__a_softmax_gamma_that_holds_five_steps_but_not_twenty_fails_as_unstable():
    """A Softmax SVGP after 30 steps of γ = 0.3: 5 steps of γ = 1.5 hold, and GPflow's optimizer with it reaches NaN at
    step 8 to 14. A stochastic loss gets no λ estimate, so the check passed γ = 1.5 and suggested it; every γ whose k
    steps held is now tried for 4·k steps. Oracle: GPflow's own optimizer on copies, at 1.5 and at the suggestion."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-3.0, 3.0, (60, 1))
    Y = np.digitize(np.sin(X), [-0.4, 0.4]).astype(np.int64)
    Z = X[np.linspace(0, 59, 8).astype(int)].copy()
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Softmax(3), Z, num_latent_gps=3, num_data=60)
    data = (tf.constant(X), tf.constant(Y))
    tf.random.set_seed(0)
    for _ in range(30):
        NaturalGradient(0.3).minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])
    report = nd.check_natgrad(model, data, gamma=1.5, mode="fast", progress=False)
    health = report.check("step_health")
    assert health.status == "fail" and "unstable: the 5 steps held, but 20 steps did not" in health.detail, health.detail
    suggested = report.suggested_gamma
    assert suggested is not None and suggested < 1.5
    start = _accurate_loss(model, data)
    for seed in range(2):
        tf.random.set_seed(seed)
        assert np.isnan(_gpflow_losses(model, data, 1.5, steps=20)).any()
        tf.random.set_seed(seed)
        kept = _gpflow_losses(model, data, suggested, steps=20)  # near the optimum: flat, within the accurate loss's
        assert np.all(np.isfinite(kept)) and max(kept) < start + 0.2, kept  # noise (σ ≈ 0.02 each, 6·√2·σ < 0.2)


@pytest.mark.slow
def test_noise__estimate_matches_the_spread_of_gpflows_own_evaluations():
    from natgrad_diag.checks.evaluator import Context, Evaluator, Step
    from natgrad_diag.checks.health import noise

    model, data = _softmax()
    oracle = np.std([float(model.training_loss(data)) for _ in range(100)], ddof=1)
    ev = Evaluator(Context(model, data, None, 1.0, None, np.float64, 10, 3))
    loss = float(model.training_loss(data))
    sigma = noise(ev, Step(loss, None, None, None, None))  # no new q(u): the spread at the current one
    # σ̂ from 10 draws: σ̂²/σ² ~ χ²₉/9, inside [0.09, 4] with probability 1 − 10⁻⁴ (and the seed fixes the draws)
    assert 0.3 * oracle < sigma < 2.0 * oracle, (sigma, oracle)
    gaussian, gdata = nd.demo.make_model("svgp", "gaussian", num_inducing=4, num_data=8)
    gev = Evaluator(Context(gaussian, gdata, None, 1.0, None, np.float64, 4, 1))
    assert noise(gev, Step(float(gaussian.training_loss(gdata)), None, None, None, None)) == 0.0 == gev.noise  # deterministic


@pytest.mark.slow
def test_custom_step__stochastic_loss_passes_gpflows_step_and_names_a_mistake():
    model, data = _softmax()
    report = nd.check_natgrad(model, data, optimizer=NaturalGradient(0.3), gamma=0.3, gamma_steps=1, gamma_search=False, progress=False)
    assert report.check("custom_step").passed, str(report.check("custom_step"))
    wrong = nd.check_natgrad(model, data, optimizer=gpflow_like("default_seed"), gamma=0.3, gamma_steps=1, gamma_search=False, progress=False)
    assert not wrong.check("custom_step").passed and "the mistake 'default_seed'" in wrong.check("custom_step").detail


@pytest.mark.slow  # the docs' var_list example runs this form in the default suite
def test_var_list_form__stochastic_loss_is_healthy():
    model, data = _softmax()
    report = nd.check_natgrad(lambda: model.training_loss(data), var_list=[(model.q_mu, model.q_sqrt)], gamma=1.0, progress=False)
    assert report.passed, str(report)


@pytest.mark.slow
def test_training__monitor_and_verifying_guard_keep_training_a_softmax_model():
    model, data = _softmax()
    start = _accurate_loss(model, data)
    natgrad = NaturalGradient(tf.Variable(1.0, dtype=tf.float64))
    monitor = NatGradMonitor(model, data, gamma=1.0, on_failure="raise", every=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for i in range(10):
            with monitor.guard(i, natgrad, verify=True):
                natgrad.minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])
            monitor(i)
    assert all(r.passed for r in monitor.guard_records) and not monitor.failures and monitor.rollbacks == 0
    stochastic = [w for w in caught if "cannot verify" in str(w.message)]
    assert len(stochastic) == 1 and "stochastic" in str(stochastic[0].message)
    assert _accurate_loss(model, data) < start - 10.0  # it trained, as GPflow's own steps do (see above)


def test_verify_step__stochastic_loss_is_inconclusive_not_a_mistake():
    from natgrad_diag.checks.pairs import verify_step

    model, data = _softmax()
    pairs = [(model.q_mu, model.q_sqrt)]
    before = [model.q_mu.unconstrained_variable.numpy(), model.q_sqrt.unconstrained_variable.numpy()]
    NaturalGradient(0.3).minimize(lambda: model.training_loss(data), pairs)  # GPflow's own, correct step
    after = _values(model)
    (check,) = verify_step(NaturalGradient(0.3), lambda: model.training_loss(data), pairs, before)
    assert check.status == "warn" and "stochastic" in check.detail and _values(model) == after


@pytest.mark.slow
def test_var_list_form__unseeded_deep_gp_is_healthy_where_its_seeded_loss_is():
    """A two-layer GPflux deep GP whose output layer starts at q_mu = 0, q_sqrt = I: its unseeded loss is the same to
    the bit at the current q(u) and noisy where a step lands, which the noise test must see."""
    from test_gpflux import _deep_gp, _seeded_loss

    model, data = _deep_gp(2)
    seeded, pairs = _seeded_loss(model, data), [(layer.q_mu, layer.q_sqrt) for layer in model.f_layers]
    start = float(seeded())
    tf.random.set_seed(0)
    # at γ = 0.5 each layer's own steps hold (the output layer's loss rises only within the noise its step exposes),
    # and the layers stepped together fail, as GPflow's own steps together do (tests/test_gpflux.py)
    loose = nd.check_natgrad(lambda: -model.elbo(data), var_list=pairs, gamma=0.5, mode="fast", progress=False)
    assert [c.name for c in loose.checks if not c.passed] == ["joint_step_health"], str(loose)
    assert "stochastic loss" in loose.check("pair 1: step_health").claim  # the noise seen where the step lands
    unseeded = nd.check_natgrad(lambda: -model.elbo(data), var_list=pairs, gamma=0.1, mode="fast", progress=False)
    assert unseeded.passed, str(unseeded)
    assert nd.check_natgrad(seeded, var_list=pairs, gamma=0.1, mode="fast", progress=False).passed  # the same draws each time
    opt = NaturalGradient(0.1)  # the oracle: GPflow's own five steps together at γ = 0.1 train, judged on the seeded loss
    for _ in range(5):
        opt.minimize(seeded, pairs)
    assert float(seeded()) < start - 50.0


@pytest.mark.slow
def test_step_health__a_rise_after_the_noisy_start_is_judged_by_the_noise_where_it_happens():
    """A fresh, unwhitened Softmax SVGP: the loss's σ̂ is about 2-3 at q(u) = N(0, I) (loss ≈ 600) and about 0.3 a step
    on. GPflow's own NaturalGradient(1) raises the accurate loss at step 2 by several units, each time; judged by the
    start's σ̂ (6·√2·σ̂ ≈ 20) that rise passed, now it fails, and the suggestion is a γ whose five GPflow steps train."""
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (40, 1))
    Y = np.clip(np.floor((np.sin(X) + 0.3 * rng.normal(size=X.shape) + 1.2) / 0.8), 0, 2).astype(np.int64)
    Z = X[np.random.default_rng(1).choice(40, 6, replace=False)].copy()
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Softmax(3), Z, num_latent_gps=3, whiten=False)
    gpflow.set_trainable(model, False)
    data = (tf.constant(X), tf.constant(Y))
    oracle = _gpflow_losses(model, data, 1.0, steps=2)
    assert oracle[1] > oracle[0] + 1.0  # the accurate loss (σ ≈ 0.02) rises at GPflow's second step
    report = nd.check_natgrad(model, data, gamma=1.0, progress=False)
    health = report.check("step_health")
    assert health.status == "fail" and "fails at step 2: the loss rose" in health.detail, health.detail
    assert report.suggested_gamma is not None and report.suggested_gamma < 1.0
    trained = _gpflow_losses(model, data, report.suggested_gamma)
    assert all(b < a for a, b in zip([_accurate_loss(model, data), *trained], trained)), trained
