"""The HTML form of a report: a self-contained document (pictures embedded) or a fragment for Jupyter."""

from __future__ import annotations

import base64
import html
import textwrap
from collections.abc import Sequence
from typing import Any

from natgrad_diag.report.layout import blocks, report_pictures_or_note
from natgrad_diag.report.records import STATUSES, Check, Table, worst_status

__all__ = ["html_document", "to_html_fragment"]

_CSS = """
.ngd-report { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; line-height: 1.45; max-width: 62rem; }
.ngd-report table { border-collapse: collapse; margin: 0.6rem 0 1rem; font-size: 0.9rem; }
.ngd-report caption { text-align: left; font-style: italic; padding-bottom: 0.25rem; }
.ngd-report th, .ngd-report td { border: 1px solid #ccc; padding: 0.2rem 0.55rem; vertical-align: top; }
.ngd-report th { background: #f3f3f3; }
.ngd-report td.num { text-align: right; font-family: ui-monospace, Menlo, Consolas, monospace; white-space: nowrap; }
.ngd-report td.text { overflow-wrap: anywhere; min-width: 12rem; } .ngd-report h1, .ngd-report h2 { overflow-wrap: anywhere; }
.ngd-report .ngd-scroll { max-width: 100%; overflow-x: auto; }
.ngd-report pre { background: #f6f8fa; padding: 0.5rem 0.75rem; overflow-x: auto; }
.ngd-report .pass, .ngd-report .fail, .ngd-report .warn { font-weight: bold; }
.ngd-report .pass { color: #1e7b34; } .ngd-report .fail { color: #b42318; } .ngd-report .warn { color: #9a6700; }
.ngd-report .claim { color: #444; }
.ngd-report .note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.4rem 0.75rem; }
.ngd-report figure { margin: 1rem 0; } .ngd-report figure img { max-width: 100%; height: auto; }
.ngd-report figcaption { font-size: 0.9rem; color: #444; }
"""


def _html_grid(head: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "", cls: str = "") -> str:
    """A scrolling table: escaped headers ``head``, rows of ready ``<td>`` cells."""
    heads = "".join(f"<th>{h}</th>" for h in head)
    return "\n".join([f'<div class="ngd-scroll"><table{cls}>{caption}<thead><tr>{heads}</tr></thead><tbody>',
                      *("<tr>" + "".join(r) + "</tr>" for r in rows), "</tbody></table></div>"])


def _html_table(table: Table) -> str:
    e = html.escape
    rows = [[f"<td>{e(cell)}</td>" if k == 0 else f'<td class="{"num" if len(cell) <= 24 else "text"}">{e(cell)}</td>'
             for k, cell in enumerate(row)] for row in table.rows]  # fmt: skip
    caption = f"<caption>{e(table.title)}</caption>" if table.title else ""
    return _html_grid([e(c) for c in table.columns], rows, caption)


def _html_checks(checks: Sequence[Check]) -> str:
    e = html.escape
    rows = [[f'<td><span class="{c.status}">{c.mark}</span></td>', f"<td><code>{e(c.name)}</code></td>",
             f'<td class="claim">{e(c.claim)}' + (f"<br><small>{e(c.detail)}</small>" if c.detail else "") + "</td>",
             *(f'<td class="num">{e(n)}</td>' for n in c.numbers())] for c in checks]  # fmt: skip
    return _html_grid(["", "check", "claim", "max abs error", "tolerance"], rows, cls=' class="ngd-checks"')


def _html_lead(block: str) -> str:
    """A line of the answer under the verdict (a NatGradReport's); a list item's PASS/WARN/FAIL marked."""
    status = block[2:6].lower()
    if not block.startswith("- "):
        return f"<p>{html.escape(block)}</p>"
    mark = f'<span class="{status}">{block[2:6]}</span>{html.escape(block[6:])}' if status in STATUSES else None
    return f"<ul><li>{mark or html.escape(block[2:])}</li></ul>"


def _html_body(report: Any, pictures: Sequence[Any], note: str) -> str:
    e = html.escape
    status = worst_status(c.status for c in report.checks)
    draw: dict[str, Any] = {
        "h1": lambda t: f"<h1>{e(t)}</h1>", "h2": lambda t: f"<h2>{e(t)}</h2>", "lead": _html_lead,
        "verdict": lambda t: f'<p>Verdict: <span class="{status}">{e(t)}</span></p>',
        "code": lambda t: f"<pre>{e(textwrap.dedent(t))}</pre>", "note": lambda t: f'<p class="note">{e(t)}</p>',
        "para": lambda t: f"<p>{e(t)}</p>", "table": _html_table, "checks": _html_checks, "figure": lambda p: (
            f'<figure id="figure-{e(p.name)}"><img src="data:image/png;base64,{base64.b64encode(p.png).decode("ascii")}" '
            f'alt="{e(p.caption)}"><figcaption>{e(p.caption)}</figcaption></figure>'),
    }  # fmt: skip
    return "\n".join(['<div class="ngd-report">', *(draw[k](x) for k, x in blocks(report, pictures, note)), "</div>"])


def to_html_fragment(report: Any) -> str:
    """The report as an HTML ``<div>`` of headings, paragraphs, tables and its pictures as base64 PNG (or the note
    that matplotlib is missing), for Jupyter: ``Report._repr_html_`` returns this."""
    return f"<style>{_CSS}</style>\n" + _html_body(report, *report_pictures_or_note(report))


def html_document(report: Any, pics: Sequence[Any], note: str) -> str:
    """A self-contained HTML document: the report, ``pics`` as base64 PNG data URIs, ``note`` where pictures are missing."""
    from natgrad_diag import __version__

    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(str(report.title))}</title>",
        f'<meta name="generator" content="natgrad-diag {__version__}">', f"<style>{_CSS}</style></head><body>",
        _html_body(report, pics, note), f"<footer><small>Written by natgrad-diag {__version__}.</small></footer>",
        "</body></html>", "",
    ])  # fmt: skip
