"""The terminal form of a report (rich): title, sections, aligned tables, the checks with PASS/FAIL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from natgrad_diag.report.layout import check_numbers, text_blocks, verdict
from natgrad_diag.report.records import Check, Table

__all__ = ["console_for", "render_on", "to_terminal"]


def _plain_box() -> Any:
    from rich.box import Box

    # top, head, head row, mid, row, foot row, foot, bottom: only a dashed line under the header.
    return Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def _rich_table(table: Table, plain: bool, width: int) -> Any:
    from rich import box
    from rich.table import Table as RichTable

    t = RichTable(
        title=table.title or None, title_justify="left", title_style="" if plain else "italic",
        box=_plain_box() if plain else box.ROUNDED, header_style="" if plain else "bold",
        show_edge=not plain, pad_edge=not plain,
    )  # fmt: skip
    # Columns at least as wide as their cells (so numbers never break) when the table fits that way;
    # headers wrap.
    cells = [max((len(row[k]) for row in table.rows), default=1) for k in range(len(table.columns))]
    fits = sum(cells) + 3 * len(cells) + 1 <= width
    for k, column in enumerate(table.columns):
        t.add_column(column, justify="left" if k == 0 else "right", overflow="fold", min_width=cells[k] if fits else None)
    for row in table.rows:
        t.add_row(*row)
    return t


def _rich_checks(checks: Sequence[Check], plain: bool) -> Any:
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text

    t = RichTable(
        box=_plain_box() if plain else box.ROUNDED, header_style="" if plain else "bold",
        show_edge=not plain, pad_edge=not plain, expand=True, show_lines=True,
    )  # fmt: skip
    t.add_column("", no_wrap=True)
    t.add_column("check: claim", overflow="fold", ratio=1)
    t.add_column("error", justify="right", no_wrap=True)
    t.add_column("tolerance", justify="right", no_wrap=True)
    for c in checks:
        mark = Text("PASS" if c.passed else "FAIL", style="" if plain else ("bold green" if c.passed else "bold red"))
        cell = Text()
        cell.append(c.name, style="" if plain else "bold")
        cell.append("\n" + c.claim)
        if c.detail:
            cell.append("\n" + c.detail, style="" if plain else "dim")
        err, bound = check_numbers(c)
        t.add_row(mark, cell, err, bound.replace(" (must differ)", "\n(must differ)"))
    return t


def _print_terminal(report: Any, console: Any, plain: bool) -> None:
    from rich.text import Text

    title = str(report.title)
    console.print(Text(title, style="" if plain else "bold"))
    console.print("=" * min(len(title), console.width))
    for section in report.sections():
        if section.heading:
            console.print()
            console.print(Text(section.heading, style="" if plain else "bold underline"))
            if plain:
                console.print("-" * min(len(section.heading), console.width))
        for kind, block in text_blocks(section.text):
            style = "cyan" if kind == "code" and not plain else ""
            console.print(Text(block, style=style, no_wrap=False, overflow="fold"), soft_wrap=False)
        for table in section.tables:
            console.print()
            console.print(_rich_table(table, plain, console.width))
    console.print()
    console.print(Text("Checks", style="" if plain else "bold underline"))
    if plain:
        console.print("------")
    console.print(_rich_checks(report.checks, plain))
    console.print()
    style = "" if plain else ("bold green" if report.passed else "bold red")
    console.print(Text(f"Verdict: {verdict(report)}", style=style))


def console_for(stream: TextIO, *, plain: bool, width: int | None, color: bool | None) -> Any:
    from rich.console import Console

    return Console(
        file=stream, width=width, force_terminal=color if not plain else None, no_color=plain,
        color_system=None if plain or color is False else "auto", highlight=False, markup=False,
        emoji=False, force_jupyter=False, soft_wrap=False,
    )  # fmt: skip


def to_terminal(report: Any, *, plain: bool = False, width: int = 80, color: bool = False) -> str:
    """The report as the terminal shows it: title, sections, aligned tables, the checks with PASS/FAIL.

    Args:
        report: any :class:`~natgrad_diag.report.records.Report`.
        plain: no colour and no table borders (only a dashed line under each header).
        width: the width to lay out for, in columns (80 is readable everywhere).
        color: include ANSI colour codes (as on a terminal); ignored when ``plain``.

    Returns:
        The text, lines at most ``width`` columns wide.
    """
    import io

    return render_on(report, console_for(io.StringIO(), plain=plain, width=width, color=color), plain)


def render_on(report: Any, console: Any, plain: bool) -> str:
    """Lay the report out on ``console`` (its width, its colours) and return the text, right-stripped."""
    with console.capture() as captured:
        _print_terminal(report, console, plain)
    return "\n".join(line.rstrip() for line in captured.get().splitlines()) + "\n"
