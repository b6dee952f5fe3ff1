"""Memory of a dense Jacobian: its size, the guard that refuses one too large, the chunk budget."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from natgrad_diag._validate import require_max_bytes
from natgrad_diag.exceptions import MemoryLimitError

__all__ = ["DEFAULT_MAX_BYTES", "AllocationLimitError", "auto_chunk", "check_memory", "jacobian_nbytes", "memory_limit"]

#: Default limit for a dense Jacobian: 2 GiB.
DEFAULT_MAX_BYTES = 2 * 1024**3

#: One chunk's result: the budget of :func:`auto_chunk`.
_CHUNK_FRACTION, _CHUNK_BYTES_MIN, _CHUNK_BYTES_MAX, _CHUNK_MIN = 32, 4 * 1024**2, 16 * 1024**2, 128


def jacobian_nbytes(output_shapes: Sequence[Sequence[int]], input_shapes: Sequence[Sequence[int]], itemsize: int) -> int:
    """Bytes of the dense Jacobian: (Σ output sizes) · (Σ input sizes) · itemsize.

    Examples:
        >>> jacobian_nbytes([(3, 2)], [(3, 2), (2, 3, 3)], 8)  # 6 rows, 6 + 18 columns, float64
        1152
    """
    return sum(int(np.prod(s)) for s in output_shapes) * sum(int(np.prod(s)) for s in input_shapes) * itemsize


def _gib(n: int) -> str:
    return f"{n / 1024**3:.3g} GiB" if n >= 1024**3 else f"{n / 1024**2:.3g} MiB"


class AllocationLimitError(MemoryLimitError):
    """Arrays other than a Jacobian (a demo model, a benchmark's matrices) would exceed the memory limit."""

    error_message = "Too large for this machine's memory."


def memory_limit() -> int:
    """Half of this machine's physical memory (or :data:`DEFAULT_MAX_BYTES`): the limit for what is allocated besides a
    Jacobian, above which the process would swap."""
    try:
        total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return DEFAULT_MAX_BYTES
    return max(total // 2, 1) if total > 0 else DEFAULT_MAX_BYTES


def check_memory(
    nbytes: int, max_bytes: int, what: str, *, remedy: str | None = None, title: str | None = None, argument: str = "max_bytes"
) -> None:
    """Refuse, before allocating, a dense Jacobian of ``nbytes`` (``what``: ``"2 output(s) and 2 input(s)"``) larger
    than ``max_bytes``: a MemoryLimitError, or an :class:`AllocationLimitError` for other allocations, whose ``title``
    and ``remedy`` replace the message's (``title="The demo SVGP with M = 100000"``).

    Examples:
        >>> check_memory(1024, 2048, "a small Jacobian")  # under the limit: nothing happens
    """
    max_bytes = require_max_bytes(max_bytes)  # a negative limit would print "a limit of −9.54e-07 MiB"
    if nbytes > max_bytes:
        error = MemoryLimitError if title is None else AllocationLimitError
        limit_label = "Limit (max_bytes)" if title is None else "Limit"
        raise error(
            f"{title or 'the dense Jacobian for ' + what} would need {_gib(nbytes)}, over the limit of {_gib(max_bytes)}.",
            context=[("Argument", argument), ("Estimated size", f"{nbytes} bytes ({_gib(nbytes)})"), (limit_label, f"{max_bytes} bytes ({_gib(max_bytes)})")],
            remedy=remedy or "use mode='fast' (matrix-free, no dense Jacobian), or raise max_bytes if you have the memory.",
        )


def auto_chunk(n_chunked: int, n_other: int, itemsize: int, total_bytes: int) -> int:
    """Rows (reverse mode) or columns (forward mode) per chunk, of ``n_chunked``, each ``n_other`` long, of a Jacobian
    of ``total_bytes``: about 1/32 of it, 4-16 MiB, ≥ 128 (fewer and the per-call overhead dominates; pfor holds up to
    ~8 intermediates of a chunk's size, so the peak stays near 1.25× the Jacobian), made equal: the last wastes little.

    Examples:
        >>> auto_chunk(1000, 10, 8, 80_000)  # a small Jacobian: one chunk
        1000
        >>> auto_chunk(10_000, 10_000, 8, 800_000_000)  # 16 MiB per chunk: 210 rows, made equal
        209
    """
    budget = min(max(total_bytes // _CHUNK_FRACTION, _CHUNK_BYTES_MIN), _CHUNK_BYTES_MAX)
    chunk = max(1, min(n_chunked, max(_CHUNK_MIN, budget // max(1, n_other * itemsize))))
    n_chunks = -(-n_chunked // chunk)
    return -(-n_chunked // n_chunks)  # equal chunks: the last one wastes as little as possible

