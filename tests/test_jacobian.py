"""BlockJacobian against hand-built Jacobians, tape.gradient's VJPs, and finite differences."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

import natgrad_diag as nd
from natgrad_diag.exceptions import InputError, MemoryLimitError, NonFiniteError, ShapeMismatchError
from natgrad_diag.autodiff.blocks import BlockJacobian
from natgrad_diag.autodiff.memory import jacobian_nbytes
from natgrad_diag.step.jacobian import natgrad_map_jacobian
from tests.conftest import np_meanvarsqrt, random_q


def _outer(x):
    return x[:, None] * x[None, :]


def test_jacobian__outer__equals_hand_built_and_labels_are_readable():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    J = nd.jacobian(_outer, [x], input_names=("x",), output_names=("y",))
    # ∂(x_j x_k)/∂x_i = δ_ij x_k + x_j δ_ik
    I = np.eye(4)
    want = np.einsum("ji,k->jki", I, x) + np.einsum("j,ki->jki", x, I)
    np.testing.assert_array_equal(J.block(0, 0), want)
    assert J.block(0, 0).shape == (4, 4, 4)
    assert J.matrix.shape == (16, 4)
    assert J.row_labels[:2] == ("y[0,0]", "y[0,1]") and J.col_labels == ("x[0]", "x[1]", "x[2]", "x[3]")
    np.testing.assert_array_equal(J.summed_gradient()[0], 2 * x.sum() * np.ones(4))  # [20, 20, 20, 20]
    assert not J.is_diagonal()


def test_jacobian__unconnected_block_is_zeros_not_none():
    J = nd.jacobian(lambda a, b: (a * 2.0, tf.reduce_sum(b)), [np.ones(3), np.ones((2, 2))])
    assert J.block(0, 1).shape == (3, 2, 2) and not J.block(0, 1).any()
    assert J.block(1, 0).shape == (3,) and not J.block(1, 0).any()
    np.testing.assert_array_equal(J.block(1, 1), np.ones((2, 2)))


def test_jacobian__elementwise_is_diagonal():
    x = np.linspace(-1, 1, 5)
    J = nd.jacobian(tf.sin, [x])
    assert J.is_diagonal()
    np.testing.assert_allclose(np.diag(J.matrix), np.cos(x), rtol=1e-15)


def test_jacobian__dict_inputs_and_outputs_give_names():
    J = nd.jacobian(lambda a, b: {"s": a + b, "p": a * b}, {"a": np.ones(2), "b": 2 * np.ones(2)})
    assert J.input_names == ("a", "b") and J.output_names == ("p", "s")  # tf.nest sorts dict keys
    np.testing.assert_array_equal(J.block(0, 0), 2 * np.eye(2))


shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)


@given(xshape=shapes, yshape=shapes, seed=st.integers(0, 10_000))
def test_jacobian__vjp_and_default_seed_equal_tape_gradient(xshape, yshape, seed):
    """Property: tape.gradient(output_gradients=v) = Jᵀ·v and the default seed = Jᵀ·1, any shapes."""
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=xshape))
    W = tf.constant(rng.normal(size=yshape + xshape))
    n = len(xshape)

    def f(x):
        lin = tf.tensordot(W, x, axes=n) if n else W * x
        return tf.sin(lin) + tf.reduce_sum(x**2), tf.exp(0.1 * x)

    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y1, y2 = f(x)
    v1, v2 = rng.normal(size=yshape), rng.normal(size=xshape)
    g_v = tape.gradient([y1, y2], x, output_gradients=[tf.constant(v1), tf.constant(v2)]).numpy()
    g_1 = tape.gradient([y1, y2], x).numpy()
    J = nd.jacobian(f, [x])
    # the contraction by hand, independent of BlockJacobian.vjp
    by_hand = np.concatenate([v1.ravel(), v2.ravel()]) @ J.matrix
    np.testing.assert_allclose(g_v.ravel(), by_hand, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(J.vjp([v1, v2])[0], g_v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(J.summed_gradient()[0], g_1, rtol=1e-12, atol=1e-12)
    u = rng.normal(size=xshape)
    np.testing.assert_allclose(
        np.concatenate([r.ravel() for r in J.jvp(u)]), J.matrix @ u.ravel(), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("M,L", [(3, 1), (2, 2)])
def test_natgrad_map_jacobian__matches_finite_differences(M, L):
    """Columns of eta1 by central differences of the numpy map; eta2 along symmetric tangents."""
    q_mu, q_sqrt = random_q(M, L, seed=3)
    eta1 = q_mu
    eta2 = q_sqrt @ np.transpose(q_sqrt, (0, 2, 1)) + np.einsum("ml,nl->lmn", q_mu, q_mu)
    J = natgrad_map_jacobian(eta1, eta2)
    eps = 1e-6

    def flat(e1, e2):
        m, vs = np_meanvarsqrt(e1, e2)
        return np.concatenate([m.ravel(), vs.ravel()])

    for idx in np.ndindex(M, L):
        d = np.zeros_like(eta1)
        d[idx] = eps
        fd = (flat(eta1 + d, eta2) - flat(eta1 - d, eta2)) / (2 * eps)
        col = J.matrix[:, J.col_labels.index(f"eta1[{idx[0]},{idx[1]}]")]
        np.testing.assert_allclose(col, fd, rtol=1e-6, atol=1e-7)
    for l in range(L):
        for i in range(M):
            for j in range(i + 1):
                d = np.zeros_like(eta2)
                d[l, i, j] += eps
                if i != j:
                    d[l, j, i] += eps
                fd = (flat(eta1, eta2 + d) - flat(eta1, eta2 - d)) / (2 * eps)
                c_ij = J.matrix[:, J.col_labels.index(f"eta2[{l},{i},{j}]")]
                c_ji = J.matrix[:, J.col_labels.index(f"eta2[{l},{j},{i}]")]
                jvp = c_ij + c_ji if i != j else c_ij
                np.testing.assert_allclose(jvp, fd, rtol=1e-6, atol=1e-7)


def test_jacobian__memory_guard_refuses_before_allocating():
    calls = []

    def f(x):
        calls.append(1)
        return x * 2.0

    x = np.ones(1000)
    assert jacobian_nbytes([(1000,)], [(1000,)], 8) == 8_000_000
    with pytest.raises(MemoryLimitError) as e:
        nd.jacobian(f, [x], max_bytes=1_000_000)
    msg = str(e.value)
    assert "7.63 MiB" in msg and "mode='fast'" in msg and "max_bytes" in msg
    assert len(calls) == 1  # one forward pass for the shapes, no Jacobian


def test_block_jacobian__vjp_with_wrong_shape_is_refused():
    J = nd.jacobian(_outer, [np.ones(4)])
    with pytest.raises(ShapeMismatchError, match=r"cotangents\[0\] has a shape of \[4\] and output 0 has a shape of \[4, 4\]"):
        J.vjp([np.ones(4)])
    with pytest.raises(ShapeMismatchError, match="2 array"):
        J.vjp([np.ones((4, 4)), np.ones((4, 4))])


def test_block_jacobian__block__by_position_or_unique_name_else_an_input_error_naming_the_argument():
    a, b = np.array([1.0, 2.0]), np.array([3.0, 5.0])
    J = nd.jacobian(lambda a, b: {"s": a + b, "p": a * b}, {"a": a, "b": b})  # outputs ("p", "s"), sorted
    np.testing.assert_array_equal(J.block("p", "a"), np.diag(b))  # ∂(a·b)/∂a = diag(b)
    np.testing.assert_array_equal(J.block(0, "b"), np.diag(a))
    np.testing.assert_array_equal(J.block(np.int64(1), 1), np.eye(2))  # ∂(a + b)/∂b = I
    with pytest.raises(InputError) as info:
        J.block(2, 0)
    assert str(info.value).splitlines() == [
        "Invalid input. i=2 is not the position or the unique name of an output.",
        "  Argument: i",
        "    Expected: a position 0 to 1 or a name: 'p', 's'",
        "    Got:      2",
        "  To fix: pass a position in .output_names (negative positions are not accepted) or one of its names.",
    ]
    for i, j, argument in ((-1, 0, "i"), ("y0", 0, "i"), (0, "x0", "j"), (0, True, "j"), (0, 1.0, "j"), (0, -2, "j")):
        with pytest.raises(InputError, match=rf"^Invalid input. {argument}=.* is not the position") as info:
            J.block(i, j)
        assert f"  Argument: {argument}" in str(info.value).splitlines()
    twice = BlockJacobian.from_compact(np.array([[1.0, 2.0], [3.0, 4.0]]), ["y", "y"], ["x"], [(1,), (1,)], [(2,)])
    np.testing.assert_array_equal(twice.block(1, "x"), [[3.0, 4.0]])
    with pytest.raises(InputError, match=r"i='y' is not the position or the unique name"):
        twice.block("y", "x")


def test_block_jacobian__vjp_and_jvp__refuse_nan_and_inf_naming_the_argument():
    J = nd.jacobian(lambda a, b: (2.0 * a, tf.reduce_sum(b)), [np.ones(3), np.ones(2)])  # outputs [3], []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning on the way
        with pytest.raises(NonFiniteError) as info:
            J.vjp([np.ones(3), np.nan])
        assert str(info.value).splitlines()[:2] == [
            "Non-finite values. cotangents[1] contains 1 NaN and 0 Inf value(s).", "  Argument: cotangents[1]"]
        with pytest.raises(NonFiniteError) as info:
            J.jvp([np.array([1.0, np.inf, -np.inf]), np.ones(2)])
        assert str(info.value).splitlines()[:2] == [
            "Non-finite values. tangents[0] contains 0 NaN and 2 Inf value(s).", "  Argument: tangents[0]"]


@pytest.mark.parametrize("compiled", [False, True])
def test_jacobian__a_derivative_that_does_not_exist_is_named_not_returned_as_nan(compiled: bool) -> None:
    """tf.sqrt at 0 has the derivative 1/(2·√0) = Inf; tf.norm at 0 gives 0/0 = NaN (tape.jacobian's own values)."""
    x = tf.constant([0.0, 4.0], tf.float64)
    with pytest.raises(NonFiniteError, match=r"The Jacobian has inf at ∂y0\[0\]/∂x0\[0\]") as info:
        nd.jacobian(tf.sqrt, [x], compiled=compiled)
    assert "Non-finite entries: 1" in str(info.value) and "nan_policy='propagate'" in str(info.value)
    with pytest.raises(NonFiniteError, match=r"has nan at ∂y0/∂x0\[0\]"):
        nd.jacobian(tf.norm, [tf.zeros(2, tf.float64)], compiled=compiled)
    with tf.GradientTape() as tape:  # the oracle: TensorFlow's own Jacobian, NaN and Inf in the same places
        tape.watch(x)
        y = tf.sqrt(x)
    np.testing.assert_array_equal(nd.jacobian(tf.sqrt, [x], nan_policy="propagate", compiled=compiled).block(0, 0),
                                  tape.jacobian(y, x).numpy())  # [[inf, 0], [0, 1/4]]
    with pytest.raises(InputError, match="nan_policy must be 'raise' or 'propagate'"):
        nd.jacobian(tf.sqrt, [x], nan_policy="omit")
