"""NatGradMonitor.guard around a user's own NaturalGradient step: GPflow #820, the heteroskedastic blow-up, Adam moving q(u)."""

from __future__ import annotations

import contextlib
import warnings

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from _user_models import branchy_copy, gpflow_losses, heteroskedastic_svgp, multiclass_svgp, same_bits, variables_of
from gpflow.keras import tf_keras
from gpflow.optimizers import NaturalGradient

from natgrad_diag import NatGradMonitor, check_natgrad
from natgrad_diag.demo import make_model
from natgrad_diag.exceptions import InputError, NatGradCheckError, ShapeMismatchError, UnsupportedModelError
from natgrad_diag.report.timeline import timeline_of
from natgrad_diag.training.guard import lower_gamma
from natgrad_diag.training.records import GuardRecord


def _q_values(model) -> list[np.ndarray]:
    return [model.q_mu.unconstrained_variable.numpy().copy(), model.q_sqrt.unconstrained_variable.numpy().copy()]


def _natgrad_step(natgrad, model, data):
    natgrad.minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])


def _natgrad_only(model_and_data):
    """The model with q(u) not trainable, as GPflow's recipe trains it (natural gradients step q(u), nothing else)."""
    model, data = model_and_data
    gpflow.set_trainable(model.q_mu, False)
    gpflow.set_trainable(model.q_sqrt, False)
    return model, data


def _bernoulli():
    """An SVGP with a Bernoulli likelihood (M = 10, N = 50) whose first GPflow NaturalGradient(5) step raises."""
    model, data = make_model("svgp", "bernoulli", num_inducing=10, num_data=50)
    return _natgrad_only((model, tuple(tf.constant(a) for a in data)))


def _searched_gamma(model, data, gamma: float) -> float:
    """The oracle for the γ a rollback sets: check_natgrad's suggestion on a deep copy (the next grid γ when it has none
    below ``gamma``)."""
    suggested = check_natgrad(gpflow.utilities.deepcopy(model), data, gamma=gamma, mode="fast", progress=False).suggested_gamma
    return suggested if suggested is not None and suggested < gamma else lower_gamma(gamma)


@pytest.mark.slow
def test_guard__gpflow_820_multiclass_trains_with_rollback_to_a_lower_finite_loss():
    model, data = multiclass_svgp()
    copy_ = gpflow.utilities.deepcopy(model)
    with pytest.raises(tf.errors.InvalidArgumentError):  # the oracle: GPflow's own first step at γ = 0.1 raises
        _natgrad_step(NaturalGradient(0.1), copy_, data)
    start = float(model.training_loss(data).numpy())
    natgrad = NaturalGradient(tf.Variable(0.1, dtype=tf.float64))
    with pytest.warns(UserWarning, match="model.q_mu, model.q_sqrt are trainable"):  # GPflow #820's loop has no Adam
        monitor = NatGradMonitor(model, data, gamma=0.1, on_failure="rollback")
    q0, others0 = _q_values(model), [v.numpy().copy() for v in model.kernel.variables]
    with monitor.guard(0, natgrad):
        _natgrad_step(natgrad, model, data)  # raises inside: swallowed under rollback
    first = monitor.guard_records[0]
    assert isinstance(first, GuardRecord)
    assert same_bits(q0, _q_values(model)) and same_bits(others0, [v.numpy() for v in model.kernel.variables])
    searched = _searched_gamma(model, data, 0.1)
    assert (first.status, first.rolled_back, first.gamma_before, first.gamma_after) == ("failed", True, 0.1, searched)
    assert first.cause.startswith("the step raised InvalidArgumentError")
    assert float(natgrad.gamma.numpy()) == searched == monitor.gamma and searched < 0.1
    for step in range(1, 4):
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
    end = float(model.training_loss(data).numpy())
    assert np.isfinite(end) and end < start
    assert [r.status for r in monitor.guard_records[1:]] == ["ok"] * 3 and monitor.rollbacks == 1
    # the guarded run is GPflow's own run at the searched γ, bit for bit: the guard changed nothing else
    oracle, _ = multiclass_svgp()
    plain = NaturalGradient(searched)
    for _ in range(3):
        _natgrad_step(plain, oracle, data)
    assert same_bits(_q_values(oracle), _q_values(model))


@pytest.mark.slow
def test_guard__rollback_jumps_to_the_gamma_the_search_measured():
    model, data = _bernoulli()
    with pytest.raises(tf.errors.InvalidArgumentError):  # the oracle: GPflow's own step at γ = 5 raises
        _natgrad_step(NaturalGradient(5.0), gpflow.utilities.deepcopy(model), data)
    monitor = NatGradMonitor(model, data, gamma=5.0, on_failure="rollback")
    natgrad = NaturalGradient(tf.Variable(5.0, dtype=tf.float64))
    q0 = _q_values(model)
    with monitor.guard(0, natgrad):
        _natgrad_step(natgrad, model, data)
    (r,) = monitor.guard_records
    assert same_bits(q0, _q_values(model)) and r.rolled_back and r.status == "failed"
    searched = _searched_gamma(model, data, 5.0)
    assert r.gamma_after == float(natgrad.gamma.numpy()) == monitor.gamma == searched < 5.0
    assert r.loss_after == pytest.approx(r.loss_before, rel=1e-12)  # q(u) restored, nothing else moved
    copy_ = gpflow.utilities.deepcopy(model)
    before = float(copy_.training_loss(data).numpy())
    _natgrad_step(NaturalGradient(searched), copy_, data)  # GPflow's step at the searched γ does not raise ...
    assert float(copy_.training_loss(data).numpy()) < before  # ... and lowers the loss


def test_guard__raise_names_the_cause_and_a_gamma_and_leaves_q_as_the_step_left_it():
    model, data = _natgrad_only(multiclass_svgp())
    monitor = NatGradMonitor(model, data, gamma=0.1, on_failure="raise")
    natgrad = NaturalGradient(0.1)
    with pytest.raises(NatGradCheckError) as info, monitor.guard(7, natgrad):
        _natgrad_step(natgrad, model, data)
    text = str(info.value)
    assert "training step 7 (gamma = 0.1) failed: the step raised InvalidArgumentError" in text
    assert "To fix: use gamma = 0.03" in text
    assert natgrad.gamma == 0.1 and not monitor.guard_records[0].rolled_back
    oracle, _ = _natgrad_only(multiclass_svgp())  # GPflow's own raising step, unguarded: q(u) as it leaves it
    with pytest.raises(tf.errors.InvalidArgumentError):
        _natgrad_step(NaturalGradient(0.1), oracle, data)
    assert same_bits(_q_values(oracle), _q_values(model))
    oracle, _ = _natgrad_only(multiclass_svgp())  # the oracle for the γ named: GPflow's own step at 0.03 trains
    start = float(oracle.training_loss(data).numpy())
    _natgrad_step(NaturalGradient(0.03), oracle, data)
    assert float(oracle.training_loss(data).numpy()) < start


