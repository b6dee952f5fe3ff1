"""natgrad_diag.checks.bounds: the checks' tolerances come from natgrad_diag.tolerance and did not move."""

from __future__ import annotations

import numpy as np
import pytest

from natgrad_diag.checks.api import Tolerances, natgrad_tolerances
from natgrad_diag.checks.bounds import with_overrides
from natgrad_diag.tolerance import default_tolerance


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        pytest.param(np.float64, (1e-10, 1e-10, 1e-8, 1e-10), id="float64"),
        pytest.param(np.float32, (1e-4, 1e-4, 1e-3, 1e-4), id="float32"),
    ],
)
def test_natgrad_tolerances__are_the_values_the_checks_always_used(dtype, expected):
    """The numbers before the move to the shared policy (the verdicts must not change with the layout)."""
    tol = natgrad_tolerances(dtype)
    assert (tol.rtol, tol.atol, tol.fisher_rtol, tol.conjugate_rtol) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_natgrad_tolerances__rtol_is_the_policys_exact_rtol(dtype):
    assert natgrad_tolerances(dtype).rtol == default_tolerance(dtype, "exact").rtol


def test_with_overrides__replaces_only_what_is_given():
    base = natgrad_tolerances(np.float64)
    tol = with_overrides(base, rtol=1e-3, atol=None, fisher_rtol=2, conjugate_rtol=None)
    assert tol == Tolerances(rtol=1e-3, atol=base.atol, fisher_rtol=2.0, conjugate_rtol=base.conjugate_rtol)
    assert isinstance(tol.fisher_rtol, float)
