"""Output of reports: the terminal (rich), JSON, HTML and Markdown files, and Jupyter.

Every report lays itself out once, as ``title``, ``sections()`` (headings, text, tables) and ``checks``;
each form here is drawn from that layout, so any :class:`~natgrad_diag.report.records.Report` renders without
this module knowing its class. Pictures come from ``report.figures()`` (see :mod:`natgrad_diag.report.pictures`).

* :func:`emit`: the command's output: aligned tables with PASS/FAIL marks on the terminal (colour only
  on a terminal; ``plain=True`` for no colour and no borders), or JSON; then, if asked, a report file.
* :func:`write_report`: a self-contained ``.html`` (pictures embedded as base64 PNG) or ``.md``
  (pictures written beside it, linked relatively), chosen by the extension. Everything is rendered
  in memory first, then each file is written to a temporary file in the same directory and moved
  into place with ``os.replace``: an existing report is never left half-written.
* :func:`to_html_fragment`: the ``<div>`` Jupyter shows (``Report._repr_html_``).

rich and matplotlib are imported inside the functions.
"""

from __future__ import annotations

import base64
import html
import json
import os
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from natgrad_diag.exceptions import InputError, MissingExtraError, ReportWriteError
from natgrad_diag.report.records import Check, Table, format_number

__all__ = [
    "REPORT_FORMATS",
    "WrittenReport",
    "emit",
    "report_format",
    "to_html",
    "to_html_fragment",
    "to_markdown",
    "to_terminal",
    "write_report",
]

#: File extension -> report format.
REPORT_FORMATS = {".html": "html", ".htm": "html", ".md": "markdown"}


def report_format(path: str | os.PathLike[str], *, argument: str = "path") -> str:
    """``"html"`` or ``"markdown"`` from the extension of ``path``.

    Raises:
        InputError: the extension is not ``.html``, ``.htm`` or ``.md`` (the message names ``argument``).
    """
    suffix = Path(os.fspath(path)).suffix.lower()
    if suffix not in REPORT_FORMATS:
        raise InputError(
            "the report format is chosen by the file extension.",
            context=[("Argument", argument), ("Expected", "a path ending in .html, .htm or .md"), ("Got", repr(os.fspath(path)))],
            remedy="name the file report.html (self-contained, pictures embedded) or report.md (pictures beside it).",
        )
    return REPORT_FORMATS[suffix]


# ---------------------------------------------------------------------------------------------------
# the layout, shared by every form


def text_blocks(text: str) -> list[tuple[str, str]]:
    """Split a section's text into ``("para", ...)`` and ``("code", ...)`` blocks.

    Lines indented by a space are code and keep their line breaks; consecutive other lines form one
    paragraph (reports break their source lines anywhere), except lines that start a list item.
    """
    blocks: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            blocks.append(("break", ""))
            continue
        kind = "code" if line.startswith(" ") else "para"
        starts_item = kind == "para" and line.lstrip()[:2] in ("- ", "* ", "• ")
        if blocks and blocks[-1][0] == kind and not starts_item:
            sep = "\n" if kind == "code" else " "
            blocks[-1] = (kind, blocks[-1][1] + sep + line)
        else:
            blocks.append((kind, line))
    return [b for b in blocks if b[0] != "break"]


def _check_numbers(check: Check) -> tuple[str, str]:
    """(max abs error, "≤ tol" / "> tol") as printed in every check table."""
    if check.max_abs_error is None:
        return "-", "-"
    err = format_number(check.max_abs_error)
    if check.tolerance is None:
        return err, "-"
    relation = "≤" if check.max_abs_error <= check.tolerance else ">"  # NaN is not within
    bound = f"{relation} {format_number(check.tolerance)}"
    if check.expect_difference:
        bound += " (must differ)"
    return err, bound


def _verdict(report: Any) -> str:
    failed = sum(not c.passed for c in report.checks)
    return "all checks hold." if not failed else f"{failed} of {len(report.checks)} check(s) FAILED."


def _pictures(report: Any) -> tuple[tuple[Any, ...], str]:
    """(pictures, note): the report's pictures, or none and a note saying why."""
    figures = getattr(report, "figures", None)
    try:
        if callable(figures):
            return tuple(figures()), ""
        from natgrad_diag.report.pictures import report_pictures

        return report_pictures(report), ""
    except MissingExtraError:
        from natgrad_diag.report.pictures import PLOT_EXTRA_REMEDY

        return (), f"Pictures are not included: matplotlib is not installed. To add them: {PLOT_EXTRA_REMEDY}."


