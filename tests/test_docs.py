"""The examples in README.md, CONTRIBUTING.md and docs/*.md run, and their transcripts match the real output.

Rules (a small runner, no plugin):

- Every ```python block runs, and every ```pycon block runs as a doctest session (``>>>`` lines, their
  output compared as doctest does, with ELLIPSIS on, so an error message shown there is checked whole).
  The python and pycon blocks of one file share one namespace and run in order, in a temporary
  directory of their own (so a block may write files). One test per block; a block's test first runs the
  blocks above it if they have not run in this process (so ``-k`` and ``pytest-xdist`` work).
- Every ```console block, and every ```text block whose first line is a ``$ command``, is a transcript: each
  ``$ natgrad-diag ...`` or ``$ python ...`` line runs as a subprocess of the installed command (this
  checkout first on PYTHONPATH, ``COLUMNS=80``, in a temporary directory holding a link to ``scripts/``),
  stdout and stderr together as a terminal shows them, and the lines below it, up to the next ``$`` line,
  are compared with what it printed, which must hold no line of TensorFlow's C++ logging. The only
  normalisation: trailing whitespace on each line and trailing blank lines are ignored, and ``...`` matches
  any text, across lines too (doctest's ELLIPSIS), for numbers that differ between machines and for lines
  left out. A ``# comment`` after the command is not part of it. A transcript that loads TensorFlow takes a
  few seconds and is marked slow; ``--help`` and refused arguments are not.
- Other ```text blocks are illustrations (formulas, a layout, a call) and are not run; one that the prose
  above introduces as what something "prints" must be a transcript.
- Every line of a ```bash block runs with ``bash -e`` in a temporary directory (the same link to ``scripts/``)
  and must exit 0 without TensorFlow log lines on stderr; ``pip install`` and ``pytest`` lines are skipped,
  with that reason (CI's ``.ci/run`` installs the package and runs the README's test line itself), and so
  is the full benchmark (minutes); the other benchmark lines are slow. The README's two quick-start lines
  are checked to be exactly ``pip install . && natgrad-diag`` and ``pip install ".[test]" && pytest``.
- A block opts out only with a visible marker, a quoted line right above its fence (blank lines between are
  allowed), which must say why:
    ``> Requires <module>: <why>``   skipped with that reason when ``<module>`` cannot be imported;
    ``> Not run by the tests: <why>``  always skipped.
  A quoted line above a fence that starts like a marker but is malformed, or an HTML-comment marker
  (invisible on the rendered page), fails the test. Skips are pytest skips, shown by ``-ra``, never silent.
- The python and pycon blocks import only the public API: ``natgrad_diag``'s ``__all__`` and its public
  submodules (``natgrad_diag._SUBMODULES``, each through its own ``__all__``), read from the source with ``ast``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import doctest
import importlib.util
import io
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_FILES = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
QUICK_START = ("pip install . && natgrad-diag", 'pip install ".[test]" && pytest')

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_MARKER = re.compile(r"^> (?P<body>(Requires|Not run).*?)\s*$|^\s*<!--\s*(?P<hidden>docs-test:.*?)-->\s*$")
_SKIP = re.compile(r"^Not run by the tests:\s*(?P<why>\S.*?)$")
_REQUIRES = re.compile(r"^Requires `?(?P<module>[\w.]+)`?:\s*(?P<why>\S.*?)$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block: its file, the line of its opening fence (1-based), language, text and marker."""

    path: Path
    line: int
    lang: str
    text: str
    marker: str | None  # the text of a ``> Requires ...`` / ``> Not run ...`` line right above the fence
    prose: str = ""  # the three lines above the fence

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order (indented fences are dedented)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, start = len(m["indent"]), i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        above = next((line for line in reversed(lines[:start]) if line.strip()), "")
        marker = _MARKER.match(above)
        text = marker and (marker["body"] or f"(hidden) {marker['hidden']}")
        prose = "\n".join(lines[max(0, start - 3) : start])
        blocks.append(Block(path, start + 1, m["lang"], "\n".join(body) + "\n", text or None, prose))
        i += 1
    return blocks