def test_guard__warn_warns_and_lets_the_error_through():
    model, data = _natgrad_only(multiclass_svgp())
    monitor = NatGradMonitor(model, data, gamma=0.1)  # on_failure="warn" by default
    natgrad = NaturalGradient(0.1)
    with (
        pytest.warns(UserWarning, match="training step 0 failed"),
        pytest.raises(tf.errors.InvalidArgumentError),
        monitor.guard(0, natgrad),
    ):
        _natgrad_step(natgrad, model, data)
    assert monitor.guard_records[0].status == "failed" and natgrad.gamma == 0.1


@pytest.mark.slow
def test_guard__python_float_gamma_is_set_with_a_retrace_warning():
    model, data = _bernoulli()
    monitor = NatGradMonitor(model, data, gamma=5.0, on_failure="rollback")
    natgrad = NaturalGradient(5.0)
    with pytest.warns(UserWarning, match="traced again"), monitor.guard(0, natgrad):
        _natgrad_step(natgrad, model, data)
    assert natgrad.gamma == monitor.gamma == monitor.guard_records[0].gamma_after < 5.0


@pytest.mark.slow
def test_guard__heteroskedastic_blow_up_is_flagged_and_rolled_back():
    model, data = _natgrad_only(heteroskedastic_svgp())
    start = float(model.training_loss(data).numpy())
    flagged = NatGradMonitor(gpflow.utilities.deepcopy(model), data, gamma=1.0)
    natgrad = NaturalGradient(1.0)
    with flagged.guard(0, natgrad):
        _natgrad_step(natgrad, flagged.model, data)
    with pytest.warns(UserWarning, match="the loss rose from"), flagged.guard(1, natgrad):
        _natgrad_step(natgrad, flagged.model, data)
    bad = flagged.guard_records[1]
    assert bad.status == "failed" and bad.loss_after > 20 * bad.loss_before  # GPflow's own numbers: 115 → 5746
    monitor = NatGradMonitor(model, data, gamma=1.0, on_failure="rollback")
    natgrad = NaturalGradient(tf.Variable(1.0, dtype=tf.float64))
    for step in range(4):
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
    end = float(model.training_loss(data).numpy())
    assert monitor.rollbacks >= 1 and monitor.guard_records[1].rolled_back
    assert np.isfinite(end) and end < start and all(r.loss_after <= r.loss_before * 1.5 for r in monitor.guard_records)


def test_guard__a_healthy_step_is_untouched_and_recorded_ok():
    model, data = _natgrad_only(heteroskedastic_svgp())
    oracle = gpflow.utilities.deepcopy(model)
    monitor = NatGradMonitor(model, data, gamma=0.1, on_failure="rollback")
    natgrad = NaturalGradient(0.1)
    with monitor.guard(0, natgrad):
        _natgrad_step(natgrad, model, data)
    _natgrad_step(NaturalGradient(0.1), oracle, data)
    assert same_bits(variables_of(oracle), variables_of(model))
    (r,) = monitor.guard_records
    assert (r.status, r.rolled_back, r.gamma_after, r.cause, r.moved_by_other) == ("ok", False, 0.1, "", ())
    assert r.loss_after == float(model.training_loss(data).numpy())


def test_guard__a_model_with_python_control_flow_on_a_tensor_is_guarded_like_gpflows_own_training():
    """The guard's compiled loss call is traced again with AutoGraph for such a model (plain SVGP as the oracle)."""
    plain, data = _natgrad_only(make_model("svgp", "gaussian", num_inducing=8, num_data=30))
    data = tuple(tf.constant(a) for a in data)
    model, _ = _natgrad_only((branchy_copy(plain), data))
    monitor = NatGradMonitor(model, data, gamma=0.5, on_failure="raise")
    natgrad = NaturalGradient(0.5)
    for step in range(3):
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
        _natgrad_step(NaturalGradient(0.5), plain, data)
    assert [r.status for r in monitor.guard_records] == ["ok"] * 3
    assert monitor.guard_records[-1].loss_after == pytest.approx(float(plain.training_loss(data).numpy()), rel=1e-12)


def test_lower_gamma__walks_down_the_grid():
    assert [lower_gamma(g) for g in (1.0, 0.5, 0.1, 0.07, 0.001)] == [0.3, 0.3, 0.03, 0.03, 0.0005]


@pytest.mark.parametrize(
    ("kw", "arg"),
    [
        ({"on_failure": "ignore"}, "on_failure"),
        ({"loss_increase": -1.0}, "loss_increase"),
        ({"loss_increase": float("nan")}, "loss_increase"),
    ],
)
def test_monitor__bad_guard_options_are_input_errors(kw, arg):
    model, data = multiclass_svgp(num_data=10, num_inducing=3)
    with pytest.raises(InputError, match=arg):
        NatGradMonitor(model, data, **kw)


# --------------------------------------------------------------------------------------------------
# another optimizer moving q(u)
# --------------------------------------------------------------------------------------------------


def _train_with_adam(all_variables: bool) -> NatGradMonitor:
    from natgrad_diag.demo import make_model

    model, (X, Y) = make_model("svgp", "bernoulli", num_inducing=5, num_data=20)
    data = (tf.constant(X), tf.constant(Y))
    if not all_variables:
        gpflow.set_trainable(model.q_mu, False)
        gpflow.set_trainable(model.q_sqrt, False)
    monitor = NatGradMonitor(model, data, gamma=0.1, loss_increase=float("inf"))
    natgrad, adam = NaturalGradient(0.1), tf_keras.optimizers.Adam(0.01)
    for step in range(3):
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
        adam.minimize(lambda: model.training_loss(data), model.trainable_variables)
    return monitor


