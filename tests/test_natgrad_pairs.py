"""check_natgrad(loss_fn, var_list=[(q_mu, q_sqrt), ...]): pair by pair, against GPflow's NaturalGradient, read only."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from _user_models import same_bits
from gpflow.optimizers import NaturalGradient

from natgrad_diag import check_natgrad
from natgrad_diag.exceptions import UnsupportedModelError


def _two_svgps():
    """Two SVGPs summed into one loss: two independent (q_mu, q_sqrt) pairs of the same shapes (GPflow's minimize
    declares var_list[all][0]: [N, D], one N and D for every pair)."""
    from natgrad_diag.demo import make_model

    a, (Xa, Ya) = make_model("svgp", "bernoulli", num_inducing=4, num_data=12, seed=1)
    b, (Xb, Yb) = make_model("svgp", "gaussian", num_inducing=4, num_data=10, seed=2)
    da, db = (tf.constant(Xa), tf.constant(Ya)), (tf.constant(Xb), tf.constant(Yb))

    def loss():
        return a.training_loss(da) + b.training_loss(db)

    return loss, [a, b]


@pytest.mark.slow
def test_check_natgrad__var_list_of_two_pairs_equals_two_single_pair_checks():
    loss, models = _two_svgps()
    pairs = [(m.q_mu, m.q_sqrt) for m in models]
    before = [v.numpy().copy() for m in models for v in m.variables]
    both = check_natgrad(loss, var_list=pairs, gamma=0.5)
    assert same_bits(before, [v.numpy() for m in models for v in m.variables])  # read only, bit for bit
    single = [check_natgrad(loss, var_list=[p], gamma=0.5).pairs[0] for p in pairs]
    assert len(both.pairs) == 2 and both.passed
    for r, s in zip(both.pairs, single):
        assert r.loss_before == s.loss_before and r.suggested_gamma == s.suggested_gamma
        assert r.gamma_losses.keys() == s.gamma_losses.keys()
        for g, loss in r.gamma_losses.items():  # None where γ failed, in both
            assert (loss is None and s.gamma_losses[g] is None) or loss == pytest.approx(s.gamma_losses[g], rel=1e-12), g
        assert [(c.name, c.passed) for c in r.checks] == [(c.name, c.passed) for c in s.checks]
        assert [c.name for c in s.checks if "joint" in c.name] == []  # one pair: nothing to step together
        np.testing.assert_allclose(r.new_q_sqrt, s.new_q_sqrt, rtol=0, atol=1e-12)
    assert same_bits(before, [v.numpy() for m in models for v in m.variables])
    # the oracle: GPflow's NaturalGradient.minimize on both pairs at once, on copies of the same seeded models
    loss_c, copies = _two_svgps()
    NaturalGradient(0.5).minimize(loss_c, [(m.q_mu, m.q_sqrt) for m in copies])
    for r, c in zip(both.pairs, copies):
        np.testing.assert_allclose(r.new_q_mu, c.q_mu.numpy(), rtol=0, atol=1e-10)
        np.testing.assert_allclose(r.new_q_sqrt, c.q_sqrt.numpy(), rtol=0, atol=1e-10)
    assert [c.name for c in both.checks] == [
        "pair 0: reproduction",
        "pair 0: step_health",
        "pair 1: reproduction",
        "pair 1: step_health",
        "joint_step_health",  # independent pairs: together as each alone, so it holds as both do
    ]
    assert both.check("joint_step_health").passed and both.suggested_gamma is None
    assert "var_list[1][0], var_list[1][1]" in str(both)


def test_check_natgrad__var_list_with_data_and_a_failing_pair():
    from natgrad_diag.demo import make_model

    model, (X, Y) = make_model("svgp", "bernoulli", num_inducing=5, num_data=20)
    data = (tf.constant(X), tf.constant(Y))
    report = check_natgrad(model.training_loss, var_list=[(model.q_mu, model.q_sqrt)], data=data, gamma=5.0)
    (r,) = report.pairs
    assert not report.passed and not r.check("step_health").passed
    assert r.suggested_gamma is not None and r.suggested_gamma < 5.0
    assert r.check("reproduction").passed  # GPflow's update fails too, or agrees
    assert r.loss_before == pytest.approx(float(model.training_loss(data).numpy()), rel=1e-12)  # the data were used
    # the oracle: GPflow's optimizer at gamma = 5 breaks a copy of the pair (raises or gives non-finite values)
    import gpflow

    copy_ = gpflow.utilities.deepcopy(model)
    try:
        NaturalGradient(5.0).minimize(lambda: copy_.training_loss(data), [(copy_.q_mu, copy_.q_sqrt)])
        assert not np.all(np.isfinite(copy_.q_sqrt.numpy()))
    except tf.errors.InvalidArgumentError:
        pass
    # one pair: the report's suggestion is the pair's, and GPflow's optimizer trains a copy with it
    assert report.suggested_gamma == r.suggested_gamma and report.pair_suggestions() == [r.suggested_gamma]
    copy_ = gpflow.utilities.deepcopy(model)
    losses = [float(copy_.training_loss(data))]
    for _ in range(20):
        NaturalGradient(report.suggested_gamma).minimize(lambda: copy_.training_loss(data), [(copy_.q_mu, copy_.q_sqrt)])
        losses.append(float(copy_.training_loss(data)))
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_check_natgrad__var_list_must_hold_parameter_pairs():
    with pytest.raises(UnsupportedModelError, match=r"var_list\[0\]"):
        check_natgrad(lambda: tf.constant(0.0), var_list=[(tf.Variable([[0.0]]), tf.Variable([[[1.0]]]))])


def test_var_list__a_gradient_not_finite_before_any_step_is_one_failed_check_naming_it():
    # sqrt(|q_mu|) at q_mu = 0: a finite loss whose gradient in q_mu is NaN (inf times sign(0) = 0)
    from natgrad_diag.demo import make_model

    model, data = make_model("svgp", "gaussian", num_inducing=4, num_data=10, seed=3)
    model.q_mu.assign(np.zeros_like(model.q_mu.numpy()))

    def loss():
        return model.training_loss(data) + 1e-3 * tf.reduce_sum(tf.sqrt(tf.abs(model.q_mu)))

    before = [v.numpy() for v in model.trainable_variables]
    report = check_natgrad(loss, var_list=[(model.q_mu, model.q_sqrt)], progress=False)
    (pair,) = report.pairs
    assert [(c.name, c.status) for c in pair.checks] == [("finite_gradients", "fail")]
    assert "with respect to var_list[0][0] (4 NaN/Inf)" in pair.checks[0].detail and "var_list[0][1]" not in pair.checks[0].detail
    assert report.status == "fail" and report.suggested_gamma is None
    assert same_bits(before, [v.numpy() for v in model.trainable_variables])
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN"):  # the oracle: GPflow's own step cannot be taken
        NaturalGradient(0.1).minimize(loss, [(model.q_mu, model.q_sqrt)])


@pytest.mark.parametrize("connected", ["neither", "q_mu only"])
def test_var_list__a_loss_that_does_not_depend_on_a_pair_is_refused_naming_it(connected):
    """GPflow's own optimizer cannot step a parameter the loss does not depend on (its gradient is None); the check
    used to read the missing gradient as zero and pass. Oracle: GPflow's NaturalGradient.minimize raises."""
    from natgrad_diag.demo import make_model
    from natgrad_diag.exceptions import UnconnectedGradientError

    model, data = make_model("svgp", "bernoulli", num_inducing=4, num_data=12, seed=1)
    other, _ = make_model("svgp", "bernoulli", num_inducing=4, num_data=12, seed=2)
    loss = other.training_loss_closure(data)  # the other model's loss: a copy-paste slip
    if connected == "q_mu only":
        loss = lambda: other.training_loss(data) + tf.reduce_sum(model.q_mu**2)  # noqa: E731
    before = [v.numpy() for v in model.variables]
    unused = "var_list[0][0]" if connected == "neither" else "var_list[0][1]"
    with pytest.raises(UnconnectedGradientError, match=rf"loss_fn does not depend on {re.escape(unused)}") as raised:
        check_natgrad(loss, var_list=[(model.q_mu, model.q_sqrt)], progress=False)
    assert "pass the loss of the model that holds the pair" in str(raised.value)
    assert same_bits(before, [v.numpy() for v in model.variables])
    with pytest.raises(ValueError):
        NaturalGradient(0.5).minimize(loss, [(model.q_mu, model.q_sqrt)])