def _skip_reason(block: Block) -> str | None:
    """The reason to skip ``block`` (None to run it); a malformed marker fails the test."""
    if block.marker is None:
        return None
    if m := _SKIP.match(block.marker):
        return f"{block.id}: {m['why']}"
    if m := _REQUIRES.match(block.marker):
        if importlib.util.find_spec(m["module"]) is None:
            return f"{block.id}: needs {m['module']} ({m['why']})"
        return None
    pytest.fail(
        f"{block.id}: unknown, incomplete or invisible marker {block.marker!r}; expected a quoted line "
        "'> Requires <module>: <why>' or '> Not run by the tests: <why>' right above the fence"
    )


def _all_blocks() -> list[Block]:
    return [b for path in DOC_FILES if path.exists() for b in parse_blocks(path)]


PYTHON_BLOCKS = [b for b in _all_blocks() if b.lang in ("python", "pycon")]
CONSOLE_BLOCKS = [b for b in _all_blocks() if b.lang == "console" or b.lang == "text" and b.text.startswith("$ ")]
TEXT_BLOCKS = [b for b in _all_blocks() if b.lang == "text" and b not in CONSOLE_BLOCKS]


def _bash_lines() -> list[tuple[str, Block]]:
    """Every command line of the bash blocks, once, with the first block that shows it (``# comments`` dropped)."""
    lines: dict[str, Block] = {}
    for block in _all_blocks():
        for text in block.text.splitlines() if block.lang == "bash" else ():
            if line := re.sub(r"\s+#.*$", "", text).strip():
                lines.setdefault(line, block)
    return list(lines.items())


# ------------------------------------------------------------------------------------------------
# python blocks: one namespace per file, run in order


@dataclasses.dataclass
class _FileRun:
    namespace: dict[str, Any]
    directory: Path
    done: int = 0  # how many of the file's python blocks have run
    failed: str | None = None


_RUNS: dict[Path, _FileRun] = {}


@contextlib.contextmanager
def _inside(directory: Path):
    old = Path.cwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(old)


def _exec(block: Block, run: _FileRun) -> None:
    name = str(block.path.relative_to(ROOT))
    if block.lang == "pycon":
        _run_session(block, run)
        return
    # padded with newlines so that a traceback's line numbers are the Markdown file's
    code = compile("\n" * block.line + block.text, name, "exec")
    with _inside(run.directory):
        exec(code, run.namespace)  # noqa: S102


