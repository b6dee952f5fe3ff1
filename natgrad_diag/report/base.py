"""The base class of every report: its checks, its layout, and ``str()``/Jupyter output through the renderers (which
draw every output form from ``title``, ``checks`` and ``sections()``)."""

from __future__ import annotations

import io
from typing import Any

from natgrad_diag.report.records import TEXT_WIDTH, Check, Section, worst_status

__all__ = ["Report"]


class Report:
    """Base of every report; subclasses are frozen dataclasses that define ``title``, ``checks`` and ``sections()``."""

    # Annotations only: a default here would leak into subclasses' dataclass fields.
    title: str
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        """True when checks ran and none fails (an inconclusive "warn" check does not fail the report); a report
        with no check is never a pass."""
        return bool(self.checks) and all(c.status != "fail" for c in self.checks)

    @property
    def status(self) -> str:
        """The worst status of the checks: "pass", "warn" or "fail" ("fail" when there is no check)."""
        return worst_status(c.status for c in self.checks) if self.checks else "fail"

    def sections(self) -> tuple[Section, ...]:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "status": self.status, "passed": self.passed, "checks": [c.to_dict() for c in self.checks]}

    def __str__(self) -> str:
        """The plain-text layout that ``natgrad-diag --plain`` prints."""
        from natgrad_diag.report.text import render_on

        return render_on(self, io.StringIO(), plain=True, width=TEXT_WIDTH).rstrip("\n")

    def figures(self) -> tuple[Any, ...]:
        """The pictures of this report (:func:`natgrad_diag.pictures.report_pictures`); override to add or replace."""
        from natgrad_diag.pictures import report_pictures

        return report_pictures(self)

    def _repr_html_(self) -> str:
        from natgrad_diag.report.html import to_html_fragment

        return to_html_fragment(self)