def test_guard__adam_over_all_variables_moving_q_is_reported_once_with_the_fix():
    with pytest.warns(UserWarning) as caught:
        monitor = _train_with_adam(all_variables=True)
    trainable = [str(w.message) for w in caught if "are trainable" in str(w.message)]
    assert len(trainable) == 1  # named at construction, before any step
    assert "gpflow.set_trainable(model.q_mu, False); gpflow.set_trainable(model.q_sqrt, False)" in trainable[0]
    moved = [str(w.message) for w in caught if "something other than" in str(w.message)]
    assert len(moved) == 1  # warned once
    assert "model.q_mu, model.q_sqrt" in moved[0]
    assert "gpflow.set_trainable(model.q_mu, False); gpflow.set_trainable(model.q_sqrt, False)" in moved[0]
    assert [r.moved_by_other for r in monitor.guard_records] == [
        (),
        ("model.q_mu", "model.q_sqrt"),
        ("model.q_mu", "model.q_sqrt"),
    ]


def test_guard__adam_over_hyperparameters_only_is_not_reported():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at construction or at any step
        monitor = _train_with_adam(all_variables=False)
    assert all(r.moved_by_other == () for r in monitor.guard_records) and len(monitor.guard_records) == 3


@pytest.mark.slow
def test_guard__natgrad_diags_own_optimizer_is_rolled_back_the_same_way():
    import natgrad_diag

    model, data = _bernoulli()
    natgrad = natgrad_diag.NaturalGradient(tf.Variable(5.0, dtype=tf.float64))
    monitor = NatGradMonitor(model, data, gamma=5.0, on_failure="rollback")
    q0 = _q_values(model)
    with monitor.guard(0, natgrad):
        _natgrad_step(natgrad, model, data)
    (r,) = monitor.guard_records
    assert r.rolled_back and r.gamma_after == float(natgrad.gamma.numpy()) == monitor.gamma < 5.0
    assert same_bits(q0, _q_values(model))


def test_guard__docstring_examples_run():
    import doctest

    from natgrad_diag.training import guard
    from natgrad_diag.checks import health

    for module in (guard, health):
        result = doctest.testmod(module)
        assert result.attempted >= 1 and result.failed == 0, module.__name__


# --------------------------------------------------------------------------------------------------
# what the guard costs: one loss evaluation per step, compiled when safe
# --------------------------------------------------------------------------------------------------


def _counting_loss(model, data, traceable: bool):
    """The training loss and a list counting its Python calls (a traced call runs the Python once, at tracing)."""
    calls = []

    def loss():
        calls.append(1)
        value = model.training_loss(data)
        return value if traceable else tf.constant(float(value.numpy()), tf.float64)  # .numpy(): not traceable

    return loss, calls


@pytest.mark.parametrize("traceable", [True, False], ids=["compiled", "eager"])
def test_guard__one_loss_evaluation_per_step_and_the_loss_after_is_the_next_loss_before(traceable):
    model, data = _bernoulli()
    loss, calls = _counting_loss(model, data, traceable)
    monitor = NatGradMonitor(model, data, gamma=0.5, loss_fn=loss)
    natgrad = NaturalGradient(0.5)
    with monitor.guard(0, natgrad):
        _natgrad_step(natgrad, model, data)
    start = len(calls)
    for step in range(1, 5):
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
    assert len(calls) - start == (0 if traceable else 4)  # compiled: no Python call after tracing; eager: one a step
    records = monitor.guard_records
    assert all(a.loss_after == b.loss_before for a, b in zip(records, records[1:]))
    assert records[-1].loss_after == pytest.approx(float(model.training_loss(data).numpy()), rel=1e-12)


@pytest.mark.slow
def test_guard__minibatches_of_two_sizes_and_data_changed_in_place_give_gpflows_own_loss():
    """The compiled loss is called through one concrete function per batch shape: each guarded step's loss after is
    GPflow's eager training_loss on that step's batch (two batch sizes, then the same arrays overwritten in place)."""
    model, (X, Y) = _natgrad_only(_bernoulli())
    X, Y = X.numpy(), Y.numpy()
    batches = [(X[:20].copy(), Y[:20].copy()), (X[:35].copy(), Y[:35].copy()), (X[:20].copy(), Y[:20].copy())]
    current = [batches[0]]
    monitor = NatGradMonitor(model, lambda: current[0], gamma=0.5, loss_increase=np.inf)
    natgrad = NaturalGradient(0.1)
    for step, batch in enumerate(batches + [batches[0]]):
        if step == 3:  # the first batch's own arrays, overwritten: the loss must follow the new values
            batch[0][:] = X[20:40]
            batch[1][:] = Y[20:40]
        current[0] = batch
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, batch)
        expected = float(model.training_loss(batch).numpy())
        assert monitor.guard_records[-1].loss_after == pytest.approx(expected, rel=1e-12), step


@pytest.mark.slow  # 6 s each; test_custom_step's test_guard_verify__catches_a_wrong_optimizer_* runs verify by default
@pytest.mark.parametrize("wrong", [False, True], ids=["gpflow", "default_seed"])
@pytest.mark.parametrize("natgrad_first", [True, False], ids=["natgrad_then_adam", "adam_then_natgrad"])
def test_guard_verify__an_adam_step_in_the_block_is_accounted_for(natgrad_first, wrong):
    """docs/training.md's loop runs NaturalGradient and Adam in one compiled step inside the guard. verify=True judges
    the natural-gradient step with the hyperparameters it saw: GPflow's own optimizer passes every step, in either
    order, and trains bit for bit as the unguarded loop on a copy; the question's optimizer is named at its first
    step. Judged with the hyperparameters Adam left, GPflow's optimizer failed and every step was rolled back."""
    from test_custom_step import _SeedMistakeNatGrad

    model, data = _bernoulli()
    copy = gpflow.utilities.deepcopy(model)

    def loop(m):
        opt, adam = kind(tf.Variable(0.1, dtype=tf.float64), name="natgrad"), tf_keras.optimizers.Adam(0.01)
        loss = m.training_loss_closure(data, compile=False)
        parts = [lambda: opt.minimize(loss, [(m.q_mu, m.q_sqrt)]), lambda: adam.minimize(loss, m.trainable_variables)]

        @tf.function
        def step():
            for part in parts if natgrad_first else parts[::-1]:
                part()

        return step, opt

    kind = _SeedMistakeNatGrad if wrong else NaturalGradient
    (step, opt), (plain, _) = loop(model), loop(copy)
    monitor = NatGradMonitor(model, data, gamma=0.1, on_failure="rollback")
    for i in range(3):
        with monitor.guard(i, opt, verify=True):
            step()
        plain()
    records = monitor.guard_records
    if wrong:
        assert not records[0].passed and "'default_seed'" in records[0].cause
    else:
        assert [r.passed for r in records] == [True] * 3 and monitor.rollbacks == 0
        assert same_bits(variables_of(model), variables_of(copy))