# ---------------------------------------------------------------------------------------------------
# terminal


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
        err, bound = _check_numbers(c)
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
    console.print(Text(f"Verdict: {_verdict(report)}", style=style))


def _console(stream: TextIO, *, plain: bool, width: int | None, color: bool | None) -> Any:
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

    return _render_terminal(report, _console(io.StringIO(), plain=plain, width=width, color=color), plain)


def _render_terminal(report: Any, console: Any, plain: bool) -> str:
    """Lay the report out on ``console`` (its width, its colours) and return the text, right-stripped."""
    with console.capture() as captured:
        _print_terminal(report, console, plain)
    return "\n".join(line.rstrip() for line in captured.get().splitlines()) + "\n"


# ---------------------------------------------------------------------------------------------------
# HTML

_CSS = """
.ngd-report { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; line-height: 1.45; max-width: 62rem; }
.ngd-report table { border-collapse: collapse; margin: 0.6rem 0 1rem; font-size: 0.9rem; }
.ngd-report caption { text-align: left; font-style: italic; padding-bottom: 0.25rem; }
.ngd-report th, .ngd-report td { border: 1px solid #ccc; padding: 0.2rem 0.55rem; vertical-align: top; }
.ngd-report th { background: #f3f3f3; }
.ngd-report td.num { text-align: right; font-family: ui-monospace, Menlo, Consolas, monospace; white-space: nowrap; }
.ngd-report pre { background: #f6f8fa; padding: 0.5rem 0.75rem; overflow-x: auto; }
.ngd-report .pass { color: #1e7b34; font-weight: bold; }
.ngd-report .fail { color: #b42318; font-weight: bold; }
.ngd-report .claim { color: #444; }
.ngd-report .note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.4rem 0.75rem; }
.ngd-report figure { margin: 1rem 0; }
.ngd-report figure img { max-width: 100%; height: auto; }
.ngd-report figcaption { font-size: 0.9rem; color: #444; }
"""


def _html_table(table: Table) -> str:
    e = html.escape
    parts = ["<table>"]
    if table.title:
        parts.append(f"<caption>{e(table.title)}</caption>")
    parts.append("<thead><tr>" + "".join(f"<th>{e(c)}</th>" for c in table.columns) + "</tr></thead><tbody>")
    for row in table.rows:
        cells = [f"<td>{e(cell)}</td>" if k == 0 else f'<td class="num">{e(cell)}</td>' for k, cell in enumerate(row)]
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</tbody></table>")
    return "\n".join(parts)


def _html_checks(checks: Sequence[Check]) -> str:
    e = html.escape
    parts = [
        '<table class="ngd-checks"><thead><tr><th></th><th>check</th><th>claim</th>'
        "<th>max abs error</th><th>tolerance</th></tr></thead><tbody>"
    ]
    for c in checks:
        mark = '<span class="pass">PASS</span>' if c.passed else '<span class="fail">FAIL</span>'
        err, bound = _check_numbers(c)
        claim = e(c.claim) + (f"<br><small>{e(c.detail)}</small>" if c.detail else "")
        parts.append(
            f"<tr><td>{mark}</td><td><code>{e(c.name)}</code></td><td class=\"claim\">{claim}</td>"
            f'<td class="num">{e(err)}</td><td class="num">{e(bound)}</td></tr>'
        )
    parts.append("</tbody></table>")
    return "\n".join(parts)


def _html_body(report: Any, pictures: Sequence[Any], note: str) -> str:
    e = html.escape
    parts = ['<div class="ngd-report">', f"<h1>{e(str(report.title))}</h1>"]
    verdict_class = "pass" if report.passed else "fail"
    parts.append(f'<p>Verdict: <span class="{verdict_class}">{e(_verdict(report))}</span></p>')
    for section in report.sections():
        if section.heading:
            parts.append(f"<h2>{e(section.heading)}</h2>")
        for kind, block in text_blocks(section.text):
            parts.append(f"<pre>{e(textwrap.dedent(block))}</pre>" if kind == "code" else f"<p>{e(block)}</p>")
        parts.extend(_html_table(t) for t in section.tables)
    if pictures or note:
        parts.append("<h2>Pictures</h2>")
    if note:
        parts.append(f'<p class="note">{e(note)}</p>')
    for p in pictures:
        data = base64.b64encode(p.png).decode("ascii")
        parts.append(
            f'<figure id="figure-{e(p.name)}"><img src="data:image/png;base64,{data}" alt="{e(p.caption)}">'
            f"<figcaption>{e(p.caption)}</figcaption></figure>"
        )
    parts.append("<h2>Checks</h2>")
    parts.append(_html_checks(report.checks))
    parts.append("</div>")
    return "\n".join(parts)


