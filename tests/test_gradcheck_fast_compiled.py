"""Fast-mode check_gradients runs compiled (traced once, reused for GPflow's maps) and falls back to eager."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import natgrad_diag as nd
from natgrad_diag._compile import trace_count
from natgrad_diag.exceptions import NonFiniteError


def _natural_point(M: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(M, M)) / np.sqrt(M)
    prec = np.linalg.inv(A @ A.T + np.eye(M))
    prec = 0.5 * (prec + prec.T)
    return [prec @ rng.normal(size=(M, 1)), (-0.5 * prec)[None]]


def test_fast_mode__gpflow_map_is_traced_once_and_reused():
    from gpflow.optimizers.natgrad import natural_to_meanvarsqrt

    x = _natural_point(6, seed=1)
    first = nd.check_gradients(natural_to_meanvarsqrt, x, mode="fast", seed=0)
    before = trace_count("gradcheck_fast")
    again = nd.check_gradients(natural_to_meanvarsqrt, _natural_point(6, seed=2), mode="fast", seed=1)
    assert trace_count("gradcheck_fast") == before  # same shapes: the compiled pieces are reused
    assert first.passed and again.passed and len(again.rows) == 4


def test_fast_mode__compiled_numbers_equal_the_eager_definition():
    """The compiled ⟨Jᵀv, u⟩ of f(x) = sin(x)·Σy against the hand-written Jᵀv, for the rows' worst directions."""

    def f(x, y):
        return tf.sin(x) * tf.reduce_sum(y), tf.exp(y)

    x0, y0 = np.linspace(0.1, 0.9, 4), np.linspace(-0.5, 0.5, 3)
    before = trace_count("gradcheck_fast")
    r = nd.check_gradients(f, [x0, y0], mode="fast", seed=5)
    assert trace_count("gradcheck_fast") > before  # the compiled path ran (a user function: traced per check)
    assert r.passed
    for row in r.rows:
        assert row.forward is not None
        np.testing.assert_allclose(row.analytical, row.numerical, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(row.forward, row.analytical, rtol=1e-12, atol=1e-14)


def test_fast_mode__a_function_with_python_control_flow_on_a_tensor_still_runs_compiled():
    """Traced without AutoGraph first; the ``if`` on a tensor makes it trace again with AutoGraph, not eagerly."""

    def f(x):
        if tf.reduce_sum(x) > 0.0:
            return x**3
        return -x

    before = trace_count("gradcheck_fast")
    r = nd.check_gradients(f, [np.linspace(0.1, 0.9, 4)], mode="fast", seed=0)
    # the plain trace that meets the `if` counts one; the eager path would count no more, AutoGraph's traces do
    assert trace_count("gradcheck_fast") - before > 1
    row = r.rows[0]
    assert r.passed and row.numerical == pytest.approx(row.analytical, rel=1e-7)


def test_fast_mode__a_function_that_cannot_be_traced_runs_eagerly():
    def f(x):  # .numpy() exists only eagerly: tracing fails, the eager path checks it
        return tf.constant(np.sin(x.numpy())) + 0.0 * x + x**2

    r = nd.check_gradients(f, [np.linspace(0.1, 0.9, 5)], mode="fast", seed=0)
    # the gradient TensorFlow sees is 2x only (np.sin is a constant to it): fast mode must fail the block
    assert not r.passed


def test_fast_mode__the_eager_runs_error_does_not_carry_the_compiled_attempt():
    """sqrt at 1e-7 is not finite a finite-difference step below: the compiled run gives up, the eager run names the
    point; its error is the user's whole traceback, without TensorFlow's compiled attempt chained before it."""

    @tf.autograph.experimental.do_not_convert
    def f(x):
        return tf.sqrt(x)

    try:
        nd.check_gradients(f, [np.array([1e-7, 1.0])], mode="fast")
    except NonFiniteError as e:
        assert e.__context__ is None or e.__suppress_context__
    else:
        raise AssertionError("a function not finite at a finite-difference point passed")
