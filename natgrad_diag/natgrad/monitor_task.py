"""The NatGradMonitor class, a ``gpflow.monitor.MonitorTask``; imports GPflow, so only natgrad.monitor's lazy lookup imports it."""

from __future__ import annotations

from typing import Any

from gpflow.monitor import MonitorTask

from natgrad_diag.exceptions import InputError
from natgrad_diag.natgrad.monitor_record import NatGradRecord

__all__ = ["NatGradMonitor"]


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


NatGradMonitor.__module__ = "natgrad_diag.natgrad.monitor"  # where users import it from
