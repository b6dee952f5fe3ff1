"""The pytest plugin, loaded through the package's ``pytest11`` entry point; nothing heavy is imported until a test
asks for the rules.

``pytest --strict-gradients`` runs every test (set-up, call and tear-down) under ``natgrad_diag.strict_gradients()``;
``@pytest.mark.strict_gradients`` (with ``strict_gradients()``'s arguments, e.g. ``action="warn"``) one test; the
``strict_gradients`` fixture yields the context (``.violations``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import pytest

MARKER = "strict_gradients"


def pytest_addoption(parser: Any) -> None:
    parser.getgroup("natgrad-diag").addoption(
        "--strict-gradients", action="store_true", default=False, dest="strict_gradients",
        help="run every test under natgrad_diag.strict_gradients(): tf.GradientTape.gradient refuses a "
        "non-scalar target without output_gradients and a seed of the wrong shape, as PyTorch does.",
    )  # fmt: skip


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", f"{MARKER}(action='raise', *, allow_implicit_sum=False): run this test under "
                            "natgrad_diag.strict_gradients() (PyTorch's seed rules for tf.GradientTape.gradient).")


def _context(item: Any) -> contextlib.AbstractContextManager[Any]:
    if (marker := item.get_closest_marker(MARKER)) is None and not item.config.getoption("strict_gradients"):
        return contextlib.nullcontext()
    from natgrad_diag._validate import input_error
    from natgrad_diag.strict.context import StrictGradients

    args, kwargs = ((), {}) if marker is None else (marker.args, marker.kwargs)
    try:
        inspect.signature(StrictGradients).bind(*args, **kwargs)
    except TypeError as e:
        raise input_error(f"@pytest.mark.{MARKER} got arguments it does not take ({e}).", f"@pytest.mark.{MARKER}",
                          "(action='raise' or 'warn', *, allow_implicit_sum=False)", f"args {args}, kwargs {kwargs}",
                          f"pass strict_gradients()'s arguments, e.g. @pytest.mark.{MARKER}(action='warn').") from None  # fmt: skip
    return StrictGradients(*args, **kwargs)


@pytest.hookimpl(wrapper=True)
def _under_the_rules(item: Any) -> Iterator[None]:
    with _context(item):
        return (yield)


# a test's set-up, call and tear-down, each under the rules (pytest finds hooks by these names)
pytest_runtest_setup = pytest_runtest_call = pytest_runtest_teardown = _under_the_rules


@pytest.fixture(name=MARKER)
def strict_gradients_fixture() -> Iterator[Any]:
    """This test under ``natgrad_diag.strict_gradients()``; yields the context (``.violations``)."""
    from natgrad_diag.strict.context import StrictGradients

    with StrictGradients() as strict:
        yield strict
