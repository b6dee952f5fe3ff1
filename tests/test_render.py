"""Tests of natgrad_diag.report's renderers: terminal tables, HTML and Markdown files, atomic writes, the CLI's --report.

Oracles: Python's own html.parser and base64, the PNG signature and matplotlib's PNG decoder, the
report's own fields (every check name, every table cell) and the file system before and after.
"""

from __future__ import annotations

import base64
import html.parser
import io
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from natgrad_diag import progress
from natgrad_diag.cli import app as cli
from natgrad_diag.report import emit as emit_mod
from natgrad_diag.report import files as files_mod
from natgrad_diag.report import html as html_mod
from natgrad_diag.report import layout as layout_mod
from natgrad_diag.report import markdown as markdown_mod
from natgrad_diag.report import text as text_mod
from natgrad_diag.exceptions import InputError, ReportWriteError
from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section, Table

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ANSI = "\x1b["
BOX_CHARS = set("│─╭╮╰╯├┤┬┴┼")


@dataclass(frozen=True)
class Demo(Report):
    """A small report with every feature: code text, a table with awkward cells, failing and numeric checks."""

    title: str = "Demo report <M = 3>"
    checks: tuple[Check, ...] = (
        Check("exact_match", "the two routes agree", True, 0.0, 1e-12),
        Check("large_gap", "the two routes agree", False, 2.5e-3, 1e-8, detail="entry [1, 0] is off"),
        Check("must_differ", "the naive product differs", True, 0.389, 6.35e-11, expect_difference=True),
        Check("structural", "J is not diagonal", True),
    )

    def sections(self) -> tuple[Section, ...]:
        table = Table(("", "value [3, 1]", "a|b <c>"), (("x[0,0]", "1.5", "2 | 3"), ("x[1,0]", "-0.25", "*4*")), "numbers")
        text = "First line of a paragraph\nthat continues here.\n    code = line(1)\n    more_code()\nAfter the code."
        return (Section("Intro", text), Section("Table", "", (table,)))


@pytest.fixture(scope="module")
def explanation():
    from natgrad_diag import explain_output_gradients

    return explain_output_gradients()


def _html(report):
    """The HTML document write_report writes: the report with its pictures (or the note that they are missing)."""
    return html_mod.html_document(report, *layout_mod.report_pictures_or_note(report))


