"""Pictures of reports and Jacobians, drawn with matplotlib (the extra ``plot``) on an Agg canvas, no pyplot.

Chosen by what a report has: a heatmap of a :class:`~natgrad_diag.BlockJacobian` (for GPflow's map (mean,
varsqrt) = (η₁, chol(η₂ − η₁η₁ᵀ)) the varsqrt–eta1 block is why ``dL/deta1 ≠ dtheta_deta1 * dL/dmean``); per
element of η₁, dL/dη₁ = Jᵀ·v against the naive (Jᵀ·1)⊙v; the loss after k steps against γ; a training timeline;
each check's error against its tolerance. Each ``plot_*`` returns a ``matplotlib.figure.Figure`` and raises
MissingExtraError without matplotlib; the ``*_data`` functions (what each draws) need no matplotlib.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag._validate import input_error, require_int
from natgrad_diag.exceptions import MissingExtraError
from natgrad_diag.report.records import Check, status_of
from natgrad_diag.typing import Array

__all__ = [
    "BlockSpan", "CheckError", "Eta1Comparison", "GammaCurve", "HeatmapData", "Picture", "TimelineData",
    "check_errors_data", "eta1_comparison_data", "gamma_curve_data", "heatmap_data", "plot_check_errors",
    "plot_eta1_comparison", "plot_gamma_losses", "plot_jacobian_heatmap", "plot_training_timeline", "report_pictures",
    "require_matplotlib", "timeline_data",
]

#: What to run when matplotlib is missing.
PLOT_EXTRA_REMEDY = 'pip install "natgrad-diag[plot]"  (or pip install matplotlib)'

def require_matplotlib() -> Any:
    """Import matplotlib, or raise :class:`MissingExtraError` naming the extra ``plot``."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError(
            "pictures need matplotlib, which is not installed.",
            context=[("Extra", "plot"), ("Expected", "matplotlib importable"), ("Got", "ImportError")],
            remedy=PLOT_EXTRA_REMEDY + "; the text report works without it.",
        ) from None
    return matplotlib


