"""The benchmark's records: one row per comparison, and the report that lays the rows out as tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section, Table, to_jsonable

__all__ = ["SHORT", "BenchReport", "BenchRow", "fmt_value"]


@dataclass(frozen=True)
class BenchRow:
    """One comparison in its ``group`` (table): ``what`` against ``baseline_name`` at M inducing points (None: none).

    ``ours`` and ``baseline`` are median seconds (``unit="bytes"``: peak bytes above the process baseline; None: not
    run); ``ratio`` is ours / baseline (baseline / ours when ``higher_is_better``); ``target`` the target as text
    (``"reference"``: shown, not judged) and ``meets`` its verdict (None: not measured or not judged); ``applies``
    False shows "n/a at this size", never "NO".
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
    """Timings and ratios of one benchmark run (``rows``, in order) on ``machine`` (cores and versions), ``repeats``
    timed calls per measurement, ``quick`` or not, in ``seconds``; ``checks`` are the correctness of what was timed
    (speed never fails). ``sections()`` holds the tables."""

    machine: dict[str, Any]
    rows: tuple[BenchRow, ...]
    repeats: int
    quick: bool
    checks: tuple[Check, ...] = ()
    seconds: float = 0.0
    title: str = "natgrad-diag benchmark: ours / baseline (median of repeats, after warm-up)"

    def sections(self) -> tuple[Section, ...]:
        m = self.machine
        machine = (
            f"{m.get('cores')} cores ({m.get('machine')}), Python {m.get('python')}, TensorFlow {m.get('tensorflow')}, "
            f"GPflow {m.get('gpflow')}, numpy {m.get('numpy')}. {self.repeats} repeats per measurement"
            f"{' (quick run: small sizes)' if self.quick else ''}; whole run {self.seconds:.1f} s. "
            "Ratio = ours / baseline (lower is better) unless marked ×faster. Targets are reported, not enforced."
        )
        sections = [Section("Machine", machine)]
        for name in dict.fromkeys(r.group for r in self.rows):
            rows = [r for r in self.rows if r.group == name]
            table = Table(columns=("what", "ours", "baseline", "ratio", "target"), rows=tuple((
                SHORT.get(r.what, r.what) + ("" if r.M is None else f", M={r.M}"), fmt_value(r.ours, r.unit),
                f"{SHORT.get(r.baseline_name, r.baseline_name)} {fmt_value(r.baseline, r.unit)}",
                "-" if r.ratio is None else f"{r.ratio:.3g}×" + (" faster" if r.higher_is_better else ""),
                f"{r.target} {({True: 'yes', False: 'NO', None: '-'})[r.meets] if r.applies else 'n/a at this size'}",
            ) for r in rows))  # fmt: skip
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
        return to_jsonable({**super().to_dict(), "machine": self.machine, "repeats": self.repeats, "quick": self.quick,
                            "seconds": self.seconds, "ratios": self.ratios, "rows": [r.to_dict() for r in self.rows]})  # fmt: skip


#: Short names for the tables (the rows and ``to_dict()`` keep the full ones; each section's text maps them).
SHORT = {
    "_natgrad_apply_gradients": "GPflow", "natgrad_map_jacobian": "jacobian()", "tape.jacobian, compiled": "TF graph",
    "tape.jacobian, eager": "TF eager", "vech Jacobian: time": "vech time", "vech Jacobian: stored size": "vech size",
    "general Jacobian": "general", "jacobian(), general η₂": "ours, general", "jacobian(), vech η₂": "ours, vech",
    "Jacobian size": "J", "check_natgrad(mode='fast', gamma_steps=1)": "fast check, 1 step",
    "check_natgrad(mode='fast', defaults)": "fast check", "NaturalGradient step": "GPflow step",
    "NaturalGradient apply (natgrad_diag)": "ours, apply", "NaturalGradient (natgrad_diag)": "ours, minimize",
    "NaturalGradient (gpflow)": "GPflow minimize", "filling its array": "np.ones",
    "check_gradients(mode='fast')": "fast gradcheck", "one compiled f and VJP": "f + VJP", "natgrad-diag --help": "--help",
    "python -c pass": "python", "natgrad-diag (explain)": "explain", "python -c 'import gpflow'": "import gpflow",
    "LAPACK record, 1 BLAS thread": "1 thread", "BLAS default threads": "default",
}  # fmt: skip


def fmt_value(v: float | None, unit: str) -> str:
    """Seconds as ms or s (3 significant digits), bytes as MiB; ``-`` for not measured."""
    if v is None or unit == "bytes":
        return "-" if v is None else f"{v / 1024**2:.1f} MiB"
    return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"
