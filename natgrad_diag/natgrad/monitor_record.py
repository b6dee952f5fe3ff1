"""NatGradRecord: what the monitor records at one training step (imports neither GPflow nor TensorFlow)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NatGradRecord"]


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