def _new_figure(width: float, height: float) -> Any:
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_to_png(fig: Any, *, dpi: int = 100) -> bytes:
    """The PNG bytes of a matplotlib Figure."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


@dataclass(frozen=True)
class BlockSpan:
    """One block of rows (an output) or of columns (an input): ``matrix[start:stop]`` belongs to ``name``."""

    name: str
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def label(self) -> str:
        """``"varsqrt [1, 5, 5]"``."""
        return f"{self.name} [{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class HeatmapData:
    """What the Jacobian heatmap draws.

    Attributes:
        matrix: [R, C], R = Σ output sizes, C = Σ input sizes; rows are the flattened outputs in order,
            columns the flattened inputs (the dense matrix of the BlockJacobian, copied).
        row_labels, col_labels: one label per row / column, e.g. ``"varsqrt[0,4,0]"``, ``"eta1[2,0]"``.
        row_blocks, col_blocks: the block boundaries, one :class:`BlockSpan` per output / input.
    """

    matrix: Array
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...]
    row_blocks: tuple[BlockSpan, ...]
    col_blocks: tuple[BlockSpan, ...]

    def block(self, output: str, input: str) -> Array:  # noqa: A002 - the Jacobian's own words
        """The 2-D sub-matrix ∂output/∂input, e.g. ``block("varsqrt", "eta1")`` is [L·M·M, M·L]."""
        rows, cols = ({b.name: b for b in blocks} for blocks in (self.row_blocks, self.col_blocks))
        for argument, name, spans in (("output", output, rows), ("input", input, cols)):
            if name not in spans:
                raise input_error(f"the heatmap has no {argument} named {name!r}.", argument,
                                  f"one of {sorted(spans)}", repr(name),
                                  f"use a name from .{'row' if argument == 'output' else 'col'}_blocks.")
        r, c = rows[output], cols[input]
        return self.matrix[r.start : r.stop, c.start : c.stop]


def _spans(names: Sequence[str], shapes: Sequence[Sequence[int]]) -> tuple[BlockSpan, ...]:
    sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
    return tuple(BlockSpan(str(n), tuple(int(d) for d in shape), start, start + size)
                 for n, shape, start, size in zip(names, shapes, np.cumsum([0, *sizes]).tolist(), sizes))  # fmt: skip


def heatmap_data(jacobian: Any) -> HeatmapData:
    """The matrix, labels and block boundaries that :func:`plot_jacobian_heatmap` draws, from a
    :class:`~natgrad_diag.BlockJacobian` (e.g. ``Explanation.jacobian``); an InputError for anything else."""
    from natgrad_diag.autodiff.blocks import BlockJacobian

    if not isinstance(jacobian, BlockJacobian):
        raise input_error("the heatmap needs the explicit Jacobian.", "jacobian",
                          "a natgrad_diag.BlockJacobian", type(jacobian).__name__,
                          "pass natgrad_diag.jacobian(...) or natgrad_map_jacobian(eta1, eta2), e.g. Explanation.jacobian.")
    return HeatmapData(
        matrix=np.array(jacobian.matrix, copy=True), row_labels=tuple(jacobian.row_labels),
        col_labels=tuple(jacobian.col_labels), row_blocks=_spans(jacobian.output_names, jacobian.output_shapes),
        col_blocks=_spans(jacobian.input_names, jacobian.input_shapes),
    )


def plot_jacobian_heatmap(jacobian: Any) -> Any:
    """A heatmap of a :class:`~natgrad_diag.BlockJacobian` with block boundaries and labels, colours symmetric about
    zero (white = 0), a block of zeros (mean–eta2 for GPflow's map) marked "all 0"; InputError for anything else."""
    data = heatmap_data(jacobian)
    R, C = data.matrix.shape
    side = min(9.0, max(5.0, 0.12 * max(R, C) + 3.0))
    fig = _new_figure(side + 1.5, side)
    from matplotlib.colors import TwoSlopeNorm

    ax = fig.add_subplot()
    vmax = float(np.max(np.abs(data.matrix[np.isfinite(data.matrix)]), initial=0.0)) or 1.0
    image = ax.imshow(data.matrix, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -vmax, vmax), interpolation="nearest", aspect="auto")
    fig.colorbar(image, ax=ax, shrink=0.8, label="∂ output element / ∂ input element")
    for blocks, line, ticks in ((data.row_blocks, ax.axhline, ax.set_yticks), (data.col_blocks, ax.axvline, ax.set_xticks)):
        for span in blocks[:-1]:
            line(span.stop - 0.5, color="black", linewidth=1.2)
        ticks([(s.start + s.stop - 1) / 2 for s in blocks], [s.label for s in blocks])
    ax.tick_params(length=0)
    ax.xaxis.tick_top()
    for r in data.row_blocks:
        for c in data.col_blocks:
            if not np.any(data.matrix[r.start : r.stop, c.start : c.stop]):
                ax.text((c.start + c.stop - 1) / 2, (r.start + r.stop - 1) / 2, f"∂{r.name}/∂{c.name}\nall 0",
                        ha="center", va="center", fontsize=8, color="0.35")  # fmt: skip
    outs, ins = (", ".join(s.name for s in blocks) for blocks in (data.row_blocks, data.col_blocks))
    ax.set_xlabel(f"J = ∂({outs}) / ∂({ins}),  {R} × {C}: rows = outputs, columns = inputs")
    return fig


@dataclass(frozen=True)
class Eta1Comparison:
    """What :func:`plot_eta1_comparison` draws, one entry per element of η₁ (flattened [M, L]): ``labels``
    (``"eta1[0,0]"``, ...), ``vjp`` = dL/dη₁ = Jᵀ·v (what ``output_gradients`` returns) = ``mean_path + varsqrt_path``,
    and ``naive``, ``mean_path``, ``varsqrt_path``: :class:`~natgrad_diag.Explanation`'s ``naive_product`` and paths."""

    labels: tuple[str, ...]
    vjp: Array
    naive: Array
    mean_path: Array
    varsqrt_path: Array

    #: (attribute, legend) in the order drawn.
    SERIES = (("vjp", "dL/deta1 = J^T v  (output_gradients)"), ("naive", "naive (J^T 1) * v"),
              ("mean_path", "mean path"), ("varsqrt_path", "varsqrt path"))  # fmt: skip


def has_eta1_comparison(report: Any) -> bool:
    """True when ``report`` carries what the η₁ chart needs (an ``Explanation`` does)."""
    trace = getattr(report, "trace", None)
    return all(hasattr(report, a) for a in ("naive_product", "mean_path", "varsqrt_path")) and hasattr(trace, "dL_deta1")


