"""The loss_gradient check: dL/dmean, dL/dvarsqrt against central differences; a 1%-wrong custom gradient fails as
wrong_gradient in full and fast mode, a correct model passes, the model is untouched."""

from __future__ import annotations

import dataclasses

import gpflow
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from natgrad_diag._gpflow import read_once
from natgrad_diag.checks.api import _checking, check_natgrad
from natgrad_diag.checks.conjugate import keeps_gaussian_maths
from natgrad_diag.checks.evaluator import evaluator
from natgrad_diag.checks.loss_gradient import probes, random_directions


class OffGaussian(gpflow.likelihoods.Gaussian):
    """GPflow's Gaussian likelihood whose gradient w.r.t. the predictive mean is 1% too large (values unchanged)."""

    def _variational_expectations(self, X, Fmu, Fvar, Y):
        @tf.custom_gradient
        def scaled(fmu):
            def grad(upstream):
                return 1.01 * upstream

            return tf.identity(fmu), grad

        return super()._variational_expectations(X, scaled(Fmu), Fvar, Y)


def _svgp(likelihood):
    rng = np.random.RandomState(1)
    X = rng.rand(30, 1)
    Y = np.sin(6 * X) + 0.1 * rng.randn(30, 1)
    m = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), likelihood, X[::5].copy(), num_data=30)
    m.q_mu.assign(rng.randn(6, 1))
    return m, (X, Y)


def _snapshot(m):
    return [v.numpy().copy() for v in m.variables]


def test_directions__are_unit_and_lower_triangular_and_seeded():
    a, b = random_directions(4, 2, 3), random_directions(4, 2, 3)
    assert len(a) == len(b) == 3 and all(m.shape == (4, 2) and s.shape == (2, 4, 4) for m, s in a)
    assert not np.array_equal(a[0][0], random_directions(4, 2, 3, seed=1)[0][0])  # the seed is used
    for (m1, s1), (m2, s2) in zip(a, b):
        assert np.array_equal(m1, m2) and np.array_equal(s1, s2)
        assert np.all(np.triu(s1, 1) == 0)
        assert np.sum(m1**2) + np.sum(s1**2) == pytest.approx(1.0, rel=1e-14)


def test_off_gaussian__keeps_gaussians_values_but_not_its_gradient():
    # the oracle for the injection itself: the loss is GPflow's, its gradient w.r.t. q_mu is not
    m_off, data = _svgp(OffGaussian(variance=0.1))
    m_ok, _ = _svgp(gpflow.likelihoods.Gaussian(variance=0.1))
    assert float(m_off.training_loss(data)) == float(m_ok.training_loss(data))
    with tf.GradientTape(persistent=True) as t:
        l1, l2 = m_off.training_loss(data), m_ok.training_loss(data)
    g1, g2 = t.gradient(l1, m_off.q_mu.unconstrained_variable), t.gradient(l2, m_ok.q_mu.unconstrained_variable)
    assert np.max(np.abs(g1 - g2)) > 1e-3 * np.max(np.abs(g2))
    assert keeps_gaussian_maths(m_off.likelihood) and not keeps_gaussian_maths(gpflow.likelihoods.StudentT())


@pytest.mark.parametrize("mode", [pytest.param("full", marks=pytest.mark.slow), "fast"])
def test_loss_gradient__wrong_custom_gradient_fails_as_wrong_gradient(mode):
    m, data = _svgp(OffGaussian(variance=0.1))
    before = _snapshot(m)
    r = check_natgrad(m, data, mode=mode, progress=False)
    c = r.check("loss_gradient")
    assert c.status == "fail" and c.max_abs_error > c.tolerance
    assert "worst direction" in c.detail
    cause = next(x for x in r.causes if x.name == "wrong_gradient")
    assert "loss_gradient" in cause.checks
    assert r.check("reproduction").status == "pass"  # GPflow's step uses the same wrong gradient
    for a, b in zip(before, m.variables):
        assert np.array_equal(a, b.numpy())
    if mode == "full":  # a subclass that keeps Gaussian's values keeps the conjugate checks, which miss too
        assert r.check("conjugate_optimality").status == "fail"


@pytest.mark.parametrize("mode", [pytest.param("full", marks=pytest.mark.slow), "fast"])
def test_loss_gradient__correct_model_passes(mode):
    m, data = _svgp(gpflow.likelihoods.Gaussian(variance=0.1))
    r = check_natgrad(m, data, mode=mode, progress=False)
    assert r.check("loss_gradient").status == "pass" and r.status == "pass", str(r)
    assert r.causes == ()


