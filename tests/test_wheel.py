"""The built wheel: typed (py.typed), its entry points as declared, every module, no tests, Python 3.10–3.12."""

from __future__ import annotations

import configparser
import email.parser
import importlib.util
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """The wheel built from this checkout by the project's own build backend (hatchling), once per module."""
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(ROOT)]
    if importlib.util.find_spec("hatchling") is not None:
        cmd.insert(4, "--no-build-isolation")  # no download when the backend is already here
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (path,) = out.glob("natgrad_diag-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (member,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}") and n.count("/") == 1]
    return wheel.read(member).decode()


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _entry_points(wheel: zipfile.ZipFile) -> dict[str, dict[str, str]]:
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # entry-point names are case-sensitive
    parser.read_string(_dist_info(wheel, "entry_points.txt"))
    return {group: {k: v.strip() for k, v in parser[group].items()} for group in parser.sections()}


def test_wheel__ships_py_typed(wheel):
    assert "natgrad_diag/py.typed" in wheel.namelist()


def test_wheel__has_every_module_of_the_package_and_no_tests(wheel):
    names = set(wheel.namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "natgrad_diag").rglob("*.py")}
    assert modules, "no modules found in the checkout"
    assert modules <= names, sorted(modules - names)
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n or n.endswith("conftest.py")]
    assert {n.split("/")[0] for n in names} == {"natgrad_diag", f"natgrad_diag-{_package_version()}.dist-info"}


def test_wheel__console_script_is_the_cli_main(wheel):
    assert _entry_points(wheel)["console_scripts"]["natgrad-diag"] == "natgrad_diag.cli:main"


def test_wheel__every_entry_point_declared_in_pyproject_is_in_the_wheel(wheel):
    """The console script and each ``[project.entry-points.<group>]`` table (the pytest11 plugin, when declared)."""
    project = _pyproject()["project"]
    declared = {"console_scripts": dict(project.get("scripts", {}))}
    declared.update({group: dict(table) for group, table in project.get("entry-points", {}).items()})
    built = _entry_points(wheel)
    for group, table in declared.items():
        assert built.get(group) == table, (group, built.get(group), table)
    if "pytest11" in project.get("entry-points", {}):
        assert built["pytest11"], "the pytest plugin entry point is declared but not in the wheel"


def test_wheel__metadata_states_the_supported_pythons(wheel):
    meta = email.parser.Parser().parsestr(_dist_info(wheel, "METADATA"))
    assert meta["Requires-Python"] == "<3.13,>=3.10"
    classifiers = set(meta.get_all("Classifier"))
    for minor in ("3.10", "3.11", "3.12"):
        assert f"Programming Language :: Python :: {minor}" in classifiers
    assert "Programming Language :: Python :: 3.13" not in classifiers
    assert "Typing :: Typed" in classifiers
    assert meta["Version"] == _package_version()


def _package_version() -> str:
    # read, not imported: the version hatchling takes from natgrad_diag/__init__.py
    for line in (ROOT / "natgrad_diag" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise AssertionError("no __version__ in natgrad_diag/__init__.py")