def _run_session(block: Block, run: _FileRun) -> None:
    """A ```pycon block as a doctest in the file's namespace; a mismatch fails with doctest's report."""
    test = doctest.DocTestParser().get_doctest(
        block.text, run.namespace, block.id, str(block.path), block.line
    )  # fmt: skip
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    with _inside(run.directory):
        result = runner.run(test, out=out.write, clear_globs=False)
    run.namespace.update(test.globs)  # DocTest works on a copy of the namespace
    if result.failed:
        raise AssertionError(f"{block.id}: the session's output differs\n{out.getvalue()}")


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_python_block__runs(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    same_file = [b for b in PYTHON_BLOCKS if b.path == block.path]
    index = same_file.index(block)
    run = _RUNS.get(block.path)
    if run is None or run.done > index:  # first visit, or run again from the top (e.g. pytest --lf)
        name = re.sub(r"\W", "_", block.path.stem)
        run = _RUNS[block.path] = _FileRun({"__name__": f"docs_{name}"}, tmp_path_factory.mktemp(name))
    while run.done < index:  # the blocks above this one, if a filter or xdist left them out
        earlier = same_file[run.done]
        run.done += 1
        if run.failed is None and _skip_reason(earlier) is None:
            try:
                _exec(earlier, run)
            except BaseException as exc:  # noqa: BLE001
                run.failed = f"{earlier.id} ({type(exc).__name__}: {exc})"
    if (reason := _skip_reason(block)) is not None:
        run.done = index + 1
        pytest.skip(reason)
    if run.failed is not None:
        pytest.fail(f"not run: an earlier block of {block.path.name} failed: {run.failed}")
    run.done = index + 1
    try:
        _exec(block, run)
    except BaseException as exc:
        run.failed = f"{block.id} ({type(exc).__name__}: {exc})"
        raise


# ------------------------------------------------------------------------------------------------
# the docs import only public paths

PACKAGE = ROOT / "natgrad_diag"


def _public_names(module: str) -> frozenset[str]:
    """The ``__all__`` of a natgrad_diag module, read from its source (nothing is imported)."""
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts).with_suffix(".py") if parts else PACKAGE / "__init__.py"
    if not path.exists():
        path = PACKAGE.joinpath(*parts, "__init__.py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def _submodules() -> tuple[str, ...]:
    """natgrad_diag's public submodules (its ``_SUBMODULES``), read from its source."""
    for node in ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_SUBMODULES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("natgrad_diag/__init__.py defines no _SUBMODULES")


PUBLIC_MODULES = frozenset({"natgrad_diag", *(f"natgrad_diag.{m}" for m in _submodules())})


def _public(module: str, name: str) -> bool:
    """Whether ``module.name`` is public: a name of the module's ``__all__`` or a public submodule."""
    return f"{module}.{name}" in PUBLIC_MODULES or name in _public_names(module) or (module, name) == ("natgrad_diag", "__version__")


def private_uses(source: str) -> list[str]:
    """The non-public natgrad_diag paths ``source`` imports, or reaches as attributes of an imported public module."""
    bound: dict[str, str] = {}  # local name -> the public module it is
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "natgrad_diag":
                    continue
                if alias.name not in PUBLIC_MODULES:
                    found.append(f"import {alias.name}")
                bound[alias.asname or "natgrad_diag"] = alias.name if alias.asname else "natgrad_diag"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "natgrad_diag":
            module = node.module or ""
            if module not in PUBLIC_MODULES:
                found.append(f"from {module} import ...")
                continue
            for alias in node.names:
                if not _public(module, alias.name):
                    found.append(f"from {module} import {alias.name}")
                elif f"{module}.{alias.name}" in PUBLIC_MODULES:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            module = bound[node.value.id]
            if not _public(module, node.attr):
                found.append(f"{module}.{node.attr}")
    return found


def _source(block: Block) -> str:
    if block.lang == "pycon":
        return "".join(example.source for example in doctest.DocTestParser().get_examples(block.text))
    return block.text


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_python_block__uses_only_the_public_api(block: Block) -> None:
    assert private_uses(_source(block)) == [], f"{block.id} reaches natgrad-diag's internals"


def test_private_uses__finds_internal_paths() -> None:
    source = (
        "import natgrad_diag as nd\nfrom natgrad_diag.report.text import to_terminal\nimport natgrad_diag.step.jacobian\n"
        "from natgrad_diag import progress, check_natgrad\nfrom natgrad_diag.pictures import heatmap_data, figure_to_png\n"
        "nd.report.text.to_terminal\nnd.pictures.heatmap_data\n"
    )
    assert private_uses(source) == [
        "from natgrad_diag.report.text import ...", "import natgrad_diag.step.jacobian", "from natgrad_diag import progress",
        "from natgrad_diag.pictures import figure_to_png", "natgrad_diag.report",
    ]
    assert private_uses("from natgrad_diag import to_terminal, testing\nimport natgrad_diag\nnatgrad_diag.demo.make_model\n") == []


# ------------------------------------------------------------------------------------------------
# console transcripts


@dataclasses.dataclass(frozen=True)
class Command:
    line: int
    argv: list[str]
    want: str


def parse_transcript(block: Block) -> list[Command]:
    """The ``$ natgrad-diag ...`` commands of a console block, each with the output shown below it."""
    commands: list[Command] = []
    current: tuple[int, list[str]] | None = None
    out: list[str] = []
    for offset, text in enumerate(block.text.splitlines(), start=1):
        if text.startswith("$ "):
            if current is not None:
                commands.append(Command(current[0], current[1], "\n".join(out)))
            words = shlex.split(text[2:], comments=True)
            if not words or words[0] not in ("natgrad-diag", "python"):
                pytest.fail(
                    f"{block.id}: line {block.line + offset} runs {text[2:]!r}; a transcript may only "
                    "run natgrad-diag or python (put other commands in a bash block)"
                )
            current, out = (block.line + offset, words), []
        elif current is None:
            pytest.fail(f"{block.id}: a transcript starts with a '$ natgrad-diag ...' line, got {text!r}")
        else:
            out.append(text)
    if current is not None:
        commands.append(Command(current[0], current[1], "\n".join(out)))
    return commands


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip() + "\n"


_TF_LOG = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|oneDNN|cuInit|cuda drivers|cpu_feature_guard|rebuild TensorFlow")


def _environment(directory: Path) -> dict[str, str]:
    """What a user's shell has: this checkout's package first, the interpreter's folder first on PATH (so ``python``
    and the installed ``natgrad-diag`` are this environment's), ``COLUMNS=80``, no TF_CPP_MIN_LOG_LEVEL."""
    import sys

    if not (directory / "scripts").exists():
        (directory / "scripts").symlink_to(ROOT / "scripts")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "COLUMNS", "PYTHONIOENCODING")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return {**env, "COLUMNS": "80"}


