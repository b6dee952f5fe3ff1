"""NatGradMonitor(log_dir=...): the scalars in the TensorBoard event file, read back with TensorFlow's own reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from _user_models import multiclass_svgp
from gpflow.optimizers import NaturalGradient

from natgrad_diag import NatGradMonitor
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


def test_monitor__writes_guard_and_check_scalars_for_tensorboard(tmp_path):
    model, data = multiclass_svgp()  # GPflow #820: the first step at γ = 0.1 fails
    monitor = NatGradMonitor(model, data, gamma=0.1, on_failure="rollback", log_dir=tmp_path)
    natgrad = NaturalGradient(tf.Variable(0.1, dtype=tf.float64))
    for step in range(3):
        with monitor.guard(step, natgrad):
            natgrad.minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])
    monitor.gamma = float(natgrad.gamma.numpy())
    monitor(3)  # the periodic check at the γ now in use
    monitor.log.close()
    plugins: set[str] = set()
    scalars = _read_scalars(tmp_path, plugins)
    assert set(scalars) <= set(SCALARS)
    assert plugins == {"scalars"}  # TensorBoard's scalar dashboard shows them
    records, check = monitor.guard_records, monitor.records[0]
    assert scalars["natgrad/gamma"] == [(r.step, pytest.approx(r.gamma_after, rel=1e-7)) for r in records]
    assert scalars["natgrad/rollbacks"] == [
        (r.step, float(sum(q.rolled_back for q in records[: i + 1]))) for i, r in enumerate(records)
    ]
    assert scalars["natgrad/step_failed"] == [(r.step, float(not r.passed)) for r in records]
    assert monitor.rollbacks >= 1 and records[0].rolled_back
    # tf.summary.scalar stores float32: compare to float32 rounding
    before = [v for s, v in scalars["natgrad/loss_before"] if s < 3]
    assert np.allclose(before, [r.loss_before for r in records], rtol=1e-6, atol=0)
    ((rep_step, rep_err),) = scalars["natgrad/reproduction_error"]
    assert rep_step == 3 and rep_err == pytest.approx(check.reproduction_error, rel=1e-6, abs=1e-30)
    assert scalars["natgrad/suggested_gamma"] == [(3, pytest.approx(check.suggested_gamma, rel=1e-7))]
    assert (3, pytest.approx(check.loss, rel=1e-6)) in scalars["natgrad/loss_before"]


def test_monitor__no_log_dir_writes_nothing(tmp_path):
    model, data = multiclass_svgp(num_data=10, num_inducing=3)
    monitor = NatGradMonitor(model, data, gamma=0.01)
    assert monitor.log is None
    assert list(tmp_path.iterdir()) == []
