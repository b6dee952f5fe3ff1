"""The natgrad-diag command: the lesson, JSON that agrees with the API, exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import natgrad_diag as nd
from natgrad_diag.cli.app import COMMANDS, main


def test_cli__no_arguments_prints_the_lesson_and_exits_0(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "Why dL/deta1" in out and "mean path" in out and "Jᵀ·1" in out


def test_cli__explain_json_agrees_with_the_api(capsys):
    assert main(["explain", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    t = nd.natgrad_trace(*nd.seed_scenario())
    for key in ("dL_deta1", "dL_deta2", "dtheta_deta1", "dtheta_deta2"):
        np.testing.assert_allclose(np.array(d[key]), getattr(t, key), rtol=0, atol=1e-15, err_msg=key)
    np.testing.assert_allclose(np.array(d["naive_product"]), t.dtheta_deta1 * t.dL_dmean, atol=1e-15)
    assert all(c["passed"] for c in d["checks"]) and d["passed"] is True
    assert all(isinstance(c["max_abs_error"], float) for c in d["checks"])


def test_cli__an_option_before_the_command_is_the_commands(capsys):
    # `natgrad-diag --json outer` was read as `explain --json outer`: "explain: unrecognized arguments: outer"
    assert main(["--json", "outer"]) == 0
    assert json.loads(capsys.readouterr().out)["gradient_ones_seed"] == [20.0, 20.0, 20.0, 20.0]  # 2·Σx, x = 1..4
    assert main(["--gamma", "0.5", "--json"]) == 0 and json.loads(capsys.readouterr().out)["gamma"] == 0.5  # explain's


def test_cli__explain_meanvar_gamma(capsys):
    assert main(["explain", "--xi", "meanvar", "--gamma", "0.5", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["xi_transform"] == "XiSqrtMeanVar" and d["gamma"] == 0.5


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "--gamma", "-1"],
        ["explain", "--xi", "other"],
        ["nonsense"],
        ["outer", "--x", "a,b"],
        ["outer", "--x", "1,,2"],
        ["outer", "--x", "1,2,"],
        ["check", "--seed", "-1"],
        ["gradcheck", "--seed", "x"],
        ["gradcheck", "--rtol", "abc"],
        ["gradcheck", "--rtol", "-1"],
        ["gradcheck", "--atol", "nan"],
        ["bench", "--sizes", "10,,20"],
    ],
)
def test_cli__bad_usage_exits_2(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "error: argument" in err or "invalid choice" in err
    assert err.count("\nnatgrad-diag ") + err.startswith("natgrad-diag ") == 1  # one error line after the usage
    assert out == ""


@pytest.mark.parametrize("argv", [["outer", "--x", "1,,2", "--json"], ["check", "--seed", "-1", "--json"], ["outer", "--x", "1,nan", "--json"]])
def test_cli__bad_input_under_json_prints_one_json_error(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert set(d) == {"error", "command", "exit_code"} and d["exit_code"] == 2 and d["command"] == argv[0]
    assert d["error"] and d["error"].splitlines()[0] in err


def test_cli__every_option_has_help_and_shows_its_default(capsys):
    import argparse

    from natgrad_diag.cli.app import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert tuple(subparsers.choices) == COMMANDS  # main() moves options after the first of these names
    missing = [
        f"{name} {'/'.join(action.option_strings)}"
        for name, sub in subparsers.choices.items()
        for action in sub._actions
        if action.option_strings and not action.help
    ]
    assert missing == []
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = capsys.readouterr().out
    assert "inducing points M (default: 10)" in text and "(default: None)" not in text and "(default: False)" not in text


_TF_LOG = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|oneDNN|cuInit|cuda drivers|cpu_feature_guard|rebuild TensorFlow")


def _tensorflow_log_lines(stderr: str) -> list[str]:
    """Lines of TensorFlow's C++ start-up logging (absl's ``I0000 00:00:...`` format and its notes)."""
    return [line for line in stderr.splitlines() if _TF_LOG.search(line)]


def _env_without_tf_level() -> dict[str, str]:
    """The environment as a user has it: no TF_CPP_MIN_LOG_LEVEL, so the package's own quieting is tested."""
    return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def test_tensorflow_log_detector__finds_the_start_up_lines():
    sample = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1796056431.950319   21403 port.cc:153] oneDNN custom operations are on.\n"
        "natgrad-diag: report written to r.html\n"
    )
    assert len(_tensorflow_log_lines(sample)) == 2


