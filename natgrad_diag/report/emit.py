"""The command's output: a report printed as terminal tables or JSON, then, if asked, written to a file."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from natgrad_diag.exceptions import InputError, ReportWriteError
from natgrad_diag.report.files import WrittenReport, write_report
from natgrad_diag.report.records import to_jsonable
from natgrad_diag.report.text import render_on

__all__ = ["emit"]


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
