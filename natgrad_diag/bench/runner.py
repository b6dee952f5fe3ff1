"""How fast natgrad-diag is, measured against TensorFlow and GPflow in the same run.

Every row times ours and its baseline in one process, after a warm-up call of each (tracing is not
timed), alternating the two ``repeats`` times and taking the median of each, and reports the ratio
ours / baseline (lower is better) next to its target:

* ``natgrad_trace`` (compiled) against GPflow's ``NaturalGradient._natgrad_apply_gradients`` in a
  ``tf.function`` on a copy of the parameters, for each M (target ≤ 1.3×);
* ``natgrad_map_jacobian`` (``jacobian()`` of the natgrad map, vech η₂) against ``tape.jacobian``,
  compiled (target ≤ 1.2×) and eager (target: ≥ 3× faster);
* the vech Jacobian against the general one (M + M(M+1)/2 against M + M² columns; target ≤ 0.6×
  in time and stored size);
* the peak memory of building the dense Jacobian, in a fresh subprocess (``VmHWM`` from
  ``/proc/self/status`` after resetting it), as a multiple of the Jacobian's size above the
  process baseline (target ≤ 1.5×; ``tape.jacobian``'s pfor needs 3-4×);
* fast-mode ``check_natgrad`` against one compiled GPflow ``NaturalGradient`` step on an SVGP
  (target ≤ 1.6×), when ``check_natgrad(..., mode="fast")`` exists; the natgrad_trace target is ≤ 0.7× at M = 1000;
* ``natgrad_diag.NaturalGradient.apply_natgrad`` against GPflow's ``_natgrad_apply_gradients`` on a plain
  ``gpflow.optimizers.NaturalGradient`` (the apply part alone, same gradients, both compiled; M = 200, 1000;
  target ≤ 0.6×), and one whole compiled ``minimize`` step of each on an SVGP with N = 2000 (≤ 0.8×);
* the closed-form ``natgrad_map_jacobian`` against ``np.ones`` of its stored array's shape and dtype
  (M = 60, 100; target ≤ 4×);
* fast-mode ``check_gradients`` on ``natural_to_meanvarsqrt`` (4 directions) against one compiled f and
  VJP, tracing included on both sides (M = 1000; target ≤ 15×);
* ``natgrad-diag --help`` (target ≤ 0.3 s, and no TensorFlow import) and ``natgrad-diag`` against
  ``python -c "import gpflow"`` (target: within 2 s).

Targets are reported, never enforced: a slow machine does not fail the command; in a ``--quick`` run
the targets meant for the full sizes read "n/a at this size". The checks are about correctness only
(what is timed computes the same numbers as its baseline).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from natgrad_diag.bench.cases import (
    bench_check_natgrad,
    bench_cli,
    bench_jacobian,
    bench_memory,
    bench_trace,
    bench_vech,
)
from natgrad_diag.bench.report import BenchReport, BenchRow
from natgrad_diag.bench.speed import bench_apply, bench_check_gradients_fast, bench_fill, bench_minimize, not_applicable
from natgrad_diag.bench.timing import machine_info
from natgrad_diag.exceptions import InputError
from natgrad_diag.report.records import Check

__all__ = ["DEFAULT_SIZES", "QUICK_SIZES", "BenchReport", "BenchRow", "run_bench"]

#: M for the natgrad_trace rows.
DEFAULT_SIZES = (50, 200, 1000)
#: M for ``--quick`` (a smoke run of every row at small sizes).
QUICK_SIZES = (10, 30)


def _validate_sizes(sizes: Any) -> tuple[int, ...] | None:
    if sizes is None:
        return None
    try:
        out = tuple(int(s) for s in sizes)
    except (TypeError, ValueError):
        out = ()
    if not out or any(s < 2 for s in out) or any(float(s) != float(o) for s, o in zip(out, sizes)):
        raise InputError(
            "sizes must be a list of integers M ≥ 2.",
            context=[("Argument", "sizes"), ("Expected", "e.g. [50, 200, 1000]"), ("Got", repr(sizes))],
            remedy="pass --sizes 50,200 (comma-separated), or leave it out for the defaults.",
        )
    _check_sizes_fit(out)
    return out


#: M×M float64 matrices alive at once in a natgrad_trace row: q_sqrt, its gradient and GPflow's copies of both,
#: S, its Cholesky factor and inverse, the natural parameters and their gradients, and the new q_sqrt (about 16).
_TRACE_MATRICES = 16


def trace_nbytes(M: int) -> int:
    """Peak bytes of one natgrad_trace row at M (float64, L = 1), estimated before anything is allocated.

    Examples:
        >>> trace_nbytes(1000)  # 16 matrices of 1000 × 1000 float64
        128000000
    """
    return _TRACE_MATRICES * M * M * 8


def _check_sizes_fit(sizes: tuple[int, ...]) -> None:
    """Refuse, before any allocation, a size whose natgrad_trace row would not fit in memory (estimate shown)."""
    from natgrad_diag.autodiff.memory import check_memory, memory_limit

    M = max(sizes)
    check_memory(
        trace_nbytes(M), memory_limit(), "the benchmark", title=f"The natgrad_trace benchmark at M = {M} (about {_TRACE_MATRICES} M×M float64 matrices)",
        remedy="pass smaller --sizes (e.g. 50,200,1000); the limit is half of this machine's memory.", argument="sizes",
    )  # fmt: skip


#: The name the CLI and tests use.
validate_sizes = _validate_sizes


def _judged(rows: list[BenchRow], quick: bool) -> list[BenchRow]:
    """Rows whose target is meant for the full sizes: not judged in a quick run."""
    return [not_applicable(r) for r in rows] if quick else rows


def run_bench(
    sizes: Sequence[int] | None = None,
    repeats: int = 5,
    quick: bool = False,
    progress: bool = True,
) -> BenchReport:
    """Time natgrad-diag against TensorFlow and GPflow in one run; return the ratios.

    Each measurement warms up ours and the baseline (tracing is not timed), then alternates
    ``repeats`` timed calls of each and takes the medians; ratio = ours / baseline.

    Args:
        sizes: M for the ``natgrad_trace`` rows (default 50, 200, 1000; ``quick``: 10, 30). The
            other rows use fixed sizes: the Jacobian at M = 40, vech against general at M = 60,
            memory at M = 80, fast-mode check at M = 1000 with N = 2000 (``quick``: 10, 20, 30, 50).
        repeats: timed calls per measurement (≥ 1).
        quick: a smoke run at small sizes (about half a minute); targets are meant for the full run.
        progress: show a progress bar on a terminal.

    Returns:
        A frozen :class:`BenchReport`: ``sections()`` are the tables, ``to_dict()["ratios"]`` the ratios.
        Its checks are correctness checks of what was timed; missed speed targets never fail it.

    Raises:
        InputError: ``sizes`` or ``repeats`` is not valid.
    """
    from natgrad_diag.progress import progress_bar

    size_list = _validate_sizes(sizes)
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise InputError(
            "repeats must be a positive integer.",
            context=[("Argument", "repeats"), ("Expected", "an int ≥ 1"), ("Got", repr(repeats))],
            remedy="pass e.g. repeats=5.",
        )
    repeats = int(repeats)
    if size_list is None:
        size_list = QUICK_SIZES if quick else DEFAULT_SIZES
    M_jac, M_vech, M_mem, M_check, N_check = (10, 20, 30, 50, 200) if quick else (40, 60, 80, 1000, 2000)
    M_apply, M_fill = ((10, 30), (10, 20)) if quick else ((200, 1000), (60, 100))
    start = time.perf_counter()
    checks: list[Check] = []
    rows: list[BenchRow] = []
    tasks: list[tuple[str, Callable[[], list[BenchRow]]]] = [
        ("natgrad_trace", lambda: bench_trace(size_list, repeats, checks)),
        ("jacobian", lambda: bench_jacobian(M_jac, repeats, checks)),
        ("vech", lambda: bench_vech(M_vech, repeats, checks)),
        ("memory", lambda: bench_memory(M_mem, ("general",) if quick else ("general", "vech", "tape"))),
        (
            "check_natgrad",
            lambda: _judged(bench_check_natgrad(M_check, N_check, max(1, min(repeats, 3)), checks), quick),
        ),
        ("apply", lambda: bench_apply(M_apply, repeats, checks, applies=not quick)),
        ("minimize", lambda: bench_minimize(M_check, N_check, max(1, min(repeats, 3)), checks, applies=not quick)),
        ("fill", lambda: bench_fill(M_fill, max(1, min(repeats, 3)), checks, applies=not quick)),
        (
            "check_gradients",
            lambda: bench_check_gradients_fast(M_check, 1 if not quick else repeats, checks, applies=not quick),
        ),
        ("cli", lambda: bench_cli(repeats, quick, checks)),
    ]
    with progress_bar(total=len(tasks), description="benchmark", enabled=progress) as advance:
        machine = machine_info()
        for _, task in tasks:
            rows.extend(task())
            advance()
    return BenchReport(
        machine=machine,
        rows=tuple(rows),
        repeats=repeats,
        quick=bool(quick),
        checks=tuple(checks),
        seconds=time.perf_counter() - start,
    )
