"""Progress bars (through rich, on stderr) for work that takes more than a second: checks, benchmarks, training."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def progress_bar(total: int | None, description: str, *, enabled: bool = True) -> Iterator[Callable[..., None]]:
    """A context manager yielding ``advance(n=1)``; a no-op when ``enabled`` is false or stderr is not a terminal::

        with progress_bar(total=n, description="full-mode check") as advance:
            for ...:
                advance()
    """
    if not (enabled and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
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
