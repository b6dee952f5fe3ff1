"""NatGradMonitor in short real training runs: records against the model's own loss and GPflow's optimizer."""

from __future__ import annotations

import subprocess
import sys
import warnings

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.keras import tf_keras
from gpflow.optimizers import NaturalGradient

from natgrad_diag import NatGradMonitor, check_natgrad
from natgrad_diag.exceptions import InputError, NatGradCheckError
from natgrad_diag.demo import make_model
from natgrad_diag.training.records import NatGradRecord


def _setup(likelihood: str = "gaussian", **kw):
    model, data = make_model("svgp", likelihood, num_inducing=6, num_data=30, **kw)
    data = tuple(tf.constant(a) for a in data)
    gpflow.set_trainable(model.q_mu, False)
    gpflow.set_trainable(model.q_sqrt, False)
    return model, data


@pytest.mark.slow
def test_monitor__records_every_k_steps_of_a_real_training_run():
    model, data = _setup()
    gamma = 0.5
    monitor = NatGradMonitor(model, data, gamma=gamma, every=2)
    assert isinstance(monitor, gpflow.monitor.MonitorTask)
    natgrad = NaturalGradient(gamma)
    adam = tf_keras.optimizers.Adam(0.01)
    expected = {}
    for step in range(6):
        natgrad.minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])
        adam.minimize(lambda: model.training_loss(data), model.trainable_variables)
        if step % 2 == 0:  # the oracles, computed before the monitor runs
            copy_ = gpflow.utilities.deepcopy(model)
            NaturalGradient(gamma).minimize(lambda: copy_.training_loss(data), [(copy_.q_mu, copy_.q_sqrt)])
            expected[step] = (float(model.training_loss(data).numpy()), float(copy_.training_loss(data).numpy()))
        before = [v.numpy().copy() for v in model.variables]
        monitor(step)
        assert all(np.array_equal(v.numpy(), b) for v, b in zip(model.variables, before))
    assert [r.step for r in monitor.records] == [0, 2, 4]
    for r in monitor.records:
        assert isinstance(r, NatGradRecord)
        loss, loss_after = expected[r.step]
        assert r.loss == pytest.approx(loss, rel=1e-12)
        assert r.loss_after == pytest.approx(loss_after, rel=1e-12)
        assert r.passed and r.step_healthy and r.reproduction_passed and r.reproduction_error <= 1e-10
    assert monitor.failures == []
    # training moves the loss: the records are not copies of one another
    assert monitor.records[0].loss > monitor.records[-1].loss
    with pytest.raises(Exception):
        monitor.records[0].loss = 0.0  # frozen


def test_monitor__the_periodic_check_judges_the_loss_fn_the_guard_judges():
    """With a model and a loss_fn (here the training loss plus a penalty on q_mu), the periodic check judged the
    model's own loss while the guard judged loss_fn; both now judge loss_fn (oracle: loss_fn() itself)."""
    model, data = _setup()
    loss_fn = lambda: model.training_loss(data) + 10.0 * tf.reduce_sum(tf.square(model.q_mu))  # noqa: E731
    model.q_mu.assign(np.ones_like(model.q_mu.numpy()))
    monitor = NatGradMonitor(model, data, gamma=0.1, loss_fn=loss_fn)
    monitor(0)
    assert monitor.records[0].loss == pytest.approx(float(loss_fn().numpy()), rel=1e-12)
    assert abs(monitor.records[0].loss - float(model.training_loss(data).numpy())) > 1.0


@pytest.mark.slow  # 6 s: three periodic checks inside GPflow's Monitor
def test_monitor__inside_gpflow_monitor_group_with_a_data_callable():
    model, data = _setup("bernoulli")
    task = NatGradMonitor(model, lambda: data, gamma=0.3)
    monitor = gpflow.monitor.Monitor(gpflow.monitor.MonitorTaskGroup([task], period=3))
    natgrad = NaturalGradient(0.3)
    for step in range(7):
        natgrad.minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])
        monitor(step)
    assert [r.step for r in task.records] == [0, 3, 6]
    assert all(r.passed for r in task.records)
    # the data callable was evaluated: the last record (step 6, the last step) judged the model's own loss on that data
    assert task.records[-1].loss == pytest.approx(float(model.training_loss(data).numpy()), rel=1e-12)
    assert task.records[0].loss > task.records[-1].loss


