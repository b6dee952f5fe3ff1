"""How the benchmark times and judges: one run's settings, warm-up, alternating repeats, medians, a row's verdict."""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from natgrad_diag.bench.report import BenchRow
from natgrad_diag.report.records import Check, status_of
from natgrad_diag.typing import Array

__all__ = ["Run", "compare", "machine_info", "make_row", "random_q", "subprocess_env", "time_subprocess"]


@dataclasses.dataclass
class Run:
    """One benchmark run: the natgrad_trace sizes, repeats, quick or not, and the correctness checks it collects."""

    sizes: tuple[int, ...]
    repeats: int
    quick: bool
    checks: list[Check] = dataclasses.field(default_factory=list)

    @property
    def few(self) -> int:
        """Repeats for the rows whose calls take seconds."""
        return max(1, min(self.repeats, 3))

    def size(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full

    def row(self, *args: Any, **kwargs: Any) -> BenchRow:
        """:func:`make_row`, its target judged in a full run only (a quick run shows "n/a at this size")."""
        return make_row(*args, applies=not self.quick, **kwargs)

    def agree(self, name: str, claim: str, err: float, tolerance: float) -> None:
        """Record the correctness check that what was timed equals its baseline to ``tolerance``."""
        self.checks.append(Check(name, claim, status_of(err <= tolerance), max_abs_error=err, tolerance=tolerance))


def _time_once(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    getattr(fn(), "numpy", lambda: None)()  # a tensor is ready when its value is
    return time.perf_counter() - t


def compare(ours: Callable[[], Any], base: Callable[[], Any], repeats: int, *, warm_up: bool = True) -> tuple[float, float]:
    """The medians of ``repeats`` alternated timed calls (who goes first alternates too: a burst of load on a shared
    machine does not land on one side), after a warm-up call of each unless ``warm_up=False``."""
    for fn in (ours, base) if warm_up else ():
        fn()
    times: tuple[list[float], list[float]] = ([], [])
    for k in range(repeats):
        for i in (1, 0) if k % 2 else (0, 1):
            times[i].append(_time_once((ours, base)[i]))
    return statistics.median(times[0]), statistics.median(times[1])


def make_row(group: str, what: str, M: int | None, ours: float | None, base_name: str, base: float | None,
             target: float | None, *, higher_is_better: bool = False, note: str = "", unit: str = "s",
             applies: bool = True) -> BenchRow:  # fmt: skip
    """The :class:`BenchRow` of a comparison, with its ratio, its target as text (``None``: a reference row) and verdict."""
    ratio = None if ours is None or base is None or ours <= 0 or base <= 0 else (base / ours if higher_is_better else ours / base)
    meets = ((ratio >= target if higher_is_better else ratio <= target)
             if ratio is not None and target is not None and applies else None)  # fmt: skip
    tgt = "reference" if target is None else f"≥ {target:g}× faster" if higher_is_better else f"≤ {target:g}×"
    return BenchRow(group, what, M, ours, base_name, base, ratio, tgt, meets, note, unit, higher_is_better, applies or target is None)


def machine_info() -> dict[str, Any]:
    import gpflow
    import tensorflow as tf

    return {"cores": os.cpu_count(), "machine": platform.machine(), "platform": platform.platform(terse=True),
            "python": platform.python_version(), "tensorflow": tf.__version__, "gpflow": gpflow.__version__, "numpy": np.__version__}  # fmt: skip


def random_q(M: int, L: int = 1, seed: int = 0) -> tuple[Array, Array]:
    """q_mu [M, L] ~ N(0, 1) and q_sqrt [L, M, M] = chol(A Aᵀ + I), A ~ N(0, 1/M): κ(S) of a few."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(L, M, M)) / np.sqrt(M)
    return rng.normal(size=(M, L)), np.linalg.cholesky(A @ np.swapaxes(A, -1, -2) + np.eye(M))


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}


def time_subprocess(cmd: Sequence[str], repeats: int) -> float | None:
    """The median wall time of running ``cmd``, or None if it cannot run."""
    try:
        return statistics.median([_time_once(lambda: subprocess.run(list(cmd), capture_output=True, timeout=600,
                                                                    env=subprocess_env(), check=False)) for _ in range(repeats)])  # fmt: skip
    except (subprocess.SubprocessError, OSError):
        return None