class _Parsed(html.parser.HTMLParser):
    """Collect what an HTML document contains, and check that its tags are balanced."""

    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.images: list[dict[str, str]] = []
        self.codes: list[str] = []
        self.cells: list[str] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None
        self._code: list[str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag in ("td", "th"):
            self._cell = []
        if tag == "code":
            self._code = []

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()
        if tag in ("td", "th") and self._cell is not None:
            self.cells.append("".join(self._cell))
            self._cell = None
        if tag == "code" and self._code is not None:
            self.codes.append("".join(self._code))
            self._code = None

    def handle_data(self, data):
        self.text.append(data)
        for acc in (self._cell, self._code):
            if acc is not None:
                acc.append(data)


def _decode_png(uri: str) -> np.ndarray:
    import matplotlib.image

    prefix = "data:image/png;base64,"
    assert uri.startswith(prefix)
    data = base64.b64decode(uri[len(prefix) :], validate=True)
    assert data.startswith(PNG_SIGNATURE)
    return matplotlib.image.imread(io.BytesIO(data), format="png")


def _all_cells(report: Report, *, headers: bool = True) -> list[str]:
    return [
        cell for s in report.sections() for t in s.tables for row in ((t.columns,) if headers else ()) + t.rows
        for cell in row
    ]  # fmt: skip


# --------------------------------------------------------------------------------------------------
# the shared layout


def test_text_blocks__paragraphs_join_code_keeps_its_lines():
    assert layout_mod.text_blocks("a\nb\n    c = 1\n    d()\ne\n\nf\n- item\n- item two") == [
        ("para", "a b"),
        ("code", "    c = 1\n    d()"),
        ("para", "e"),
        ("para", "f"),
        ("para", "- item"),
        ("para", "- item two"),
    ]


@pytest.mark.parametrize("path, fmt", [("r.html", "html"), ("R.HTM", "html"), ("dir/r.md", "markdown")])
def test_report_format__by_extension(path, fmt):
    assert files_mod.report_format(path) == fmt


def test_report_format__other_extensions_name_the_argument():
    with pytest.raises(InputError) as info:
        files_mod.report_format("out/report.pdf", argument="--report")
    assert str(info.value) == (
        "Invalid input. the report format is chosen by the file extension.\n"
        "  Argument: --report\n"
        "    Expected: a path ending in .html, .htm or .md\n"
        "    Got:      'out/report.pdf'\n"
        "  To fix: name the file report.html (self-contained, pictures embedded) or report.md (pictures beside it)."
    )


# --------------------------------------------------------------------------------------------------
# terminal


def test_to_terminal__in_colour_only_the_check_name_is_bold():
    text = emit_mod.to_terminal(Demo(), width=120, color=True)
    bold = re.compile(r"\x1b\[([0-9;]*)m([^\x1b]*)")
    bold_runs = [run for codes, run in bold.findall(text) if "1" in codes.split(";") and run.strip()]
    assert "large_gap" in " ".join(bold_runs)
    assert not any("the two routes agree" in run or "entry [1, 0] is off" in run for run in bold_runs), bold_runs


@pytest.mark.parametrize("plain", [False, True], ids=["rich", "plain"])
def test_to_terminal__fits_80_columns_and_names_every_check(plain, explanation):
    for report in (Demo(), explanation):
        text = emit_mod.to_terminal(report, plain=plain, width=80)
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= 80
        for c in report.checks:
            mark = "PASS" if c.passed else "FAIL"
            assert any(c.name in line and line.lstrip().startswith(("│ " + mark, mark)) for line in lines), c.name
        for cell in _all_cells(report, headers=False):  # headers may wrap in narrow columns
            assert cell in text, cell
        assert report.title in text
        assert (ANSI in text) is False


def test_to_terminal__plain_has_no_borders_rich_has_them():
    plain = emit_mod.to_terminal(Demo(), plain=True)
    boxed = emit_mod.to_terminal(Demo(), plain=False)
    assert not BOX_CHARS & set(plain)
    assert BOX_CHARS & set(boxed)
    assert "Verdict: 1 of 4 check(s) FAILED." in plain


def test_to_terminal__colour_only_when_asked():
    coloured = emit_mod.to_terminal(Demo(), color=True)
    assert ANSI in coloured
    assert ANSI not in emit_mod.to_terminal(Demo(), color=True, plain=True)


def test_to_terminal__numbers_against_their_tolerance():
    lines = emit_mod.to_terminal(Demo(), plain=True).splitlines()
    row = {c.name: next(line for line in lines if c.name in line) for c in Demo().checks}
    assert re.search(r"FAIL\s+large_gap\s+0\.0025\s+> 1\.00e-08$", row["large_gap"])
    assert re.search(r"PASS\s+exact_match\s+0\s+≤ 1\.00e-12$", row["exact_match"])
    assert re.search(r"PASS\s+must_differ\s+0\.389\s+> 6\.35e-11$", row["must_differ"])
    assert re.search(r"PASS\s+structural\s+-\s+-$", row["structural"])


def test_to_terminal__nan_error_is_not_within_tolerance():
    @dataclass(frozen=True)
    class NaNReport(Demo):
        checks: tuple[Check, ...] = (Check("nan_error", "the two routes agree", False, float("nan"), 1e-8),)

    row = next(line for line in emit_mod.to_terminal(NaNReport(), plain=True).splitlines() if "nan_error" in line)
    assert re.search(r"FAIL\s+nan_error\s+nan\s+> 1\.00e-08$", row)


def test_emit__not_a_terminal_gets_no_colour_and_json_is_to_dict():
    out = io.StringIO()
    assert emit_mod.emit(Demo(), stream=out) is None
    assert ANSI not in out.getvalue() and "large_gap" in out.getvalue()
    out = io.StringIO()
    emit_mod.emit(Demo(), as_json=True, stream=out)
    assert json.loads(out.getvalue()) == json.loads(json.dumps(Demo().to_dict()))


# --------------------------------------------------------------------------------------------------
# HTML


def test_to_html__parses_embeds_png_and_names_every_check(explanation):
    doc = _html(explanation)
    parsed = _Parsed(doc)
    assert parsed.errors == [] and parsed.stack == []
    assert doc.startswith("<!DOCTYPE html>")
    assert {c.name for c in explanation.checks} <= set(parsed.codes)
    assert len(parsed.images) == 3
    for img in parsed.images:
        image = _decode_png(img["src"])
        assert image.ndim == 3 and min(image.shape[:2]) > 100
        assert img["alt"]
    for cell in _all_cells(explanation):
        assert cell in parsed.cells
    assert "http://" not in doc and "https://" not in doc  # self-contained


def test_to_html__escapes_cells_and_keeps_the_layout():
    parsed = _Parsed(html_mod.html_document(Demo(), (), ""))
    assert parsed.errors == []
    assert "a|b <c>" in parsed.cells and "2 | 3" in parsed.cells
    assert "Demo report <M = 3>" in parsed.text
    text = "".join(parsed.text)
    assert "First line of a paragraph that continues here." in text
    assert "code = line(1)\nmore_code()" in text
    row = parsed.cells[parsed.cells.index("large_gap") - 1 : parsed.cells.index("large_gap") + 4]
    assert row == ["FAIL", "large_gap", "the two routes agreeentry [1, 0] is off", "0.0025", "> 1.00e-08"]


def test_repr_html__is_tables_and_embedded_pictures_for_jupyter(explanation):
    pytest.importorskip("matplotlib")
    fragment = explanation._repr_html_()
    parsed = _Parsed(fragment)
    assert parsed.errors == [] and parsed.stack == []
    assert "<table" in fragment
    assert [img["alt"] for img in parsed.images] == [p.caption for p in explanation.figures()]
    assert all(base64.b64decode(img["src"].split(",", 1)[1]).startswith(PNG_SIGNATURE) for img in parsed.images)
    assert {c.name for c in explanation.checks} <= set(parsed.codes)


# --------------------------------------------------------------------------------------------------
# Markdown


def _md_cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_write_report__markdown_links_its_images_beside_it(tmp_path, explanation):
    written = files_mod.write_report(explanation, tmp_path / "r.md")
    text = (tmp_path / "r.md").read_text(encoding="utf-8")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links == ["r-jacobian.png", "r-eta1.png", "r-checks.png"]
    assert sorted(written.images) == sorted(tmp_path / link for link in links)
    for link in links:
        assert (tmp_path / link).read_bytes().startswith(PNG_SIGNATURE)
    for c in explanation.checks:
        assert f"`{c.name}`" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r-checks.png", "r-eta1.png", "r-jacobian.png", "r.md"]


@pytest.mark.parametrize("suffix", [".md", ".html"])
def test_write_report__a_name_near_255_bytes_is_written_with_its_pictures(tmp_path, explanation, suffix):
    """The file system allows 255 bytes per name: a report whose name fits is written, its temporary file and the
    Markdown's pictures (``<stem>-<picture>.png``, which would not fit) named by the stem's SHA-1."""
    import hashlib

    name = "r" * (255 - len(suffix)) + suffix
    written = files_mod.write_report(explanation, tmp_path / name)
    assert (tmp_path / name).is_file() and not list(tmp_path.glob(".*.tmp"))
    if suffix == ".md":
        stem = hashlib.sha1(("r" * 252).encode()).hexdigest()
        links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (tmp_path / name).read_text(encoding="utf-8"))
        assert links == [f"{stem}-jacobian.png", f"{stem}-eta1.png", f"{stem}-checks.png"]
        assert sorted(written.images) == sorted(tmp_path / link for link in links)
        assert all((tmp_path / link).read_bytes().startswith(PNG_SIGNATURE) for link in links)
    else:  # the pictures are embedded
        parsed = _Parsed((tmp_path / name).read_text(encoding="utf-8"))
        assert parsed.errors == [] and len(parsed.images) == 3
        assert all(img["alt"] and _decode_png(img["src"]).ndim == 3 for img in parsed.images)


