"""The Markdown form of a report (GitHub flavour): headings, paragraphs, pipe tables, the checks."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from natgrad_diag.report.layout import blocks

__all__ = ["to_markdown"]

_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_<>|"})


def _md(text: str) -> str:
    """Escape text for Markdown: emphasis, code, HTML, table pipes, links and a heading ``#``."""
    text = text.translate(_MD_SPECIAL).replace("](", "\\](").replace("][", "\\][")
    return "\\" + text if text.startswith("#") else text


def _md_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A pipe table, the first column left-aligned, the others right; ``rows`` escaped already."""
    lines = [[_md(c) or " " for c in columns], ["---"] + ["---:"] * (len(columns) - 1), *rows]
    return "\n".join("| " + " | ".join(c.replace("\n", "<br>") for c in cells) + " |" for cells in lines)


def to_markdown(report: Any, *, image_names: Sequence[str] = (), pictures: Sequence[Any] = (), note: str = "") -> str:
    """The report as Markdown (GitHub flavour): headings, paragraphs, pipe tables, the checks; ``pictures``
    (:class:`~natgrad_diag.pictures.Picture`) linked by their relative ``image_names`` with their captions, or ``note``
    where they would be (e.g. that matplotlib is missing)."""
    links = dict(zip((p.name for p in pictures), image_names))
    draw: dict[str, Any] = {
        "h1": lambda t: f"# {_md(t)}", "h2": lambda t: f"## {_md(t)}", "verdict": lambda t: f"Verdict: **{t}**",
        "lead": _md, "para": _md, "code": lambda t: f"```\n{textwrap.dedent(t)}\n```", "note": lambda t: f"> {_md(t)}",
        "table": lambda t: (f"*{_md(t.title)}*\n\n" if t.title else "")
        + _md_table(t.columns, [[_md(c) for c in r] for r in t.rows]),
        "checks": _md_checks, "figure": lambda p: (
            f"![{_md(p.caption)}]({quote(links[p.name])})\n\n{_md(p.caption)}" if p.name in links else ""),
    }  # fmt: skip
    return "\n\n".join(x for x in (draw[kind](v) for kind, v in blocks(report, pictures, note)) if x) + "\n"


def _md_checks(checks: Sequence[Any]) -> str:
    rows = [[f"**{c.mark}**", f"`{c.name}`", _md(c.claim + (f"\n{c.detail}" if c.detail else "")),
             *map(_md, c.numbers())] for c in checks]  # fmt: skip
    return _md_table(["", "check", "claim", "max abs error", "tolerance"], rows)
