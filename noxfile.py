"""Sessions: the tests on Python 3.10–3.12, the 3.13 refusal, lint, typecheck, and the built wheel and sdist.

    nox -s tests                    # 3.10, 3.11 and 3.12, full suite, two workers each
    nox -s tests-3.12 -- -x -q      # one interpreter; arguments after -- go to pytest
    nox -s py313 lint typecheck build

Interpreters come from PATH, or else from pyenv's installed versions (``$(pyenv root)/versions/3.X.Y``):
only the ``python3.X`` executables are linked into ``.nox/_interpreters``, which goes first on PATH, so
pyenv's shims (which refuse versions that are not selected) do not shadow them and ``python`` is untouched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nox

HERE = Path(__file__).resolve().parent
PYTHONS = ["3.10", "3.11", "3.12"]
#: The CPU build of PyTorch that lies on the CI machine's disk (for Python 3.11 only): the torch
#: cross-checks run there and are skipped on the other interpreters, where pip would fetch a CUDA build.
TORCH = "torch==2.13.0"
TORCH_PYTHON = "3.11"
#: Pinned so that a new release of a linter does not turn CI red on unchanged code.
RUFF = "ruff==0.17.6"
MYPY = "mypy==2.4.1"
RESOLVES_ON_313 = "GPflow now resolves on 3.13: update requires-python and the support table"

nox.options.sessions = ["tests", "py313", "lint", "typecheck", "build"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True


def _pyenv_root() -> Path | None:
    if os.environ.get("PYENV_ROOT"):
        return Path(os.environ["PYENV_ROOT"])
    try:
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        out = ""
    return Path(out) if out else (Path.home() / ".pyenv" if (Path.home() / ".pyenv").is_dir() else None)


def _link_pyenv_interpreters() -> None:
    """Put ``python3.X`` of every pyenv version (newest patch release wins) first on PATH."""
    root = _pyenv_root()
    if root is None or not (root / "versions").is_dir():
        return
    links = HERE / ".nox" / "_interpreters"
    links.mkdir(parents=True, exist_ok=True)
    found: dict[str, tuple[tuple[int, ...], Path]] = {}
    for version_dir in (root / "versions").iterdir():
        m = re.fullmatch(r"(3\.\d+)\.(\d+)", version_dir.name)
        exe = version_dir / "bin" / f"python{m.group(1)}" if m else None
        if m and exe is not None and exe.exists():
            key = tuple(int(p) for p in version_dir.name.split("."))
            if m.group(1) not in found or key > found[m.group(1)][0]:
                found[m.group(1)] = (key, exe)
    for minor, (_, exe) in found.items():
        link = links / f"python{minor}"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(exe)
    path = os.environ.get("PATH", "")
    if str(links) not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([str(links), path])


_link_pyenv_interpreters()


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The full test suite (two xdist workers unless pytest arguments are given after ``--``)."""
    session.env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if session.python == TORCH_PYTHON:
        # the CPU build first, so that nothing later resolves torch to a CUDA build; optional, as in .ci/run
        session.run("python", "-m", "pip", "install", "--quiet", TORCH, success_codes=[0, 1])
    session.install(".[test]", "pytest-xdist")
    args = session.posargs or ["-q", "-n", "2", "-m", "slow or not slow"]
    session.run("python", "-m", "pytest", *args)