def test_to_markdown__tables_keep_their_columns_and_escape_pipes():
    text = markdown_mod.to_markdown(Demo())
    lines = text.splitlines()
    header = lines.index(next(line for line in lines if "value [3, 1]" in line))
    assert _md_cells(lines[header]) == ["", "value [3, 1]", r"a\|b \<c\>"]
    assert _md_cells(lines[header + 2]) == ["x[0,0]", "1.5", r"2 \| 3"]
    assert _md_cells(lines[header + 3])[2] == r"\*4\*"
    checks = lines.index("## Checks")
    rows = [_md_cells(line) for line in lines[checks + 2 :] if line.startswith("|")]
    assert [r[1] for r in rows[2:]] == [f"`{c.name}`" for c in Demo().checks]
    assert rows[3][0] == "**FAIL**" and rows[3][4] == r"\> 1.00e-08"
    assert "```\ncode = line(1)\nmore_code()\n```" in text


def test_write_report__markdown_with_special_file_name_links_it_quoted(tmp_path):
    written = files_mod.write_report(Demo(), tmp_path / "my report.md")
    text = written.path.read_text(encoding="utf-8")
    assert "](my%20report-checks.png)" in text
    assert (tmp_path / "my report-checks.png").exists()


# --------------------------------------------------------------------------------------------------
# atomic writes


