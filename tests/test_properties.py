"""The input rule, as a property: random shapes, dtypes, nestings, non-finite values and wrong types thrown
at each public function give either a correct result or a NatGradDiagError whose message names an argument.

Never a raw TensorFlow, numpy or Python error, and never NaN in a result. Examples are derandomized (the
profile in conftest.py) so that a failure reproduces; max_examples is small to keep the file fast.
"""

from __future__ import annotations

import functools

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
@example(fn=tf.sin, x=np.array([0.5, 1.0]), v=np.array([1.0, -2.0]))  # valid: the result branch runs
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
@example(parts=[np.zeros((2, 1)), np.eye(2)[None], np.full((2, 1), 0.1), np.tril(np.full((1, 2, 2), 0.1))], gamma=0.5)
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

    (name,) = kwargs
    for call in (lambda: check_gradients(tf.sin, [1.0], **kwargs), lambda: assert_vjp_matches_jacobian(tf.sin, [1.0], [1.0], **kwargs)):
        with pytest.raises(NatGradDiagError) as info:
            call()
        assert f"  Argument: {name}" in str(info.value).splitlines(), str(info.value)


# ---- the training monitor, the var_list form, check_natgrad's options, strict_gradients ---------------------

_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=2))


@functools.lru_cache(maxsize=1)
def _tiny_svgp():
    """One SVGP (M = 2, N = 4) for every example: fast mode compiles its pieces once; the tests assert it never changes."""
    import gpflow

    X = np.linspace(0, 1, 4)[:, None]
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(), X[:2].copy())
    gpflow.set_trainable(model.q_mu, False)
    gpflow.set_trainable(model.q_sqrt, False)
    return model, (X, np.sin(6 * X))


def _unchanged(model, before):
    assert all(b.tobytes() == v.numpy().tobytes() for b, v in zip(before, model.variables)), "the model changed"


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(step=_JUNK, log_dir=st.one_of(_JUNK, st.sampled_from(["file", "file/sub", "new/dir", ""])))
def test_monitor__random_step_and_log_dir_follow_the_rule(step, log_dir):
    import os
    import tempfile

    import gpflow

    from natgrad_diag import NatGradMonitor

    model, data = _tiny_svgp()
    before = [v.numpy().copy() for v in model.variables]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            with open("file", "w") as f:
                f.write("x")
            monitor = _assert_rule(lambda: NatGradMonitor(model, data, every=7, log_dir=log_dir))
            made = set(os.listdir(".")) - {"file"}
            new = {os.path.normpath(str(log_dir)).split(os.sep)[0]} if monitor is not None and monitor.log else set()
            assert made <= new, made  # nothing but the accepted log directory
            assert open("file").read() == "x"
            if monitor is not None:
                _assert_rule(lambda: monitor.guard(step, gpflow.optimizers.NaturalGradient(0.1)))
                if isinstance(step, int) and step % 7:
                    _assert_rule(lambda: monitor(step))  # not a multiple of every: no check runs
        finally:
            os.chdir(cwd)
    _unchanged(model, before)


@FAST
@given(v=_values(), k=st.one_of(_JUNK, st.integers(1, 3)), mode=st.sampled_from(["full", "fast"]))
@example(v=[np.array([np.nan, 1.0])], k=2, mode="fast")
@example(v=[np.ones(2)], k=10**9, mode="fast")
@example(v=[np.array([1.0, -2.0])], k=2, mode="fast")  # valid: report.passed is asserted
@example(v=[np.array([0.3, 0.4])], k=1, mode="full")
def test_gradient_checks__random_cotangents_and_directions_follow_the_rule(v, k, mode):
    from natgrad_diag.gradcheck.api import check_gradients
    from natgrad_diag.testing import assert_vjp_matches_jacobian

    x = [np.array([0.1, 0.2])]
    report = _assert_rule(lambda: check_gradients(tf.sin, x, mode=mode, cotangents=v, num_directions=k))
    if report is not None:
        assert report.passed  # tf.sin's gradient is right: no cotangent may make it look wrong
    got = _assert_rule(lambda: assert_vjp_matches_jacobian(tf.sin, x, v))
    if got is not None:
        np.testing.assert_allclose(got[0], np.cos(x[0]) * np.asarray(v[0] if isinstance(v, list) else v), rtol=1e-12)


@FAST
@given(sources=_values())
def test_checked_gradient__random_sources_follow_the_rule(sources):
    from natgrad_diag.autodiff.seeded import checked_gradient

    x = tf.constant([1.0, 2.0], tf.float64)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = tf.reduce_sum(x**2)
    g = _assert_rule(lambda: checked_gradient(tape, y, sources))
    if g is not None:
        _finite(g)


_LOSSES = [None, "x", 3, lambda m: tf.ones(3, tf.float64), lambda m: tf.constant(np.nan, tf.float64), lambda m: m.prior_kl()]


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    loss=st.sampled_from(_LOSSES), swapped=st.booleans(), as_generator=st.booleans(),
    options=st.dictionaries(st.sampled_from(["rtol", "atol", "gamma", "gamma_steps", "gamma_search", "mode"]), _JUNK, max_size=2),
)
@example(loss=_LOSSES[-1], swapped=False, as_generator=True, options={})
def test_check_natgrad_var_list__random_losses_pairs_and_options_follow_the_rule(loss, swapped, as_generator, options):
    from natgrad_diag import check_natgrad

    model, _ = _tiny_svgp()
    before = [v.numpy().copy() for v in model.variables]
    pair = (model.q_sqrt, model.q_mu) if swapped else (model.q_mu, model.q_sqrt)
    var_list = (p for p in [pair]) if as_generator else [pair]
    fn = (lambda: loss(model)) if callable(loss) else loss
    report = _assert_rule(lambda: check_natgrad(fn, var_list=var_list, progress=False, **options))
    if report is not None:
        assert report.checks and report.passed  # the prior KL's step is GPflow's: every check that ran holds
    _unchanged(model, before)


@pytest.mark.slow  # each valid draw runs a check (about 1 s)
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(options=st.dictionaries(st.sampled_from(["rtol", "atol", "fisher", "progress", "gamma", "gamma_search", "var_list"]), _JUNK, min_size=1, max_size=2))
@example(options={"var_list": []})
@example(options={"gamma": True})
def test_check_natgrad__random_options_follow_the_rule(options):
    from natgrad_diag import check_natgrad

    model, data = _tiny_svgp()
    before = [v.numpy().copy() for v in model.variables]
    report = _assert_rule(lambda: check_natgrad(model, data, mode="fast", **{"progress": False, "gamma_search": False, **options}))
    if report is not None:
        assert report.checks
    _unchanged(model, before)


@FAST
@given(action=st.one_of(_JUNK, st.sampled_from(["raise", "warn"])), allow=_JUNK)
def test_strict_gradients__random_arguments_follow_the_rule(action, allow):
    from natgrad_diag.strict.context import strict_gradients

    _assert_rule(lambda: strict_gradients(action, allow_implicit_sum=allow))