def _dependencies() -> list[str]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - nox itself runs on 3.11 here
        import tomli as tomllib
    with open(HERE / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


@nox.session(python="3.13")
def py313(session: nox.Session) -> None:
    """Python 3.13 is refused by name, and GPflow's numpy pin still cannot resolve there.

    pip must refuse the package itself with "requires a different Python", and resolving its
    dependencies alone must end in a conflict that names numpy and GPflow (GPflow 2.11 pins numpy<2;
    TensorFlow's ml-dtypes needs numpy>=2.1 on 3.13). The day that resolves, this session fails and
    says to update requires-python and the support table.
    """
    pip = ["python", "-m", "pip", "install", "--dry-run"]
    refusal = session.run(*pip, "--no-deps", ".", silent=True, success_codes=[0, 1]) or ""
    if "requires a different Python" not in refusal:
        session.error(f"pip did not refuse natgrad-diag on Python 3.13 by its version:\n{refusal}")
    session.log("natgrad-diag on 3.13: " + next(ln for ln in refusal.splitlines() if "different Python" in ln))

    # Wheels only: numpy 1.26 has no 3.13 wheel, and pip would otherwise compile its sdist for many minutes
    # just to read its metadata (the build fails on 3.13 anyway).
    out = session.run(*pip, "--only-binary=:all:", *_dependencies(), silent=True, success_codes=[0, 1]) or ""
    if "ResolutionImpossible" not in out:
        if re.search(r"^Would install ", out, flags=re.M):
            session.error(RESOLVES_ON_313)
        session.error(f"pip failed on 3.13 for another reason than the numpy conflict:\n{out}")
    causes = [ln.strip() for ln in out.splitlines() if "depends on numpy" in ln]
    if not any(c.startswith("gpflow") and "numpy<2" in c for c in causes):
        session.error(f"the 3.13 conflict no longer names GPflow's numpy<2 pin; read it and update the docs:\n{out}")
    shown = [c for c in causes if c.startswith("gpflow") or "3.13" in c]
    session.log("dependencies on 3.13: ResolutionImpossible, as documented: " + "; ".join(shown))


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check on the package, tests, scripts and this file."""
    session.install(RUFF)
    session.run("ruff", "check", *(session.posargs or ["."]))


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy, configured in pyproject.toml: strict on the public modules, lenient elsewhere.

    TensorFlow, GPflow and the other heavy dependencies are not installed: their imports are typed as
    ``Any`` (ignore_missing_imports), so the check is fast and does not depend on their stubs.
    """
    session.install(MYPY, "numpy>=1.26,<2", "rich>=13.7", "pytest>=8")
    session.run("mypy", *(session.posargs or []))


@nox.session(python="3.11")
def build(session: nox.Session) -> None:
    """sdist and wheel, ``twine check``, then the wheel in a fresh venv runs ``natgrad-diag --json`` elsewhere."""
    session.install("build", "twine")
    tmp = Path(session.create_tmp()).resolve()
    dist = tmp / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist), str(HERE))
    artifacts = sorted(str(p) for p in dist.iterdir())
    session.run("twine", "check", "--strict", *artifacts)
    wheel = next(p for p in artifacts if p.endswith(".whl"))

    venv = tmp / "wheel-venv"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("python", "-m", "venv", str(venv))
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    session.run(str(bindir / "python"), "-m", "pip", "install", "--quiet", wheel, external=True)
    outside = Path(tempfile.mkdtemp(prefix="natgrad-diag-wheel-"))  # not under the checkout
    session.chdir(outside)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("PYTHONPATH", None)
    cmd = [str(bindir / "natgrad-diag"), "--json"]
    session.log(f"cd {outside} && {' '.join(cmd)}")
    # stdout alone: TensorFlow may log to stderr, which is not part of the JSON
    run = subprocess.run(cmd, cwd=outside, env=env, capture_output=True, text=True, timeout=1200)
    if run.returncode != 0:
        session.error(f"natgrad-diag --json from the wheel exited {run.returncode}:\n{run.stderr[-3000:]}")
    try:
        result = json.loads(run.stdout)
    except json.JSONDecodeError as e:
        session.error(f"natgrad-diag --json printed no valid JSON ({e}):\n{run.stdout[:2000]}")
    keys = sorted(result)[:8] if isinstance(result, dict) else type(result).__name__
    session.log(f"natgrad-diag --json from the wheel: {len(run.stdout)} characters of JSON, keys {keys}")
    origin = subprocess.run([str(bindir / "python"), "-c", "import natgrad_diag; print(natgrad_diag.__file__)"],
                            cwd=outside, env=env, capture_output=True, text=True, check=True).stdout
    if not Path(origin.strip()).resolve().is_relative_to(venv.resolve()):
        session.error(f"the wheel test did not import the installed wheel: {origin}")
    session.log(f"imported from {origin.strip()}")
    session.chdir(HERE)
    shutil.rmtree(outside, ignore_errors=True)
