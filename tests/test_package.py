"""The package itself: a sorted, working __all__, lazy heavy imports, one exception hierarchy."""

from __future__ import annotations

import subprocess
import sys

import pytest

import natgrad_diag as nd
from natgrad_diag import exceptions


def test_package__all_is_sorted_and_every_name_resolves():
    assert nd.__all__ == sorted(nd.__all__)
    for name in nd.__all__:
        assert getattr(nd, name) is not None, name
    assert callable(nd.jacobian) and nd.jacobian.__name__ == "jacobian"  # the function, not the module


def test_package__import_loads_no_heavy_dependency():
    code = (
        "import sys, natgrad_diag, natgrad_diag.results, natgrad_diag.exceptions, natgrad_diag.cli; "
        "print(sorted(m for m in ('tensorflow', 'gpflow', 'matplotlib', 'torch') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr


def test_package__version_is_what_the_build_reads():
    import importlib.metadata

    assert nd.__version__ == importlib.metadata.version("natgrad-diag")


@pytest.mark.parametrize("name", exceptions.__all__)
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