def _old(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text("OLD REPORT", encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["r.html", "r.md"])
def test_write_report__failed_replace_leaves_old_file_and_no_temp(tmp_path, monkeypatch, name):
    path = _old(tmp_path, name)

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files_mod.os, "replace", refuse)
    with pytest.raises(ReportWriteError) as info:
        files_mod.write_report(Demo(), path)
    assert path.read_text(encoding="utf-8") == "OLD REPORT"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert str(info.value) == (
        "Could not write the report. Permission denied.\n"
        "  Argument: path\n"
        f"  Path:     {path}\n"
        "    Got:      PermissionError: Permission denied\n"
        "  To fix: choose a path in an existing, writable directory; any previous report there is unchanged."
    )
    assert isinstance(info.value, OSError)


def test_write_report__disk_full_half_way_leaves_old_file(tmp_path, monkeypatch):
    path = _old(tmp_path, "r.html")
    real_fdopen = os.fdopen

    class HalfFile:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(files_mod.os, "fdopen", lambda fd, mode: HalfFile(real_fdopen(fd, mode)))
    with pytest.raises(ReportWriteError, match="No space left on device"):
        files_mod.write_report(Demo(), path)
    assert path.read_text(encoding="utf-8") == "OLD REPORT"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_write_report__exception_while_rendering_leaves_old_file(tmp_path):
    @dataclass(frozen=True)
    class Broken(Demo):
        def sections(self):
            raise RuntimeError("bug in a report's layout")

    for name in ("r.html", "r.md"):
        path = _old(tmp_path, name)
        with pytest.raises(RuntimeError, match="bug in a report's layout"):
            files_mod.write_report(Broken(), path)
        assert path.read_text(encoding="utf-8") == "OLD REPORT"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.md"]


def test_write_report__replaces_an_existing_report_keeping_its_mode(tmp_path):
    path = _old(tmp_path, "r.html")
    path.chmod(0o640)
    files_mod.write_report(Demo(), path)
    assert "large_gap" in path.read_text(encoding="utf-8")
    assert path.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("where", ["inside_a_file", "missing_directory", "a_directory", "a_markdown_directory"])
