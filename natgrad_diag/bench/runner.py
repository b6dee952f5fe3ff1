"""``natgrad-diag bench``: every comparison in one run (docs/performance.md lists them), and the command line's rows."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from natgrad_diag.bench.jacobian import bench_check_gradients_fast, bench_fill, bench_jacobian, bench_memory, bench_vech
from natgrad_diag.bench.report import BenchReport, BenchRow
from natgrad_diag.bench.step import (bench_apply, bench_check_natgrad, bench_guard, bench_minimize, bench_threads,
                                     bench_trace)  # fmt: skip
from natgrad_diag._validate import input_error, require_int
from natgrad_diag.autodiff.memory import check_memory, memory_limit
from natgrad_diag.bench.timing import Run, machine_info, make_row, subprocess_env, time_subprocess
from natgrad_diag.exceptions import error_line
from natgrad_diag.progress import progress_bar
from natgrad_diag.report.records import Check, status_of

__all__ = ["DEFAULT_SIZES", "QUICK_SIZES", "BenchReport", "BenchRow", "run_bench", "validate_sizes"]

DEFAULT_SIZES, QUICK_SIZES = (50, 200, 1000), (10, 30)  #: M for the natgrad_trace rows, in a full and a quick run
#: M×M float64 matrices alive at once in a natgrad_trace row: q_sqrt, its gradient and GPflow's copies of both,
#: S, its Cholesky factor and inverse, the natural parameters and their gradients, and the new q_sqrt (about 16).
_TRACE_MATRICES = 16


def validate_sizes(sizes: Any) -> tuple[int, ...] | None:
    """The sizes as ints ≥ 2, refused before any allocation if a natgrad_trace row would not fit in memory."""
    if sizes is None:
        return None
    out: tuple[int, ...] = ()
    with contextlib.suppress(TypeError, ValueError):
        out = tuple(int(s) for s in sizes)
    if not out or any(s < 2 for s in out) or any(float(s) != float(o) for s, o in zip(out, sizes)):
        raise input_error("sizes must be a list of integers M ≥ 2.", "sizes", "e.g. [50, 200, 1000]", repr(sizes),
                          "pass --sizes 50,200 (comma-separated), or leave it out for the defaults.")  # fmt: skip
    check_memory(
        _TRACE_MATRICES * max(out) ** 2 * 8, memory_limit(), "the benchmark",
        title=f"The natgrad_trace benchmark at M = {max(out)} (about {_TRACE_MATRICES} M×M float64 matrices)",
        remedy="pass smaller --sizes (e.g. 50,200,1000); the limit is half of this machine's memory.", argument="sizes",
    )  # fmt: skip
    return out


def bench_cli(run: Run) -> list[BenchRow]:
    """``natgrad-diag --help`` (≤ 0.3 s, no TensorFlow import) and ``natgrad-diag`` against ``import gpflow``."""
    group = "the command line"
    code = "import sys; from natgrad_diag.cli.app import build_parser; build_parser(); print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=subprocess_env())
    run.checks.append(Check("help_imports_no_tensorflow", "importing natgrad_diag.cli.app and building the parser does "
                            "not import TensorFlow", status_of(out.stdout.strip() == "False"),
                            detail=out.stderr.strip()[-200:] if out.returncode else ""))  # fmt: skip
    exe = shutil.which("natgrad-diag")
    cli = [exe] if exe else [sys.executable, "-m", "natgrad_diag"]
    n = max(3, min(run.repeats, 5))
    t_help, t_py = time_subprocess(cli + ["--help"], n), time_subprocess([sys.executable, "-c", "pass"], n)
    # the target is absolute (≤ 0.3 s): judge the time itself; the ratio to a bare interpreter is context
    rows = [BenchRow(group, "natgrad-diag --help", None, t_help, "python -c pass", t_py,
                     None if t_help is None or not t_py else t_help / t_py, "≤ 0.3 s", None if t_help is None else t_help <= 0.3)]  # fmt: skip
    t_explain = None if run.quick else time_subprocess(cli + ["--plain"], run.few)
    t_gpflow = None if run.quick else time_subprocess([sys.executable, "-c", "import gpflow"], run.few)
    ratio, meets, note = (
        (t_explain / t_gpflow, t_explain <= t_gpflow + 2.0, f"{t_explain - t_gpflow:+.2f} s")
        if t_explain is not None and t_gpflow is not None else (None, None, "skipped in --quick" if run.quick else "")
    )
    rows.append(BenchRow(group, "natgrad-diag (explain)", None, t_explain, "python -c 'import gpflow'", t_gpflow, ratio,
                         "≤ import + 2 s", meets, note=note))  # fmt: skip
    return rows


#: Every comparison, in the report's order.
ROWS = (bench_trace, bench_threads, bench_jacobian, bench_vech, bench_memory, bench_check_natgrad, bench_apply,
        bench_minimize, bench_fill, bench_check_gradients_fast, bench_guard, bench_cli)  # fmt: skip


def run_bench(sizes: Sequence[int] | None = None, repeats: int = 5, quick: bool = False, progress: bool = True) -> BenchReport:
    """Time natgrad-diag against TensorFlow and GPflow in one run, each measurement by ``timing.compare``. Targets are
    reported, never enforced. A comparison that raises gets a row saying so.

    Args:
        sizes: M for the ``natgrad_trace`` rows (default 50, 200, 1000; ``quick``: 10, 30); the others are fixed.
        repeats: timed calls per measurement (≥ 1).
        quick: a smoke run at small sizes (about a minute); the targets are meant for the full run.
        progress: show a progress bar on a terminal.

    Returns a frozen :class:`BenchReport` (``to_dict()["ratios"]``) whose checks are the correctness of what was
    timed; raises InputError when ``sizes`` or ``repeats`` is not valid.
    """
    size_list = validate_sizes(sizes)
    run = Run(size_list or (QUICK_SIZES if quick else DEFAULT_SIZES), require_int(repeats, "repeats", minimum=1), bool(quick))
    start, rows = time.perf_counter(), []
    with progress_bar(total=len(ROWS), description="benchmark", enabled=progress) as advance:
        machine = machine_info()
        for bench in ROWS:
            try:
                rows.extend(bench(run))
            except Exception as e:  # noqa: BLE001 - one failing comparison must not abort the run: its row says why
                rows.append(make_row(bench.__name__, bench.__name__, None, None, "-", None, None,
                                     note=f"failed: {error_line(e, with_type=True, limit=120)}"))  # fmt: skip
            advance()
    return BenchReport(machine=machine, rows=tuple(rows), repeats=run.repeats, quick=run.quick, checks=tuple(run.checks),
                       seconds=time.perf_counter() - start)  # fmt: skip