def to_html_fragment(report: Any) -> str:
    """The report as an HTML ``<div>`` of headings, paragraphs and tables, no pictures (for Jupyter).

    ``Report._repr_html_`` returns this, so a report shows as tables in a notebook.
    """
    return f"<style>{_CSS}</style>\n" + _html_body(report, (), "")


def _html_document(report: Any, pics: Sequence[Any], note: str) -> str:
    from natgrad_diag import __version__

    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(str(report.title))}</title>",
        f'<meta name="generator" content="natgrad-diag {__version__}">',
        f"<style>{_CSS}</style></head><body>",
        _html_body(report, pics, note),
        f"<footer><small>Written by natgrad-diag {__version__}.</small></footer>",
        "</body></html>",
        "",
    ])  # fmt: skip


def to_html(report: Any, *, pictures: bool = True) -> str:
    """A self-contained HTML document: the report, its pictures as base64 PNG data URIs, and styles.

    Without matplotlib the document has no pictures and a note that names the extra to install.
    """
    pics, note = _pictures(report) if pictures else ((), "")
    return _html_document(report, pics, note)


# ---------------------------------------------------------------------------------------------------
# Markdown

_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_<>|"})


def _md(text: str) -> str:
    """Escape text for Markdown: emphasis, code, HTML, table pipes, links and a heading ``#``."""
    text = text.translate(_MD_SPECIAL).replace("](", "\\](").replace("][", "\\][")
    return "\\" + text if text.startswith("#") else text


def _md_table(columns: Sequence[str], rows: Sequence[Sequence[str]], right: bool = True) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("\n", "<br>") for c in cells) + " |"

    align = ["---"] + ["---:" if right else "---"] * (len(columns) - 1)
    return "\n".join([line([_md(c) or " " for c in columns]), line(align), *(line(r) for r in rows)])


