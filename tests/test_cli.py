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
from natgrad_diag.cli.app import main


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
