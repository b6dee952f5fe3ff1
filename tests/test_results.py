"""close_check and max_abs_diff: the one comparison every report's checks are built on."""

from __future__ import annotations

import numpy as np

from natgrad_diag.report.records import close_check, max_abs_diff


def test_close_check__bound_is_atol_plus_rtol_times_largest_want():
    c = close_check("c", "claim", [1.0, 2.0 + 3e-6], [1.0, 2.0], rtol=1e-6, atol=1e-7)
    assert c.max_abs_error == np.float64(2.0 + 3e-6) - 2.0
    assert c.tolerance == 1e-7 + 1e-6 * 2.0
    assert not c.passed  # 3e-6 > 2.1e-6
    assert close_check("c", "claim", [1.0, 2.0 + 1e-6], [1.0, 2.0], rtol=1e-6, atol=1e-7).passed


def test_close_check__pairs_share_one_bound_scaled_by_the_largest_want():
    got = (np.array([0.0]), np.array([100.0 + 5e-5]))
    want = (np.array([1e-9]), np.array([100.0]))
    c = close_check("c", "claim", got, want, rtol=1e-6, atol=0.0)
    assert c.tolerance == 1e-6 * 100.0 and c.passed
    assert max_abs_diff(got, want) == c.max_abs_error


def test_close_check__different_shapes_or_counts_fail_instead_of_broadcasting():
    c = close_check("c", "claim", np.ones((4, 1)), np.ones(4), rtol=1.0, atol=1.0)
    assert not c.passed and c.detail == "shapes differ: [4, 1] vs [4]"
    c = close_check("c", "claim", [np.ones(2)], [np.ones(2), np.ones(2)], rtol=1.0, atol=1.0)
    assert not c.passed and c.detail == "1 array(s) against 2"
