"""NatGradMonitor(log_dir=...): the scalars in the TensorBoard event file, read back with TensorFlow's own reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import gpflow
from _user_models import multiclass_svgp
from gpflow.optimizers import NaturalGradient

from natgrad_diag import NatGradMonitor
from natgrad_diag.demo import make_model
from natgrad_diag.training.tensorboard import SCALARS


def _read_scalars(log_dir: Path, plugins: set[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((int(event.step), float(tf.make_ndarray(value.tensor))))
                if plugins is not None and value.metadata.plugin_data.plugin_name:
                    plugins.add(value.metadata.plugin_data.plugin_name)
    return out


def _read_events(log_dir: Path) -> list[tuple[str, int]]:
    """Every (tag, step) written, in file order, repeats included."""
    return [
        (value.tag, int(event.step))
        for path in sorted(log_dir.glob("events.out.tfevents.*"))
        for event in tf.compat.v1.train.summary_iterator(str(path))
        for value in event.summary.value
    ]


@pytest.mark.slow
def test_monitor__writes_guard_and_check_scalars_for_tensorboard_once_per_tag_and_step(tmp_path):
    model, data = make_model("svgp", "bernoulli", num_inducing=10, num_data=50)  # GPflow's step at γ = 5 raises
    gpflow.set_trainable(model.q_mu, False)
    gpflow.set_trainable(model.q_sqrt, False)
    data = tuple(tf.constant(a) for a in data)
    monitor = NatGradMonitor(model, data, gamma=5.0, on_failure="rollback", log_dir=tmp_path)
    natgrad = NaturalGradient(tf.Variable(5.0, dtype=tf.float64))
    for step in range(3):
        with monitor.guard(step, natgrad):
            natgrad.minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])
        monitor(step)  # the periodic check at the same step, at the γ the guard left
    with monitor.guard(2, natgrad):  # the same step guarded again: its tags are not written twice
        natgrad.minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])
    monitor.log.close()
    events = _read_events(tmp_path)
    assert len(events) == len(set(events)), sorted(e for e in events if events.count(e) > 1)
    plugins: set[str] = set()
    scalars = _read_scalars(tmp_path, plugins)
    assert set(scalars) == set(SCALARS)
    assert plugins == {"scalars"}  # TensorBoard's scalar dashboard shows them
    records, checks = monitor.guard_records[:3], monitor.records
    assert scalars["natgrad/gamma"] == [(r.step, pytest.approx(r.gamma_after, rel=1e-7)) for r in records]
    assert scalars["natgrad/rollbacks"] == [(0, 1.0), (1, 1.0), (2, 1.0)]  # the first step rolled back, none since
    assert scalars["natgrad/step_failed"] == [(0, 1.0), (1, 0.0), (2, 0.0)]
    assert records[0].rolled_back and monitor.rollbacks == 1
    # tf.summary.scalar stores float32: compare to float32 rounding
    assert np.allclose([v for _, v in scalars["natgrad/loss_before"]], [r.loss_before for r in records], rtol=1e-6, atol=0)
    assert np.allclose([v for _, v in scalars["natgrad/check/loss_before"]], [c.loss for c in checks], rtol=1e-6, atol=0)
    # loss_after: written where it is finite (None is not written): the rolled-back step's, then the healthy ones'
    after = [(r.step, r.loss_after) for r in records if r.loss_after is not None]
    assert len(after) == 3 and [s for s, _ in scalars["natgrad/loss_after"]] == [s for s, _ in after] == [0, 1, 2]
    assert np.allclose([v for _, v in scalars["natgrad/loss_after"]], [v for _, v in after], rtol=1e-6, atol=0)
    checked = [(c.step, c.loss_after) for c in checks if c.loss_after is not None]
    assert checked and scalars["natgrad/check/loss_after"] == [(s, pytest.approx(v, rel=1e-6)) for s, v in checked]
    assert [s for s, _ in scalars["natgrad/check/reproduction_error"]] == [c.step for c in checks] == [0, 1, 2]
    assert np.allclose([v for _, v in scalars["natgrad/check/reproduction_error"]], [c.reproduction_error for c in checks],
                       rtol=1e-6, atol=0)  # fmt: skip
    assert scalars["natgrad/check/suggested_gamma"] == [(c.step, pytest.approx(c.suggested_gamma, rel=1e-7)) for c in checks]


def test_monitor__no_log_dir_writes_nothing(tmp_path):
    model, data = multiclass_svgp(num_data=10, num_inducing=3)
    gpflow.set_trainable(model.q_mu, False)
    gpflow.set_trainable(model.q_sqrt, False)
    monitor = NatGradMonitor(model, data, gamma=0.01)
    assert monitor.log is None
    assert list(tmp_path.iterdir()) == []