def test_var_list__a_pair_listed_twice_is_refused_as_gpflow_would_step_it_twice():
    """Oracle: GPflow's minimize with the pair listed twice moves q_mu elsewhere than with it listed once."""
    import gpflow

    from natgrad_diag import NatGradMonitor
    from natgrad_diag.demo import make_model
    from natgrad_diag.exceptions import InputError

    model, data = make_model("svgp", "bernoulli", num_inducing=4, num_data=12, seed=1)
    loss = model.training_loss_closure(data)
    for var_list in ([(model.q_mu, model.q_sqrt)] * 2, [(model.q_mu, model.q_sqrt), (model.q_mu, gpflow.Parameter(model.q_sqrt.numpy()))]):
        with pytest.raises(InputError, match=r"var_list\[1\]\[0\] is var_list\[0\]\[0\] again: NaturalGradient.minimize would step it twice"):
            check_natgrad(loss, var_list=var_list, progress=False)
    with pytest.raises(InputError, match=r"var_list\[1\]\[0\] is var_list\[0\]\[0\] again"):
        NatGradMonitor(model, data, var_list=[(model.q_mu, model.q_sqrt)] * 2)
    once, twice = gpflow.utilities.deepcopy(model), gpflow.utilities.deepcopy(model)
    NaturalGradient(0.5).minimize(once.training_loss_closure(data), [(once.q_mu, once.q_sqrt)])
    NaturalGradient(0.5).minimize(twice.training_loss_closure(data), [(twice.q_mu, twice.q_sqrt)] * 2)
    assert np.abs(once.q_mu.numpy() - twice.q_mu.numpy()).max() > 1e-3