def to_markdown(report: Any, *, image_names: Sequence[str] = (), pictures: Sequence[Any] = (), note: str = "") -> str:
    """The report as Markdown (GitHub flavour): headings, paragraphs, pipe tables, the checks.

    Args:
        report: any :class:`~natgrad_diag.report.records.Report`.
        image_names: relative file names of ``pictures``, in order (linked with ``![caption](name)``).
        pictures: :class:`~natgrad_diag.report.pictures.Picture` records (only their captions are used here).
        note: a line shown where the pictures would be (e.g. that matplotlib is missing).
    """
    parts = [f"# {_md(str(report.title))}", "", f"Verdict: **{_verdict(report)}**"]
    for section in report.sections():
        if section.heading:
            parts += ["", f"## {_md(section.heading)}"]
        for kind, block in text_blocks(section.text):
            parts += ["", f"```\n{textwrap.dedent(block)}\n```" if kind == "code" else _md(block)]
        for table in section.tables:
            if table.title:
                parts += ["", f"*{_md(table.title)}*"]
            parts += ["", _md_table(table.columns, [[_md(c) for c in r] for r in table.rows])]
    if pictures or note:
        parts += ["", "## Pictures"]
    if note:
        parts += ["", f"> {_md(note)}"]
    for name, p in zip(image_names, pictures):
        parts += ["", f"![{_md(p.caption)}]({quote(name)})", "", _md(p.caption)]
    rows = []
    for c in report.checks:
        err, bound = _check_numbers(c)
        claim = _md(c.claim) + (f"<br>{_md(c.detail)}" if c.detail else "")
        rows.append(["**PASS**" if c.passed else "**FAIL**", f"`{c.name}`", claim, _md(err), _md(bound)])
    parts += ["", "## Checks", "", _md_table(["", "check", "claim", "max abs error", "tolerance"], rows), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------
# writing files


@dataclass(frozen=True)
class WrittenReport:
    """What :func:`write_report` wrote.

    Attributes:
        path: the report file.
        format: ``"html"`` or ``"markdown"``.
        images: the picture files written beside a Markdown report (none for HTML: embedded).
        note: why pictures are missing, if they are ("" otherwise).
    """

    path: Path
    format: str
    images: tuple[Path, ...] = ()
    note: str = ""


def _file_mode(path: Path) -> int:
    """The mode a new file gets (the existing file's mode when replacing one)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then move it over ``path`` (os.replace)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_report(report: Any, path: str | os.PathLike[str], *, argument: str = "path") -> WrittenReport:
    """Write ``report`` as a self-contained HTML file or as Markdown with its pictures beside it.

    The format follows the extension: ``.html``/``.htm`` embed the pictures as base64 PNG; ``.md``
    writes ``<stem>-<picture>.png`` in the same directory and links them relatively. Everything is
    rendered in memory first; each file then goes to a temporary file in the target directory and
    is moved into place with ``os.replace``, so a failure at any point leaves any previous report at
    ``path`` as it was. Without matplotlib the report is written without pictures and ``note`` says so.

    Args:
        report: any :class:`~natgrad_diag.report.records.Report`.
        path: where to write; the extension chooses the format.
        argument: the name to use for ``path`` in error messages (the CLI passes ``"--report"``).

    Returns:
        A :class:`WrittenReport` (the paths written and any note).

    Raises:
        InputError: the extension is not .html, .htm or .md.
        ReportWriteError: the file could not be written (directory missing, not writable, ...).
    """
    fmt = report_format(path, argument=argument)
    target = Path(os.fspath(path))
    pics, note = _pictures(report)
    images: list[tuple[Path, bytes]] = []
    if fmt == "html":
        text = _html_document(report, pics, note)
    else:
        names = [f"{target.stem}-{p.name}.png" for p in pics]
        images = [(target.with_name(n), p.png) for n, p in zip(names, pics)]
        text = to_markdown(report, image_names=names, pictures=pics, note=note)
    try:
        for image_path, data in images:
            _atomic_write(image_path, data)
        _atomic_write(target, text.encode("utf-8"))
    except OSError as exc:
        raise ReportWriteError(
            f"{exc.strerror or exc}.",
            context=[("Argument", argument), ("Path", str(target)), ("Got", f"{type(exc).__name__}: {exc.strerror or exc}")],
            remedy="choose a path in an existing, writable directory; any previous report there is unchanged.",
        ) from exc
    return WrittenReport(target, fmt, tuple(p for p, _ in images), note)


# ---------------------------------------------------------------------------------------------------
# the command's output


def emit(
    report: Any,
    *,
    as_json: bool = False,
    plain: bool = False,
    report_path: str | os.PathLike[str] | None = None,
    stream: TextIO | None = None,
    err_stream: TextIO | None = None,
) -> WrittenReport | None:
    """Print ``report`` to ``stream`` (stdout), then write the report file if ``report_path`` is given.

    The result is printed first, whatever happens to the file. A file that cannot be written is
    reported on ``err_stream`` (stderr) as a :class:`ReportWriteError` message and not raised, so
    the command keeps its exit code (0 when every check holds, 1 otherwise).

    Args:
        report: any :class:`~natgrad_diag.report.records.Report`.
        as_json: print ``report.to_dict()`` as JSON instead of the tables.
        plain: no colour and no table borders. Colour is used only when ``stream`` is a terminal.
        report_path: also write an ``.html`` or ``.md`` report there (see :func:`write_report`).
        stream, err_stream: where to print (default stdout, stderr).

    Returns:
        The :class:`WrittenReport`, or ``None`` when no file was asked for or it could not be written.
    """
    stream = sys.stdout if stream is None else stream
    err_stream = sys.stderr if err_stream is None else err_stream
    if as_json:
        stream.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        stream.write(_render_terminal(report, _console(stream, plain=plain, width=None, color=None), plain))
    stream.flush()
    if report_path is None:
        return None
    try:
        written = write_report(report, report_path, argument="--report")
    except (ReportWriteError, InputError) as exc:
        err_stream.write(f"natgrad-diag: {exc}\n")
        return None
    extra = f" and {len(written.images)} picture(s) beside it" if written.images else ""
    err_stream.write(f"natgrad-diag: report written to {written.path}{extra}\n")
    if written.note:
        err_stream.write(f"natgrad-diag: {written.note}\n")
    return written
