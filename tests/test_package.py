"""The package itself: a sorted, working __all__, lazy heavy imports, one exception hierarchy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import natgrad_diag as nd
from natgrad_diag import exceptions

ROOT = Path(__file__).resolve().parents[1]


def test_package__all_is_sorted_and_every_name_resolves():
    assert nd.__all__ == sorted(nd.__all__)
    for name in nd.__all__:
        assert getattr(nd, name) is not None, name
    assert callable(nd.jacobian) and nd.jacobian.__name__ == "jacobian"  # the function, not the module


def test_package__import_loads_no_heavy_dependency():
    public = ", ".join(f"natgrad_diag.{m}" for m in nd._SUBMODULES)
    code = (
        f"import sys, natgrad_diag, natgrad_diag.report.records, natgrad_diag.exceptions, natgrad_diag.cli, {public}; "
        "print(sorted(m for m in ('tensorflow', 'gpflow', 'matplotlib', 'torch') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr


def test_package__public_submodules_are_attributes_with_a_sorted_all():
    assert set(nd._SUBMODULES) == {"demo", "keras", "pictures", "strict", "testing", "torch_bridge"}
    for name in nd._SUBMODULES:
        module = getattr(nd, name)
        assert module.__name__ == f"natgrad_diag.{name}" and name in dir(nd)
        assert module.__all__ == sorted(module.__all__), name
        for public in module.__all__:
            assert getattr(module, public) is not None, f"natgrad_diag.{name}.{public}"


@pytest.mark.parametrize("package", sorted(p.parent.name for p in (ROOT / "natgrad_diag").glob("*/__init__.py")))
def test_package__an_internal_package_says_so(package):
    doc = ast.get_docstring(ast.parse((ROOT / "natgrad_diag" / package / "__init__.py").read_text(encoding="utf-8"))) or ""
    if package in nd._SUBMODULES:
        assert "internal" in doc and "Public" in doc, f"natgrad_diag/{package}: say what is public and what is internal"
    else:
        assert "Internal" in doc, f"natgrad_diag/{package}/__init__.py does not say that the package is internal"


def test_package__version_is_what_the_build_reads():
    import importlib.metadata

    assert nd.__version__ == importlib.metadata.version("natgrad-diag")


@pytest.mark.parametrize("name", [n for n in exceptions.__all__ if isinstance(getattr(exceptions, n), type)])
def test_exceptions__every_error_derives_from_the_base_and_states_its_message(name):
    cls = getattr(exceptions, name)
    assert issubclass(cls, exceptions.NatGradDiagError)
    assert cls.error_message.endswith(".") and cls.error_message[0].isupper()


def test_exceptions__message_is_aligned_context_and_a_remedy():
    e = exceptions.ShapeMismatchError(
        "detail.", context=[("Argument", "a"), ("Expected", "[2, 3]"), ("Actual", "[3]")], remedy="reshape a."
    )
    assert str(e) == (
        "Shape mismatch. detail.\n"
        "  Argument: a\n"
        "    Expected: [2, 3]\n"
        "    Actual:   [3]\n"
        "  To fix: reshape a."
    )
    assert isinstance(e, ValueError)
    assert isinstance(exceptions.OutputGradientsError(), ValueError)
    assert isinstance(exceptions.JacobianMismatchError(), AssertionError)
    assert isinstance(exceptions.MemoryLimitError(), MemoryError)


def test_error_line__drops_tensorflows_graph_noise_and_prefers_the_numerical_failure():
    e = RuntimeError(
        "Graph execution error:\n\nDetected at node Cholesky defined at (most recent call last):\n"
        '  File "x.py", line 3\n{{function_node __wrapped__Cholesky}} Cholesky decomposition was not '
        "successful. The input might not be valid. [Op:Cholesky] name: "
    )
    assert exceptions.error_line(e) == "Cholesky decomposition was not successful. The input might not be valid."
    assert exceptions.error_line(ValueError("boom\nsecond line"), with_type=True) == "ValueError: boom"
    assert exceptions.error_line(ValueError(""), with_type=True) == "ValueError"
    assert exceptions.error_line(ValueError("x" * 300), limit=10) == "x" * 10


def test_error_line__on_a_real_tensorflow_error():
    import tensorflow as tf

    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        tf.reshape(tf.constant([1.0]), [4])
    line = exceptions.error_line(info.value, with_type=True)
    assert line.startswith("InvalidArgumentError: Input to reshape is a tensor with 1 values")
    assert "[Op:" not in line and "{{" not in line