def run_command(argv: list[str], directory: Path) -> tuple[int, str]:
    """``argv`` (``natgrad-diag ...`` or ``python ...``) as a subprocess in ``directory``: the exit code and what it
    printed on stdout and stderr together."""
    import shutil
    import subprocess

    if argv[0] == "natgrad-diag" and shutil.which("natgrad-diag") is None:
        pytest.skip("the natgrad-diag command is not installed (pip install -e .)")
    r = subprocess.run(argv, cwd=directory, env=_environment(directory), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600)  # fmt: skip
    return r.returncode, r.stdout


def matches(want: str, got: str) -> bool:
    """Whether ``got`` is the output shown as ``want``, under the runner's rules (see the module docstring)."""
    return doctest.OutputChecker().check_output(_normalise(want), _normalise(got), doctest.ELLIPSIS)


def _loads_tensorflow(command: Command) -> bool:
    """False for what answers before TensorFlow loads: ``--help``, ``--version`` and arguments the command refuses."""
    return not ({"--help", "-h", "--version"} & set(command.argv) or command.want.startswith(f"{command.argv[0]} "))


def _console_params() -> list[Any]:
    return [
        pytest.param(b, id=b.id, marks=[pytest.mark.slow] if any(map(_loads_tensorflow, parse_transcript(b))) else [])
        for b in CONSOLE_BLOCKS
    ]


@pytest.mark.parametrize("block", _console_params())
def test_console_transcript__matches_the_real_output(block: Block, tmp_path: Path) -> None:
    if (reason := _skip_reason(block)) is not None:
        pytest.skip(reason)
    commands = parse_transcript(block)
    assert commands, f"{block.id}: a transcript without a '$ natgrad-diag' line"
    for command in commands:
        _, got = run_command(command.argv, tmp_path)
        if not matches(command.want, got):
            diff = "\n".join(difflib.unified_diff(
                _normalise(command.want).splitlines(), _normalise(got).splitlines(),
                "shown in the docs", "printed now", lineterm="",
            ))  # fmt: skip
            pytest.fail(f"{block.path.name}:{command.line}: {shlex.join(command.argv)}\n{diff}")
        assert [line for line in got.splitlines() if _TF_LOG.search(line)] == [], f"{block.id}: TensorFlow's logging"


@pytest.mark.parametrize("block", TEXT_BLOCKS, ids=[b.id for b in TEXT_BLOCKS])
def test_text_block__that_shows_output_is_a_transcript(block: Block) -> None:
    assert not re.search(r"\bprints\b", block.prose), (
        f"{block.id}: the prose calls this block output; start it with the '$ command' that prints it, so that it is run"
    )


# ------------------------------------------------------------------------------------------------
# bash blocks