def test_write_report__unwritable_path_is_a_clear_error(tmp_path, where):
    """Nothing is written, not even the pictures a Markdown report puts beside it."""
    (tmp_path / "file.txt").write_text("x", encoding="utf-8")
    (tmp_path / "dir.html").mkdir()
    path = {
        "inside_a_file": tmp_path / "file.txt" / "r.html",
        "missing_directory": tmp_path / "no" / "such" / "r.html",
        "a_directory": tmp_path / "dir.html",
        "a_markdown_directory": tmp_path / "dir.html" / "r.md",
    }[where]
    if where == "a_markdown_directory":
        path.mkdir()
    with pytest.raises(ReportWriteError) as info:
        files_mod.write_report(Demo(), path)
    message = str(info.value)
    assert message.startswith("Could not write the report.")
    assert f"Path:     {path}\n" in message and "Argument: path" in message and "To fix:" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.html", "file.txt"]
    assert [p.name for p in (tmp_path / "dir.html").iterdir()] == (["r.md"] if where == "a_markdown_directory" else [])


# --------------------------------------------------------------------------------------------------
# without matplotlib


def test_reports_without_matplotlib__still_written_with_a_note(tmp_path, monkeypatch, explanation):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    doc = _html(explanation)
    parsed = _Parsed(doc)
    assert parsed.errors == [] and parsed.images == []
    assert 'pip install "natgrad-diag[plot]"' in "".join(parsed.text)
    assert {c.name for c in explanation.checks} <= set(parsed.codes)
    written = files_mod.write_report(explanation, tmp_path / "r.md")
    assert written.images == () and "natgrad-diag[plot]" in written.path.read_text(encoding="utf-8")
    assert "matplotlib is not installed" in written.note
    assert [p.name for p in tmp_path.iterdir()] == ["r.md"]
    assert "a_vjp_equals_contraction" in emit_mod.to_terminal(explanation)


# --------------------------------------------------------------------------------------------------
# read-only


def test_rendering__leaves_the_report_bit_identical(tmp_path, explanation):
    t = explanation.trace
    before = {k: np.copy(getattr(t, k)) for k in ("eta1", "eta2", "dL_deta1", "dL_deta2", "dtheta_deta1")}
    text_before = str(explanation)
    emit_mod.to_terminal(explanation)
    files_mod.write_report(explanation, tmp_path / "r.md")
    html_mod.to_html_fragment(explanation)
    for k, v in before.items():
        assert np.array_equal(getattr(t, k), v), k
    assert str(explanation) == text_before


# --------------------------------------------------------------------------------------------------
# the command