@pytest.mark.slow
def test_cli__installed_entry_point_runs_end_to_end_quietly():
    env = _env_without_tf_level()
    r = subprocess.run([sys.executable, "-m", "natgrad_diag", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["passed"] is True
    assert _tensorflow_log_lines(r.stderr) == []


def test_cli__help_does_not_import_tensorflow():
    code = "import sys; from natgrad_diag.cli.app import build_parser; build_parser(); import natgrad_diag; print('tensorflow' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_cli__gradcheck_structure_general_fails_on_eta2_and_auto_passes(capsys):
    """The symmetric false mismatch through the CLI: exit 1 with general, 0 with the inferred structure."""
    assert main(["gradcheck", "--num-inducing", "3", "--num-latent", "1", "--structure", "general", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in d["checks"] if not c["passed"]] == ["dvarsqrt/deta2"]
    assert main(["gradcheck", "--num-inducing", "3", "--num-latent", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True


@pytest.mark.slow
def test_reproduce_seed_script__runs_the_users_snippet_and_explains_it():
    import pathlib

    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "reproduce_seed.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=_env_without_tf_level(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert _tensorflow_log_lines(r.stderr) == []
    assert "dtheta_deta1 * q_mu_grad" in r.stdout and "<- not equal" in r.stdout
    assert "-0.6255" in r.stdout and "Verdict: all checks hold." in r.stdout


def _command(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``python -m natgrad_diag ARGS`` as a user runs it: this worktree first on the path, no COLUMNS."""
    env = {k: v for k, v in (env or _env_without_tf_level()).items() if k != "COLUMNS"}
    env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "natgrad_diag", *args], capture_output=True, text=True, env=env,
                          timeout=300, **kwargs)  # fmt: skip


_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", ["", "explain", "outer", "check", "gradcheck", "bench", "strict"])
def test_cli__every_help_fits_80_columns(command):
    r = _command(*([command] if command else []), "--help")
    assert r.returncode == 0, r.stderr
    widest = max(r.stdout.splitlines(), key=len)
    assert len(widest) <= 80, widest


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["outer", "--x", "1,nan"], r"Argument: +x\n"),
        (["check", "--num-inducing", "100000"], r"Argument: +num_inducing\n"),
        (["check", "--model", "vgp", "--num-data", "5000"], r"Argument: +--num-data\n"),
        (["check", "--model", "vgp", "--no-whiten"], r"a VGP has no inducing points and no whitening(.|\n)*Argument: +--whiten\n"),
        (["check", "--num-latent", "100000"], r"Argument: +--num-latent\n"),
        (["gradcheck", "--num-inducing", "100000", "--mode", "fast"], r"Argument: +--num-inducing\n"),
        (["gradcheck", "--num-inducing", "3000"], "pass --mode fast"),
        (["bench", "--sizes", "100000"], r"Argument: +sizes\n"),
        (["outer", "--report", "README.md/x.html"], r"Argument: +--report\n"),
    ],
)
def test_cli__bad_input_is_refused_before_tensorflow_loads(argv, named):
    """Exit 2 with the message naming the argument, in under 3 s (TensorFlow alone takes 5-10 s to load); TensorFlow's
    absence is asserted directly from PYTHONPROFILEIMPORTTIME's list of every module imported."""
    import time

    start = time.perf_counter()
    r = _command(*argv, env={**_env_without_tf_level(), "PYTHONPROFILEIMPORTTIME": "1"}, cwd=_ROOT)
    seconds = time.perf_counter() - start
    assert r.returncode == 2, r.stderr[-2000:]
    assert re.search(named, r.stderr) and "Traceback" not in r.stderr
    assert not re.search(r"\| +tensorflow$", r.stderr, re.M), "TensorFlow was imported before the arguments were checked"
    assert seconds < 3, seconds


def test_cli__a_vgp_refuses_the_svgp_options_in_python_and_on_the_command_line():
    from natgrad_diag.cli.app import _preflight, build_parser
    from natgrad_diag.cli.check import check_natgrad_cli

    both = build_parser().parse_args(["check", "--model", "vgp", "--num-inducing", "4", "--whiten"])
    with pytest.raises(nd.InputError, match=r"Argument: --num-inducing, --whiten\n +Expected: neither with --model vgp\n +Got: +--num-inducing 4, --whiten True\n"):
        _preflight(both)
    _preflight(build_parser().parse_args(["check", "--model", "vgp", "--num-data", "7"]))  # the VGP's own options pass
    with pytest.raises(nd.InputError, match=r"Argument: num_inducing\n +Expected: neither with model=vgp\n +Got: +num_inducing=4\n"):
        check_natgrad_cli(model="vgp", num_inducing=4)



def test_cli__closed_stdout_is_one_line_and_exit_2():
    code = "import os, runpy, sys; os.close(1); sys.stdout = None; sys.argv = ['natgrad-diag', 'outer']; runpy.run_module('natgrad_diag', run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(_ROOT)})
    assert r.returncode == 2 and r.stderr == "natgrad-diag outer: standard output is closed; redirect it to a file or /dev/null instead.\n"


def test_cli__a_reader_that_left_ends_the_command_with_exit_1(monkeypatch):
    """``natgrad-diag outer | true``: writing the report fails with EPIPE; exit 1, not a traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", encoding="utf-8") as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        assert main(["outer", "--plain"]) == 1


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be made")
@pytest.mark.parametrize(
    "path, first_line",
    [
        ("/proc/self/r.html", "Invalid input. the report cannot be written in /proc/self."),  # exists, holds no file
        ("/proc/x/r.html", "Invalid input. the report's folder cannot be created under /proc."),  # missing, cannot be made
    ],
    ids=["existing_folder", "missing_folder"],
)
def test_cli__report_folder_that_cannot_hold_it_is_refused_before_the_run(path, first_line, monkeypatch, capsys):
    """Exit 2 with nothing run, as for any bad argument: the message names --report, the path and the OS's reason."""
    monkeypatch.setattr("natgrad_diag.cli.app._run", lambda args: pytest.fail("the command must not run"))
    assert main(["outer", "--plain", "--report", path]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"natgrad-diag outer: {first_line}\n"), err
    assert re.search(r"Argument: +--report\n", err) and "\n  To fix: " in err
    assert re.search(rf"Got: +{re.escape(repr(path))}; making a file in /proc[^:]*: \w+Error: \w", err), err


def test_cli__report_path_that_is_a_folder_is_refused_before_the_run(tmp_path, monkeypatch, capsys):
    """A Markdown report's pictures would be written beside it before the folder in the way made the write fail."""
    monkeypatch.setattr("natgrad_diag.cli.app._run", lambda args: pytest.fail("the command must not run"))
    (tmp_path / "out.md").mkdir()
    assert main(["outer", "--plain", "--report", str(tmp_path / "out.md")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("natgrad-diag outer: Invalid input. the --report path is a folder.\n"), err
    assert "To fix: name the report file" in err and [p.name for p in tmp_path.iterdir()] == ["out.md"]


def test_cli__report_folder_lost_during_the_run_gives_the_write_error_block_and_exit_1(tmp_path, monkeypatch, capsys):
    """The folder passes the check up front, then a file takes its place while the command runs: the result, then
    docs/reports.md's "Could not write the report. ... Path: ... To fix:" block, and exit 1."""
    from natgrad_diag.cli import app

    run = app._run
    monkeypatch.setattr(app, "_run", lambda args: ((tmp_path / "out").write_text("x", encoding="utf-8"), run(args))[1])
    path = tmp_path / "out" / "r.html"
    assert main(["outer", "--plain", "--report", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "Verdict: all checks hold." in out
    assert err.startswith("natgrad-diag: Could not write the report.") and f"Path:     {path}\n" in err, err
    assert re.search(r"Argument: +--report\n", err) and "To fix: " in err


@pytest.mark.parametrize("module", ["no_such_mod", "no_such.mod"])
def test_cli__strict_missing_module_is_one_line(module):
    r = _command("strict", "--", "python", "-m", module)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"natgrad-diag strict: no module named {module!r} (run from the folder that holds it, or install it)\n"


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_cli__help_spells_symbols_where_the_stream_cannot_encode_them(encoding):
    r = _command("gradcheck", "--help", env={**_env_without_tf_level(), "PYTHONIOENCODING": encoding})
    assert r.returncode == 0, r.stderr
    assert "(default: from the dtype, cbrt epsilon)" in r.stdout and "∛" not in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize("argv", [["outer"], ["explain"], ["check", "--plain"]])
def test_cli__reports_spell_symbols_where_the_stream_cannot_encode_them(encoding, argv):
    r = _command(*argv, env={**_env_without_tf_level(), "PYTHONIOENCODING": encoding}, encoding=encoding)  # or fails here
    assert (r.returncode, r.stderr) == (0, "")
    assert "Verdict: all checks hold." in r.stdout
    assert {"outer": "Sigma_jk", "explain": "!=", "check": "gamma"}[argv[0]] in r.stdout


@pytest.mark.slow
# the check at 8 s looks 1000 steps ahead, so that it is still working on a loaded machine (a process already in
# interpreter shutdown dies of the signal, as every Python program does)
@pytest.mark.parametrize(("argv", "after"), [(["check", "--num-inducing", "30"], 0.5), (["check", "--num-inducing", "30", "--gamma-steps", "1000"], 8.0),
                                             (["gradcheck", "--num-inducing", "40"], 6.0)])
def test_cli__ctrl_c_is_one_line_and_exit_130(argv, after):
    """SIGINT while TensorFlow loads (0.5 s) and while the checks run: one line on stderr, exit 130, nothing else."""
    import signal
    import time

    env = {**_env_without_tf_level(), "PYTHONPATH": str(_ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "natgrad_diag", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    time.sleep(after)
    assert p.poll() is None, "the command ended before the signal"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (130, f"natgrad-diag {argv[0]}: interrupted (Ctrl-C)\n"), err[-3000:]


_SWALLOW = "try:\n        os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n    except KeyboardInterrupt:\n        pass"
_INTERRUPTED_COMMANDS = {  # case: (command, its body, exit code, stderr)
    # Ctrl-C inside an exec() of a string, as when it lands while dataclasses or namedtuple build methods during
    # TensorFlow's import: CPython then exits by SIGINT (returncode -2) under `python -m` unless the mark is cleared
    "inside_exec": ("outer", "exec('raise KeyboardInterrupt')", 130, "natgrad-diag outer: interrupted (Ctrl-C)\n"),
    # a library that catches KeyboardInterrupt and goes on: the command finishes, yet the user asked it to stop
    "swallowed": ("outer", _SWALLOW, 130, "natgrad-diag outer: interrupted (Ctrl-C)\n"),
    # under `strict` the user's script owns Ctrl-C: one that handles it ends with its own code, as under python
    "strict_script_handles_it": ("strict", _SWALLOW, 0, ""),
}


@pytest.mark.parametrize("case", sorted(_INTERRUPTED_COMMANDS))
def test_cli__ctrl_c_where_python_or_a_library_would_lose_it_still_exits_130(tmp_path, case):
    """The two ways the SIGINT test above failed one run in thirty, made certain: exit 130 and the one line; and a
    script run by ``strict`` that handles Ctrl-C itself keeps its exit code."""
    command, body, code, stderr = _INTERRUPTED_COMMANDS[case]
    (tmp_path / "ctrl_c_run.py").write_text(
        "import os, signal, sys, time\nimport natgrad_diag.cli.app as app\n\n\ndef command(argv, name):\n"
        f"    {body}\n    return 0\n\n\napp._command = command\n"
        f"sys.argv = ['natgrad-diag', {command!r}]\nraise SystemExit(app.main())\n", encoding="utf-8")  # fmt: skip
    import signal

    # Python installs its Ctrl-C handler only where SIGINT is not ignored, and xdist's workers ignore it
    r = subprocess.run([sys.executable, "-m", "ctrl_c_run"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(_ROOT)}, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert (r.returncode, r.stdout, r.stderr) == (code, "", stderr)


@pytest.mark.slow
def test_cli__report_into_a_missing_folder_creates_it(tmp_path):
    r = _command("outer", "--plain", "--report", "out/deeper/x.html", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "deeper" / "x.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert r.stderr == "natgrad-diag: report written to out/deeper/x.html\n"


@pytest.mark.slow
def test_cli__strict_is_quiet_and_checks_the_script(tmp_path):
    script = tmp_path / "seed.py"
    script.write_text("import tensorflow as tf\nx = tf.Variable([1.0, 2.0])\nwith tf.GradientTape() as t:\n    y = x * x\n"
                      "print(t.gradient(y, x).numpy())\n")  # fmt: skip
    r = _command("strict", "--", "python", str(script))
    assert r.returncode == 1 and r.stdout == "[2. 4.]\n"
    assert _tensorflow_log_lines(r.stderr) == [] and f"{script}:5: " in r.stderr, r.stderr