#: Lines of bash blocks that are not run (the reason) or are slow (None).
_BASH_RULES = (
    (re.compile(r"^pip install|&& pytest|^pytest|^bash \.ci/run"),
     "installs the package or runs the test suite; CI's .ci/run does both itself, with the README's lines verbatim"),
    (re.compile(r"^natgrad-diag bench\s*$"), "the full benchmark takes minutes; the --quick and --sizes lines run it"),
    (re.compile(r"bench"), None),
)  # fmt: skip


def _bash_params() -> list[Any]:
    params = []
    for line, block in _bash_lines():
        rule = next((why for pattern, why in _BASH_RULES if pattern.search(line)), "")
        marks = [pytest.mark.slow] if rule is None else [pytest.mark.skip(reason=f"{block.id}: {rule}")] if rule else []
        params.append(pytest.param(line, block, id=f"{block.id}: {line}", marks=marks))
    return params


@pytest.mark.parametrize(("line", "block"), _bash_params())
def test_bash_line__runs(line: str, block: Block, tmp_path: Path) -> None:
    import subprocess

    if (reason := _skip_reason(block)) is not None:
        pytest.skip(reason)
    r = subprocess.run(["bash", "-e", "-c", line], cwd=tmp_path, env=_environment(tmp_path), capture_output=True,
                       text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, f"{block.id}: {line}\n{r.stderr[-3000:]}"
    assert [t for t in r.stderr.splitlines() if _TF_LOG.search(t)] == [], f"{block.id}: TensorFlow's logging"


# ------------------------------------------------------------------------------------------------
# the runner's own rules, on small inputs


def test_matches__ellipsis_and_trailing_whitespace_only() -> None:
    assert matches(
        "error 2.88e-11   ≤ ...\nVerdict: all checks hold.",
        "error 2.88e-11   ≤ 1.01e-05  \nVerdict: all checks hold.\n\n",
    )
    assert matches("first\n...\nlast", "first\nsecond\nthird\nlast")
    assert not matches("error 2.88e-11", "error 2.89e-11")
    assert not matches("  indented", "indented")  # leading whitespace counts
    assert not matches("a\nb", "a\n\nb")  # so do blank lines inside the output


def test_parse__markers_and_transcripts(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(
        "> Requires no_such_module_here: needs it\n\n```python\nx = 1\n```\n\n"
        "```console\n$ natgrad-diag outer --x 1,2  # a comment\nline one\n$ natgrad-diag --help\n```\n"
    )  # fmt: skip
    python, console = parse_blocks(doc)
    assert (python.lang, python.line, python.text) == ("python", 3, "x = 1\n")
    block = dataclasses.replace(python, path=ROOT / "docs" / "page.md")
    assert _skip_reason(block) == "docs/page.md:3: needs no_such_module_here (needs it)"
    console = dataclasses.replace(console, path=ROOT / "docs" / "page.md")
    assert parse_transcript(console) == [
        Command(8, ["natgrad-diag", "outer", "--x", "1,2"], "line one"), Command(10, ["natgrad-diag", "--help"], "")
    ]
    for marker in ("Not run by the tests:", "Requires torch", "(hidden) docs-test: skip: why"):  # no reason, or invisible
        with pytest.raises(pytest.fail.Exception, match="unknown, incomplete or invisible marker"):
            _skip_reason(dataclasses.replace(block, marker=marker))


# ------------------------------------------------------------------------------------------------
# the README itself


def test_readme__quick_start_lines_are_exact() -> None:
    bash = [b.text for b in parse_blocks(README) if b.lang == "bash"]
    for line in QUICK_START:
        assert line + "\n" in bash, f"README.md has no ```bash block that is exactly {line!r}"
    assert 'pip install ".[test]" && pytest\n' in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme__is_short_and_maps_every_docs_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in text, f"README.md does not link docs/{page.name}"
    assert "](CONTRIBUTING.md)" in text


@pytest.mark.parametrize("path", DOC_FILES, ids=[str(p.relative_to(ROOT)) for p in DOC_FILES])
def test_docs__relative_links_resolve(path: Path) -> None:
    assert path.exists(), f"{path.relative_to(ROOT)} is missing"
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target and not target.startswith("mailto:"):
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links {target}, which does not exist"
