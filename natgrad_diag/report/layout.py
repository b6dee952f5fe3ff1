"""The layout every output form shares: text blocks, the verdict line, the pictures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from natgrad_diag.exceptions import MissingExtraError

__all__ = ["STATUS_STYLES", "blocks", "report_pictures_or_note", "text_blocks", "verdict"]

#: The terminal colour of each status (PASS green, WARN yellow, FAIL red).
STATUS_STYLES = {"pass": "bold green", "warn": "bold yellow", "fail": "bold red"}


def text_blocks(text: str) -> list[tuple[str, str]]:
    """Split a section's text into ``("para", ...)`` and ``("code", ...)`` blocks: lines indented by a space are code
    and keep their line breaks; consecutive other lines form one paragraph, except lines that start a list item."""
    blocks: list[tuple[str, str]] = []
    previous = ""  # the kind of the line before, "" for a blank line
    for line in text.splitlines():
        kind = "" if not line.strip() else "code" if line.startswith(" ") else "para"
        starts_item = kind == "para" and line.lstrip()[:2] in ("- ", "* ", "• ")
        if kind and kind == previous and not starts_item:
            blocks[-1] = (kind, blocks[-1][1] + ("\n" if kind == "code" else " ") + line)
        elif kind:
            blocks.append((kind, line))
        previous = kind
    return blocks


def verdict(report: Any) -> str:
    """The verdict line: "all checks hold.", or how many checks failed and how many are inconclusive (WARN)."""
    statuses = [c.status for c in report.checks]
    failed, warned = statuses.count("fail"), statuses.count("warn")
    parts = [f"{failed} of {len(statuses)} check(s) FAILED." if failed else "",
             f"{warned} check(s) inconclusive (WARN)." if warned else ""]  # fmt: skip
    return " ".join(p for p in parts if p) or "all checks hold."


def blocks(report: Any, pictures: Sequence[Any] = (), note: str = "") -> list[tuple[str, Any]]:
    """The report in the order every output form draws it: ("h1" | "h2" | "verdict" | "lead" | "para" | "code" |
    "note", text), ("table", Table), ("checks", checks), ("figure", Picture). Each section is followed by the pictures
    it names; the pictures no section names go under "Pictures", then the checks unless a section carries them."""
    sections = report.sections()
    out: list[tuple[str, Any]] = [("h1", str(report.title)), ("verdict", verdict(report))]
    out += [("lead", block) for _, block in text_blocks(getattr(report, "lead", ""))]
    for section in sections:
        out += [("h2", section.heading)] if section.heading else []
        out += [*text_blocks(section.text), *(("table", t) for t in section.tables)]
        out += [("checks", section.checks)] if section.checks is not None else []
        out += [("figure", p) for n in section.figures for p in pictures if p.name == n]
    rest = [p for p in pictures if p.name not in {n for s in sections for n in s.figures}]
    out += [("h2", "Pictures")] if rest or note else []
    out += [("note", note)] if note else []
    out += [("figure", p) for p in rest]
    carried = any(s.checks is not None for s in sections)
    return out + ([] if carried else [("h2", "Checks"), ("checks", tuple(report.checks))])


def report_pictures_or_note(report: Any) -> tuple[tuple[Any, ...], str]:
    """(pictures, note): the report's pictures, or none and a note saying why."""
    from natgrad_diag.pictures import PLOT_EXTRA_REMEDY, report_pictures

    figures = getattr(report, "figures", None)
    try:
        return tuple(figures() if callable(figures) else report_pictures(report)), ""
    except MissingExtraError:
        return (), f"Pictures are not included: matplotlib is not installed. To add them: {PLOT_EXTRA_REMEDY}."
