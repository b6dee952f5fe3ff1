"""The Markdown form of a report (GitHub flavour): headings, paragraphs, pipe tables, the checks."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from natgrad_diag.report.layout import arrange, check_numbers, text_blocks, verdict

__all__ = ["to_markdown"]


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
    """The report as Markdown (GitHub flavour): headings, paragraphs, pipe tables, the checks; ``pictures``
    (:class:`~natgrad_diag.pictures.Picture`) linked by their relative ``image_names`` with their captions, or ``note``
    where they would be (e.g. that matplotlib is missing).
    """
    parts = [f"# {_md(str(report.title))}", "", f"Verdict: **{verdict(report)}**"]
    links = dict(zip((p.name for p in pictures), image_names))

    def figure(p: Any) -> list[str]:
        return ["", f"![{_md(p.caption)}]({quote(links[p.name])})", "", _md(p.caption)] if p.name in links else []

    parts += [line for _, block in text_blocks(getattr(report, "lead", "")) for line in ("", _md(block))]
    laid = arrange(report, pictures)
    for section, figures in laid.sections:
        if section.heading:
            parts += ["", f"## {_md(section.heading)}"]
        for kind, block in text_blocks(section.text):
            parts += ["", f"```\n{textwrap.dedent(block)}\n```" if kind == "code" else _md(block)]
        for table in section.tables:
            if table.title:
                parts += ["", f"*{_md(table.title)}*"]
            parts += ["", _md_table(table.columns, [[_md(c) for c in r] for r in table.rows])]
        if section.checks is not None:
            parts += ["", _md_checks(section.checks)]
        parts += [line for p in figures for line in figure(p)]
    if laid.rest or note:
        parts += ["", "## Pictures"]
    if note:
        parts += ["", f"> {_md(note)}"]
    parts += [line for p in laid.rest for line in figure(p)]
    if laid.checks is not None:
        parts += ["", "## Checks", "", _md_checks(laid.checks)]
    return "\n".join([*parts, ""])


def _md_checks(checks: Sequence[Any]) -> str:
    rows = []
    for c in checks:
        err, bound = check_numbers(c)
        claim = _md(c.claim) + (f"<br>{_md(c.detail)}" if c.detail else "")
        rows.append([f"**{c.mark}**", f"`{c.name}`", claim, _md(err), _md(bound)])
    return _md_table(["", "check", "claim", "max abs error", "tolerance"], rows)
