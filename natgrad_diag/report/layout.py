"""The layout every output form shares: text blocks, a check's numbers, the verdict line, the pictures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from natgrad_diag.exceptions import MissingExtraError
from natgrad_diag.report.records import Check, Section, format_number

__all__ = ["STATUS_STYLES", "Arranged", "arrange", "check_numbers", "report_pictures_or_note", "text_blocks", "verdict"]


#: The terminal colour of each status (PASS green, WARN yellow, FAIL red).
STATUS_STYLES = {"pass": "bold green", "warn": "bold yellow", "fail": "bold red"}


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


def check_numbers(check: Check) -> tuple[str, str]:
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


def verdict(report: Any) -> str:
    """The verdict line: "all checks hold.", or how many checks failed and how many are inconclusive (WARN)."""
    statuses = [c.status for c in report.checks]
    failed, warned = statuses.count("fail"), statuses.count("warn")
    if not failed and not warned:
        return "all checks hold."
    parts = [f"{failed} of {len(statuses)} check(s) FAILED."] if failed else []
    if warned:
        parts.append(f"{warned} check(s) inconclusive (WARN).")
    return " ".join(parts)


@dataclass(frozen=True)
class Arranged:
    """A report in the order every output form draws it: each section with the pictures it names, then the
    pictures no section named (``rest``), then ``checks`` unless a section carries them (None then)."""

    sections: tuple[tuple[Section, tuple[Any, ...]], ...]
    rest: tuple[Any, ...]
    checks: tuple[Check, ...] | None


def arrange(report: Any, pictures: Sequence[Any] = ()) -> Arranged:
    """Place ``pictures`` (:class:`~natgrad_diag.pictures.Picture`) in the sections that name them and the checks
    at the end unless a section carries them."""
    sections = report.sections()
    named = {n for s in sections for n in s.figures}
    placed = tuple((s, tuple(p for n in s.figures for p in pictures if p.name == n)) for s in sections)
    carried = any(s.checks is not None for s in sections)
    return Arranged(placed, tuple(p for p in pictures if p.name not in named), None if carried else tuple(report.checks))


def report_pictures_or_note(report: Any) -> tuple[tuple[Any, ...], str]:
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
