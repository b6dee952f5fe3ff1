"""Output of reports: JSON, plain text (and, later, the terminal, HTML and Markdown)."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO


def emit(report: Any, *, as_json: bool = False, plain: bool = False, report_path: str | None = None, stream: TextIO | None = None) -> None:
    """Print ``report`` as JSON or text to ``stream`` (stdout by default)."""
    stream = sys.stdout if stream is None else stream
    if as_json:
        stream.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        stream.write(str(report) + "\n")


def to_html_fragment(report: Any) -> str:
    import html

    return "<pre>" + html.escape(str(report)) + "</pre>"
