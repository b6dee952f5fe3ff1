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

from dataclasses import dataclass
from typing import Any

from natgrad_diag.exceptions import InputError

__all__ = ["NatGradMonitor", "NatGradRecord"]


@dataclass(frozen=True)
class NatGradRecord:
    """The cheap checks at one training step.

    Attributes:
        step: the training step the monitor was called with.
        loss: the training loss before the checked natural-gradient step.
        loss_after: the loss after it (None if the step failed).
        reproduction_error: max |natgrad-diag's step − GPflow's| (None if the step failed for both).
        reproduction_passed: the ``reproduction`` check's verdict.
        step_healthy: the ``step_health`` check's verdict.
        suggested_gamma: the largest healthy γ that lowers the loss (fast search: γ itself when it is fine).
        passed: every check of the fast report held.
        detail: the failed checks' details ("" when all passed).
    """

    step: int
    loss: float | None
    loss_after: float | None
    reproduction_error: float | None
    reproduction_passed: bool
    step_healthy: bool
    suggested_gamma: float | None
    passed: bool
    detail: str = ""

    def __str__(self) -> str:
        mark = "ok" if self.passed else "FAILED"
        err = "-" if self.reproduction_error is None else f"{self.reproduction_error:.2e}"
        return (
            f"step {self.step}: {mark}; loss {self.loss!r} → {self.loss_after!r}; healthy={self.step_healthy}; "
            f"reproduction error {err}" + (f"; {self.detail}" if self.detail else "")
        )


def _base() -> type:
    from gpflow.monitor import MonitorTask

    return MonitorTask


def _build_class() -> type:
    """``NatGradMonitor`` derives from ``gpflow.monitor.MonitorTask``; it is built on first access (module
    ``__getattr__``) so that importing this module does not import GPflow."""
    MonitorTask = _base()

    class NatGradMonitor(MonitorTask):  # type: ignore[misc, valid-type]
        """A ``gpflow.monitor.MonitorTask`` that records natural-gradient step health and reproduction every k steps.

        Args:
            model: the SVGP or VGP being trained (read only).
            data: (X, Y) for SVGP, or a zero-argument callable returning the current batch; None for VGP.
            gamma: the natural-gradient step length used in training.
            xi_transform: the ξ transform used in training (None: ``XiNat()``).
            every: run the checks when ``step % every == 0``.
            raise_on_failure: raise :class:`~natgrad_diag.exceptions.NatGradCheckError` at the first failed record.

        Attributes:
            records: list of :class:`NatGradRecord`, oldest first.
        """

        def __init__(
            self,
            model: Any,
            data: Any = None,
            *,
            gamma: float = 1.0,
            xi_transform: Any = None,
            every: int = 1,
            raise_on_failure: bool = False,
        ) -> None:
            super().__init__()
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise InputError(
                    "every must be a positive integer.",
                    context=[("Argument", "every"), ("Expected", "an int ≥ 1"), ("Got", repr(every))],
                    remedy="pass every=10 to check every tenth step.",
                )
            self.model = model
            self.data = data
            self.gamma = gamma
            self.xi_transform = xi_transform
            self.every = every
            self.raise_on_failure = raise_on_failure
            self.records: list[NatGradRecord] = []

        @property
        def failures(self) -> list[NatGradRecord]:
            """The records whose checks did not all hold."""
            return [r for r in self.records if not r.passed]

        def run(self, **kwargs: Any) -> None:
            step = int(self.current_step)
            if step % self.every:
                return
            self.records.append(self.check(step))
            last = self.records[-1]
            if self.raise_on_failure and not last.passed:
                from natgrad_diag.exceptions import NatGradCheckError

                raise NatGradCheckError(
                    f"at training step {step}.",
                    context=[("Record", str(last))],
                    remedy=(f"use gamma = {last.suggested_gamma:g}." if last.suggested_gamma else "use a smaller gamma, or float64."),
                )

        def check(self, step: int) -> NatGradRecord:
            """Run the cheap checks now and return the record (not appended)."""
            from natgrad_diag.natgrad.check import check_natgrad

            data = self.data() if callable(self.data) else self.data
            report = check_natgrad(
                self.model, data, gamma=self.gamma, xi_transform=self.xi_transform, mode="fast", progress=False,
            )  # fmt: skip
            names = {c.name: c for c in report.checks}
            rep = names.get("reproduction")
            health = names.get("step_health")
            failed = [c for c in report.checks if not c.passed]
            return NatGradRecord(
                step=step,
                loss=report.loss_before,
                loss_after=report.loss_after,
                reproduction_error=None if rep is None else rep.max_abs_error,
                reproduction_passed=bool(rep is not None and rep.passed),
                step_healthy=bool(health is not None and health.passed),
                suggested_gamma=report.suggested_gamma,
                passed=report.passed,
                detail="; ".join(f"{c.name}: {c.detail or c.claim}" for c in failed),
            )

    NatGradMonitor.__module__ = __name__
    return NatGradMonitor


_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    global _CLASS
    if name == "NatGradMonitor":
        if _CLASS is None:
            _CLASS = _build_class()
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

