"""Run a Python script under ``strict_gradients(action="warn")`` and report every call that broke a rule."""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import TextIO

from natgrad_diag._tf import import_tensorflow_quietly
from natgrad_diag.strict.context import StrictGradients
from natgrad_diag.strict.rules import StrictGradientsWarning, Violation

__all__ = ["EXIT_OK", "EXIT_USAGE", "EXIT_VIOLATIONS", "format_violations", "run_command"]

EXIT_OK, EXIT_VIOLATIONS, EXIT_USAGE = 0, 1, 2

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?(\.exe)?$")


def run_command(command: Sequence[str], *, prog: str = "python -m natgrad_diag.strict", stream: TextIO | None = None) -> int:
    """Run ``[python] [--] SCRIPT ARGS`` (or ``-m MODULE``) in this process under the rules; return the exit code.

    The script runs as ``python SCRIPT`` would (``__main__``, ``sys.argv``, its folder first on ``sys.path``).
    Violations are collected, not raised, and reported on ``stream`` (stderr), one block per call site. The exit
    code is the script's own when it fails (1 for an uncaught exception), else 1 if a call broke a rule, else 0;
    2 for bad usage (no script, a missing file).
    """
    out = sys.stderr if stream is None else stream
    if isinstance(parsed := _parse(list(command)), str):
        usage = f"usage: {prog} [--] [python] SCRIPT [ARGS ...]   or   {prog} [--] [python] -m MODULE [ARGS ...]"
        print(f"{prog}: {parsed}\n{usage}", file=out)
        return EXIT_USAGE
    kind, name, args = parsed
    if kind == "path" and not os.path.isfile(name):
        print(f"{prog}: no such script: {name}", file=out)
        return EXIT_USAGE
    if kind == "module" and not _module_exists(name):
        print(f"{prog}: no module named {name!r} (run from the folder that holds it, or install it)", file=out)
        return EXIT_USAGE
    import_tensorflow_quietly()  # TensorFlow's start-up lines stay off stderr unless TF_CPP_MIN_LOG_LEVEL=0
    strict = StrictGradients("warn")
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [name, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(name)) if kind == "path" else os.getcwd())
    code = EXIT_OK
    try:
        with warnings.catch_warnings(), strict:
            warnings.simplefilter("ignore", StrictGradientsWarning)  # reported once, below
            if kind == "path":
                runpy.run_path(name, run_name="__main__")
            else:
                runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or EXIT_OK
        else:
            print(e.code, file=out)  # sys.exit("message"), as Python prints it
            code = 1
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001  # the script failed: show it as Python would, then still report
        traceback.print_exc(file=out)
        code = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    print(format_violations(strict.violations, checked_calls=strict.checked_calls, prog=prog), file=out)
    return code or (EXIT_VIOLATIONS if strict.violations else EXIT_OK)


def _parse(command: list[str]) -> tuple[str, str, list[str]] | str:
    """("path", script, args) or ("module", name, args), or the usage error."""
    if command[:1] == ["--"]:
        command = command[1:]
    if command and (_PYTHON.match(os.path.basename(command[0])) or command[0] == sys.executable):
        command = command[1:]
    if not command:
        return "no script given."
    if command[0] == "-m":
        return "-m needs a module name." if len(command) < 2 else ("module", command[1], command[2:])
    if command[0].startswith("-"):
        return f"unsupported option {command[0]!r}: only a script or -m MODULE can be run."
    return "path", command[0], command[1:]


def _module_exists(name: str) -> bool:
    """True when ``python -m name`` would find the module (from the current folder too, as ``-m`` does)."""
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package, or an empty or relative name
        return False
    finally:
        sys.path.remove(os.getcwd())


def format_violations(violations: Sequence[Violation], *, checked_calls: int, prog: str) -> str:
    """The report: one block per call site (file:line, how many calls, the message), or one line if none."""
    if not violations:
        return f"{prog}: no tape.gradient call broke PyTorch's seed rules ({checked_calls} call(s) checked)."
    sites: dict[tuple[str, int, str], list[Violation]] = {}
    for v in violations:
        sites.setdefault((v.site.filename, v.site.lineno, str(v.error)), []).append(v)
    lines = [f"{prog}: {len(violations)} tape.gradient call(s) broke PyTorch's seed rules, at {len(sites)} place(s) "
             f"({checked_calls} call(s) checked):"]
    for (filename, lineno, message), found in sites.items():
        times = f" ({len(found)} calls)" if len(found) > 1 else ""
        lines.extend(["", f"{filename}:{lineno}: {found[0].rule}{times}", message])
    return "\n".join(lines)
