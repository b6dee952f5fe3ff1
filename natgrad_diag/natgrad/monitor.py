"""``NatGradMonitor``: the cheap natural-gradient checks inside a training loop, as a GPflow monitor task.

Every ``every`` steps it runs :func:`natgrad_diag.check_natgrad` in fast mode (compiled once, reused) on the
current parameters and records whether the next natural-gradient step is healthy (finite, q_sqrt
lower-triangular with a positive diagonal, S positive definite) and whether natgrad-diag's step reproduces
what ``gpflow.optimizers.NaturalGradient`` would assign. The model is never changed.

Use it as any ``gpflow.monitor.MonitorTask``::

    monitor = NatGradMonitor(model, data, gamma=0.1, every=10)
    for step in range(1000):
        natgrad.minimize(loss, [(model.q_mu, model.q_sqrt)])
        adam.minimize(loss, hyperparameters)
        monitor(step)
    print(monitor.records[-1])

or inside ``gpflow.monitor.Monitor(MonitorTaskGroup([monitor], period=10))`` (then leave ``every=1``).
"""

from __future__ import annotations

from typing import Any

from natgrad_diag.natgrad.monitor_record import NatGradRecord

__all__ = ["NatGradMonitor", "NatGradRecord"]


def __getattr__(name: str) -> Any:
    """``NatGradMonitor`` derives from ``gpflow.monitor.MonitorTask``: it lives in
    :mod:`natgrad_diag.natgrad.monitor_task`, imported on first access so that importing this module does not
    import GPflow."""
    if name == "NatGradMonitor":
        from natgrad_diag.natgrad.monitor_task import NatGradMonitor

        return NatGradMonitor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