@pytest.mark.slow
def test_loss_gradient__bernoulli_vgp_passes():
    rng = np.random.RandomState(0)
    X = rng.rand(8, 1)
    Y = (rng.rand(8, 1) > 0.5).astype(float)
    m = gpflow.models.VGP((X, Y), gpflow.kernels.Matern32(), gpflow.likelihoods.Bernoulli())
    m.q_mu.assign(rng.randn(8, 1))
    r = check_natgrad(m, progress=False)
    assert r.check("loss_gradient").status == "pass", str(r.check("loss_gradient"))


def _svgp_large(likelihood, M=150, N=300):
    rng = np.random.RandomState(2)
    X = rng.rand(N, 2)
    Y = np.sin(6 * X[:, :1]) + 0.1 * rng.randn(N, 1)
    m = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(lengthscales=0.3), likelihood, X[:M].copy(), num_data=N)
    m.q_mu.assign(0.3 * rng.randn(M, 1))
    return m, (X, Y)


class SlightlyOffGaussian(gpflow.likelihoods.Gaussian):
    """GPflow's Gaussian likelihood whose gradient w.r.t. the predictive mean is 0.1% too large (values unchanged)."""

    def _variational_expectations(self, X, Fmu, Fvar, Y):
        @tf.custom_gradient
        def scaled(fmu):
            return tf.identity(fmu), lambda upstream: 1.001 * upstream

        return super()._variational_expectations(X, scaled(Fmu), Fvar, Y)


@pytest.mark.slow
def test_loss_gradient__a_gradient_0_1_percent_off_is_caught_at_larger_M_in_fast_mode():
    # M = 150: n = 11 475 parameters. A unit random direction's derivative is about ‖∇L‖/√n, so a bound relative
    # to ‖∇L‖ itself would be √n ≈ 107 times too loose and let this gradient pass; the check's bound is relative to
    # the directional derivative's scale. The oracle for "0.1% off": GPflow's Gaussian on the same data, whose loss
    # is identical and whose gradient (GPflow's tape) gives ‖∇L‖.
    m, data = _svgp_large(SlightlyOffGaussian(variance=0.1))
    ok, _ = _svgp_large(gpflow.likelihoods.Gaussian(variance=0.1))
    assert float(m.training_loss(data)) == float(ok.training_loss(data))
    with tf.GradientTape() as tape:
        loss = ok.training_loss(data)
    grads = tape.gradient(loss, [ok.q_mu.unconstrained_variable, ok.q_sqrt.unconstrained_variable])
    grad_norm = float(np.sqrt(sum(np.sum(g.numpy() ** 2) for g in grads)))
    r_off = check_natgrad(m, data, mode="fast", progress=False)
    r_ok = check_natgrad(ok, data, mode="fast", progress=False)
    c_off, c_ok = r_off.check("loss_gradient"), r_ok.check("loss_gradient")
    assert c_ok.status == "pass", str(c_ok)
    assert c_off.status == "fail" and "wrong_gradient" in [x.name for x in r_off.causes], str(c_off)
    assert c_off.max_abs_error > 100 * c_ok.max_abs_error  # the injected error, not noise
    assert c_off.max_abs_error < 1e-5 * grad_norm  # below rtol·‖∇L‖ (rtol = 1e-5): a bound relative to ‖∇L‖ would pass it


def _svgp_with_priors(whiten):
    """An SVGP whose kernel and likelihood are trainable and carry priors (their log density is in the training
    loss), not whitened or whitened: the losses the fast check computes in one graph must include all of it."""
    rng = np.random.RandomState(3)
    X = rng.rand(40, 2)
    Y = np.sin(4 * X[:, :1]) + 0.1 * rng.randn(40, 1)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=[0.4, 0.6])
    kernel.lengthscales.prior = tfp.distributions.Gamma(np.float64(2.0), np.float64(3.0))
    likelihood = gpflow.likelihoods.Gaussian(variance=0.1)
    likelihood.variance.prior = tfp.distributions.LogNormal(np.float64(-2.0), np.float64(1.0))
    m = gpflow.models.SVGP(kernel, likelihood, X[:8].copy(), num_data=40, whiten=whiten)
    m.q_mu.assign(0.5 * rng.randn(8, 1))
    return m, (X, Y)


