"""The training timeline of a :class:`~natgrad_diag.NatGradMonitor` as a report: the loss and γ over the steps, the
failed checks and the rollbacks. Reads the monitor by duck typing (``records``, ``guard_records``, ``gamma``)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any

from natgrad_diag._validate import input_error
from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section, Table, format_number, status_of

__all__ = ["TrainingTimeline", "timeline_html", "timeline_of"]


@dataclass(frozen=True)
class TrainingTimeline(Report):
    """What a monitor recorded during training, as a report.

    Attributes:
        records, guard_records: the periodic checks and the guarded steps, as the monitor recorded them
            (:class:`~natgrad_diag.training.records.NatGradRecord`, :class:`~natgrad_diag.training.records.GuardRecord`).
        gamma: the monitor's γ now (None if unknown).
    """

    records: tuple[Any, ...]
    guard_records: tuple[Any, ...]
    gamma: float | None = None

    @property
    def title(self) -> str:  # type: ignore[override]
        return (f"Natural-gradient training: {len(self.records)} checked step(s), {len(self.guard_records)} guarded "
                f"step(s), {sum(bool(r.rolled_back) for r in self.guard_records)} rollback(s)")  # fmt: skip

    @property
    def checks(self) -> tuple[Check, ...]:  # type: ignore[override]
        """One check for the periodic checks and one for the guarded steps (each only when there are any)."""
        out = []
        if self.records:
            bad = [r.step for r in self.records if not r.passed]
            out.append(Check("periodic_checks", f"the natural-gradient checks held at each of the {len(self.records)} checked steps",
                             status_of(not bad), detail=f"failed at step(s) {_steps(bad)}" if bad else ""))  # fmt: skip
        if self.guard_records:
            bad = [r.step for r in self.guard_records if r.status != "ok"]
            back = [r.step for r in self.guard_records if r.rolled_back]
            detail = f"failed at step(s) {_steps(bad)}" + (f"; rolled back at {_steps(back)}" if back else "") if bad else ""
            out.append(Check("guarded_steps", f"each of the {len(self.guard_records)} guarded steps was healthy",
                             status_of(not bad), detail=detail))  # fmt: skip
        return tuple(out)

    @property
    def lead(self) -> str:
        """The first and last loss recorded (in time: at one step a guarded step's loss before it, a periodic check's
        loss, the guarded step's loss after it), γ now, how many checks and steps failed, each failure with its cause
        (the first five)."""
        losses = sorted([(r.step, 0, r.loss_before, "at") for r in self.guard_records if r.loss_before is not None]
                        + [(r.step, 1, r.loss, "at") for r in self.records if r.loss is not None]
                        + [(r.step, 2, r.loss_after, "after") for r in self.guard_records if r.loss_after is not None],
                        key=lambda e: e[:2])  # fmt: skip
        (s0, _, first, _), (s1, _, last, at) = (losses[0], losses[-1]) if losses else ((0, 0, 0.0, ""),) * 2
        lines = [f"Loss {format_number(first, 8)} at step {s0}, {format_number(last, 8)} {at} step {s1}"
                 + ("." if self.gamma is None else f"; gamma now {self.gamma:g}.")] if losses else []  # fmt: skip
        n_bad, n_failed = sum(not r.passed for r in self.records), sum(r.status != "ok" for r in self.guard_records)
        if n_bad or n_failed:  # what failed, and where training ended
            back = sum(bool(r.rolled_back) for r in self.guard_records)
            parts = [f"{n} of {len(rs)} {what}" for n, rs, what in ((n_bad, self.records, "periodic checks"),
                     (n_failed, self.guard_records, f"guarded steps ({back} rolled back)")) if rs]  # fmt: skip
            trend = "; the loss ended lower" if last < first else "; the loss did not end lower"
            lines.append(f"Failed: {', '.join(parts)}{trend if len(losses) > 1 else ''}.")
        events = self.events()
        lines += [f"- step {step}: {what}: {why}" for step, what, _, _, why in events[:5]]
        if len(events) > 5:
            lines.append(f"- ... and {len(events) - 5} more (table below).")
        return "\n".join(lines)

    def events(self) -> list[tuple[int, str, str, str, str]]:
        """(step, what, gamma, loss, why) for each failed check, failed guarded step and rollback, by step."""
        out = [(r.step, "check failed", f"set to {r.gamma_set:g}" if r.gamma_set is not None else "-" if r.suggested_gamma
                is None else f"suggested {r.suggested_gamma:g}", _losses(r.loss, r.loss_after), r.detail)
               for r in self.records if not r.passed]  # fmt: skip
        out += [(r.step, "rolled back" if r.rolled_back else "guard failed",
                 f"{r.gamma_before:g} → {r.gamma_after:g}" if r.gamma_after != r.gamma_before else f"{r.gamma_before:g}",
                 _losses(r.loss_before, r.loss_after), r.cause) for r in self.guard_records if r.status != "ok" or r.rolled_back]  # fmt: skip
        return sorted(out, key=lambda e: e[0])

    def sections(self) -> tuple[Section, ...]:
        events = tuple(tuple(str(x) for x in e) for e in self.events())
        table = Table(("step", "what", "gamma", "loss before → after", "why"), events, "Failed checks and rollbacks, by step")
        guarded = sorted(self.guard_records, key=lambda r: r.step)
        runs = [(g, [r.step for r in run]) for g, run in groupby(guarded, key=lambda r: r.gamma_before)]  # one γ each
        used = "; ".join(f"{g:g} (steps {s[0]}–{s[-1]})" for g, s in runs[:8]) + ("; ..." if len(runs) > 8 else "")
        return (
            Section("Loss and gamma over training", f"gamma used: {used}." if runs else "", (), None, ("timeline",)),
            *((Section("Failed checks and rollbacks", "", (table,)),) if events else ()),
            Section("Checks", "", (), self.checks),
        )  # fmt: skip


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:10])) + (f" and {len(steps) - 10} more" if len(steps) > 10 else "")


def _losses(before: float | None, after: float | None) -> str:
    return f"{format_number(before, 8)} → {format_number(after, 8)}"


def timeline_of(monitor: Any, *, what: str = "shown") -> Any:
    """A monitor's :class:`TrainingTimeline`, a report as it is; anything else an InputError naming ``report``."""
    if callable(getattr(monitor, "sections", None)) and hasattr(monitor, "checks"):
        return monitor
    if not (hasattr(monitor, "records") and hasattr(monitor, "guard_records")):
        raise input_error(f"only a natgrad-diag report can be {what}.", "report", "a report (check_natgrad(...), "
                          "explain_output_gradients(), ...) or a NatGradMonitor", type(monitor).__name__, "pass the report a natgrad-diag function returned.")
    return TrainingTimeline(tuple(monitor.records), tuple(monitor.guard_records), getattr(monitor, "gamma", None))


def timeline_html(monitor: Any) -> str:
    """The monitor's timeline as an HTML fragment with its picture embedded (a monitor's ``_repr_html_``)."""
    from natgrad_diag.report.html import to_html_fragment

    return to_html_fragment(timeline_of(monitor))
