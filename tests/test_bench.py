"""The benchmark's structure (a quick smoke run; nothing is timed against a target here) and the CLI's cold start."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from natgrad_diag.bench import runner
from natgrad_diag.bench.report import SHORT
from natgrad_diag.bench.runner import BenchReport, BenchRow, run_bench
from natgrad_diag.bench.timing import make_row
from natgrad_diag.exceptions import InputError
from natgrad_diag.report.base import Report

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_report() -> BenchReport:
    return run_bench(sizes=[12], repeats=1, quick=True, progress=False)


@pytest.mark.slow
def test_run_bench__quick_report_has_every_comparison(quick_report):
    r = quick_report
    assert isinstance(r, BenchReport) and isinstance(r, Report)
    assert all(isinstance(row, BenchRow) for row in r.rows)
    groups = {row.group for row in r.rows}
    assert any("natgrad_trace" in g for g in groups)
    assert any("tape.jacobian" in g for g in groups)
    assert any("vech" in g for g in groups)
    assert any("peak memory" in g for g in groups)
    assert any("check_natgrad" in g for g in groups)
    assert any("command line" in g for g in groups)
    trace_rows = [row for row in r.rows if row.what == "natgrad_trace"]
    assert [row.M for row in trace_rows] == [12]
    for row in trace_rows:
        assert row.ours > 0 and row.baseline > 0 and row.ratio == pytest.approx(row.ours / row.baseline)
    speedup = [row for row in r.rows if row.higher_is_better]
    assert speedup and all(row.ratio == pytest.approx(row.baseline / row.ours) for row in speedup)
    # the vech stored size is exact: (M + M(M+1)/2) / (M + M²) at M = 20
    size_row = next(row for row in r.rows if row.what == "vech Jacobian: stored size")
    assert size_row.ratio == pytest.approx((20 + 210) / (20 + 400))


@pytest.mark.slow
def test_run_bench__checks_are_correctness_only_and_hold(quick_report):
    names = {c.name for c in quick_report.checks}
    assert names == {
        "trace_matches_gpflow", "jacobian_matches_tape", "vech_matches_general", "help_imports_no_tensorflow",
        "apply_matches_gpflow", "minimize_matches_gpflow", "closed_form_jacobian_matches_autodiff",
        "fast_gradcheck_passes_on_gpflow", "fast_check_natgrad_passes_gamma_steps", "fast_check_natgrad_passes_defaults",
        "blas_threads_agree", "guarded_training_is_plain_training", "guard_records_every_step",
    }  # fmt: skip
    failed = [c.name for c in quick_report.checks if not c.passed]
    assert not failed and quick_report.passed, str(quick_report)


@pytest.mark.slow
def test_run_bench__text_and_json_carry_machine_tables_and_ratios(quick_report):
    text = str(quick_report)
    assert "TensorFlow 2." in text and "cores" in text and "ratio" in text and "target" in text
    assert len(quick_report.sections()) >= 6 and all(s.tables for s in quick_report.sections()[1:])
    d = json.loads(json.dumps(quick_report.to_dict()))
    assert d["quick"] is True and d["repeats"] == 1 and d["machine"]["tensorflow"].startswith("2.")
    assert len(d["ratios"]) == len(d["rows"]) == len(quick_report.rows)
    assert d["ratios"]["natgrad_trace vs _natgrad_apply_gradients, M=12"] == pytest.approx(quick_report.rows[0].ratio)
    assert "natgrad_map_jacobian vs tape.jacobian, eager, M=10" in d["ratios"]


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"sizes": [1]}, "sizes"),
        ({"sizes": "abc"}, "sizes"),
        ({"sizes": [2.5]}, "sizes"),
        ({"repeats": 0}, "repeats"),
        ({"repeats": True}, "repeats"),
    ],
)
def test_run_bench__bad_arguments_are_refused_before_any_work(kwargs, fragment):
    with pytest.raises(InputError, match=fragment):
        run_bench(progress=False, **kwargs)


def test_cli_parser__builds_without_importing_tensorflow():
    code = (
        "import sys; from natgrad_diag.cli.app import build_parser; p = build_parser(); "
        "a = p.parse_args(['bench', '--sizes', '50,200', '--quick']); "
        "print('tensorflow' in sys.modules, 'gpflow' in sys.modules, a.sizes, a.quick)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False", "[50,", "200]", "True"]


def test_bench_script__is_the_bench_command(capsys):
    """scripts/bench.py runs `natgrad-diag bench` with the same options (one parser, not two)."""
    import subprocess

    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "--sizes" in r.stdout and "--quick" in r.stdout and "--repeats" in r.stdout
    for bad in (["--sizes", "1,x"], ["--repeats", "0"]):
        r = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "bench.py"), *bad], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 2 and "error" in r.stderr


#: The speed rows: the key prefix (before ", M=") and the M of the quick run.
SPEED_KEYS = {
    "natgrad_trace vs _natgrad_apply_gradients": [12],
    "NaturalGradient apply (natgrad_diag) vs _natgrad_apply_gradients": [10, 30],
    "NaturalGradient (natgrad_diag) vs NaturalGradient (gpflow)": [50],
    "natgrad_map_jacobian vs filling its array": [10, 20],
    "check_natgrad(mode='fast', gamma_steps=1) vs NaturalGradient step": [50],
    "check_natgrad(mode='fast', defaults) vs NaturalGradient step": [50],
    "check_gradients(mode='fast') vs one compiled f and VJP": [50],
}


def _seconds(shown: str) -> float:
    """"0.722 ms" or "GPflow 1.2 s" (the table's cell) in seconds."""
    value, unit = shown.split()[-2:]
    return float(value) * {"ms": 1e-3, "s": 1.0}[unit]


def _shown(report: BenchReport, row: BenchRow) -> tuple[str, ...]:
    """The table row printed for ``row``: (what, ours, baseline, ratio, target), found by its labels."""
    label, base = f"{SHORT.get(row.what, row.what)}, M={row.M}", SHORT.get(row.baseline_name, row.baseline_name) + " "
    found = [cells for s in report.sections() for t in s.tables for cells in t.rows if cells[0] == label and cells[2].startswith(base)]
    assert len(found) == 1, (label, base)
    return tuple(found[0])


@pytest.mark.slow
def test_run_bench__quick_run_has_the_speed_keys_at_small_sizes(quick_report):
    """Every speed row is measured, its ratio is the one the printed timings give, and it is not judged at these sizes.

    The table prints each time with 3 significant digits and the ratio with 3 (half a unit in the last place: at
    most 0.5 % each), so the printed ratio and the ratio of the printed times agree within 1.5 %."""
    ratios, rows = quick_report.ratios, {f"{r.what} vs {r.baseline_name}, M={r.M}": r for r in quick_report.rows}
    for prefix, sizes in SPEED_KEYS.items():
        for M in sizes:
            key = f"{prefix}, M={M}"
            row = rows[key]
            assert math.isfinite(row.ours) and math.isfinite(row.baseline) and row.ours > 0 and row.baseline > 0, key
            assert ratios[key] == row.ratio == row.ours / row.baseline, key
            _, ours, base, ratio, target = _shown(quick_report, row)
            assert float(ratio.rstrip("×")) == pytest.approx(_seconds(ours) / _seconds(base), rel=0.015), (key, ours, base, ratio)
            assert target.endswith("n/a at this size") and not row.applies and row.meets is None, (key, target)
    assert quick_report.passed and [c.name for c in quick_report.checks if not c.passed] == []


@pytest.mark.slow
def test_run_bench__targets_meant_for_full_sizes_are_not_judged_in_a_quick_run(quick_report):
    """At small sizes a timing target says "n/a at this size", never "NO"; only the exact vech size ratio and the
    absolute --help time are judged (and reference rows are shown, not judged)."""
    judged = {r.what for r in quick_report.rows if r.meets is not None}
    assert judged == {"vech Jacobian: stored size", "natgrad-diag --help"}, judged
    for r in quick_report.rows:  # the others: n/a at this size, a reference, or not run (explain, skipped)
        assert r.what in judged or (r.meets is None and (not r.applies or r.target == "reference" or r.ratio is None)), r
    table_rows = [cells for s in quick_report.sections() for t in s.tables for cells in t.rows]
    unjudged = [cells for cells in table_rows if cells[0].split(",")[0] not in ("vech size", "--help")]
    assert unjudged and not any(cells[4].endswith((" NO", " yes")) for cells in unjudged)
    assert all(row["applies"] is False for row in quick_report.to_dict()["rows"] if row["what"] == "NaturalGradient apply (natgrad_diag)")


@pytest.mark.slow
def test_run_bench__blas_threads_row_shows_one_thread_against_the_default(quick_report):
    from threadpoolctl import threadpool_info

    row = next(r for r in quick_report.rows if r.what == "LAPACK record, 1 BLAS thread")
    assert (row.M, row.baseline_name, row.target, row.meets) == (30, "BLAS default threads", "reference", None)
    assert row.ours > 0 and row.baseline > 0 and row.ratio == row.ours / row.baseline
    threads = max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
    assert row.note == f"default here = {threads} threads"
    assert next(c for c in quick_report.checks if c.name == "blas_threads_agree").passed


def test_run_bench__a_failing_comparison_gets_a_row_and_the_others_still_run(monkeypatch):
    def broken(run):
        raise RuntimeError("no such kernel")

    def fine(run):
        run.agree("fine_agrees", "a comparison that runs", 0.0, 1e-9)
        return [make_row("g", "ours", 3, 1.0, "theirs", 4.0, 0.5)]

    monkeypatch.setattr(runner, "ROWS", (broken, fine))
    r = run_bench(sizes=[5], repeats=1, quick=False, progress=False)
    assert [(row.what, row.ratio, row.note) for row in r.rows] == [
        ("broken", None, "failed: RuntimeError: no such kernel"), ("ours", 0.25, "")
    ]
    assert r.rows[1].meets is True and [c.name for c in r.checks] == ["fine_agrees"]


def test_bench_row__a_full_size_row_is_judged_and_rendered():
    row = make_row("g", "NaturalGradient apply (natgrad_diag)", 1000, 2.0, "_natgrad_apply_gradients", 1.0, 0.6)
    assert row.ratio == 2.0 and row.meets is False and row.applies
    small = make_row("g", "NaturalGradient apply (natgrad_diag)", 10, 2.0, "_natgrad_apply_gradients", 1.0, 0.6, applies=False)
    assert small.meets is None and not small.applies and small.ratio == 2.0
    reference = make_row("g", "LAPACK record, 1 BLAS thread", 1000, 0.002, "BLAS default threads", 1.0, None)
    assert (reference.target, reference.meets, reference.ratio) == ("reference", None, 0.002)
    text = str(BenchReport(machine={}, rows=(row, small, reference), repeats=1, quick=False))
    assert "≤ 0.6× NO" in text and "≤ 0.6× n/a at this size" in text and "0.002×" in text and "reference -" in text
