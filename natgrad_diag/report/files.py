"""Report files: the format from the extension, and atomic writes of HTML or Markdown with its pictures."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from natgrad_diag.exceptions import ReportWriteError
from natgrad_diag.report.html import html_document
from natgrad_diag.report.layout import report_pictures_or_note
from natgrad_diag.report.markdown import to_markdown
from natgrad_diag.report.timeline import timeline_of
from natgrad_diag._validate import input_error

__all__ = ["REPORT_FORMATS", "WrittenReport", "report_format", "write_report"]

REPORT_FORMATS = {".html": "html", ".htm": "html", ".md": "markdown"}


def report_format(path: str | os.PathLike[str], *, argument: str = "path") -> str:
    """``"html"`` or ``"markdown"`` from the extension of ``path``; an InputError naming ``argument`` when ``path`` is
    not a path or its extension is not ``.html``, ``.htm`` or ``.md``."""
    if not isinstance(path, (str, os.PathLike)):
        raise input_error("the report path must be a file path.", argument,
                          "a str or os.PathLike ending in .html, .htm or .md", type(path).__name__,
                          "pass a path such as 'report.html' or pathlib.Path('out/report.md').")
    if (suffix := Path(os.fspath(path)).suffix.lower()) not in REPORT_FORMATS:
        raise input_error("the report format is chosen by the file extension.", argument,
                          "a path ending in .html, .htm or .md", repr(os.fspath(path)),
                          "name the file report.html (self-contained, pictures embedded) or report.md (pictures beside it).")
    return REPORT_FORMATS[suffix]


@dataclass(frozen=True)
class WrittenReport:
    """What :func:`write_report` wrote: the report's ``path``, its ``format`` ("html" or "markdown"), the picture
    files written beside a Markdown report (``images``; HTML embeds them) and why pictures are missing (``note``)."""

    path: Path
    format: str
    images: tuple[Path, ...] = ()
    note: str = ""


def _file_mode(path: Path) -> int:
    """The mode a new file gets (the existing file's mode when replacing one)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _short(name: str) -> str:
    """``name``, or its SHA-1 when a name built from it (a temporary file, a picture beside a Markdown report) could
    pass the file system's 255 bytes: a report whose own name fits is never refused for those."""
    return name if len(os.fsencode(name)) <= 160 else hashlib.sha1(os.fsencode(name)).hexdigest()


def _write_all(files: list[tuple[Path, bytes]]) -> None:
    """Write every file or none: all are staged to temporary files beside them with the modes they will have (a
    failure removes them and changes nothing), then moved into place in order with ``os.replace`` (atomic per file),
    the report itself last."""
    staged: list[Path] = []
    try:
        for path, data in files:
            if path.is_dir():  # os.replace would fail only after the files before it had replaced theirs
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{_short(path.name)}.", suffix=".tmp")
            staged.append(Path(name))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(name, _file_mode(path))
        for (path, _), tmp in zip(files, staged):
            os.replace(tmp, path)
    except BaseException:
        for tmp in staged:  # those already moved into place are no longer there
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


def write_report(report: Any, path: str | os.PathLike[str], *, argument: str = "path") -> WrittenReport:
    """Write ``report`` (or a ``NatGradMonitor``'s training timeline) as a self-contained HTML file, pictures embedded
    as base64 PNG (``.html``/``.htm``), or as Markdown (``.md``) with ``<stem>-<picture>.png`` beside it. Everything is
    rendered in memory, then written atomically: a failure leaves any previous report at ``path`` as it was. Without
    matplotlib there are no pictures and ``note`` says so. ``argument`` names ``path`` in error messages.

    Raises:
        InputError: the extension is not .html, .htm or .md.
        ReportWriteError: the file could not be written (directory missing, not writable, ...).
    """
    fmt = report_format(path, argument=argument)  # checks the path
    target = Path(os.fspath(path))
    report = timeline_of(report, what="written")
    pics, note = report_pictures_or_note(report)
    names = [f"{_short(target.stem)}-{p.name}.png" for p in pics] if fmt == "markdown" else []  # HTML embeds them
    images = [(target.with_name(n), p.png) for n, p in zip(names, pics)]
    text = html_document(report, pics, note) if fmt == "html" else to_markdown(report, image_names=names, pictures=pics, note=note)
    try:
        _write_all([*images, (target, text.encode("utf-8"))])
    except OSError as exc:
        raise ReportWriteError(
            f"{exc.strerror or exc}.",
            context=[("Argument", argument), ("Path", str(target)), ("Got", f"{type(exc).__name__}: {exc.strerror or exc}")],
            remedy="choose a path in an existing, writable directory; any previous report there is unchanged.",
        ) from exc
    return WrittenReport(target, fmt, tuple(p for p, _ in images), note)
