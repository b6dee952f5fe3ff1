"""NatGradRecord and GuardRecord: what the monitor records at one training step (imports neither GPflow nor TensorFlow)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GuardRecord", "NatGradRecord"]


@dataclass(frozen=True)
class NatGradRecord:
    """The cheap checks at one training step.

    Attributes:
        step: the training step the monitor was called with.
        loss, loss_after: the training loss before the checked natural-gradient step and after it (None if it failed).
        reproduction_error, reproduction_passed: max |natgrad-diag's step − GPflow's| (None if both failed) and the
            ``reproduction`` check's verdict; ``step_healthy``: the ``step_health`` check's verdict.
        suggested_gamma: the last γ search's suggestion (the monitor searches at its first check, every
            ``SEARCH_EVERY``-th, after a failed record, and a guard after a failed step); None when it had none.
        passed, detail: every check of the fast report held; the failed checks' details ("" when all passed).
        gamma_set: with ``on_failure="rollback"``, the γ the monitor set on the guarded optimizer because
            ``step_health`` failed (None: unchanged).
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
    gamma_set: float | None = None

    def __str__(self) -> str:
        err = "-" if self.reproduction_error is None else f"{self.reproduction_error:.2e}"
        return (f"step {self.step}: {'ok' if self.passed else 'FAILED'}; loss {self.loss!r} → {self.loss_after!r}; "
                f"healthy={self.step_healthy}; reproduction error {err}" + (f"; {self.detail}" if self.detail else "")
                + (f"; gamma set to {self.gamma_set:g}" if self.gamma_set is not None else ""))


@dataclass(frozen=True)
class GuardRecord:
    """What ``NatGradMonitor.guard`` found at one guarded natural-gradient step.

    Attributes:
        step, status: the training step the guard was called with; "ok" or "failed", and ``cause``: why ("" if ok).
        rolled_back: q(u) was restored to its value before the step (``on_failure="rollback"``).
        gamma_before, gamma_after: the optimizer's γ for the step, and after the guard (the searched γ after a
            rollback, raised to the search's suggestion after a run of healthy steps).
        loss_before, loss_after: the loss before the step, and after it or the rollback (None if not finite or not
            computed).
        moved_by_other: the parameters something other than the guarded step changed since the guard's previous exit.
    """

    step: int
    status: str
    rolled_back: bool
    gamma_before: float
    gamma_after: float
    cause: str = ""
    loss_before: float | None = None
    loss_after: float | None = None
    moved_by_other: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        """The step was healthy."""
        return self.status == "ok"

    def __str__(self) -> str:
        parts = [f"step {self.step}: {self.status}", f"gamma {self.gamma_before:g}" + (
            f" → {self.gamma_after:g}" if self.gamma_after != self.gamma_before else ""),
            f"loss {self.loss_before!r} → {self.loss_after!r}", "rolled back" if self.rolled_back else "", self.cause,
            f"moved by another optimizer: {', '.join(self.moved_by_other)}" if self.moved_by_other else ""]  # fmt: skip
        return "; ".join(p for p in parts if p)
