"""The command's output (a report as terminal tables or JSON, then written to a file if asked), and :func:`to_terminal`."""

from __future__ import annotations

import io
import json
import os
import sys
from typing import Any, TextIO

from natgrad_diag._validate import require_bool, require_int
from natgrad_diag.exceptions import InputError, ReportWriteError
from natgrad_diag.report.files import WrittenReport, write_report
from natgrad_diag.report.records import to_jsonable
from natgrad_diag.report.text import render_on
from natgrad_diag.report.timeline import timeline_of

__all__ = ["emit", "to_terminal"]


def emit(
    report: Any, *, as_json: bool = False, plain: bool = False, report_path: str | os.PathLike[str] | None = None,
    stream: TextIO | None = None,
) -> WrittenReport | None:  # fmt: skip
    """Print ``report`` to ``stream`` (stdout): tables (``plain``: no colour or borders; colour only on a terminal) or,
    ``as_json``, ``report.to_dict()``; then write ``report_path`` (``.html`` or ``.md``) if given and return the
    :class:`WrittenReport`. A file that cannot be written is reported on stderr and ``None`` returned, not raised: the
    command prints its report, then exits 1 even when every check holds."""
    stream = sys.stdout if stream is None else stream
    stream.write(json.dumps(to_jsonable(report.to_dict()), indent=2, allow_nan=False) + "\n" if as_json
                 else render_on(report, stream, plain=plain))
    stream.flush()
    if report_path is None:
        return None
    try:
        written = write_report(report, report_path, argument="--report")
    except (ReportWriteError, InputError) as exc:
        sys.stderr.write(f"natgrad-diag: {exc}\n")
        return None
    extra = f" and {len(written.images)} picture(s) beside it" if written.images else ""
    sys.stderr.write(f"natgrad-diag: report written to {written.path}{extra}\n")
    if written.note:
        sys.stderr.write(f"natgrad-diag: {written.note}\n")
    return written


def to_terminal(report: Any, *, plain: bool = False, width: int = 80, color: bool = False) -> str:
    """The report (or a ``NatGradMonitor``'s training timeline) as the terminal shows it, lines at most ``width`` (≥ 20)
    columns; ``plain``: no colour and no table borders; ``color``: ANSI colour codes, as on a terminal (not with ``plain``)."""
    width = require_int(width, "width", minimum=20, remedy="pass width=80 (a report needs 20 columns at least).")
    return render_on(timeline_of(report), io.StringIO(), plain=require_bool(plain, "plain"), width=width, color=require_bool(color, "color"))