@pytest.mark.parametrize("case, argument", [
    ("no_data", "data"), *(pytest.param(c, a, marks=pytest.mark.slow) for c, a in (("one_part", "data"), ("wrong_D", "data[0] (X)"),
    ("batch_of_none", "data"), ("loss_with_an_argument", "loss_fn"), ("tf_data_iterator", "data"), ("vector_loss", "loss_fn"))),
])  # fmt: skip
def test_guard__data_and_loss_fn_it_cannot_evaluate_are_input_errors_naming_them(case, argument):
    """Each was a raw TypeError or ValueError from inside the guard's compiled loss; check_natgrad names the same data."""
    model, (X, Y) = _bernoulli()
    kw = {"no_data": dict(data=None), "one_part": dict(data=(X,)), "wrong_D": dict(data=(tf.concat([X, X], 1), Y)),
          "batch_of_none": dict(data=lambda: None), "tf_data_iterator": dict(data=iter(tf.data.Dataset.from_tensor_slices((X, Y)).batch(10))),
          "vector_loss": dict(data=(X, Y), loss_fn=lambda: model.training_loss((X, Y)) * tf.ones(3, tf.float64)),
          "loss_with_an_argument": dict(data=(X, Y), loss_fn=lambda d: model.training_loss(d))}[case]  # fmt: skip
    natgrad = NaturalGradient(0.1)
    with pytest.raises(InputError) as info:
        monitor = NatGradMonitor(model, **kw)
        with monitor.guard(0, natgrad):
            _natgrad_step(natgrad, model, (X, Y))
    assert ("Argument: " + argument) in str(info.value)


def test_monitor__a_swapped_pair_a_q_diag_model_and_a_var_list_of_no_pairs_are_refused_at_construction():
    """Each was accepted until the first periodic check; a guard meanwhile took q_mu's diagonal as q_sqrt's."""
    model, data = _bernoulli()
    with pytest.raises(ShapeMismatchError, match="the pair is swapped"):
        NatGradMonitor(model, data, var_list=[(model.q_sqrt, model.q_mu)], loss_fn=lambda: model.training_loss(data))
    with pytest.raises(UnsupportedModelError, match="var_list"):
        NatGradMonitor(model, data, var_list=5, loss_fn=lambda: model.training_loss(data))
    diag = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Bernoulli(), data[0][:5], q_diag=True)
    with pytest.raises(UnsupportedModelError, match="q_diag=True"):
        NatGradMonitor(diag, data)
    with pytest.raises(InputError, match="raise_on_failure must be True or False"):
        NatGradMonitor(model, data, raise_on_failure="yes")


@pytest.mark.slow
def test_guard__gamma_climbs_back_only_to_a_searched_gamma_never_above_the_first():
    from natgrad_diag.training.guard import RAISE_AFTER

    model, data = _bernoulli()
    monitor = NatGradMonitor(model, data, gamma=5.0, on_failure="rollback", loss_increase=float("inf"))
    natgrad = NaturalGradient(tf.Variable(5.0, dtype=tf.float64))
    searches = []  # (guarded step, suggestion) of every search the guard ran: a spy on natgrad-diag's own method
    search = monitor.search
    monitor.search = lambda d, g: searches.append((len(monitor.guard_records), (r := search(d, g)).suggested_gamma)) or r
    for step in range(1 + 2 * RAISE_AFTER):
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
    first, records = monitor.guard_records[0], monitor.guard_records
    assert first.rolled_back and first.gamma_after < 5.0 and searches[0][0] == 0
    # one rule: after RAISE_AFTER healthy steps in a row the guard searches from its γ and moves only up, to the
    # suggestion capped at 5 and below every γ that failed (the next grid value down); a failed step starts the count
    gamma, run, found, cap = first.gamma_after, 0, dict(searches), lower_gamma(5.0)
    for i, r in enumerate(records[1:], start=1):
        assert r.gamma_before == gamma
        run = 0 if not r.passed else run + 1
        if not r.passed:
            cap = min(cap, lower_gamma(r.gamma_before))
        if r.rolled_back:
            gamma, run = r.gamma_after, 0
        elif run >= RAISE_AFTER and gamma < cap:
            assert i in found  # the search ran at this step
            s_ = found[i]
            gamma, run = (min(s_, cap) if s_ is not None and s_ > gamma else gamma), 0
        assert r.gamma_after == gamma
    assert monitor.gamma == gamma == float(natgrad.gamma.numpy()) and max(r.gamma_after for r in records[1:]) < 5.0
    assert len(searches) >= 2  # the rollback's, and at least one after a healthy run

def test_guard__gamma_is_never_raised_back_to_one_that_failed():
    # On minibatches a γ can train for k steps on the batch a search sees and still fail on the next one; raising back
    # to it made training fail, roll back and search again every RAISE_AFTER steps (the slow minibatch test below).
    # Here step 0 fails at γ = 1 (a NaN check, as GPflow's assignment of a NaN q(u) raises): the rollback sets 0.3,
    # the grid value below, and RAISE_AFTER healthy steps later the guard does not search to raise γ back to 1.
    from natgrad_diag.training.guard import RAISE_AFTER

    model, data = _natgrad_only(make_model("svgp", "gaussian", num_data=30))
    data = tuple(tf.constant(a) for a in data)
    monitor = NatGradMonitor(model, data, gamma=1.0, on_failure="rollback")
    natgrad = NaturalGradient(tf.Variable(1.0, dtype=tf.float64))
    searched = []  # the γ each search the guard ran started from: a spy on natgrad-diag's own method
    search = monitor.search
    monitor.search = lambda d, g: searched.append(g) or search(d, g)
    for step in range(RAISE_AFTER + 2):
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
            if step == 0:
                tf.debugging.check_numerics(tf.constant(np.nan, tf.float64), "the step blew up")
    first, rest = monitor.guard_records[0], monitor.guard_records[1:]
    assert first.rolled_back and first.gamma_after == lower_gamma(1.0) == 0.3
    assert all(r.passed and r.gamma_after == 0.3 for r in rest) and float(natgrad.gamma.numpy()) == 0.3
    assert searched == [1.0]  # the rollback's search only: none from 0.3 after RAISE_AFTER healthy steps


