"""The terminal form of a report (rich): title, sections, aligned tables, the checks with PASS/FAIL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from natgrad_diag.report.layout import STATUS_STYLES, blocks, verdict
from natgrad_diag.report.records import Check, Table, worst_status

__all__ = ["column_widths", "fits", "render_on", "vertical"]


def _rich_table_of(plain: bool, **options: Any) -> Any:
    """A rich Table: rounded borders and bold headers, or (``plain``) only a dashed line under the header."""
    from rich import box
    from rich.table import Table as RichTable

    # top, head, head row, mid, row, foot row, foot, bottom
    plain_box = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
    return RichTable(box=plain_box if plain else box.ROUNDED, header_style="" if plain else "bold", show_edge=not plain,
                     pad_edge=not plain, **options)  # fmt: skip


def column_widths(table: Table) -> list[int]:
    """The width each column needs so that neither its header nor any cell is broken."""
    return [max([len(table.columns[k])] + [len(row[k]) for row in table.rows]) for k in range(len(table.columns))]


def fits(table: Table, width: int) -> bool:
    """True when the table, every header and cell whole, fits ``width`` columns (3 per column separator)."""
    return sum(column_widths(table)) + 3 * len(table.columns) <= width


def _rich_table(table: Table, plain: bool) -> Any:
    """The table as columns, every header and cell on one line (callers use :func:`vertical` when it does not fit)."""
    t = _rich_table_of(plain, title=table.title or None, title_justify="left", title_style="" if plain else "italic")
    for k, (column, cells) in enumerate(zip(table.columns, column_widths(table))):
        t.add_column(column, justify="left" if k == 0 else "right", no_wrap=True, min_width=cells)
    for row in table.rows:
        t.add_row(*row)
    return t


def vertical(table: Table) -> str:
    """A table too wide for the screen, one record per row: the row's first cell, then ``column: value`` lines.

    Examples:
        >>> print(vertical(Table(("block", "error"), (("∂mean/∂eta1", "2.9e-11"),), "blocks")))
        blocks
        ∂mean/∂eta1
          error: 2.9e-11
        >>> print(vertical(Table(("", "block", "error"), (("PASS", "∂mean/∂eta1", "2.9e-11"),))))
        PASS ∂mean/∂eta1
          error: 2.9e-11
    """
    # an unnamed first column is a mark (PASS/FAIL): the record's heading is the mark and the next cell
    head = 2 if not table.columns[0] and len(table.columns) > 1 else 1
    lines = [table.title] if table.title else []
    label_width = max((len(c) for c in table.columns[head:]), default=0)
    for row in table.rows:
        lines.append(" ".join(cell for cell in row[:head] if cell) or table.columns[0])
        lines.extend(f"  {(c + ':').ljust(label_width + 1)} {cell}" for c, cell in zip(table.columns[head:], row[head:]))
    return "\n".join(lines)


def _rich_checks(checks: Sequence[Check], plain: bool) -> Any:
    from rich.text import Text

    t = _rich_table_of(plain, expand=True, show_lines=True)
    t.add_column("", no_wrap=True)
    t.add_column("check: claim", overflow="fold", ratio=1)
    t.add_column("error", justify="right", no_wrap=True)
    t.add_column("tolerance", justify="right", no_wrap=True)
    for c in checks:
        mark = Text(c.mark, style="" if plain else STATUS_STYLES[c.status])
        cell = Text.assemble((c.name, "" if plain else "bold"), "\n" + c.claim,  # a style per part, not the cell's
                             ("\n" + c.detail, "" if plain else "dim") if c.detail else "")
        err, bound = c.numbers()
        t.add_row(mark, cell, err, bound.replace(" (must differ)", "\n(must differ)"))
    return t


def render_on(report: Any, stream: TextIO, *, plain: bool, width: int | None = None, color: bool | None = None) -> str:
    """Lay the report out as a console on ``stream`` shows it (its width and colours, unless ``width`` and ``color``
    say otherwise; nothing is written to ``stream``) and return the text, right-stripped."""
    from rich.console import Console
    from rich.text import Text

    console = Console(
        file=stream, width=width, force_terminal=color if not plain else None, no_color=plain,
        color_system=None if plain or color is False else "auto", highlight=False, markup=False,
        emoji=False, force_jupyter=False, soft_wrap=False,
    )  # fmt: skip
    style = "" if plain else STATUS_STYLES[worst_status(c.status for c in report.checks)]

    def heading(text: str, level: int) -> None:
        if level == 2:
            console.print()
        console.print(Text(text, style="" if plain else ("bold", "bold underline")[level - 1]))
        if level == 1 or plain:
            console.print("=-"[level - 1] * min(len(text), console.width))

    def paragraph(block: str, colour: str = "") -> None:
        console.print(Text(block, style="" if plain else colour, no_wrap=False, overflow="fold"), soft_wrap=False)

    def table(t: Table) -> None:
        console.print()
        wide = not fits(t, console.width if plain else console.width - 2)
        console.print(Text(vertical(t)) if wide else _rich_table(t, plain), soft_wrap=wide)

    draw: dict[str, Any] = {
        "h1": lambda t: heading(t, 1), "h2": lambda t: heading(t, 2),
        # a report that leads with its answer prints the verdict, then why, first
        "verdict": lambda t: console.print(Text(f"Verdict: {t}", style=style)) if hasattr(report, "lead") else None,
        "lead": paragraph, "para": paragraph, "code": lambda t: paragraph(t, "cyan"), "table": table,
        "checks": lambda checks: console.print(_rich_checks(checks, plain)),
    }  # fmt: skip
    with console.capture() as captured:
        for kind, x in blocks(report):
            draw[kind](x)
        console.print()
        console.print(Text(f"Verdict: {verdict(report)}", style=style))
    return "\n".join(line.rstrip() for line in captured.get().splitlines()) + "\n"
