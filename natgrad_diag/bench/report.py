"""The benchmark's records: one row per comparison, and the report that lays the rows out as tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section, Table, to_jsonable

__all__ = ["NOT_APPLICABLE", "BenchReport", "BenchRow", "SHORT", "fmt_value"]

#: What a row whose target is meant for the full sizes shows at small sizes.
NOT_APPLICABLE = "n/a at this size"


@dataclass(frozen=True)
class BenchRow:
    """One comparison: ours against a baseline, in seconds (or bytes for memory rows).

    Attributes:
        group: the table this row belongs to.
        what: what ours is, e.g. ``"natgrad_trace (compiled)"``.
        M: the number of inducing points.
        ours: median seconds (or peak bytes above baseline) of ours; ``None`` if not run.
        baseline_name: what we compare with.
        baseline: median seconds (or bytes) of the baseline; ``None`` if not run.
        ratio: ``ours / baseline`` (lower is better), or ``baseline / ours`` for speedups when
            ``higher_is_better``.
        target: the target as text, e.g. ``"≤ 1.3×"``.
        meets: whether the ratio meets the target (``None`` when not measured).
        note: anything to say (skipped, not available, ...).
        unit: ``"s"`` or ``"bytes"``.
        applies: whether the target applies at this size (``False``: shown as "n/a at this size", never "NO").
    """

    group: str
    what: str
    M: int | None
    ours: float | None
    baseline_name: str
    baseline: float | None
    ratio: float | None
    target: str
    meets: bool | None
    note: str = ""
    unit: str = "s"
    higher_is_better: bool = False
    applies: bool = True

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable({k: getattr(self, k) for k in self.__dataclass_fields__})


@dataclass(frozen=True)
class BenchReport(Report):
    """Timings and ratios of one benchmark run; ``sections()`` holds the tables.

    Attributes:
        machine: cores, platform, Python, TensorFlow, GPflow and numpy versions.
        rows: every comparison, in order.
        repeats: timed calls per measurement (median taken).
        quick: whether this was a ``--quick`` smoke run.
        checks: correctness of what was timed (ours equals its baseline); speed never fails.
        seconds: the wall time of the whole run.
    """

    machine: dict[str, Any]
    rows: tuple[BenchRow, ...]
    repeats: int
    quick: bool
    checks: tuple[Check, ...] = ()
    seconds: float = 0.0
    title: str = field(default="natgrad-diag benchmark: ours / baseline (median of repeats, after warm-up)")

    def sections(self) -> tuple[Section, ...]:
        m = self.machine
        machine = (
            f"{m.get('cores')} cores ({m.get('machine')}), Python {m.get('python')}, TensorFlow {m.get('tensorflow')}, "
            f"GPflow {m.get('gpflow')}, numpy {m.get('numpy')}. {self.repeats} repeats per measurement"
            f"{' (quick run: small sizes)' if self.quick else ''}; whole run {self.seconds:.1f} s. "
            "Ratio = ours / baseline (lower is better) unless marked ×faster. Targets are reported, not enforced."
        )
        sections = [Section("Machine", machine)]
        groups: dict[str, list[BenchRow]] = {}
        for r in self.rows:
            groups.setdefault(r.group, []).append(r)
        for name, rows in groups.items():
            table = Table(
                columns=("what", "ours", "baseline", "ratio", "target"),
                rows=tuple(
                    (
                        SHORT.get(r.what, r.what) + ("" if r.M is None else f", M={r.M}"),
                        fmt_value(r.ours, r.unit),
                        f"{SHORT.get(r.baseline_name, r.baseline_name)} {fmt_value(r.baseline, r.unit)}",
                        "-" if r.ratio is None else f"{r.ratio:.2f}×" + (" faster" if r.higher_is_better else ""),
                        f"{r.target} {({True: 'yes', False: 'NO', None: '-'})[r.meets] if r.applies else NOT_APPLICABLE}",
                    )
                    for r in rows
                ),
            )
            names = dict.fromkeys(n for r in rows for n in (r.what, r.baseline_name) if SHORT.get(n, n) != n)
            notes = dict.fromkeys(f"{SHORT.get(r.what, r.what)}: {r.note}" for r in rows if r.note)
            text = "; ".join([f"{SHORT[n]} = {n}" for n in names] + list(notes))
            sections.append(Section(name, text + "." if text else "", (table,)))
        return tuple(sections)

    @property
    def ratios(self) -> dict[str, float | None]:
        """``{"<what> vs <baseline>[, M=<M>]": ratio}`` for every row (see each row for its direction)."""
        return {f"{r.what} vs {r.baseline_name}" + ("" if r.M is None else f", M={r.M}"): r.ratio for r in self.rows}

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.update(
            machine=self.machine,
            repeats=self.repeats,
            quick=self.quick,
            seconds=self.seconds,
            ratios=self.ratios,
            rows=[r.to_dict() for r in self.rows],
        )
        return to_jsonable(d)


#: Short names for the tables (the rows and ``to_dict()`` keep the full ones; each section's text maps them).
SHORT = {
    "_natgrad_apply_gradients": "GPflow",
    "natgrad_map_jacobian": "jacobian()",
    "tape.jacobian, compiled": "TF graph",
    "tape.jacobian, eager": "TF eager",
    "vech Jacobian: time": "vech time",
    "vech Jacobian: stored size": "vech size",
    "general Jacobian": "general",
    "jacobian(), general η₂": "ours, general",
    "jacobian(), vech η₂": "ours, vech",
    "Jacobian size": "J",
    "check_natgrad(mode='fast')": "fast check",
    "NaturalGradient step": "GPflow step",
    "NaturalGradient apply (natgrad_diag)": "ours, apply",
    "NaturalGradient (natgrad_diag)": "ours, minimize",
    "NaturalGradient (gpflow)": "GPflow minimize",
    "filling its array": "np.ones",
    "check_gradients(mode='fast')": "fast gradcheck",
    "one compiled f and VJP": "f + VJP",
    "natgrad-diag --help": "--help",
    "python -c pass": "python",
    "natgrad-diag (explain)": "explain",
    "python -c 'import gpflow'": "import gpflow",
}


def fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "bytes":
        return f"{v / 1024**2:.1f} MiB"
    return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"
