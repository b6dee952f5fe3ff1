"""Progress bars for work that takes more than a second (full-mode checks, benchmarks, training).

Bars go to stderr through rich, and only when stderr is a terminal and progress is enabled;
``natgrad-diag --json`` disables them. Use::

    with progress_bar(total=n, description="full-mode check") as advance:
        for ...:
            ...
            advance()
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

_ENABLED = True


def set_enabled(enabled: bool) -> None:
    """Turn progress bars on or off for this process (the CLI turns them off for ``--json``)."""
    global _ENABLED
    _ENABLED = bool(enabled)


def progress_enabled() -> bool:
    """True when bars are on and stderr is a terminal."""
    return _ENABLED and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


@contextlib.contextmanager
def progress_bar(total: int | None, description: str, *, enabled: bool | None = None) -> Iterator[Callable[..., None]]:
    """A context manager yielding ``advance(n=1)``; a no-op when bars are off."""
    show = progress_enabled() if enabled is None else (enabled and progress_enabled())
    if not show:
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    ) as prog:  # fmt: skip
        task = prog.add_task(description, total=total)
        yield lambda n=1: prog.advance(task, n)