def test_monitor__records_a_failing_step_and_can_raise():
    model, data = _setup("bernoulli")
    monitor = NatGradMonitor(model, data, gamma=5.0)
    monitor(0)
    (record,) = monitor.records
    assert not record.passed and not record.step_healthy
    assert record.loss_after is None and "step_health" in record.detail
    assert record.suggested_gamma is not None and record.suggested_gamma < 5.0
    assert monitor.failures == [record]
    strict = NatGradMonitor(model, data, gamma=5.0, raise_on_failure=True)
    with pytest.raises(NatGradCheckError, match="at training step 3"):
        strict(3)


def test_monitor__every_must_be_positive():
    model, data = _setup()
    for bad in (0, -2, 1.5, True):
        with pytest.raises(InputError, match="every"):
            NatGradMonitor(model, data, every=bad)


@pytest.mark.slow  # a fresh interpreter imports TensorFlow: 6 s
def test_monitor__records_import_no_gpflow_and_the_class_loads_on_first_access():
    code = (
        "import sys, natgrad_diag, natgrad_diag.training.records; a = 'gpflow' in sys.modules, 'tensorflow' in sys.modules; "
        "cls = natgrad_diag.NatGradMonitor; print(*a, 'gpflow' in sys.modules, cls.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "True", "natgrad_diag"]


@pytest.mark.slow
def test_train_script__runs_a_few_steps_on_diabetes_with_the_monitor():
    from pathlib import Path

    pytest.importorskip("sklearn")
    script = Path(__file__).resolve().parents[1] / "scripts" / "train_svgp_natgrad.py"
    env = {**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, str(script), "--steps", "6", "--every", "3", "--num-inducing", "8"],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "N = 353 train, 89 test, D = 10, M = 8" in done.stdout
    assert "monitor: 2 checks, 0 failed" in done.stdout
    bad = subprocess.run([sys.executable, str(script), "--steps", "0"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "--steps must be a positive integer" in bad.stderr


def test_monitor__names_trainable_q_at_construction_and_is_silent_when_not():
    model, data = make_model("svgp", "gaussian", num_inducing=6, num_data=30)
    with pytest.warns(UserWarning) as caught:
        NatGradMonitor(model, data)
    (message,) = [str(w.message) for w in caught]
    assert message.startswith("model.q_mu, model.q_sqrt are trainable: an optimizer over the model's trainable variables")
    assert message.endswith("gpflow.set_trainable(model.q_mu, False); gpflow.set_trainable(model.q_sqrt, False).")
    gpflow.set_trainable(model.q_mu, False)
    with pytest.warns(UserWarning, match=r"model.q_sqrt is trainable: .*: gpflow.set_trainable\(model.q_sqrt, False\)\.$"):
        NatGradMonitor(model, data)
    gpflow.set_trainable(model.q_sqrt, False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NatGradMonitor(model, data)


@pytest.mark.slow
def test_monitor__searches_gamma_first_after_a_failed_check_and_every_tenth():
    from natgrad_diag.training.monitor import SEARCH_EVERY

    model, data = _setup("bernoulli")
    monitor = NatGradMonitor(model, data, gamma=5.0)

    copy_ = gpflow.utilities.deepcopy(model)  # nothing trains here: the model stays as the copy is
    oracles = {(g, search): check_natgrad(copy_, data, gamma=g, mode="fast", progress=False, gamma_search=search)
               for g, search in ((5.0, True), (0.5, True), (0.3, False), (0.3, True))}  # fmt: skip

    def oracle(gamma, search):  # check_natgrad itself, on the copy
        return oracles[gamma, search]

    first = monitor.check(0)  # the first check searches: GPflow's step at γ = 5 fails
    assert not first.passed and first.suggested_gamma == oracle(5.0, True).suggested_gamma < 5.0
    monitor.records.append(first)
    monitor.gamma = 0.5
    second = monitor.check(1)  # after a failed record: searched at 0.5
    assert second.passed and second.suggested_gamma == oracle(0.5, True).suggested_gamma
    monitor.records.append(second)
    monitor.gamma = 0.3
    for step in range(2, SEARCH_EVERY):  # judged alone: the record keeps the last search's suggestion
        record = monitor.check(step)
        assert record.passed == oracle(0.3, False).passed and record.suggested_gamma == second.suggested_gamma
    tenth = monitor.check(SEARCH_EVERY)
    assert tenth.suggested_gamma == oracle(0.3, True).suggested_gamma


def test_monitor__bad_loss_fn_is_an_input_error():
    model, data = _setup()
    with pytest.raises(InputError, match="Argument: loss_fn"):
        NatGradMonitor(model, data, loss_fn=3.0)