def test_var_list__a_loss_that_raises_is_an_input_error_naming_loss_fn():
    from natgrad_diag.demo import make_model
    from natgrad_diag.exceptions import InputError

    model, (X, Y) = make_model("svgp", "bernoulli", num_inducing=4, num_data=12, seed=1)
    pairs = [(model.q_mu, model.q_sqrt)]
    with pytest.raises(InputError, match=r"loss_fn\(\) raised an error\.") as raised:
        check_natgrad(lambda: model.training_loss(X), var_list=pairs, progress=False)  # X alone: not the data tuple
    assert re.search(r"Error: +\w*Error", str(raised.value)) and "To fix: call loss_fn yourself" in str(raised.value)
    with pytest.raises(InputError, match=r"loss_fn\(\) raised an error on data\.\n.*\n +Error: +ZeroDivisionError"):
        check_natgrad(lambda data: 1 / 0, var_list=pairs, data=(X, Y), progress=False)


@pytest.mark.slow  # 10 s, as the two-pair test above
def test_var_list__pairs_gpflow_cannot_step_in_one_call_get_an_inconclusive_joint_check_not_a_traceback():
    """Two SVGPs with M = 4 and M = 3: GPflow's NaturalGradient.minimize(loss, var_list) declares one M for every pair
    and refuses them (the oracle, below); the joint check ran that call and raised check_shapes' ShapeMismatchError.
    Each pair's own checks still run; the joint one is WARN and says to step the pairs one minimize each."""
    from check_shapes.exceptions import CheckShapesError

    from natgrad_diag.demo import make_model

    a, (Xa, Ya) = make_model("svgp", "bernoulli", num_inducing=4, num_data=12, seed=1)
    b, (Xb, Yb) = make_model("svgp", "gaussian", num_inducing=3, num_data=10, seed=2)
    loss = lambda: a.training_loss((Xa, Ya)) + b.training_loss((Xb, Yb))  # noqa: E731
    pairs = [(m.q_mu, m.q_sqrt) for m in (a, b)]
    before = [v.numpy().copy() for m in (a, b) for v in m.variables]
    report = check_natgrad(loss, var_list=pairs, gamma=0.5, progress=False)
    assert same_bits(before, [v.numpy() for m in (a, b) for v in m.variables])
    joint = report.check("joint_step_health")
    assert joint.status == "warn" and "one minimize per pair" in joint.detail, joint
    assert [c.status for c in report.checks if c.name.startswith("pair")] == ["pass"] * 4
    # the var_list form knows no model: no whiten, and GPflow's step is taken on the pair itself (restored after)
    assert report.pairs[0].whiten is None and "whiten=" not in str(report)
    assert all(c.claim.endswith("assigns to the pair (restored after)") for c in report.checks if c.name.endswith("reproduction"))
    with pytest.raises(CheckShapesError):
        NaturalGradient(0.5).minimize(loss, pairs)
