"""The base class of every report: its checks, its layout, and ``str()``/Jupyter output through the renderers.

A report is a frozen dataclass that derives from :class:`Report`. It lists its ``checks`` and lays itself
out as ``sections()``; from that one layout the renderers below draw every output form (they take any object
with ``title``, ``checks`` and ``sections()``, so they never import this module): ``str()`` is the plain
terminal text, ``_repr_html_`` the Jupyter fragment, ``figures()`` the pictures; ``to_dict()`` gives JSON.
"""

from __future__ import annotations

from typing import Any

from natgrad_diag.report.records import TEXT_WIDTH, Check, Section, worst_status

__all__ = ["Report"]


class Report:
    """Base of every report: ``checks``, ``sections()``, ``to_dict()``, ``passed`` and ``str()``.

    Subclasses are frozen dataclasses that define ``title``, ``checks`` and ``sections()``.
    """

    # Annotations only: a default here would leak into subclasses' dataclass fields.
    title: str
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        """True when no check fails (an inconclusive "warn" check does not fail the report)."""
        return all(c.status != "fail" for c in self.checks)

    @property
    def status(self) -> str:
        """The worst status of the checks: "pass", "warn" or "fail"."""
        return worst_status(c.status for c in self.checks)

    def sections(self) -> tuple[Section, ...]:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "status": self.status, "passed": self.passed, "checks": [c.to_dict() for c in self.checks]}

    def __str__(self) -> str:
        """The plain-text layout that ``natgrad-diag --plain`` prints (one renderer for both)."""
        from natgrad_diag.report.text import to_terminal

        return to_terminal(self, plain=True, width=TEXT_WIDTH).rstrip("\n")

    def figures(self) -> tuple[Any, ...]:
        """The pictures of this report, as ``natgrad_diag.pictures.Picture`` (name, caption, PNG bytes).

        By default drawn from what the report carries (see ``natgrad_diag.pictures.picture_kinds``):
        a heatmap of ``jacobian``, the η₁ chart of an explanation, the numeric checks against their
        tolerances. Override to add or replace pictures. Empty when there is nothing to draw; raises
        ``MissingExtraError`` when there is and matplotlib is not installed.
        """
        from natgrad_diag.pictures import report_pictures

        return report_pictures(self)

    def _repr_html_(self) -> str:
        from natgrad_diag.report.html import to_html_fragment

        return to_html_fragment(self)