@pytest.mark.slow
def test_cli_explain__report_html_end_to_end(tmp_path, capsys):
    path = tmp_path / "r.html"
    assert cli.main(["explain", "--report", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "Verdict: all checks hold." in out and f"report written to {path}" in err
    parsed = _Parsed(path.read_text(encoding="utf-8"))
    assert parsed.errors == [] and len(parsed.images) == 3
    assert "a_vjp_equals_contraction" in parsed.codes and "e_onehot_row" in parsed.codes


@pytest.mark.parametrize("report", [Demo(), None], ids=["failing-report", "passing-report"])
def test_cli__unwritable_report_prints_result_error_and_exits_1(tmp_path, monkeypatch, capsys, report):
    """A folder takes the report's path during the run, so the write fails after it: the result, the error, and exit 1
    (never 0)."""

    @dataclass(frozen=True)
    class Passing(Demo):
        checks: tuple[Check, ...] = (Check("exact_match", "the two routes agree", True, 0.0, 1e-12),)

    report, path = report or Passing(), tmp_path / "r.html"
    monkeypatch.setattr(cli, "_run", lambda args: (path.mkdir(), report)[1])
    assert cli.main(["outer", "--plain", "--report", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "exact_match" in out and "Verdict:" in out
    assert err.startswith("natgrad-diag: Could not write the report.")
    assert "Argument: --report" in err and str(path) in err


def test_cli__report_under_a_file_is_refused_before_the_command_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_run", lambda args: pytest.fail("the command must not run"))
    (tmp_path / "file.txt").write_text("x", encoding="utf-8")
    path = tmp_path / "file.txt" / "r.html"
    assert cli.main(["outer", "--plain", "--report", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"natgrad-diag outer: Invalid input. the report's folder cannot be created under {tmp_path / 'file.txt'}.")


def test_cli__bad_report_extension_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_run", lambda args: pytest.fail("the command must not run"))
    assert cli.main(["explain", "--report", "r.pdf"]) == 2
    err = capsys.readouterr().err
    assert "argument --report: expected a path ending in .html, .htm or .md" in err and "'r.pdf'" in err


def test_cli__json_and_markdown_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_run", lambda args: Demo())
    assert cli.main(["check", "--json", "--report", str(tmp_path / "r.md")]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["title"] == Demo().title
    assert [(c["name"], c["passed"]) for c in json.loads(out)["checks"]] == [
        ("exact_match", True), ("large_gap", False), ("must_differ", True), ("structural", True)
    ]
    text = (tmp_path / "r.md").read_text(encoding="utf-8")
    assert re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text) == ["r-checks.png"]
    assert (tmp_path / "r-checks.png").read_bytes().startswith(PNG_SIGNATURE)
    for c in Demo().checks:
        assert f"`{c.name}`" in text
    assert "1.5" in text and r"\*4\*" in text  # the table's cells


# --------------------------------------------------------------------------------------------------
# progress bars


class _TTY(io.StringIO):
    def isatty(self):
        return True


def _progress_output(monkeypatch, stream, enabled):
    monkeypatch.setattr(sys, "stderr", stream)
    with progress.progress_bar(total=3, description="working", enabled=enabled) as advance:
        for _ in range(3):
            advance()
    return stream.getvalue()


def test_progress_bar__silent_off_a_terminal_and_when_disabled(monkeypatch):
    assert _progress_output(monkeypatch, io.StringIO(), True) == ""
    assert _progress_output(monkeypatch, _TTY(), False) == ""
    assert "working" in _progress_output(monkeypatch, _TTY(), True)


def test_cli__without_matplotlib_the_report_is_written_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(cli, "_run", lambda args: Demo())
    path = tmp_path / "r.html"
    assert cli.main(["check", "--report", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "large_gap" in out
    assert f"report written to {path}" in err and 'pip install "natgrad-diag[plot]"' in err
    parsed = _Parsed(path.read_text(encoding="utf-8"))
    assert parsed.images == [] and "large_gap" in parsed.codes


def test_write_report__is_exported_at_the_top_level():
    import natgrad_diag

    assert natgrad_diag.write_report is files_mod.write_report and "write_report" in natgrad_diag.__all__


def _strict_json(text):
    """json.loads that refuses NaN/Infinity, which JSON does not have (Python's json accepts them)."""

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_cli__json_is_strict_for_non_finite_numbers(capsys, monkeypatch):
    inf_check = Check(name="overflow", claim="a check whose error overflowed", status=False, max_abs_error=float("inf"),
                      tolerance=1e-12)  # fmt: skip
    monkeypatch.setattr(cli, "_run", lambda args: Demo(checks=(inf_check,)))
    assert cli.main(["check", "--json"]) == 1
    d = _strict_json(capsys.readouterr().out)
    assert d["checks"][0]["max_abs_error"] == "inf"


def test_cli__outer_with_overflowing_x_is_bad_input(capsys):
    # x = 1e300: y = x xᵀ and z = y² overflow float64: refused (exit 2), one strict JSON error object
    assert cli.main(["outer", "--x", "1e300,1e300", "--json"]) == 2
    d = _strict_json(capsys.readouterr().out)
    assert d["exit_code"] == 2 and "too large" in d["error"]


def test_strict_json_helper__refuses_infinity():
    with pytest.raises(AssertionError, match="Infinity"):
        _strict_json('{"a": Infinity}')


# --------------------------------------------------------------------------------------------------
# every table fits 80 (and 120) columns without breaking a header, a cell or a check's name


def _wide_demo():
    """A table too wide for 80 columns whole: it must switch to records, not break cells."""

    @dataclass(frozen=True)
    class Wide(Report):
        title: str = "wide"
        checks: tuple[Check, ...] = (Check("a_rather_long_check_name_that_must_stay_whole", "claim", True, 0.0, 1.0),)

        def sections(self):
            columns = ("", "block", "worst entry", "numerical", "analytical", "abs err", "rel err")
            row = ("PASS", "∂varsqrt/∂eta2", "[0,2,2]/[0,1,0]+[0,0,1]", "-0.03625", "0.02103", "9.04e-11", "1.75e-09")
            return (Section("Blocks", "", (Table(columns, (row,)),)),)

    return Wide()


@pytest.mark.parametrize("width", [80, 120])
def test_terminal__tables_fit_the_width_and_break_no_cell(explanation, width):
    for report in (Demo(), explanation, _wide_demo()):
        out = emit_mod.to_terminal(report, plain=True, width=width)
        assert max(len(line) for line in out.splitlines()) <= width
        for section in report.sections():
            for table in section.tables:
                # headers appear whole when the table is drawn as columns; records show the value columns' names
                headers = table.columns if text_mod.fits(table, width) else table.columns[2:]
                for cell in [*headers, *(c for row in table.rows for c in row)]:
                    assert not cell.strip() or any(cell in line for line in out.splitlines()), (width, cell)
        for check in report.checks:
            assert any(check.name in line for line in out.splitlines())


def test_terminal__a_table_too_wide_becomes_records():
    out = emit_mod.to_terminal(_wide_demo(), plain=True, width=80)
    assert "PASS ∂varsqrt/∂eta2\n  worst entry: [0,2,2]/[0,1,0]+[0,0,1]" in out
    wide = emit_mod.to_terminal(_wide_demo(), plain=True, width=120)
    assert "worst entry" in wide.splitlines()[wide.splitlines().index("Blocks") + 3]  # a header row at 120


def test_cli__piped_output_fits_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(cli, "_run", lambda args: _wide_demo())
    cli.main(["check", "--plain"])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80 and "[0,2,2]/[0,1,0]+[0,0,1]" in out


def test_write_report__markdown_failing_after_its_pictures_changes_nothing(tmp_path, monkeypatch):
    """The .md text fails to write after its pictures were staged: no new picture is left beside the old report."""
    pytest.importorskip("matplotlib")
    path = _old(tmp_path, "r.md")
    real_mkstemp = files_mod.tempfile.mkstemp

    def mkstemp(dir=None, prefix="", suffix=""):
        if prefix == ".r.md.":
            raise OSError(28, "No space left on device")
        return real_mkstemp(dir=dir, prefix=prefix, suffix=suffix)

    monkeypatch.setattr(files_mod.tempfile, "mkstemp", mkstemp)
    with pytest.raises(ReportWriteError, match="No space left on device"):
        files_mod.write_report(Demo(), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.md"]
    assert path.read_text(encoding="utf-8") == "OLD REPORT"


@pytest.mark.parametrize("bad", [3, None, b"r.html", ["r.html"]])
def test_write_report__a_path_that_is_not_a_path_is_bad_input(bad):
    with pytest.raises(InputError) as info:
        files_mod.write_report(Demo(), bad)
    assert "Argument: path" in str(info.value) and type(bad).__name__ in str(info.value)


def test_write_report__something_that_is_not_a_report_is_bad_input(tmp_path):
    with pytest.raises(InputError, match="only a natgrad-diag report can be written"):
        files_mod.write_report({"title": "x"}, tmp_path / "r.html")
