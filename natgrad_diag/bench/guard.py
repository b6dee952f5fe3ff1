"""The benchmark's row for the training guard: ``NatGradMonitor.guard`` with its defaults around the step users write."""

from __future__ import annotations

from typing import Any

import numpy as np

from natgrad_diag.bench.report import BenchRow
from natgrad_diag.bench.step import svgp
from natgrad_diag.bench.timing import Run, compare
from natgrad_diag.report.records import Check, max_abs_diff, status_of

__all__ = ["bench_guard"]

#: Training steps per timed call (one step takes milliseconds: a block of them times well).
_BLOCK = 10


def _training(M: int, N: int) -> tuple[Any, Any, Any, Any]:
    """An SVGP as GPflow's recipe trains it: q(u) not trainable, natural gradients on q(u) and Adam on the kernel and
    likelihood in one ``tf.function``; returns the model, its data, the NaturalGradient (γ a tf.Variable) and the step."""
    import gpflow
    import tensorflow as tf
    from gpflow.keras import tf_keras

    model, data = svgp(M, N)
    for part, trainable in ((model.kernel, True), (model.likelihood, True), (model.q_mu, False), (model.q_sqrt, False)):
        gpflow.set_trainable(part, trainable)
    natgrad, adam = gpflow.optimizers.NaturalGradient(tf.Variable(0.5, dtype=tf.float64)), tf_keras.optimizers.Adam(0.01)
    loss = model.training_loss_closure(data, compile=False)

    @tf.function
    def step() -> None:
        natgrad.minimize(loss, [(model.q_mu, model.q_sqrt)])
        adam.minimize(loss, model.trainable_variables)

    return model, data, natgrad, step


def bench_guard(run: Run) -> list[BenchRow]:
    """A guarded compiled NaturalGradient + Adam step (``NatGradMonitor(..., on_failure="rollback")``, defaults
    otherwise) against the same step unguarded, on an SVGP with M = 50, N = 1000; blocks of :data:`_BLOCK` steps."""
    from natgrad_diag.training.monitor import NatGradMonitor

    M, N = run.size((50, 1000), (10, 100))
    (plain, _, _, plain_step), (model, data, natgrad, step) = _training(M, N), _training(M, N)
    monitor = NatGradMonitor(model, data, gamma=0.5, on_failure="rollback")
    count = [0]

    def guarded() -> None:
        for _ in range(_BLOCK):
            with monitor.guard(count[0], natgrad):
                step()
            count[0] += 1

    t_ours, t_base = compare(guarded, lambda: [plain_step() for _ in range(_BLOCK)], max(run.repeats, 7))
    records = monitor.guard_records
    run.checks.append(Check("guard_records_every_step", f"the guard recorded each of the {len(records)} timed steps "
                            "healthy and rolled none back", status_of(len(records) == count[0] and all(r.passed for r in records))))  # fmt: skip
    scale = max(1.0, float(np.max(np.abs(plain.q_sqrt.numpy()))), float(np.max(np.abs(plain.q_mu.numpy()))))
    run.agree("guarded_training_is_plain_training", f"after the same {count[0]} steps the guarded SVGP's q(u) equals the "
              "unguarded one's (the guard changes nothing on a healthy step)",
              max_abs_diff((model.q_mu, model.q_sqrt), (plain.q_mu, plain.q_sqrt)) / scale, 1e-10)  # fmt: skip
    return [run.row("the training guard with its defaults (SVGP, natural gradients on q(u) + Adam, one tf.function)",
                    "guarded step", M, t_ours / _BLOCK, "compiled NaturalGradient + Adam step", t_base / _BLOCK, 1.5,
                    note=f"N = {N}")]  # fmt: skip
