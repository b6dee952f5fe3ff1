"""The input rule, as a property: random shapes, dtypes, nestings, non-finite values and wrong types thrown
at each public function give either a correct result or a NatGradDiagError whose message names an argument.

Never a raw TensorFlow, numpy or Python error, and never NaN in a result. Examples are derandomized (the
profile in conftest.py) so that a failure reproduces; max_examples is small to keep the file fast.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from natgrad_diag import NatGradDiagError

FAST = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_DTYPES = [np.float64, np.float32, np.float16, np.int32, np.int64, np.complex128, np.bool_]


def _arrays():
    return st.sampled_from(_DTYPES).flatmap(
        lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3))
    )


def _values():
    """Anything a user might pass as a tensor argument: arrays of every dtype and shape, numbers (incl. NaN, ∞),
    lists (ragged too), tensors, nests, None, strings, objects."""
    leaf = st.one_of(
        st.sampled_from([np.array([np.nan, 1.0]), np.array([[np.inf]]), np.array(-np.inf, np.float32), np.zeros((0, 2))]),
        _arrays(),
        _arrays().map(lambda a: tf.constant(a) if a.dtype != np.float16 or a.size else tf.constant(a)),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-3, 3),
        st.lists(st.floats(-2, 2), max_size=3),
        st.just([[1.0, 2.0], [3.0]]),
        st.none(),
        st.text(max_size=3),
        st.just(object()),
    )
    return st.one_of(leaf, st.lists(leaf, max_size=2), st.dictionaries(st.sampled_from(["a", "b"]), leaf, max_size=2))


def _nested(x):
    return {"z": (tf.sin(x), 2 * x), "w": [tf.reduce_sum(x)]}


_FUNCTIONS = [
    tf.sin,
    lambda x: 2 * x,
    lambda x: tf.reduce_sum(x * x),
    _nested,
    lambda x: {10: tf.sin(x), 2: x},
    lambda x: None,
    lambda x: tf.cast(x, tf.int32),
    lambda x: tf.cast(x, tf.float32),
    lambda x: 3.0,
    lambda x: tf.gather(tf.reshape(x, [-1]), [0]),
    5,
    "sin",
]


def _assert_rule(call):
    """Run ``call``: a NatGradDiagError must name an argument; any other exception fails the property."""
    try:
        return call()
    except NatGradDiagError as e:
        assert any(line.strip().startswith("Argument:") for line in str(e).splitlines()), str(e)
        return None


def _finite(*arrays):
    for a in arrays:
        for leaf in tf.nest.flatten(a):
            if leaf is not None:
                assert np.all(np.isfinite(np.asarray(leaf))), f"NaN/Inf in a result: {leaf}"


@FAST
@given(fn=st.sampled_from(_FUNCTIONS), x=_values())
@example(fn=tf.sin, x=np.array([np.nan]))
@example(fn=tf.sin, x=np.array([1.0], np.float16))
@example(fn=_nested, x=[1.0, 2.0])
def test_jacobian__random_inputs_follow_the_rule(fn, x):
    from natgrad_diag.autodiff.dense import jacobian

    J = _assert_rule(lambda: jacobian(fn, [x], max_bytes=1 << 20))
    if J is not None:
        _finite(J.compact)


@FAST
@given(fn=st.sampled_from(_FUNCTIONS), x=_values())
def test_check_gradients__random_inputs_follow_the_rule(fn, x):
    from natgrad_diag.gradcheck.api import check_gradients

    report = _assert_rule(lambda: check_gradients(fn, x, max_bytes=1 << 20))
    if report is not None:
        assert report.dtype in ("float64", "float32", "float16")
        str(report)


@FAST
@given(fn=st.sampled_from(_FUNCTIONS), x=_values(), v=_values())
@example(fn=tf.sin, x=np.array([1.0]), v=np.array([np.nan]))
@example(fn=tf.sin, x=np.array([np.inf]), v=np.array([1.0]))
def test_vjp__random_inputs_follow_the_rule(fn, x, v):
    from natgrad_diag.autodiff.seeded import vjp

    out = _assert_rule(lambda: vjp(fn, x, v))
    if out is not None:
        _finite(out[1])


@FAST
@given(target=_values(), seed=_values())
def test_checked_gradient__random_targets_follow_the_rule(target, seed):
    from natgrad_diag.autodiff.seeded import checked_gradient

    x = tf.constant([1.0, 2.0], tf.float64)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = tf.sin(x)
    for t in (target, y, {"y": y, "t": target}):
        g = _assert_rule(lambda t=t: checked_gradient(tape, t, x, seed))
        if g is not None:
            _finite(g)


@st.composite
def _q_parts(draw):
    """(q_mu, q_sqrt, q_mu_grad, q_sqrt_grad) with random M, L, dtype, triangle, non-finite entries, or junk."""
    M = draw(st.integers(0, 3))
    L = draw(st.integers(0, 2))
    dtype = draw(st.sampled_from([np.float64, np.float32, np.float16, np.int32]))
    q_sqrt = np.tile(np.eye(M), (L, 1, 1))
    if draw(st.booleans()) and M > 1:
        q_sqrt[:, 0, M - 1] = 0.5  # above the diagonal
    parts = [np.zeros((M, L)), q_sqrt, np.full((M, L), 0.1), np.tril(np.full((L, M, M), 0.1))]
    parts = [p.astype(dtype) for p in parts]
    k = draw(st.integers(0, 3))
    parts[k] = draw(st.one_of(st.just(parts[k]), _values(), st.just(np.full(parts[k].shape, np.nan))))
    return parts


@FAST
@given(parts=_q_parts(), gamma=st.one_of(st.floats(allow_nan=True), st.just("abc"), st.just(0.5)))
def test_natgrad_trace__random_inputs_follow_the_rule(parts, gamma):
    from natgrad_diag.step.trace import natgrad_trace

    trace = _assert_rule(lambda: natgrad_trace(*parts, gamma=gamma, compiled=False))
    if trace is not None:
        _finite(trace.new_q_mu, trace.new_q_sqrt)
        str(trace)


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.one_of(st.integers(-3, 3), st.floats(allow_nan=True), st.none(), st.text(max_size=2)),
    num_inducing=st.one_of(st.integers(-1, 4), st.just(10**6), st.floats(0, 3), st.text(max_size=2)),
    dtype=st.sampled_from(["float64", "float32", "float16", "int32", 5]),
)
@example(seed=0, num_inducing=10**6, dtype="float64")
@example(seed=-1, num_inducing=3, dtype="float64")
def test_make_model__random_arguments_follow_the_rule(seed, num_inducing, dtype):
    from natgrad_diag.demo import make_model

    demo = _assert_rule(lambda: make_model(seed=seed, num_inducing=num_inducing, num_data=5, dtype=dtype))
    if demo is not None:
        _finite(demo.model.q_mu.numpy(), demo.model.q_sqrt.numpy(), *demo.data)


@pytest.mark.parametrize("kwargs", [{"rtol": "abc"}, {"rtol": -1}, {"atol": float("nan")}, {"max_bytes": -1}])
def test_gradient_functions__bad_options_name_the_argument(kwargs):
    from natgrad_diag.gradcheck.api import check_gradients
    from natgrad_diag.testing import assert_vjp_matches_jacobian

    assert _assert_rule(lambda: check_gradients(tf.sin, [1.0], **kwargs)) is None
    assert _assert_rule(lambda: assert_vjp_matches_jacobian(tf.sin, [1.0], [1.0], **kwargs)) is None
