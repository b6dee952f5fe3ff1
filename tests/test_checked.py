"""checked_gradient and vjp against tape.gradient, closed-form Jacobians, hand contractions and torch's rule."""

# Oracles: tape.gradient itself when the seed is right (checked_gradient must be a drop-in), closed-form
# Jacobians (outer product, sin(x)·Σx), the explicit Jacobian from ``natgrad_diag.jacobian`` contracted by
# hand with ``np.tensordot``, and central finite differences.

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import natgrad_diag
from natgrad_diag import OutputGradientsError, checked_gradient, vjp
from natgrad_diag._validate import shape_str
from natgrad_diag.exceptions import DTypeMismatchError, InputError, NatGradDiagError, UnconnectedGradientError

RTOL, ATOL = 1e-12, 1e-12

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


def _tf():
    import tensorflow as tf

    return tf


def _x4():
    tf = _tf()
    return tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64)


def _fn_of_shape(shape: tuple[int, ...]):
    """y = reshape(sin(x)·Σx, shape) for x [n], n = prod(shape): a dense (non-diagonal) Jacobian."""
    tf = _tf()
    return lambda x: tf.reshape(tf.sin(x) * tf.reduce_sum(x), shape)


def _closed_form_vjp(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Jᵀ·v for y = sin(x)·Σx: J = diag(cos x)·Σx + sin(x)·1ᵀ, so Jᵀv = cos(x)·Σx·v + (sin(x)·v).sum()."""
    v = v.ravel()
    return np.cos(x) * x.sum() * v + np.dot(np.sin(x), v)


# ---------------------------------------------------------------------------------------------------
# right seeds: a drop-in for tape.gradient


@given(shape=shapes, shape2=shapes, seed=st.integers(0, 2**31 - 1))
def test_checked_gradient__equals_tape_gradient_for_right_seeds(shape, shape2, seed):
    tf = _tf()
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    x = tf.constant(rng.normal(size=n))
    v1, v2 = rng.normal(size=shape), rng.normal(size=shape2)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y1 = _fn_of_shape(shape)(x)
        y2 = tf.reshape(tf.reduce_sum(x**3) * tf.ones(int(np.prod(shape2)), tf.float64), shape2)
    got = checked_gradient(tape, [y1, y2], x, [tf.constant(v1), tf.constant(v2)])
    want = tape.gradient([y1, y2], x, output_gradients=[tf.constant(v1), tf.constant(v2)])
    assert got.shape == x.shape
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL)
    # and both are Jᵀ·v from the closed form
    xn = x.numpy()
    closed = _closed_form_vjp(xn, v1) + 3 * xn**2 * v2.sum()
    np.testing.assert_allclose(got.numpy(), closed, rtol=1e-10, atol=1e-10)


def test_checked_gradient__single_tensor_seed_for_single_target():
    tf = _tf()
    x = _x4()
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = x[:, None] * x[None, :]
    g = checked_gradient(tape, y, x, tf.ones_like(y))
    np.testing.assert_allclose(g.numpy(), 2 * np.sum(x.numpy()) * np.ones(4), rtol=0, atol=ATOL)  # [20, 20, 20, 20]


def test_checked_gradient__none_entries_mean_ones():
    tf = _tf()
    x = _x4()
    v = np.array([0.5, -1.0, 2.0, 0.25])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = x[:, None] * x[None, :]
        s = tf.sin(x) * tf.reduce_sum(x)
    xn = x.numpy()
    # outer with ones: 2·Σx; sin(x)·Σx with v: closed form
    want = 2 * xn.sum() + _closed_form_vjp(xn, v)
    got = checked_gradient(tape, [y, s], x, [None, tf.constant(v)])
    np.testing.assert_allclose(got.numpy(), want, rtol=RTOL, atol=1e-11)
    all_none = checked_gradient(tape, [y, s], x, [None, None])
    default = checked_gradient(tape, [y, s], x)
    want_ones = 2 * xn.sum() + _closed_form_vjp(xn, np.ones(4))
    np.testing.assert_allclose(all_none.numpy(), want_ones, rtol=RTOL, atol=1e-11)
    np.testing.assert_allclose(default.numpy(), want_ones, rtol=RTOL, atol=1e-11)


def test_checked_gradient__dict_target_flattens_by_sorted_keys():
    tf = _tf()
    x = _x4()
    xn = x.numpy()
    va, vb = np.arange(4.0), np.arange(16.0).reshape(4, 4)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        target = {"b": x[:, None] * x[None, :], "a": tf.sin(x) * tf.reduce_sum(x)}
    # ∂(x_j x_k)/∂x_i = δ_ij x_k + x_j δ_ik  →  (Jᵀv)_i = Σ_k v_ik x_k + Σ_j v_ji x_j
    want = _closed_form_vjp(xn, va) + vb @ xn + vb.T @ xn
    as_dict = checked_gradient(tape, target, x, {"a": tf.constant(va), "b": tf.constant(vb)})
    as_list = checked_gradient(tape, target, x, [tf.constant(va), tf.constant(vb)])  # a before b
    np.testing.assert_allclose(as_dict.numpy(), want, rtol=RTOL, atol=1e-11)
    np.testing.assert_allclose(as_list.numpy(), want, rtol=RTOL, atol=1e-11)
    with pytest.raises(OutputGradientsError, match=r"different keys"):
        checked_gradient(tape, target, x, {"a": tf.constant(va), "c": tf.constant(vb)})


def test_checked_gradient__structured_sources_keep_their_structure():
    tf = _tf()
    a = tf.Variable([1.0, 2.0], dtype=tf.float64)
    b = tf.Variable([[3.0]], dtype=tf.float64)
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(a**2) * b  # [1, 1]
    g = checked_gradient(tape, y, {"a": a, "b": b}, tf.constant([[2.0]], tf.float64))
    assert set(g) == {"a", "b"}
    np.testing.assert_allclose(g["a"].numpy(), 2.0 * 2 * a.numpy() * 3.0, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(g["b"].numpy(), [[2.0 * 5.0]], rtol=RTOL, atol=ATOL)


def test_checked_gradient__python_number_seed_takes_target_dtype():
    tf = _tf()
    x = _x4()
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(x**2)  # scalar float64
    g = checked_gradient(tape, y, x, 2.0)
    np.testing.assert_allclose(g.numpy(), 4.0 * x.numpy(), rtol=RTOL, atol=ATOL)


def test_checked_gradient__numpy_seed_of_right_dtype():
    tf = _tf()
    x = _x4()
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.sin(x)
    v = np.array([1.0, -2.0, 0.5, 3.0])
    g = checked_gradient(tape, y, x, v)
    np.testing.assert_allclose(g.numpy(), np.cos(x.numpy()) * v, rtol=RTOL, atol=ATOL)


def test_checked_gradient__agrees_with_central_differences():
    tf = _tf()
    rng = np.random.default_rng(3)
    xn = rng.normal(size=5)
    v = rng.normal(size=(5, 5))

    def f(a):
        return np.tanh(np.outer(a, a)) * a.sum()

    x = tf.constant(xn)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.tanh(x[:, None] * x[None, :]) * tf.reduce_sum(x)
    g = checked_gradient(tape, y, x, tf.constant(v)).numpy()
    h = 1e-6
    fd = np.array([np.sum(v * (f(xn + h * e) - f(xn - h * e))) / (2 * h) for e in np.eye(5)])
    np.testing.assert_allclose(g, fd, rtol=1e-7, atol=1e-7)


# ---------------------------------------------------------------------------------------------------
# wrong seeds: always our error, never a broadcast or a deep TensorFlow error


@st.composite
def wrong_seed_shapes(draw):
    """A target shape and a different seed shape: arbitrary, or broadcastable to the target."""
    target = draw(shapes)
    variants = [target + (1,), (1,) + target, target[1:], (), target[:-1] + (1,) if target else (2,)]
    if target:
        variants.append(tuple(1 if k == 0 else d for k, d in enumerate(target)))
        variants.append(target[::-1])
    seed = draw(st.one_of(st.sampled_from(variants), shapes))
    if seed == target:
        seed = target + (2,)
    return target, seed


@given(shapes_pair=wrong_seed_shapes())
def test_checked_gradient__any_wrong_shape_raises_with_both_shapes(shapes_pair):
    tf = _tf()
    target_shape, seed_shape = shapes_pair
    n = int(np.prod(target_shape))
    x = tf.constant(np.linspace(0.1, 1.0, n))
    with tf.GradientTape() as tape:  # not persistent: must survive the error
        tape.watch(x)
        y = _fn_of_shape(target_shape)(x)
    with pytest.raises(OutputGradientsError) as info:
        checked_gradient(tape, y, x, tf.ones(seed_shape, tf.float64))
    msg = str(info.value)
    assert (
        f"output_gradients[0] has a shape of {shape_str(seed_shape)} and target[0] has a shape of "
        f"{shape_str(target_shape)}." in msg
    )
    assert isinstance(info.value, ValueError) and isinstance(info.value, NatGradDiagError)
    # nothing was computed: the one-shot tape is still usable, with the right seed
    g = checked_gradient(tape, y, x, tf.ones(target_shape, tf.float64))
    np.testing.assert_allclose(g.numpy(), _closed_form_vjp(x.numpy(), np.ones(target_shape)), rtol=1e-10, atol=1e-10)


def test_checked_gradient__seed_tensorflow_broadcasts_silently__refused():
    tf = _tf()
    x = _x4()
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = tf.sin(x)
    seed = tf.ones([4, 1], tf.float64)
    raw = tape.gradient(y, x, output_gradients=seed)  # TensorFlow 2.21: no error, a [4, 4] "gradient"
    assert tuple(raw.shape) == (4, 4), "TensorFlow rejects this seed itself: update the docs"
    with pytest.raises(OutputGradientsError) as info:
        checked_gradient(tape, y, x, seed)
    assert str(info.value) == (
        "Mismatch in output_gradients. output_gradients[0] has a shape of [4, 1] and target[0] has a shape of [4].\n"
        "  Argument: output_gradients[0]\n"
        "    Expected: [4] (target[0]'s shape)\n"
        "    Actual:   [4, 1]\n"
        "  To fix: pass a seed of exactly the target's shape, e.g. tf.ones_like(target[0]) or dL/dtarget[0]; "
        "TensorFlow would broadcast it or fail deep inside."
    )


def test_checked_gradient__seed_of_the_source_shape__refused_before_tensorflows_reshape_error():
    tf = _tf()
    x = _x4()
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = x[:, None] * x[None, :]
    with pytest.raises(tf.errors.InvalidArgumentError, match="reshape"):
        tape.gradient(y, x, output_gradients=tf.ones_like(x))  # TensorFlow's deep error
    with pytest.raises(OutputGradientsError) as info:
        checked_gradient(tape, y, x, tf.ones_like(x))
    assert str(info.value) == (
        "Mismatch in output_gradients. output_gradients[0] has a shape of [4] and target[0] has a shape of [4, 4].\n"
        "  Argument: output_gradients[0]\n"
        "    Expected: [4, 4] (target[0]'s shape)\n"
        "    Actual:   [4]\n"
        "  To fix: pass a seed of exactly the target's shape, e.g. tf.ones_like(target[0]) or dL/dtarget[0]; "
        "TensorFlow would broadcast it or fail deep inside."
    )


@pytest.mark.parametrize(
    "case, n_seeds, n_targets",
    [("two_seeds_one_target", 2, 1), ("one_seed_two_targets", 1, 2), ("three_seeds_two_targets", 3, 2)],
)
def test_checked_gradient__wrong_number_of_seeds(case, n_seeds, n_targets):
    tf = _tf()
    x = _x4()
    with tf.GradientTape() as tape:
        tape.watch(x)
        ys = [tf.sin(x), x * 2.0][:n_targets]
    seeds = [tf.ones([4], tf.float64) for _ in range(n_seeds)]
    target = ys if n_targets > 1 else ys[0]
    og = seeds if n_seeds > 1 else seeds[0]
    entries = "entry" if n_seeds == 1 else "entries"
    with pytest.raises(OutputGradientsError, match=rf"output_gradients has {n_seeds} {entries} for {n_targets} target\(s\)"):
        checked_gradient(tape, target, x, og)


def test_checked_gradient__python_list_of_numbers_is_many_seeds():
    tf = _tf()
    x = _x4()
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.sin(x)
    with pytest.raises(OutputGradientsError) as info:
        checked_gradient(tape, y, x, [1.0, 1.0, 1.0, 1.0])
    assert "4 entries for 1 target(s)" in str(info.value)
    assert "wrap it, e.g. tf.constant([...], dtype=tf.float64)" in str(info.value)


@pytest.mark.parametrize("seed_dtype", ["float32", "int64", "float16"])
def test_checked_gradient__wrong_dtype(seed_dtype):
    tf = _tf()
    x = _x4()
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.sin(x)
    with pytest.raises(OutputGradientsError) as info:
        checked_gradient(tape, y, x, tf.ones([4], seed_dtype))
    assert f"output_gradients[0] has dtype {seed_dtype} and target[0] has dtype float64." in str(info.value)
    with pytest.raises(OutputGradientsError, match="has dtype float32"):
        checked_gradient(tape, y, x, np.ones(4, np.float32))


def test_checked_gradient__unknown_dims_inside_tf_function():
    tf = _tf()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float64), tf.TensorSpec([None], tf.float64)])
    def good(x, v):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.sin(x)
        return checked_gradient(tape, y, x, v)

    x = np.array([0.1, 0.2, 0.3])
    v = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(good(x, v).numpy(), np.cos(x) * v, rtol=RTOL, atol=ATOL)
    with pytest.raises(tf.errors.InvalidArgumentError, match="different shapes at run time"):
        good(x, v[:2])  # [None] and [None] agree when tracing; [3] and [2] do not when running

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float64), tf.TensorSpec([None, 1], tf.float64)])
    def bad_rank(x, v):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.sin(x)
        return checked_gradient(tape, y, x, v)

    with pytest.raises(OutputGradientsError, match=r"shape of \[None, 1\] and target\[0\] has a shape of \[None\]"):
        bad_rank(x, v[:, None])


# ---------------------------------------------------------------------------------------------------
# unconnected sources


def test_checked_gradient__unconnected_none_zero_raise():
    tf = _tf()
    x = _x4()
    w = tf.constant(np.ones((3, 2)))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        y = tf.sin(x)
        s = tf.reduce_sum(w)
    g_none = checked_gradient(tape, y, [x, w])
    assert g_none[1] is None
    g_zero = checked_gradient(tape, y, [x, w], unconnected="zero")
    assert g_zero[1].shape == (3, 2) and g_zero[1].dtype == tf.float64
    np.testing.assert_array_equal(g_zero[1].numpy(), np.zeros((3, 2)))
    np.testing.assert_allclose(g_zero[0].numpy(), np.cos(x.numpy()), rtol=RTOL, atol=ATOL)
    g_enum = checked_gradient(tape, y, [x, w], unconnected=tf.UnconnectedGradients.ZERO)
    np.testing.assert_array_equal(g_enum[1].numpy(), np.zeros((3, 2)))
    with pytest.raises(UnconnectedGradientError) as info:
        checked_gradient(tape, y, [x, w], unconnected="raise")
    assert str(info.value) == (
        "Unconnected gradient. sources[1] is not connected to target[0]: TensorFlow's gradient is None.\n"
        "  Source: sources[1]: shape [3, 2], float64\n"
        "  Target: target[0]: shape [4], float64\n"
        "  To fix: compute the target from the source inside the tape's context and make sure the tape watches it "
        "(tf.Variables are watched automatically, tensors need tape.watch(x)); if a zero gradient is right, "
        'pass unconnected="zero".'
    )
    # connected to one target of two: not unconnected
    g = checked_gradient(tape, [y, s], [x, w], unconnected="raise")
    np.testing.assert_array_equal(g[1].numpy(), np.ones((3, 2)))


def test_checked_gradient__unconnected_raise_names_every_missing_source():
    tf = _tf()
    x = _x4()
    a, b = tf.constant(1.0, tf.float64), tf.constant([2.0], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch([x, a, b])
        y1, y2 = tf.sin(x), x**2
    with pytest.raises(UnconnectedGradientError) as info:
        checked_gradient(tape, [y1, y2], [a, x, b], unconnected="raise")
    msg = str(info.value)
    assert "sources[0] is not connected to any of the 2 targets" in msg
    assert "Also unconnected: sources[2]" in msg


def test_checked_gradient__bad_arguments():
    tf = _tf()
    x = _x4()
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.sin(x)
    with pytest.raises(InputError, match='"none", "zero" or "raise"'):
        checked_gradient(tape, y, x, unconnected="ignore")
    with pytest.raises(InputError, match="tape must be the tf.GradientTape"):
        checked_gradient(None, y, x)
    with pytest.raises(InputError, match="empty"):
        checked_gradient(tape, [], x)
    # the tape was not consumed by any of the bad calls
    np.testing.assert_allclose(checked_gradient(tape, y, x).numpy(), np.cos(x.numpy()), rtol=RTOL, atol=ATOL)


def test_checked_gradient__leaves_variables_bit_identical():
    tf = _tf()
    v = tf.Variable(np.array([0.3, -1.2, 2.5]))
    before = v.numpy().copy()
    with tf.GradientTape() as tape:
        y = v[:, None] * v[None, :]
    g = checked_gradient(tape, y, v, tf.ones_like(y))
    np.testing.assert_array_equal(v.numpy(), before)
    np.testing.assert_allclose(g.numpy(), 2 * before.sum() * np.ones(3), rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------------------------------------
# vjp against the explicit Jacobian contracted by hand


@settings(max_examples=12)
@given(n=st.integers(1, 4), m=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_vjp__equals_hand_contracted_explicit_jacobian(n, m, seed):
    tf = _tf()
    rng = np.random.default_rng(seed)
    a, B = rng.normal(size=n), rng.normal(size=(n, m))
    v1, v2 = rng.normal(size=(n, m)), rng.normal()

    def fn(a, B):
        return a[:, None] * tf.sin(B), tf.reduce_sum(tf.exp(a)) * tf.reduce_sum(B**2)

    outputs, (ga, gB) = vjp(fn, [a, B], [v1, v2])
    J = natgrad_diag.jacobian(fn, [tf.constant(a), tf.constant(B)])
    want_a = np.tensordot(v1, J.block(0, 0), axes=2) + v2 * J.block(1, 0)
    want_B = np.tensordot(v1, J.block(0, 1), axes=2) + v2 * J.block(1, 1)
    np.testing.assert_allclose(ga.numpy(), want_a, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gB.numpy(), want_B, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(outputs[0].numpy(), a[:, None] * np.sin(B), rtol=RTOL, atol=ATOL)


def test_vjp__outer_and_the_chain_two_steps_equal_one():
    tf = _tf()
    x = np.array([1.0, 2.0, 3.0, 4.0])
    y, g = vjp(lambda x: x[:, None] * x[None, :], x, np.ones((4, 4)))
    np.testing.assert_allclose(g.numpy(), 2 * x.sum() * np.ones(4), rtol=0, atol=ATOL)
    # z = y²: dL/dy = dL/dz · dz/dy = 2y (seed of ones on z), then dL/dx = (dL/dy)·dy/dx
    z, dL_dy = vjp(lambda y: y**2, y, tf.ones_like(y))
    _, two_step = vjp(lambda x: x[:, None] * x[None, :], x, dL_dy)
    _, one_step = vjp(lambda x: (x[:, None] * x[None, :]) ** 2, x, np.ones((4, 4)))
    closed = 4 * x * np.sum(x**2)  # d/dx_i (Σx²)² = 4 x_i Σx²
    np.testing.assert_allclose(two_step.numpy(), closed, rtol=RTOL, atol=1e-10)
    np.testing.assert_allclose(one_step.numpy(), closed, rtol=RTOL, atol=1e-10)


def test_vjp__one_tensor_passed_as_two_primals_is_two_inputs():
    # Oracle: the partial derivatives by hand. f(x, y) = 2x + y² at x = y = (1, 2) with one seed v: ∂f/∂x = 2v,
    # ∂f/∂y = 2y·v. Passing the same tf.Tensor twice used to give both primals ∂/∂x + ∂/∂y.
    tf = _tf()
    t, v = tf.constant([1.0, 2.0], tf.float64), np.array([0.5, -1.0])
    _, (gx, gy) = vjp(lambda x, y: 2.0 * x + y**2, [t, t], v)
    np.testing.assert_array_equal(gx.numpy(), 2.0 * v)
    np.testing.assert_array_equal(gy.numpy(), 2.0 * np.array([1.0, 2.0]) * v)


def test_vjp__wrong_cotangent_shape_message():
    with pytest.raises(OutputGradientsError) as info:
        vjp(lambda x: x[:, None] * x[None, :], np.array([1.0, 2.0, 3.0, 4.0]), np.ones(4))
    assert str(info.value) == (
        "Mismatch in output_gradients. cotangents[0] has a shape of [4] and output[0] has a shape of [4, 4].\n"
        "  Argument: cotangents[0]\n"
        "    Expected: [4, 4] (output[0]'s shape)\n"
        "    Actual:   [4]\n"
        "  To fix: pass a seed of exactly the output's shape, e.g. tf.ones_like(output[0]) or dL/doutput[0]; "
        "TensorFlow would broadcast it or fail deep inside."
    )


def test_vjp__bad_inputs_and_unconnected():
    tf = _tf()
    with pytest.raises(DTypeMismatchError, match=r"primals\[0\] is int32"):
        vjp(lambda x: x * 2, tf.constant([1, 2]), np.ones(2))
    with pytest.raises(OutputGradientsError, match="cotangents is None"):
        vjp(tf.sin, np.ones(2), None)
    with pytest.raises(OutputGradientsError, match="has dtype float32 and output"):
        vjp(tf.sin, np.ones(2), np.ones(2, np.float32))
    x, w = np.array([0.5, 1.5]), np.array([2.0, 3.0, 4.0])
    _, (gx, gw) = vjp(lambda x, w: tf.sin(x), [x, w], np.ones(2))
    np.testing.assert_array_equal(gw.numpy(), np.zeros(3))
    np.testing.assert_allclose(gx.numpy(), np.cos(x), rtol=RTOL, atol=ATOL)
    with pytest.raises(UnconnectedGradientError, match=r"primals\[1\] is not connected to output\[0\]"):
        vjp(lambda x, w: tf.sin(x), [x, w], np.ones(2), unconnected="raise")


def test_checked_gradient__unknown_rank_seed_inside_tf_function():
    tf = _tf()

    @tf.function(input_signature=[tf.TensorSpec([3], tf.float64), tf.TensorSpec(None, tf.float64)])
    def two_seeds_one_target(x, v):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.sin(x)
        return checked_gradient(tape, y, x, [v, v])

    with pytest.raises(OutputGradientsError, match=r"2 seed\(s\): unknown rank, unknown rank"):
        two_seeds_one_target(np.ones(3), np.ones(3))

    @tf.function(input_signature=[tf.TensorSpec([3], tf.float64), tf.TensorSpec(None, tf.float64)])
    def one_seed(x, v):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.sin(x)
        return checked_gradient(tape, y, x, v)

    np.testing.assert_allclose(one_seed(np.ones(3), np.full(3, 2.0)).numpy(), 2 * np.cos(np.ones(3)), rtol=RTOL, atol=ATOL)
    # unknown when tracing, so checked when the graph runs: no broadcast of a [3, 1] seed
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"output_gradients\[0\] and target\[0\] have different shapes at run time"):
        one_seed(np.ones(3), np.ones((3, 1)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="different shapes at run time"):
        one_seed(np.ones(3), np.ones(4))


def test_checked_gradient__dict_seeds_for_a_list_of_targets_are_refused_not_paired_by_sorted_key():
    """{"var": ..., "mean": ...} for targets [var, mean] used to flatten by sorted key, swapping the seeds:
    [3, 0, 60] instead of the chain rule's 2x·dL_dvar + 3·dL_dmean = [2, 0, 30] (by hand, which the list form gives)."""
    import tensorflow as tf

    x = tf.constant([1.0, 2.0, 3.0], tf.float64)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        var, mean = x**2, 3.0 * x
    seeds = {"var": tf.constant([1.0, 0.0, 0.0], tf.float64), "mean": tf.constant([0.0, 0.0, 10.0], tf.float64)}
    with pytest.raises(OutputGradientsError, match=r"is a dict but the targets are not(.|\n)*Argument:\s+output_gradients"):
        checked_gradient(tape, [var, mean], x, seeds)
    with pytest.raises(OutputGradientsError, match=r"Argument:\s+cotangents"):
        vjp(lambda a: (a**2, 3.0 * a), x, seeds)
    np.testing.assert_array_equal(checked_gradient(tape, [var, mean], x, [seeds["var"], seeds["mean"]]), [2.0, 0.0, 30.0])
