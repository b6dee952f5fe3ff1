"""close_check and max_abs_diff: the one comparison every report's checks are built on; loss_rose, the one way a
check or the guard says how much the loss rose."""

from __future__ import annotations

import re

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from natgrad_diag.report.records import close_check, loss_rose, max_abs_diff


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


@given(st.floats(-1e7, 1e7), st.floats(1e-10, 10.0))
@example(820.9344019, 0.0219 / 820.9563)  # a trained MultiClass SVGP's γ = 1 step: 4 digits said "820.9 to 821"
@example(1.23456e5, 1e-5)  # scientific notation prints one significant digit less
def test_loss_rose__the_printed_numbers_show_the_rise_to_within_a_tenth(before, relative):
    # Oracle: the numbers parsed back from the text. With d ≥ log10(scale/rise) + 2 significant digits each printed
    # number is within half a unit of its d-th digit, 0.5·10^(1-d)·scale ≤ rise/20, so the printed difference is
    # within rise/10 of the true one (and positive): the reader sees the rise, not "from 820.9 to 821".
    after = before + relative * max(abs(before), 1.0)
    if after <= before:  # the rise is below before's resolution
        return
    text = loss_rose(before, after)
    shown = [float(x) for x in re.fullmatch(r"the loss rose from (\S+) to (\S+)", text).groups()]
    rise = after - before
    assert abs((shown[1] - shown[0]) - rise) <= rise / 10 + 4 * np.spacing(max(abs(before), abs(after))), text
