"""The pytest plugin: ``--strict-gradients``, the marker and the fixture, run on a sample suite with pytester."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

# imported here so that pytester's in-process runs share these modules (and their one patch state)
import natgrad_diag.strict.context
import natgrad_diag.strict.pytest_plugin

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "natgrad_diag.strict.pytest_plugin"

SAMPLE = """\
import tensorflow as tf


def outer():
    x = tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = x[:, None] * x[None, :]
    return tape, x, y


def test_bad_call():
    tape, x, y = outer()
    assert tape.gradient(y, x).numpy().tolist() == [20.0] * 4


def test_seeded_call():
    tape, x, y = outer()
    assert tape.gradient(y, x, output_gradients=tf.ones_like(y)).numpy().tolist() == [20.0] * 4
"""
BAD_LINE = 14  # the line of tape.gradient(y, x) in test_bad_call


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # the plugin is imported above, so pytest cannot assertion-rewrite it: that warning is expected here
    return pytester.runpytest("-p", PLUGIN, "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


def test_plugin__strict_gradients_option_fails_the_bad_call_at_the_users_line(pytester):
    pytester.makepyfile(test_sample=SAMPLE)
    assert SAMPLE.splitlines()[BAD_LINE - 1].strip() == "assert tape.gradient(y, x).numpy().tolist() == [20.0] * 4"
    result = run(pytester, "--strict-gradients")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        f"test_sample.py:{BAD_LINE}: OutputGradientsError",
        "FAILED test_sample.py::test_bad_call - natgrad_diag.exceptions.*",
    ])  # fmt: skip
    assert f"At:       {pytester.path / 'test_sample.py'}:{BAD_LINE}" in out
    # the failure is shown at the user's line: no frame of the package in the traceback
    assert "natgrad_diag/strict" not in out and "natgrad_diag\\strict" not in out


def test_plugin__without_the_option_tensorflows_behaviour(pytester):
    pytester.makepyfile(test_sample=SAMPLE)
    run(pytester).assert_outcomes(passed=2)


def test_plugin__marker_and_fixture_apply_the_rules_to_one_test(pytester):
    pytester.makepyfile(test_sample=SAMPLE + '''

import pytest


@pytest.mark.strict_gradients
def test_marked():
    test_bad_call()


@pytest.mark.strict_gradients(allow_implicit_sum=True)
def test_marked_allowing_the_sum():
    test_bad_call()


@pytest.mark.strict_gradients(action="warn")
def test_marked_warn():
    with pytest.warns(UserWarning, match="grad can be implicitly created only for scalar outputs"):
        test_bad_call()


def test_fixture(strict_gradients):
    try:
        test_bad_call()
    finally:
        assert [v.rule for v in strict_gradients.violations] == ["implicit_sum"]
''')
    result = run(pytester, "--strict-markers", "-rf")
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines_random([
        "FAILED test_sample.py::test_marked - natgrad_diag.exceptions.*",
        "FAILED test_sample.py::test_fixture - natgrad_diag.exceptions.*",
    ])  # fmt: skip
    # with the option the marker's arguments still win: the sum allowed, the warning a warning
    result = run(pytester, "--strict-gradients", "-rf")
    result.assert_outcomes(passed=3, failed=3)


def test_plugin__help_lists_the_option(pytester):
    result = run(pytester, "--help")
    result.stdout.fnmatch_lines(["*--strict-gradients*"])


def test_plugin__pyproject_declares_the_pytest11_entry_point():
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python 3.11+; the package supports 3.10)
    section = re.search(r"^\[project\.entry-points\.pytest11\]\n((?:[^\[\n].*\n|#.*\n)*)", text, flags=re.MULTILINE)
    assert section is not None, "pyproject.toml has no [project.entry-points.pytest11] table"
    entries = [line for line in section.group(1).splitlines() if line.strip() and not line.startswith("#")]
    # named after its module: `-p natgrad_diag.strict.pytest_plugin` and the entry point load it once
    assert entries == [f'"{PLUGIN}" = "{PLUGIN}"']
    module = importlib.import_module(PLUGIN)
    assert module is natgrad_diag.strict.pytest_plugin
    assert callable(module.pytest_addoption) and callable(module.pytest_configure)


def test_plugin__marker_with_an_unknown_argument_is_a_clear_error(pytester):
    pytester.makepyfile(test_sample='''
import pytest


@pytest.mark.strict_gradients(bogus=1)
def test_marked():
    pass
''')
    result = run(pytester)
    assert result.parseoutcomes()["errors"] >= 1  # set-up (and tear-down) refuse the marker
    out = result.stdout.str()
    assert "InputError: Invalid input. @pytest.mark.strict_gradients got arguments it does not take" in out
    assert "Argument: @pytest.mark.strict_gradients" in out and "E   TypeError" not in out


def test_plugin__the_fixture_lists_violations_also_under_the_option_and_the_marker(pytester):
    """The plugin enters its own (inner) context around the call: the fixture's .violations must still list what
    broke a rule, else `assert strict_gradients.violations == []` passes although a violation happened."""
    pytester.makepyfile(test_sample=SAMPLE.split("def test_bad_call")[0] + '''
def swallowed():
    tape, x, y = outer()
    try:
        tape.gradient(y, x)
    except Exception:
        pass


def test_fixture(strict_gradients):
    swallowed()
    assert [v.rule for v in strict_gradients.violations] == ["implicit_sum"]


@pytest.mark.strict_gradients(action="warn")
def test_fixture_and_marker(strict_gradients):
    swallowed()
    assert [v.rule for v in strict_gradients.violations] == ["implicit_sum"]
'''.replace("def swallowed", "import pytest\n\n\ndef swallowed"))
    run(pytester).assert_outcomes(passed=2, warnings=1)
    run(pytester, "--strict-gradients").assert_outcomes(passed=2, warnings=1)
