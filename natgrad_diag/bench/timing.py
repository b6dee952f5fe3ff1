"""How the benchmark times: warm-up, alternating repeats, medians, ratios against a target, the machine."""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from natgrad_diag.bench.report import BenchRow
from natgrad_diag.typing import Array

__all__ = ["cli_command", "compare", "machine_info", "make_row", "random_q", "subprocess_env", "time_once", "time_subprocess"]


def time_once(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    out = fn()
    if hasattr(out, "numpy"):
        out.numpy()
    return time.perf_counter() - t


def compare(ours: Callable[[], Any], base: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Warm up both, then alternate ``repeats`` timed calls of each (which goes first alternates too,
    so that a burst of load on a shared machine does not land on one side); the two medians."""
    ours()
    base()
    t_ours, t_base = [], []
    for k in range(repeats):
        if k % 2:
            t_base.append(time_once(base))
            t_ours.append(time_once(ours))
        else:
            t_ours.append(time_once(ours))
            t_base.append(time_once(base))
    return statistics.median(t_ours), statistics.median(t_base)


def make_row(group: str, what: str, M: int | None, ours: float | None, base_name: str, base: float | None,
         target: float, *, higher_is_better: bool = False, note: str = "", unit: str = "s") -> BenchRow:  # fmt: skip
    if ours is None or base is None or ours <= 0 or base <= 0:
        ratio, meets = None, None
    elif higher_is_better:
        ratio = base / ours
        meets = ratio >= target
    else:
        ratio = ours / base
        meets = ratio <= target
    tgt = f"≥ {target:g}× faster" if higher_is_better else f"≤ {target:g}×"
    return BenchRow(group, what, M, ours, base_name, base, ratio, tgt, meets, note, unit, higher_is_better)


def machine_info() -> dict[str, Any]:
    import gpflow
    import tensorflow as tf

    return {
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "gpflow": gpflow.__version__,
        "numpy": np.__version__,
    }


def random_q(M: int, L: int = 1, seed: int = 0) -> tuple[Array, Array]:
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(L, M, M)) / np.sqrt(M)
    S = A @ np.swapaxes(A, -1, -2) + np.eye(M)
    return rng.normal(size=(M, L)), np.linalg.cholesky(S)


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def cli_command() -> list[str]:
    exe = shutil.which("natgrad-diag")
    return [exe] if exe else [sys.executable, "-m", "natgrad_diag"]


def time_subprocess(cmd: Sequence[str], repeats: int) -> float | None:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        try:
            subprocess.run(list(cmd), capture_output=True, timeout=600, env=subprocess_env(), check=False)
        except (subprocess.SubprocessError, OSError):
            return None
        times.append(time.perf_counter() - t)
    return statistics.median(times)