@pytest.mark.parametrize("on_failure", ["warn", "rollback"])
def test_guard__a_gamma_the_loop_lowered_is_never_raised(on_failure):
    # A researcher's decay: γ = 1 at step 0, then the loop sets 0.01. Nothing failed, so the guard set no γ; it used to
    # search after RAISE_AFTER healthy steps and raise γ to the suggestion (1), even under the default "warn".
    from natgrad_diag.training.guard import RAISE_AFTER

    model, data = _bernoulli()
    monitor = NatGradMonitor(model, data, gamma=1.0, on_failure=on_failure)
    natgrad = NaturalGradient(tf.Variable(1.0, dtype=tf.float64))
    searched = []  # the γ each search started from: a spy on natgrad-diag's own method
    search = monitor.search
    monitor.search = lambda d, g: searched.append(g) or search(d, g)
    for step in range(RAISE_AFTER + 3):
        if step == 1:
            natgrad.gamma.assign(0.01)
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
    assert float(natgrad.gamma.numpy()) == 0.01 and searched == []
    assert all(r.passed and r.gamma_after == 0.01 for r in monitor.guard_records[1:])


def _assert_held_after_the_first_rollback(monitor, model, data, restored, held: float) -> None:
    """Step 0 failed and was rolled back, every later step passed at the held γ, and q(u) is, bit for bit, GPflow's own
    optimizer at that γ run from the restored q(u), one step per later guarded step (the oracle)."""
    first, rest = monitor.guard_records[0], monitor.guard_records[1:]
    assert first.rolled_back and held < 5.0 and monitor.rollbacks == 1
    assert all(r.passed and r.gamma_before == r.gamma_after == held for r in rest)
    oracle = NaturalGradient(held)
    for _ in rest:
        _natgrad_step(oracle, restored, data)
    assert same_bits(_q_values(restored), _q_values(model))


def test_guard__a_schedule_that_sets_a_failing_gamma_at_every_step_is_held_at_the_gamma_the_guard_set():
    # The loop assigns γ = 5 before every step (a schedule at its ceiling). Step 0 fails and is rolled back to the
    # searched γ; the loop's 5 used to come back at every step, each one failing, rolled back and searched again.
    model, data = _bernoulli()
    monitor = NatGradMonitor(model, data, gamma=5.0, on_failure="rollback")
    natgrad = NaturalGradient(tf.Variable(5.0, dtype=tf.float64))
    for step in range(4):
        natgrad.gamma.assign(5.0)
        if step == 1:  # the oracle's start: the q(u) the rollback restored, and the γ it set
            restored, held = gpflow.utilities.deepcopy(model), monitor.guard_records[0].gamma_after
        warns = pytest.warns(UserWarning, match="set optimizer.gamma = 5 before training step 1, above the γ = ")
        with warns if step == 1 else contextlib.nullcontext(), monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
    _assert_held_after_the_first_rollback(monitor, model, data, restored, held)


def test_guard__an_optimizer_built_anew_at_every_step_is_held_like_the_one_it_replaces():
    # A researcher's loop that builds NaturalGradient(5.0) inside the loop. The guard kept its γ per id(optimizer): each
    # new object had no γ the guard set, so all 12 steps of this loop failed and were rolled back (and an object
    # reusing a freed id inherited another's state). The guard's state is per slot of the optimizers it guards.
    model, data = _bernoulli()
    monitor = NatGradMonitor(model, data, gamma=5.0, on_failure="rollback")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the held-γ and Python-number-γ warnings (tested above)
        for step in range(4):
            if step == 1:  # the oracle's start: the q(u) the rollback restored, and the γ it set
                restored, held = gpflow.utilities.deepcopy(model), monitor.guard_records[0].gamma_after
            natgrad = NaturalGradient(5.0)
            with monitor.guard(step, natgrad):
                _natgrad_step(natgrad, model, data)
    _assert_held_after_the_first_rollback(monitor, model, data, restored, held)


def test_guard__a_gamma_set_inside_the_block_is_the_one_judged_recorded_and_searched_from():
    # A schedule inside the step function: the block sets γ = 5 and steps. The guard read γ = 0.1 before the block,
    # so its record named 0.1 for a step taken at 5, and its search started from 0.1. It reads γ again after the block
    # and warns once that a γ it sets will be overwritten. Oracle: GPflow's own NaturalGradient(5) raises from this q(u).
    model, data = _bernoulli()
    with pytest.raises(tf.errors.InvalidArgumentError):
        _natgrad_step(NaturalGradient(5.0), gpflow.utilities.deepcopy(model), data)
    monitor = NatGradMonitor(model, data, gamma=0.1, on_failure="rollback")
    natgrad = NaturalGradient(tf.Variable(0.1, dtype=tf.float64))
    searched = []  # the γ each search started from: a spy on natgrad-diag's own method
    search = monitor.search
    monitor.search = lambda d, g: searched.append(g) or search(d, g)
    for step in range(2):
        warns = pytest.warns(UserWarning, match=r"changed inside the guarded block at training step 0 \(0.1 → 5\)")
        with warns if step == 0 else contextlib.nullcontext(), monitor.guard(step, natgrad):
            natgrad.gamma.assign(5.0)
            _natgrad_step(natgrad, model, data)
    assert [(r.status, r.gamma_before) for r in monitor.guard_records] == [("failed", 5.0), ("failed", 5.0)]
    assert searched == [5.0, 5.0] and all(r.rolled_back and r.gamma_after < 5.0 for r in monitor.guard_records)


@pytest.mark.slow
def test_guard__minibatch_training_at_a_fragile_gamma_does_not_fail_again_and_again():
    # A researcher's loop: a Bernoulli SVGP on 2,000 points in shuffled batches of 200, natural gradients at γ = 1
    # and Adam in one tf.function, the guard rolling back. γ = 1 fails on some batches: after the first failure the
    # guard keeps γ below 1, where raising back to a γ a search measured on one batch failed again every ~25 steps
    # (four rollbacks in these 100 steps). GPflow's own NaturalGradient runs every step.
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, (2000, 1))
    Y = (np.sin(X) + 0.3 * rng.normal(size=X.shape) > 0).astype(float)
    model = gpflow.models.SVGP(gpflow.kernels.Matern52(), gpflow.likelihoods.Bernoulli(), np.linspace(0, 10, 30)[:, None], num_data=2000)
    _natgrad_only((model, None))
    batches = iter(tf.data.Dataset.from_tensor_slices((X, Y)).repeat().shuffle(2000, seed=1).batch(200))
    natgrad, adam = NaturalGradient(tf.Variable(1.0, dtype=tf.float64)), tf_keras.optimizers.Adam(0.01)

    @tf.function
    def step(batch):
        loss = model.training_loss_closure(batch, compile=False)
        natgrad.minimize(loss, [(model.q_mu, model.q_sqrt)])
        adam.minimize(loss, model.trainable_variables)

    batch = [next(batches)]
    monitor = NatGradMonitor(model, lambda: batch[0], gamma=1.0, on_failure="rollback")
    elbo_before = float(model.elbo((X, Y)))
    for i in range(100):
        batch[0] = next(batches)
        with monitor.guard(i, natgrad):
            step(batch[0])
    records = monitor.guard_records
    failed = [r for r in records if not r.passed]
    assert failed and monitor.rollbacks == len(failed) <= 2
    first = records.index(failed[0])
    assert all(r.gamma_before < failed[0].gamma_before for r in records[first + 1:])
    assert float(model.elbo((X, Y))) > elbo_before + 100  # it trains: the full-data ELBO, GPflow's own


