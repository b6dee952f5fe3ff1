"""The benchmark's structure (a quick smoke run; nothing is timed against a target here) and the CLI's cold start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from natgrad_diag.bench.runner import BenchReport, BenchRow, run_bench
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
        "fast_gradcheck_passes_on_gpflow", "fast_check_natgrad_passes",
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


#: The speed rows of issue 15: the key prefix (before ", M=") and the M of the quick run.
SPEED_KEYS = {
    "natgrad_trace vs _natgrad_apply_gradients": [12],
    "NaturalGradient apply (natgrad_diag) vs _natgrad_apply_gradients": [10, 30],
    "NaturalGradient (natgrad_diag) vs NaturalGradient (gpflow)": [50],
    "natgrad_map_jacobian vs filling its array": [10, 20],
    "check_natgrad(mode='fast') vs NaturalGradient step": [50],
    "check_gradients(mode='fast') vs one compiled f and VJP": [50],
}


@pytest.mark.slow
def test_run_bench__quick_run_has_the_speed_keys_at_small_sizes(quick_report):
    ratios = quick_report.to_dict()["ratios"]
    for prefix, sizes in SPEED_KEYS.items():
        for M in sizes:
            key = f"{prefix}, M={M}"
            assert key in ratios, key
            assert ratios[key] is not None and ratios[key] > 0, key


@pytest.mark.slow
def test_run_bench__targets_meant_for_full_sizes_are_not_judged_in_a_quick_run(quick_report):
    """At small sizes a missed target says "n/a at this size", never "NO"."""
    new = [r for r in quick_report.rows if any(f"{r.what} vs {r.baseline_name}" == k for k in SPEED_KEYS)]
    speed = [r for r in new if r.what != "natgrad_trace"]
    assert speed and all(not r.applies and r.meets is None for r in speed)
    text = str(quick_report)
    assert text.count("n/a at this size") >= len(speed)
    rows = [
        line for line in text.splitlines() if "ours, apply" in line or "fast gradcheck" in line or "np.ones" in line
    ]
    assert rows and not any(" NO" in line for line in rows)
    d = quick_report.to_dict()
    assert all(row["applies"] is False for row in d["rows"] if row["what"] == "NaturalGradient apply (natgrad_diag)")


def test_bench_row__a_full_size_row_is_judged_and_rendered():
    from natgrad_diag.bench.report import BenchReport
    from natgrad_diag.bench.speed import not_applicable
    from natgrad_diag.bench.timing import make_row

    row = make_row("g", "NaturalGradient apply (natgrad_diag)", 1000, 2.0, "_natgrad_apply_gradients", 1.0, 0.6)
    assert row.ratio == 2.0 and row.meets is False and row.applies
    small = not_applicable(row)
    assert small.meets is None and not small.applies and small.ratio == 2.0
    text = str(BenchReport(machine={}, rows=(row, small), repeats=1, quick=False))
    assert "≤ 0.6× NO" in text and "≤ 0.6× n/a at this size" in text