@pytest.mark.parametrize("whiten", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_fast_take__losses_at_the_probes_and_after_gpflows_step_are_the_models_own(whiten):
    # The compiled evaluator computes GPflow's update, the loss after it and the loss at the probe points in one
    # graph whose parameters are read once. Oracles: the model's own training_loss, eagerly, on a deep copy with
    # q(u) assigned, and GPflow's NaturalGradient optimizer on another copy. Graph and eager kernels may round
    # differently: rtol 1e-12 (the losses are O(10)-O(100), a few hundred flops per term at ε = 2.2e-16).
    m, data = _svgp_with_priors(whiten)
    before = _snapshot(m)
    with _checking(m, data, 0.1, None, {}) as ctx:
        ev = evaluator(ctx, compiled=True)
        points = probes(ev)
        taken = ev.take(points)
    assert len(points) == 2 * ev.loss_directions == len(taken.losses) > 0
    for (q_mu, q_sqrt), loss in zip(points, taken.losses):
        other = gpflow.utilities.deepcopy(m)
        other.q_mu.assign(q_mu)
        other.q_sqrt.assign(q_sqrt)
        assert loss == pytest.approx(float(other.training_loss(data)), rel=1e-12, abs=0)
    theirs = gpflow.utilities.deepcopy(m)
    gpflow.optimizers.NaturalGradient(gamma=0.1).minimize(theirs.training_loss_closure(data), [(theirs.q_mu, theirs.q_sqrt)])
    assert taken.gp.loss_after == pytest.approx(float(theirs.training_loss(data)), rel=1e-12, abs=0)
    np.testing.assert_allclose(taken.gp.q_sqrt, theirs.q_sqrt.numpy(), rtol=0, atol=1e-12)
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(before, m.variables))  # read-only
    assert all("_value" not in vars(p) for p in ev.scratch.parameters)  # the parameters convert as before


def test_read_once__two_losses_in_one_graph_read_each_parameter_once_with_the_same_value():
    # Each use of a gpflow.Parameter reads its variable (a ReadVariableOp Grappler never merges); under read_once
    # the graph has one read per parameter however often the body uses it. Oracle: the same body without it.
    m, data = _svgp_with_priors(False)
    X, Y = (tf.constant(a) for a in data)

    def reads(shared):
        def body():
            if not shared:
                return m.training_loss((X, Y)) + m.training_loss((X, Y))
            with read_once(m, skip=(m.q_mu, m.q_sqrt)):
                return m.training_loss((X, Y)) + m.training_loss((X, Y))

        f = tf.function(body)
        ops = [op.type for op in f.get_concrete_function().graph.get_operations()]
        return ops.count("ReadVariableOp"), float(f())

    (n_plain, plain), (n_once, once) = reads(False), reads(True)
    assert n_once < n_plain / 2  # 22 against 52: the second loss reads nothing again but q_mu, q_sqrt
    assert once == pytest.approx(plain, rel=1e-13, abs=0) and once == pytest.approx(2 * float(m.training_loss((X, Y))), rel=1e-13)
    assert all("_value" not in vars(p) for p in m.parameters)


def test_loss_gradient_stage__without_the_runs_probes_computes_them_and_still_fails_a_wrong_gradient():
    # The stage is handed its losses by check_natgrad's run; called on its own it must not pass with nothing compared.
    from natgrad_diag.checks import loss_gradient
    from natgrad_diag.checks.bounds import measure_conditioning
    from natgrad_diag.checks.evaluator import Run

    m, data = _svgp(OffGaussian(variance=0.1))
    with _checking(m, data, 0.1, None, {}) as ctx:
        ev = evaluator(ctx, compiled=False)
        taken = ev.take()
        cond = measure_conditioning(m, *ev.q_arrays, taken.step.new_q_sqrt)
        check = loss_gradient.stage(Run(ev, taken.step, taken.gp, cond, lambda *a: None)).checks[0]
    assert check.status == "fail" and check.max_abs_error > check.tolerance > 0


def test_loss_gradient_stage__a_nan_in_the_analytic_gradient_fails_it():
    # A NaN directional derivative makes every ratio NaN, and a NaN never compares greater: it must fail, not pass
    # with the initial "error 0 ≤ bound 0" of no direction judged.
    from natgrad_diag.checks import loss_gradient
    from natgrad_diag.checks.bounds import measure_conditioning
    from natgrad_diag.checks.evaluator import Run

    m, data = _svgp(gpflow.likelihoods.Gaussian(variance=0.1))
    with _checking(m, data, 0.1, None, {}) as ctx:
        ev = evaluator(ctx, compiled=False)
        taken = ev.take()
        cond = measure_conditioning(m, *ev.q_arrays, taken.step.new_q_sqrt)
        nan_step = dataclasses.replace(taken.step, dL_dmean=np.full_like(np.asarray(taken.step.dL_dmean), np.nan))
        check = loss_gradient.stage(Run(ev, nan_step, taken.gp, cond, lambda *a: None)).checks[0]
    assert check.status == "fail" and check.max_abs_error == np.inf