@pytest.mark.slow  # the default run's margin; CI's slow stage runs it
def test_guard__verify_judges_the_xi_the_loop_passes_in_var_list():
    # the loop passes XiSqrtMeanVar in var_list and tells the monitor: GPflow's own step is not a 'wrong_xi' mistake
    # (it was, and with rollback the guard undid healthy steps and lowered γ); a step with XiNat still is one
    from gpflow.optimizers import XiNat, XiSqrtMeanVar

    model, data = _natgrad_only(make_model("svgp", "bernoulli", num_inducing=6, num_data=30, seed=2))
    data = tuple(tf.constant(a) for a in data)
    monitor = NatGradMonitor(model, data, gamma=0.3, xi_transform=XiSqrtMeanVar(), on_failure="raise")
    natgrad, loss = NaturalGradient(0.3), model.training_loss_closure(data)
    with monitor.guard(0, natgrad, verify=True):
        natgrad.minimize(loss, [(model.q_mu, model.q_sqrt, XiSqrtMeanVar())])
    assert monitor.guard_records[-1].passed
    with pytest.raises(NatGradCheckError, match="wrong_xi"), monitor.guard(1, natgrad, verify=True):
        natgrad.minimize(loss, [(model.q_mu, model.q_sqrt, XiNat())])


def test_monitor__a_var_list_triples_xi_is_the_one_checked_and_verified():
    """NatGradMonitor(var_list=[(q_mu, q_sqrt, XiSqrtMeanVar())]) dropped the triple's ξ: its periodic check judged
    XiNat's step and passed γ = 1, which GPflow's optimizer with this var_list blows up in a few steps (the oracle), and
    verify called GPflow's own step 'wrong_xi'. At the fresh q(u) verify also warned that the loss was stochastic."""
    from gpflow.optimizers import XiSqrtMeanVar

    rng = np.random.default_rng(3)
    X = rng.uniform(-3, 3, (80, 1))
    Y = (rng.uniform(size=X.shape) < 1 / (1 + np.exp(-2 * np.sin(2 * X)))).astype(float)
    data = (tf.constant(X), tf.constant(Y))
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Bernoulli(), np.linspace(-3, 3, 10)[:, None], num_data=80)
    model, data = _natgrad_only((model, data))
    loss = model.training_loss_closure(data, compile=False)
    var_list = [(model.q_mu, model.q_sqrt, XiSqrtMeanVar())]
    monitor = NatGradMonitor(model, data, gamma=1.0, var_list=var_list, loss_fn=loss)
    monitor(0)
    assert not monitor.records[-1].step_healthy
    copy_ = gpflow.utilities.deepcopy(model)
    oracle, step = [float(copy_.training_loss(data))], NaturalGradient(1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN"):  # a NaN within five steps
        for _ in range(5):
            step.minimize(lambda: copy_.training_loss(data), [(copy_.q_mu, copy_.q_sqrt, XiSqrtMeanVar())])
            oracle.append(float(copy_.training_loss(data)))
    assert oracle[-1] > 1e3 * oracle[0], oracle  # ... after the loss grew a thousandfold
    natgrad = NaturalGradient(tf.Variable(0.1, dtype=tf.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(2):
            with monitor.guard(i, natgrad, verify=True):
                natgrad.minimize(loss, var_list)
    assert [r.status for r in monitor.guard_records] == ["ok", "ok"]


@pytest.mark.slow  # a γ search and GPflow's steps at two γ (6 s)
def test_guard__a_monitor_without_xi_searches_with_the_optimizers():
    # NaturalGradient(γ, xi_transform=XiSqrtMeanVar()) under a monitor given no ξ: the search after the failed first
    # step measured XiNat's steps (which suggested 1, so γ only went one grid value down per rollback: 3 rollbacks). The
    # oracle: GPflow's own optimizer on copies, at the γ the guard set and at the one XiNat's search left (0.3)
    from gpflow.optimizers import XiSqrtMeanVar

    model, data = _natgrad_only(make_model("svgp", "gaussian"))
    data = tuple(tf.constant(a) for a in data)
    monitor = NatGradMonitor(model, data, gamma=0.5, on_failure="rollback")
    opt = NaturalGradient(tf.Variable(0.5, dtype=tf.float64), xi_transform=XiSqrtMeanVar())
    with monitor.guard(0, opt):
        opt.minimize(model.training_loss_closure(data), [(model.q_mu, model.q_sqrt)])
    gamma = float(opt.gamma.numpy())
    assert monitor.rollbacks == 1 and monitor.xi_transform is opt.xi_transform and gamma < lower_gamma(0.5)

    def losses(g):  # GPflow's five steps with ξ = XiSqrtMeanVar on a copy: the losses, None once one raises
        copy = gpflow.utilities.deepcopy(model)
        step, out = NaturalGradient(g, xi_transform=XiSqrtMeanVar()), [float(copy.training_loss(data))]
        for _ in range(5):
            try:
                step.minimize(copy.training_loss_closure(data), [(copy.q_mu, copy.q_sqrt)])
            except tf.errors.InvalidArgumentError:
                return out + [None]
            out.append(float(copy.training_loss(data)))
        return out

    held = losses(gamma)
    assert all(b is not None and b < a for a, b in zip(held, held[1:]))  # every step at the guard's γ lowers the loss
    broke = losses(lower_gamma(0.5))
    assert None in broke or max(broke) > 1e3 * broke[0]  # XiNat's fallback γ blows up within five steps


# rollback: 6.5 s, -m slow; the default run keeps the γ set by a failed check between searches (below)
@pytest.mark.parametrize("on_failure", [pytest.param("rollback", marks=pytest.mark.slow), "warn"])
def test_monitor__a_failed_periodic_check_sets_the_guarded_optimizers_gamma_in_rollback_mode(on_failure):
    """A Student-t SVGP at γ = 1: the first step lowers the loss (121.7 → 86.4) and passes the guard; the periodic
    check after it finds γ = 1's next step fails and suggests a γ. With rollback the monitor sets the optimizer's γ to it
    at once, so the failing step is never taken (before, step 1 failed and was rolled back); "warn" leaves γ alone.
    Oracle: GPflow's optimizer on copies of the model after step 0, at γ = 1 and at the γ set."""
    model, data = make_model("svgp", "studentt", num_inducing=8, num_data=30, seed=1)
    data = tuple(tf.constant(d) for d in data)
    gpflow.set_trainable(model.q_mu, False)
    gpflow.set_trainable(model.q_sqrt, False)
    natgrad = NaturalGradient(tf.Variable(1.0, dtype=tf.float64))
    loss = model.training_loss_closure(data, compile=False)
    monitor = NatGradMonitor(model, data, gamma=1.0, on_failure=on_failure, every=1)
    with monitor.guard(0, natgrad):
        natgrad.minimize(loss, [(model.q_mu, model.q_sqrt)])
    after_step_0 = gpflow.utilities.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "warn" mode's warning for the failed check
        monitor(0)
    record = monitor.records[0]
    assert not record.step_healthy and record.suggested_gamma is not None and record.suggested_gamma < 1.0
    if on_failure == "warn":
        assert record.gamma_set is None and float(natgrad.gamma.numpy()) == monitor.gamma == 1.0
        return
    assert record.gamma_set == float(natgrad.gamma.numpy()) == monitor.gamma == record.suggested_gamma
    assert f"gamma set to {record.gamma_set:g}" in str(record)
    assert (0, "check failed", f"set to {record.gamma_set:g}") in [e[:3] for e in timeline_of(monitor).events()]
    for i in range(1, 4):
        with monitor.guard(i, natgrad):
            natgrad.minimize(loss, [(model.q_mu, model.q_sqrt)])
    assert monitor.rollbacks == 0 and all(r.status == "ok" for r in monitor.guard_records)
    assert np.isnan(gpflow_losses(after_step_0, data, 1.0, 1)[-1])  # the step the monitor kept the loop from taking
    kept = gpflow_losses(after_step_0, data, record.gamma_set, 5)
    assert all(b < a for a, b in zip(kept, kept[1:]))


def test_monitor__a_periodic_check_inside_the_guarded_block_leaves_the_gamma_it_set_for_the_next_check():
    # The researcher calls monitor(i) inside `with monitor.guard(i, natgrad)`. The check at step 0 fails at γ = 1 and
    # sets the optimizer's γ to its suggestion; the guard's exit used to set monitor.gamma back to the 1 it read at
    # entry, so the check at step 1 judged γ = 1, which the optimizer no longer used, and failed (a false alarm).
    # Oracle: GPflow's own optimizer at the γ set, from the q(u) the check at step 1 saw, lowers the loss 5 times.
    model, data = make_model("svgp", "studentt", num_inducing=8, num_data=30, seed=1)
    model, data = _natgrad_only((model, tuple(tf.constant(d) for d in data)))
    natgrad = NaturalGradient(tf.Variable(1.0, dtype=tf.float64))
    monitor = NatGradMonitor(model, data, gamma=1.0, on_failure="rollback", every=1)
    for step in range(2):
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
            if step == 1:
                at_check = gpflow.utilities.deepcopy(model)
            monitor(step)
    first, second = monitor.records
    assert first.gamma_set is not None and first.gamma_set < 1.0
    assert monitor.guard_records[0].gamma_after == monitor.gamma == float(natgrad.gamma.numpy()) == first.gamma_set
    assert second.passed and second.step_healthy, second
    kept = gpflow_losses(at_check, data, first.gamma_set, 5)
    assert all(b < a for a, b in zip(kept, kept[1:]))


@pytest.mark.slow  # ~8 s; the only test of the search between searches (CI runs it); the failed-check rollback test above runs by default
def test_monitor__a_periodic_check_that_fails_between_searches_suggests_a_gamma_measured_now():
    """The check after a search judges γ alone. When that γ fails there, the record's suggestion must be measured on
    the current q(u), not kept from the last search, which suggested the very γ that now fails (a Student-t SVGP whose
    γ = 0.3 holds after a first step (the search there suggests 1); its likelihood scale then drops 0.1 → 0.03, as a hyperparameter step may move it, and
    γ = 0.3's third step raises the loss 82.7 → 240). Before, the record kept the stale 1 and rollback mode set nothing.
    Oracle: GPflow's optimizer on copies, at 0.3 and at the γ set."""
    model, data = make_model("svgp", "studentt", num_inducing=8, num_data=30, seed=1)
    model, data = _natgrad_only((model, tuple(tf.constant(d) for d in data)))
    natgrad = NaturalGradient(tf.Variable(0.3, dtype=tf.float64))
    monitor = NatGradMonitor(model, data, gamma=0.3, on_failure="rollback", every=1)
    with monitor.guard(0, natgrad):
        natgrad.minimize(model.training_loss_closure(data, compile=False), [(model.q_mu, model.q_sqrt)])
    monitor(0)
    assert monitor.records[0].passed and monitor.records[0].suggested_gamma >= 0.3
    model.likelihood.scale.assign(0.03)
    monitor(1)
    record = monitor.records[1]
    assert not record.step_healthy and "no γ searched" not in record.detail
    assert record.suggested_gamma is not None and record.suggested_gamma < 0.3
    assert record.gamma_set == record.suggested_gamma == float(natgrad.gamma.numpy())
    failing = gpflow_losses(model, data, 0.3, 5)
    assert not all(b < a for a, b in zip(failing, failing[1:]))  # γ = 0.3 fails here
    kept = gpflow_losses(model, data, record.gamma_set, 5)
    assert all(b < a for a, b in zip(kept, kept[1:]))


@pytest.mark.slow  # 5.5 s; test_gpflux's rollback of a flipped q_sqrt runs by default
def test_guard__a_q_sqrt_with_a_negative_diagonal_is_rolled_back_because_gpflows_xinat_step_breaks_there():
    """q_sqrt·D, D = diag(±1), is the same q(u) (S unchanged), but GPflow's XiNat step takes q_sqrt for chol(S): from
    the flipped factor its step at γ = 0.5 is NaN where the step from chol(S) lowers the loss. So the guard rolls back a
    step that leaves a diagonal entry ≤ 0 and says which. Oracle: GPflow's optimizer from both factors."""
    model, data = _natgrad_only(make_model("svgp", "gaussian", num_inducing=5, num_data=20, seed=0))
    data = tuple(tf.constant(d) for d in data)
    chol = np.linalg.cholesky(np.eye(5) + 0.1 * np.ones((5, 5)))[None]
    flipped = chol @ np.diag([1.0, -1.0, 1.0, 1.0, -1.0])
    np.testing.assert_allclose(flipped[0] @ flipped[0].T, chol[0] @ chol[0].T, rtol=0, atol=1e-15)

    def gpflow_step(q_sqrt):
        copy = gpflow.utilities.deepcopy(model)
        copy.q_mu.assign(np.full((5, 1), 0.3))
        copy.q_sqrt.assign(q_sqrt)
        before = float(copy.training_loss(data))
        try:
            NaturalGradient(0.5).minimize(copy.training_loss_closure(data), [(copy.q_mu, copy.q_sqrt)])
        except tf.errors.InvalidArgumentError:
            return before, np.nan
        return before, float(copy.training_loss(data))

    (a, b), (c, d) = gpflow_step(chol), gpflow_step(flipped)
    assert a == pytest.approx(c, rel=1e-12) and b < a and np.isnan(d)
    monitor = NatGradMonitor(model, data, gamma=0.5, on_failure="rollback")
    natgrad = NaturalGradient(tf.Variable(0.5, dtype=tf.float64))
    saved = _q_values(model)
    with monitor.guard(0, natgrad):
        model.q_sqrt.assign(model.q_sqrt.numpy() @ np.diag([1.0, -1.0, 1.0, 1.0, -1.0]))
    (record,) = monitor.guard_records
    assert record.rolled_back and "model.q_sqrt has a non-positive diagonal entry model.q_sqrt[0, 1, 1]" in record.cause
    assert same_bits(saved, _q_values(model))


def test_guard__a_stochastic_loss_rising_by_its_noise_is_kept_and_a_blow_up_is_still_rolled_back():
    """A Monte Carlo loss (a GPflux deep GP's −ELBO) differs between two evaluations at one q(u) by its noise; near a
    loss of 0 that noise is far above loss_increase · max(|loss|, 1), and the guard rolled back healthy steps until γ
    was 1e-19. A rise is now also allowed 6·√2·σ̂ (σ̂ measured only when a rise is seen). Here the noise is added to a
    Gaussian SVGP's loss, which GPflow's γ = 1 step takes to its optimum (oracle: GPflow's optimizer on a copy), and
    γ = 30's blow-up still rises beyond it."""
    model, data = _natgrad_only(make_model("svgp", "gaussian", num_inducing=5, num_data=20, seed=1))
    data = tuple(tf.constant(a) for a in data)
    copy_ = gpflow.utilities.deepcopy(model)
    optimum = gpflow_losses(copy_, data, 1.0, 3)
    assert np.all(np.isfinite(optimum)) and abs(optimum[-1] - optimum[1]) < 1e-8  # GPflow: one step to the optimum
    offset, sigma = optimum[-1], 5.0  # the noisy loss is about 0 at the optimum, where 0.5 · max(|loss|, 1) is 0.5
    tf.random.set_seed(3)
    noisy = lambda: model.training_loss(data) - offset + sigma * tf.random.normal([], dtype=tf.float64)  # noqa: E731
    monitor = NatGradMonitor(model, data, gamma=1.0, loss_fn=noisy, on_failure="rollback", every=1000)
    natgrad = NaturalGradient(tf.Variable(1.0, dtype=tf.float64))
    for step in range(12):
        with monitor.guard(step, natgrad):
            _natgrad_step(natgrad, model, data)
    assert monitor.rollbacks == 0 and float(natgrad.gamma.numpy()) == 1.0, [r.cause for r in monitor.guard_records]
    assert float(model.training_loss(data)) == pytest.approx(optimum[-1], abs=1e-8)
    natgrad.gamma.assign(30.0)
    model.q_mu.assign(model.q_mu.numpy() + 3.0)  # away from the optimum, where γ = 30 overshoots it thirty-fold
    with pytest.warns(UserWarning, match="something other than the guarded natural-gradient step changed model.q_mu"):
        with monitor.guard(12, natgrad):
            _natgrad_step(natgrad, model, data)
    last = monitor.guard_records[-1]
    assert last.rolled_back and ("+ 6·√2·σ̂ (the loss's noise)" in last.cause or "raised" in last.cause or "valid" in last.cause), last.cause


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_guard__a_python_number_gamma_that_a_compiled_step_never_sees_is_named_not_lowered_for_ever(compiled):
    """GPflow's NaturalGradient(5.0): the guard sets the Python number γ = 1 after step 0 fails. An eager step uses it
    and trains. A tf.function traced at γ = 5 keeps failing at 5: lowering a γ that never reaches it (1, 0.3, 0.1, ...)
    would go on for ever, each record naming a γ the step did not take. The guard stops at the second failure, names
    the cause and the fix, and leaves q(u) restored. The oracle: GPflow's own optimizer at γ = 1 steps from that q(u)."""
    model, data = _bernoulli()
    natgrad = NaturalGradient(5.0)
    step = tf.function(_natgrad_step) if compiled else _natgrad_step
    monitor = NatGradMonitor(model, data, gamma=5.0, on_failure="rollback")
    with pytest.warns(UserWarning, match="natgrad-diag set optimizer.gamma"), monitor.guard(0, natgrad):
        step(natgrad, model, data)
    assert monitor.guard_records[0].rolled_back and natgrad.gamma < 5.0
    copy_ = gpflow.utilities.deepcopy(model)
    _natgrad_step(NaturalGradient(natgrad.gamma), copy_, data)  # the oracle: GPflow's step at the γ set holds here
    assert np.isfinite(copy_.training_loss(data).numpy())
    before, gamma = _q_values(model), natgrad.gamma
    if not compiled:
        for i in (1, 2):
            with monitor.guard(i, natgrad):
                step(natgrad, model, data)
        assert [r.status for r in monitor.guard_records] == ["failed", "ok", "ok"] and natgrad.gamma == gamma
        return
    with pytest.raises(NatGradCheckError, match=r"did not use it \(or stepped on other data: give NatGradMonitor a data callable(.|\n)*gamma=tf.Variable"), monitor.guard(1, natgrad):
        step(natgrad, model, data)
    assert natgrad.gamma == gamma and monitor.guard_records[-1].gamma_after == gamma
    assert same_bits(_q_values(model), before)