def eta1_comparison_data(report: Any) -> Eta1Comparison:
    """The four series per element of η₁, flattened in row-major [M, L] order, from an
    :class:`~natgrad_diag.Explanation` (anything with ``trace.dL_deta1``, ``naive_product``, ``mean_path`` and
    ``varsqrt_path``, each [M, L]); an InputError when one is missing or their shapes differ."""
    if not has_eta1_comparison(report):
        raise input_error("the eta1 chart needs an explanation of output_gradients.", "report",
                          "trace.dL_deta1, naive_product, mean_path, varsqrt_path", type(report).__name__,
                          "pass the result of natgrad_diag.explain_output_gradients().")
    arrays = [np.asarray(a) for a in (report.trace.dL_deta1, report.naive_product, report.mean_path, report.varsqrt_path)]
    if len({a.shape for a in arrays}) != 1:
        raise input_error("the eta1 series do not have one shape.", "report",
                          "four [M, L] arrays", str([a.shape for a in arrays]),
                          "build the report with explain_output_gradients().")
    labels = tuple(f"eta1[{','.join(map(str, idx))}]" for idx in np.ndindex(*arrays[0].shape))
    return Eta1Comparison(labels, *(np.array(a, dtype=float).ravel() for a in arrays))


def plot_eta1_comparison(report: Any, *, max_charts: int = 24) -> Any:
    """One bar chart per element of η₁ (at most ``max_charts``; the title says how many there are): dL/dη₁ (the VJP)
    = mean path + varsqrt path, and the naive product (Jᵀ·1)⊙v, right only when J is diagonal; InputError when
    ``report`` is not an explanation or ``max_charts`` < 1."""
    data = eta1_comparison_data(report)
    max_charts = require_int(max_charts, "max_charts", minimum=1, remedy="pass e.g. max_charts=24.")
    n = min(len(data.labels), max_charts)
    ncols = min(n, 5)
    nrows = math.ceil(n / ncols)
    fig = _new_figure(2.3 * ncols + 0.5, 2.3 * nrows + 1.2)
    for k in range(n):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        ax.bar(range(4), [getattr(data, attr)[k] for attr, _ in data.SERIES],
               color=("#1f5fa8", "#c0392b", "#7f8c8d", "#e6a23c"))  # fmt: skip
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_title(data.labels[k], fontsize=9)
        ax.set_xticks(range(4), ["VJP", "naive", "mean", "varsqrt"], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    fig.legend(fig.axes[0].patches[:4], [t for _, t in data.SERIES], loc="outside lower center", ncols=2, fontsize=8)
    more = f" (first {n} of {len(data.labels)} elements)" if n < len(data.labels) else ""
    fig.suptitle(f"dL/deta1 per element: the VJP = mean path + varsqrt path, not the naive product{more}", fontsize=10)
    return fig


@dataclass(frozen=True)
class CheckError:
    """One numeric check as :func:`plot_check_errors` draws it."""

    name: str
    max_abs_error: float
    tolerance: float
    passed: bool
    expect_difference: bool


def check_errors_data(report: Any) -> tuple[CheckError, ...]:
    """The checks of ``report`` that have both a ``max_abs_error`` and a ``tolerance``, in order."""
    return tuple(
        CheckError(c.name, float(c.max_abs_error), float(c.tolerance), bool(c.passed), bool(c.expect_difference))
        for c in getattr(report, "checks", ()) or () if c.max_abs_error is not None and c.tolerance is not None
    )


def plot_check_errors(report: Any) -> Any:
    """Each numeric check's max abs error (a bar, green when it passes) against its tolerance (a black tick), on a
    log scale, errors of exactly 0 at the left edge; InputError when no check has both an error and a tolerance."""
    if not (rows := check_errors_data(report)):
        raise input_error("the report has no numeric check to draw.", "report", "checks with max_abs_error and tolerance", "none",
                          "draw this picture only for reports with numeric checks (see check_errors_data).")
    values = [v for r in rows for v in (r.max_abs_error, r.tolerance) if np.isfinite(v) and v > 0]
    floor = 10.0 ** (math.floor(math.log10(min(values))) - 2) if values else 1e-18
    top = 10.0 ** (math.ceil(math.log10(max(values))) + 1) if values else 1.0
    fig = _new_figure(8.0, 1.0 + 0.42 * len(rows))
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    for yk, r in zip(y, rows):
        shown = max(r.max_abs_error if np.isfinite(r.max_abs_error) else top, floor)
        ax.barh(yk, shown - floor, left=floor, height=0.6, color="#2e8b57" if r.passed else "#c0392b", alpha=0.8)
        ax.plot([r.tolerance], [yk], marker="|", markersize=18, markeredgewidth=2.5, color="black")
        check = Check(r.name, "", status_of(r.passed), r.max_abs_error, r.tolerance, "", r.expect_difference)
        ax.text(shown * 1.5, yk, " ".join(check.numbers()), va="center", fontsize=8)
    ax.set(xscale="log", xlim=(floor, top * 1e3), xlabel="max abs error (bar) and tolerance (black tick), log scale")
    ax.set_yticks(y, [r.name for r in rows], fontsize=8)
    ax.set_title("Each check's error against its tolerance (green = pass, red = fail)", fontsize=10)
    return fig


@dataclass(frozen=True)
class GammaCurve:
    """What :func:`plot_gamma_losses` draws from a report's γ trials.

    Attributes:
        gammas, losses: the γ whose k steps were all healthy, ascending, and the loss after them.
        failed, failed_steps: the γ whose trial failed, ascending, and the step j at which each failed (None: unknown).
        suggested, checked: the suggested γ (None if none) and the γ checked.
        loss_before, steps: the loss before any step (None if unknown) and k.
    """

    gammas: tuple[float, ...]
    losses: tuple[float, ...]
    failed: tuple[float, ...]
    failed_steps: tuple[int | None, ...]
    suggested: float | None
    checked: float
    loss_before: float | None
    steps: int


def gamma_curve_data(report: Any) -> GammaCurve:
    """The γ trials of ``report`` (a :class:`~natgrad_diag.NatGradReport`) as :class:`GammaCurve`; an InputError when
    it has none."""
    if not getattr(report, "gamma_trials", ()):
        raise input_error("the report has no gamma trials to draw.", "report", "a NatGradReport with gamma_trials",
                          type(report).__name__, "run check_natgrad with gamma_search=True (the default).")
    trials = sorted(report.gamma_trials, key=lambda t: t.gamma)
    ok = [t for t in trials if t.healthy and t.loss is not None and math.isfinite(t.loss)]
    bad = [t for t in trials if t not in ok]
    return GammaCurve(
        tuple(t.gamma for t in ok), tuple(float(t.loss) for t in ok), tuple(t.gamma for t in bad),
        tuple(t.failed_step for t in bad), report.suggested_gamma, report.gamma, report.loss_before, report.gamma_steps,
    )  # fmt: skip


def plot_gamma_losses(report: Any) -> Any:
    """The training loss after k natural-gradient steps against γ (log axis): a line through the healthy trials, the
    failed ones as red × at the top edge labelled with the step that failed, the suggestion ringed, the γ checked
    dashed, the loss before any step dotted; InputError without trials."""
    data = gamma_curve_data(report)
    fig = _new_figure(7.0, 3.8)
    ax = fig.add_subplot()
    k, s = data.steps, "s" if data.steps > 1 else ""
    ax.plot(data.gammas, data.losses, marker="o", color="#1f5fa8", label=f"loss after {k} step{s}")
    if data.loss_before is not None and math.isfinite(data.loss_before):
        ax.axhline(data.loss_before, linestyle=":", color="0.4", label="loss before any step")
    ax.axvline(data.checked, linestyle="--", color="0.3", label=f"gamma checked = {data.checked:g}")
    if data.suggested is not None and data.suggested in data.gammas:
        loss = data.losses[data.gammas.index(data.suggested)]
        ax.plot([data.suggested], [loss], linestyle="none", marker="o", markersize=15, markerfacecolor="none",
                markeredgecolor="#2e8b57", markeredgewidth=2.5, label=f"suggested gamma = {data.suggested:g}")  # fmt: skip
    if data.failed:
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.3 * (high - low))  # headroom: the failed γ sit above every loss
        edge = ax.get_xaxis_transform()  # x in data, y in axes fraction: the top edge whatever the losses
        ax.plot(data.failed, [0.95] * len(data.failed), transform=edge, linestyle="none", marker="x", markersize=10,
                markeredgewidth=2.5, color="#c0392b", clip_on=False, label="failed (at step j)")  # fmt: skip
        for g, j in zip(data.failed, data.failed_steps):
            ax.text(g, 0.88, "failed" if j is None else f"step {j}", transform=edge, ha="center", va="top", fontsize=7, color="#c0392b")
    from matplotlib.ticker import FuncFormatter

    ax.set(xscale="log", xlabel="gamma (log scale)", ylabel=f"training loss after {k} step{s}")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda g, _: f"{g:g}"))
    ax.set_title(f"Loss after {k} natural-gradient step{s} with each gamma (lower is better)", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    return fig


@dataclass(frozen=True)
class TimelineData:
    """What :func:`plot_training_timeline` draws from a monitor's records (steps ascending within each series).

    Attributes:
        check_steps, check_losses: the loss at each periodic check (records with a loss).
        failed_checks: the steps whose periodic checks failed.
        guard_steps, guard_losses: the loss before each guarded step (guard records with a loss).
        gamma_steps, gammas: the γ each guarded step used (``gamma_before``); without guarded steps, the monitor's γ at
            each checked step.
        suggested_steps, suggested: the γ the periodic checks suggested (records with a suggestion).
        rollbacks, failed_guards: the steps rolled back, and the guarded steps that failed.
    """

    check_steps: tuple[int, ...]
    check_losses: tuple[float, ...]
    failed_checks: tuple[int, ...]
    guard_steps: tuple[int, ...]
    guard_losses: tuple[float, ...]
    gamma_steps: tuple[int, ...]
    gammas: tuple[float, ...]
    suggested_steps: tuple[int, ...]
    suggested: tuple[float, ...]
    rollbacks: tuple[int, ...]
    failed_guards: tuple[int, ...]


def timeline_data(monitor: Any) -> TimelineData:
    """The series of a monitor's training (a ``NatGradMonitor`` or a ``TrainingTimeline``: ``records``,
    ``guard_records``, ``gamma``) that :func:`plot_training_timeline` draws; an InputError for anything else."""
    if not (hasattr(monitor, "records") and hasattr(monitor, "guard_records")):
        raise input_error("the timeline needs a training monitor.", "monitor", "a NatGradMonitor (records, guard_records)",
                          type(monitor).__name__, "pass the NatGradMonitor used in training.")  # fmt: skip
    records = sorted(monitor.records, key=lambda r: r.step)
    guards = sorted(monitor.guard_records, key=lambda r: r.step)
    checked = [r for r in records if r.loss is not None]
    guarded = [r for r in guards if r.loss_before is not None]
    gamma = getattr(monitor, "gamma", None)
    steps, gammas = ([r.step for r in guards], [r.gamma_before for r in guards]) if guards else (
        ([r.step for r in records], [gamma] * len(records)) if gamma is not None else ([], []))  # fmt: skip
    hinted = [r for r in records if r.suggested_gamma is not None]
    return TimelineData(
        tuple(r.step for r in checked), tuple(float(r.loss) for r in checked), tuple(r.step for r in records if not r.passed),
        tuple(r.step for r in guarded), tuple(float(r.loss_before) for r in guarded), tuple(steps), tuple(map(float, gammas)),
        tuple(r.step for r in hinted), tuple(float(r.suggested_gamma) for r in hinted),
        tuple(r.step for r in guards if r.rolled_back), tuple(r.step for r in guards if r.status != "ok"),
    )  # fmt: skip


def plot_training_timeline(monitor: Any) -> Any:
    """The loss (top) and γ (bottom, a step plot on a log axis) over the training steps: failed checks as red × and
    failed guarded steps as red ▼ at the top edge, rollbacks as red dashed lines through both panels; InputError for
    anything but a monitor."""
    data = timeline_data(monitor)
    fig = _new_figure(8.0, 5.0)
    loss_ax, gamma_ax = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    if data.guard_steps:
        loss_ax.plot(data.guard_steps, data.guard_losses, color="#1f5fa8", label="loss (guarded steps)")
    if data.check_steps:
        loss_ax.plot(data.check_steps, data.check_losses, linestyle="none", marker="o", color="#e6a23c", label="loss (periodic checks)")
    edge = loss_ax.get_xaxis_transform()
    for steps, marker, label in ((data.failed_checks, "x", "check failed"), (data.failed_guards, "v", "guarded step failed")):
        if steps:
            loss_ax.plot(steps, [0.95] * len(steps), transform=edge, linestyle="none", marker=marker, markersize=9,
                         markeredgewidth=2.2, color="#c0392b", clip_on=False, label=label)  # fmt: skip
    if data.gamma_steps:
        gamma_ax.plot(data.gamma_steps, data.gammas, drawstyle="steps-post", color="0.2", label="gamma used")
    if data.suggested_steps:
        gamma_ax.plot(data.suggested_steps, data.suggested, linestyle="none", marker=".", color="#2e8b57", label="suggested gamma")
    for k, step in enumerate(data.rollbacks):
        for ax in (loss_ax, gamma_ax):
            ax.axvline(step, linestyle="--", linewidth=1.0, color="#c0392b", label="rollback" if k == 0 and ax is loss_ax else None)
    if data.gammas or data.suggested:
        from matplotlib.ticker import NullFormatter

        gamma_ax.set_yscale("log")
        levels = sorted(set(data.gammas + data.suggested))
        gamma_ax.set_yticks(levels, [f"{g:g}" for g in levels] if len(levels) <= 8 else None)
        gamma_ax.yaxis.set_minor_formatter(NullFormatter())
    loss_ax.set_ylabel("training loss")
    gamma_ax.set(xlabel="training step", ylabel="gamma")
    loss_ax.set_title("Natural-gradient training: loss and gamma over the steps", fontsize=10)
    for ax in (loss_ax, gamma_ax):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    return fig


@dataclass(frozen=True)
class Picture:
    """One picture of a report: a file-name stem, a caption and the PNG bytes."""

    name: str
    caption: str
    png: bytes


def picture_kinds(report: Any) -> tuple[str, ...]:
    """The pictures ``report`` has, by what it carries: ``"jacobian"``, ``"eta1"``, ``"gamma"`` (γ trials),
    ``"timeline"`` (a monitor's records) and ``"checks"`` when the error bars inform: numeric checks, and on a
    natural-gradient report (errors mostly 0, its γ picture saying more) one that failed or is inconclusive."""
    from natgrad_diag.autodiff.blocks import BlockJacobian

    rows = check_errors_data(report)
    has = {
        "jacobian": isinstance(getattr(report, "jacobian", None), BlockJacobian), "eta1": has_eta1_comparison(report),
        "gamma": bool(getattr(report, "gamma_trials", ())),
        "timeline": bool(getattr(report, "records", None) or getattr(report, "guard_records", None)),
        "checks": bool(rows) and (not hasattr(report, "gamma_trials") or not all(r.passed for r in rows)),
    }  # fmt: skip
    return tuple(kind for kind, ok in has.items() if ok)


def _caption(kind: str, report: Any) -> str:
    if kind == "jacobian":
        J = report.jacobian
        return (f"The explicit Jacobian ∂({', '.join(J.output_names)})/∂({', '.join(J.input_names)}) from tape.jacobian, "
                f"{J.matrix.shape[0]} × {J.matrix.shape[1]}, with block boundaries. White is 0.")
    if kind == "eta1":
        return ("Per element of eta1: dL/deta1 = Jᵀ·v (what output_gradients returns), the naive product (Jᵀ·1)⊙v, "
                "and the mean-path and varsqrt-path terms that add up to dL/deta1.")
    if kind == "gamma":
        return (f"The training loss after {report.gamma_steps} natural-gradient step(s) with each gamma tried (log axis): "
                "red × at the top = the trial failed (at the step named), ringed = the suggestion, dashed = the gamma checked.")
    if kind == "timeline":
        return ("The training loss (top) and gamma (bottom, log axis) over the steps: red × = a check failed, red ▼ = a "
                "guarded step failed, red dashed lines = rollbacks.")
    return "Each check's max abs error against its tolerance (log scale)."


_DRAW = {"jacobian": lambda report: plot_jacobian_heatmap(report.jacobian), "eta1": plot_eta1_comparison,
         "gamma": plot_gamma_losses, "timeline": plot_training_timeline, "checks": plot_check_errors}  # fmt: skip


def report_pictures(report: Any) -> tuple[Picture, ...]:
    """Every picture ``report`` has (see :func:`picture_kinds`) as PNG; empty, and no matplotlib needed, when there
    is nothing to draw. Raises MissingExtraError when there is and matplotlib is not installed."""
    if not (kinds := picture_kinds(report)):
        return ()
    require_matplotlib()
    from natgrad_diag.progress import progress_bar

    pictures = []
    with progress_bar(total=len(kinds), description="drawing pictures") as advance:
        for kind in kinds:
            pictures.append(Picture(kind, _caption(kind, report), figure_to_png(_DRAW[kind](report))))
            advance()
    return tuple(pictures)
