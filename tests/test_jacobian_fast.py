"""The chunked, compiled, vech Jacobian against tape.jacobian, hand contractions and finite differences."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import natgrad_diag as nd
from natgrad_diag.exceptions import InputError, MemoryLimitError, ShapeMismatchError
from natgrad_diag.autodiff.blocks import vech_layout
from natgrad_diag._compile import trace_count
from natgrad_diag.autodiff.chunks import TRACE_KIND
from natgrad_diag.autodiff.memory import jacobian_nbytes
from natgrad_diag.step.jacobian import natgrad_map_jacobian
from tests.conftest import np_meanvarsqrt, random_q


def _eta(M: int, L: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    q_mu, q_sqrt = random_q(M, L, seed=seed)
    eta2 = q_sqrt @ np.transpose(q_sqrt, (0, 2, 1)) + np.einsum("ml,nl->lmn", q_mu, q_mu)
    return q_mu, eta2


def _tape_blocks(fn, xs):
    """The oracle: tape.jacobian per block, eagerly, unconnected blocks as zeros."""
    xs = [tf.constant(x) for x in xs]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xs)
        ys = tf.nest.flatten(fn(*xs))
    zero = tf.UnconnectedGradients.ZERO
    return [[tape.jacobian(y, x, unconnected_gradients=zero).numpy() for x in xs] for y in ys]


def _gpflow_map(e1, e2):
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    return expectation_to_meanvarsqrt(e1, e2)


def _mixed(a, b):
    """Two inputs, three outputs of different ranks, one output unconnected to b."""
    return (tf.sin(a) * tf.reduce_sum(b), tf.linalg.matmul(b, b, transpose_b=True) + a[0], tf.exp(a))


# ---- chunked == tape.jacobian ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["forward", "reverse"])
@pytest.mark.parametrize("chunk_size", [1, 7, 64, None])
def test_jacobian_chunks__equal_tape_jacobian_for_any_chunk_and_mode(mode, chunk_size):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=3), rng.normal(size=(2, 3))
    J = nd.jacobian(_mixed, [a, b], mode=mode, chunk_size=chunk_size, compiled=True)
    want = _tape_blocks(_mixed, [a, b])
    for i in range(3):
        for j in range(2):
            assert J.block(i, j).shape == want[i][j].shape
            np.testing.assert_allclose(J.block(i, j), want[i][j], rtol=1e-13, atol=1e-14, err_msg=f"block {i},{j}")
    # stored in one preallocated array; blocks of general inputs are views of it, read-only
    assert J.compact.shape == J.shape == (3 + 4 + 3, 3 + 6)
    assert np.shares_memory(J.block(1, 1), J.compact)
    assert not J.compact.flags.writeable


@pytest.mark.parametrize("M,L", [(4, 1), (3, 2)])
def test_natgrad_map_jacobian__general_equals_tape_jacobian(M, L):
    eta1, eta2 = _eta(M, L, seed=M + L)
    J = natgrad_map_jacobian(eta1, eta2, symmetric=False, chunk_size=5)
    want = _tape_blocks(_gpflow_map, [eta1, eta2])
    for i in range(2):
        for j in range(2):
            np.testing.assert_allclose(J.block(i, j), want[i][j], rtol=1e-12, atol=1e-13)


shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


@pytest.mark.slow
@settings(max_examples=15)
@given(xshape=shapes, yshape=shapes, chunk=st.integers(1, 9), mode=st.sampled_from(["forward", "reverse"]), seed=st.integers(0, 10_000))
def test_jacobian_chunks__property_equals_tape_jacobian(xshape, yshape, chunk, mode, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=xshape)
    W = tf.constant(rng.normal(size=yshape + xshape))
    n = len(xshape)

    def f(x):
        lin = tf.tensordot(W, x, axes=n) if n else W * x
        return tf.tanh(lin) * tf.reduce_sum(x**2), tf.exp(0.3 * x)

    J = nd.jacobian(f, [x], chunk_size=chunk, mode=mode, compiled=True)
    want = _tape_blocks(f, [x])
    for i in range(2):
        np.testing.assert_allclose(J.block(i, 0), want[i][0], rtol=1e-12, atol=1e-13)


def test_jacobian__eager_small_path_equals_compiled_path():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=3), rng.normal(size=(2, 3))
    J_e = nd.jacobian(_mixed, [a, b], compiled=False)
    J_c = nd.jacobian(_mixed, [a, b], compiled=True)
    np.testing.assert_allclose(J_e.matrix, J_c.matrix, rtol=1e-13, atol=1e-14)


class _Scaled:
    """A callable whose value depends on Python state (like a layer with a float attribute)."""

    scale = 1.0

    def __call__(self, x):
        return self.scale * x @ x


@pytest.mark.parametrize("symmetric", [False, True])
def test_jacobian__a_reused_trace_follows_the_python_state_fn_reads(symmetric):
    """The third call reuses the second's compiled chunks; the state they froze must not leak into the answer.
    Oracle: d(s·X·X)/dX by hand, E ↦ s·(E·X + X·E), each column at rounding (rtol 1e-13: a few products of O(1))."""
    f, X = _Scaled(), np.array([[2.0, 0.3, 0.1], [0.3, 1.5, -0.2], [0.1, -0.2, 1.0]])
    for scale in (1.0, 2.0, 3.0, 4.0):
        f.scale = scale
        block = nd.jacobian(f, [X], symmetric=symmetric, compiled=None).block(0, 0)  # [3, 3, 3, 3]
        for a, b in np.ndindex(3, 3):
            E = np.zeros((3, 3))
            E[a, b] = 1.0
            if symmetric:  # the general block of a symmetric input is ½(∂y/∂X_ab + ∂y/∂X_ba)
                E = (E + E.T) / 2
            np.testing.assert_allclose(block[..., a, b], scale * (E @ X + X @ E), rtol=1e-13, atol=1e-14)


def test_jacobian__auto_mode_keeps_a_custom_gradient_that_forward_mode_would_ignore():
    """A straight-through tf.custom_gradient (round forward, identity backward): y = k·q(S), so ∂y/∂S_ab = k·E_ab,
    ½(E_ab + E_ba) for the symmetric input's general block (by hand). "auto" would take forward mode (6 vech columns
    < rows), which ignores the custom gradient and gives 0; every call must give the hand value."""

    @tf.custom_gradient
    def quantise(S):
        return tf.round(S * 10.0) / 10.0, lambda dy: dy

    S = np.array([[2.0, 0.31, 0.12], [0.31, 1.5, 0.2], [0.12, 0.2, 1.0]])
    for ks in ([1.0], list(range(1, 11))):  # 9 rows (eager first call, compiled second) and 90 rows (compiled)
        fn = lambda S, ks=ks: tf.concat([tf.reshape(k * quantise(S), [-1]) for k in ks], 0)  # noqa: E731
        for _ in range(2):
            block = nd.jacobian(fn, [S], symmetric=True).block(0, 0).reshape(len(ks), 3, 3, 3, 3)
            for a, b in np.ndindex(3, 3):
                E = np.zeros((3, 3))
                E[a, b] = 1.0
                want = np.stack([k * (E + E.T) / 2 for k in ks])
                np.testing.assert_array_equal(block[..., a, b], want)


def test_jacobian__a_gather_s_indexed_slices_gradient_is_a_dense_block():
    """tf.gather's gradient is an IndexedSlices: every path and assert_vjp_matches_jacobian take it (by hand: y = x[[0, 0, 1]])."""
    from natgrad_diag.testing import assert_vjp_matches_jacobian

    want, x = np.array([[1.0, 0, 0], [1, 0, 0], [0, 1, 0]]), np.array([1.0, 2.0, 3.0])
    for compiled in (False, True, None):
        np.testing.assert_array_equal(nd.jacobian(lambda t: tf.gather(t, [0, 0, 1]), [x], compiled=compiled).matrix, want)
    (g,) = assert_vjp_matches_jacobian(lambda t: tf.gather(t, [0, 0, 1]), [x], cotangents=[np.array([1.0, 1.0, 1.0])])
    np.testing.assert_array_equal(g, [2.0, 1.0, 0.0])


# ---- vech (symmetric) columns ---------------------------------------------------------------------


def test_vech_layout__maps_each_element_to_its_lower_triangle_column():
    index, scale, size = vech_layout((2, 3, 3))
    assert size == 2 * 6
    # (0, 2, 1) and (0, 1, 2) share column k(2, 1) = 2·3/2 + 1 = 4; batch 1 is offset by 6
    assert index[0 * 9 + 2 * 3 + 1] == index[0 * 9 + 1 * 3 + 2] == 4
    assert index[9 + 2 * 3 + 1] == 10
    assert scale[0 * 9 + 1 * 3 + 1] == 1.0 and scale[0 * 9 + 1 * 3 + 2] == 0.5
    assert sorted(set(index.tolist())) == list(range(12))


@pytest.mark.parametrize("M,L", [(4, 1), (3, 2)])
def test_natgrad_map_jacobian__vech_columns_are_symmetric_tangents_of_the_general_jacobian(M, L):
    """Stored column (a, b) = G·(E_ab + E_ba) contracted by hand; blocks = G symmetrised."""
    eta1, eta2 = _eta(M, L, seed=7)
    Jv = natgrad_map_jacobian(eta1, eta2)  # vech by default
    G = _tape_blocks(_gpflow_map, [eta1, eta2])  # the general Jacobian, independently
    K = M * (M + 1) // 2
    assert Jv.compact.shape == (M * L + L * M * M, M * L + L * K)
    assert Jv.block(1, 1).shape == (L, M, M, L, M, M)
    rows = np.concatenate([G[0][1].reshape(M * L, -1), G[1][1].reshape(L * M * M, -1)])  # [rows, L·M·M]
    tri = np.tril_indices(M)
    for l in range(L):
        for k, (a, b) in enumerate(zip(*tri)):
            E = np.zeros((L, M, M))
            E[l, a, b] += 1.0
            if a != b:
                E[l, b, a] += 1.0
            by_hand = rows @ E.ravel()
            np.testing.assert_allclose(Jv.compact[:, M * L + l * K + k], by_hand, rtol=1e-12, atol=1e-13)
    for i in range(2):
        Gs = 0.5 * (G[i][1] + np.swapaxes(G[i][1], -1, -2))
        np.testing.assert_allclose(Jv.block(i, 1), Gs, rtol=1e-12, atol=1e-13)
        # TensorFlow's Cholesky gradient is symmetrised, so here the symmetrised G is G itself
        np.testing.assert_allclose(Jv.block(i, 1), G[i][1], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(Jv.block(i, 0), G[i][0], rtol=1e-12, atol=1e-13)


def test_natgrad_map_jacobian__vech_column_matches_central_differences():
    M, L = 3, 1
    eta1, eta2 = _eta(M, L, seed=11)
    J = natgrad_map_jacobian(eta1, eta2)
    eps = 1e-6

    def flat(e2):
        m, vs = np_meanvarsqrt(eta1, e2)
        return np.concatenate([m.ravel(), vs.ravel()])

    assert len(J.compact_col_labels) == J.compact.shape[1] == M + M * (M + 1) // 2  # every vech column below
    for k, label in enumerate(J.compact_col_labels[M:]):
        a, b = np.tril_indices(M)[0][k], np.tril_indices(M)[1][k]
        d = np.zeros_like(eta2)
        d[0, a, b] += eps
        if a != b:
            d[0, b, a] += eps
        fd = (flat(eta2 + d) - flat(eta2 - d)) / (2 * eps)
        np.testing.assert_allclose(J.compact[:, M + k], fd, rtol=1e-6, atol=1e-7, err_msg=label)


def test_jacobian_vech__of_a_function_reading_one_triangle_gives_the_symmetrised_jacobian():
    """f(X) = X[0, 1] reads only the upper element: ∂f/∂X = e₀₁, and its symmetrised block is ½(e₀₁ + e₁₀)."""
    X = np.arange(9.0).reshape(3, 3)
    J = nd.jacobian(lambda x: x[0, 1] * 1.0, [X], symmetric=[True], compiled=True)
    want = np.zeros((3, 3))
    want[0, 1] = want[1, 0] = 0.5
    np.testing.assert_array_equal(J.block(0, 0), want)
    assert J.compact_col_labels[:3] == ("x0[0,0]", "x0[1,0]+[0,1]", "x0[1,1]")
    np.testing.assert_array_equal(J.compact[0], [0, 1, 0, 0, 0, 0])


def test_vech_jacobian__vjp_and_jvp_equal_tensorflow_and_finite_differences():
    M, L = 3, 2
    eta1, eta2 = _eta(M, L, seed=5)
    J = natgrad_map_jacobian(eta1, eta2)
    rng = np.random.default_rng(2)
    v1, v2 = rng.normal(size=(M, L)), rng.normal(size=(L, M, M))
    e1, e2 = tf.constant(eta1), tf.constant(eta2)
    with tf.GradientTape() as tape:
        tape.watch([e1, e2])
        ys = _gpflow_map(e1, e2)
    g1, g2 = tape.gradient(ys, [e1, e2], output_gradients=[tf.constant(v1), tf.constant(v2)])
    r1, r2 = J.vjp([v1, v2])
    np.testing.assert_allclose(r1, g1.numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(r2, g2.numpy(), rtol=1e-12, atol=1e-13)
    # J·u for a symmetric tangent u against central differences of the numpy map
    u1 = rng.normal(size=(M, L))
    A = rng.normal(size=(L, M, M))
    u2 = A + np.transpose(A, (0, 2, 1))
    eps = 1e-6
    plus, minus = np_meanvarsqrt(eta1 + eps * u1, eta2 + eps * u2), np_meanvarsqrt(eta1 - eps * u1, eta2 - eps * u2)
    got = J.jvp([u1, u2])
    for k in range(2):
        np.testing.assert_allclose(got[k], (plus[k] - minus[k]) / (2 * eps), rtol=1e-6, atol=1e-7)
    # and the same through the expanded general matrix
    np.testing.assert_allclose(
        np.concatenate([g.ravel() for g in got]), J.matrix @ np.concatenate([u1.ravel(), u2.ravel()]), rtol=1e-12, atol=1e-12
    )


def test_vech_jacobian__row_and_labels_of_the_general_matrix_are_kept():
    eta1, eta2 = _eta(3, 1, seed=9)
    Jv = natgrad_map_jacobian(eta1, eta2)
    Jg = natgrad_map_jacobian(eta1, eta2, symmetric=False)
    assert Jv.col_labels == Jg.col_labels and Jv.row_labels == Jg.row_labels
    assert Jv.matrix.shape == Jg.matrix.shape == Jv.shape == (3 + 9, 3 + 9)
    np.testing.assert_allclose(Jv.row("varsqrt[0,2,1]"), Jg.row("varsqrt[0,2,1]"), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(Jv.summed_gradient()[1], Jg.summed_gradient()[1], rtol=1e-12, atol=1e-13)


# ---- memory ---------------------------------------------------------------------------------------


def test_jacobian__memory_guard_counts_the_stored_vech_size():
    M = 20
    eta1, eta2 = _eta(M, 1, seed=0)
    general = jacobian_nbytes([(M, 1), (1, M, M)], [(M, 1), (1, M, M)], 8)
    vech = jacobian_nbytes([(M, 1), (1, M, M)], [(M, 1), (M * (M + 1) // 2,)], 8)
    limit = (general + vech) // 2
    J = natgrad_map_jacobian(eta1, eta2, max_bytes=limit)
    assert J.compact.nbytes == vech
    with pytest.raises(MemoryLimitError, match="max_bytes"):
        natgrad_map_jacobian(eta1, eta2, max_bytes=limit, symmetric=False)


_POINT = r"""
import numpy as np
import tensorflow as tf


def natgrad_map_point(M):
    # eta1 [M, 1], eta2 [1, M, M] from a random q(u) with S = A Aᵀ + I (the benchmark's fixture, here in numpy)
    from gpflow.optimizers.natgrad import meanvarsqrt_to_expectation

    rng = np.random.default_rng(M)
    A = rng.normal(size=(1, M, M)) / np.sqrt(M)
    S = A @ np.swapaxes(A, -1, -2) + np.eye(M)
    mu, sq = rng.normal(size=(M, 1)), np.linalg.cholesky(S)
    return meanvarsqrt_to_expectation(tf.constant(mu), tf.constant(sq))
"""


_PEAK = _POINT + r"""
import json, sys
import numpy as np
from natgrad_diag.step.jacobian import natgrad_map_jacobian
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
M = int(sys.argv[1])
natgrad_map_jacobian(*natgrad_map_point(6), symmetric=False, method="autodiff")
open("/proc/self/clear_refs", "w").write("5")
base = status("VmRSS")
J = natgrad_map_jacobian(*natgrad_map_point(M), symmetric=False, method="autodiff")
print(json.dumps({"above": status("VmHWM") - base, "nbytes": J.compact.nbytes}))
"""


@pytest.mark.slow
def test_jacobian__peak_memory_at_M80_is_under_one_and_a_half_jacobians():
    """Measured in a fresh process: VmHWM (reset after warm-up) minus the RSS baseline."""
    try:
        open("/proc/self/clear_refs", "w").write("5")
    except OSError:
        pytest.skip("cannot reset VmHWM here (/proc/self/clear_refs)")
    out = subprocess.run([sys.executable, "-c", _PEAK, "80"], capture_output=True, text=True, timeout=600, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["nbytes"] == (80 + 6400) ** 2 * 8
    assert r["above"] <= 1.5 * r["nbytes"], r


# ---- no retracing ---------------------------------------------------------------------------------


def test_jacobian__repeated_calls_of_one_shape_trace_once():
    eta1, eta2 = _eta(5, 1, seed=1)
    natgrad_map_jacobian(eta1, eta2, chunk_size=11, method="autodiff")
    before = trace_count(TRACE_KIND)
    for seed in range(4):
        e1, e2 = _eta(5, 1, seed=seed)  # new values, same shapes
        natgrad_map_jacobian(e1, e2, chunk_size=11, method="autodiff")
    assert trace_count(TRACE_KIND) == before
    natgrad_map_jacobian(*_eta(6, 1, seed=0), chunk_size=11, method="autodiff")  # a new shape traces once more
    assert trace_count(TRACE_KIND) == before + 1


def test_jacobian__a_function_with_python_control_flow_on_a_tensor_is_compiled_by_autograph_not_run_eagerly():
    def f(x):  # the `if` on a tensor: only AutoGraph can trace it
        if tf.reduce_sum(x) > 0.0:
            return x**3
        return -x

    x = np.linspace(0.5, 1.5, 3)
    before = trace_count(TRACE_KIND)
    J = nd.jacobian(f, [x], compiled=True)
    # the plain trace that meets the `if` counts one; the eager tape would count no more, AutoGraph's trace does
    assert trace_count(TRACE_KIND) - before == 2
    np.testing.assert_allclose(J.block(0, 0), np.diag(3 * x**2), rtol=1e-14)  # d(x³)/dx = diag(3x²), by hand


# ---- bad input ------------------------------------------------------------------------------------


def test_jacobian__bad_symmetric_flags_are_refused_with_the_argument_named():
    with pytest.raises(InputError) as e:
        nd.jacobian(tf.sin, [np.ones((2, 2))], symmetric=[True, False])
    assert "symmetric needs one flag per input" in str(e.value) and "Argument: symmetric" in str(e.value)
    with pytest.raises(ShapeMismatchError) as e:
        nd.jacobian(tf.sin, [np.ones((2, 3))], symmetric=[True])
    assert "[..., M, M]" in str(e.value) and "[2, 3]" in str(e.value)


@pytest.mark.parametrize("kwargs,fragment", [({"mode": "sideways"}, "mode"), ({"chunk_size": 0}, "chunk_size"), ({"chunk_size": 2.5}, "chunk_size")])
def test_jacobian__bad_mode_or_chunk_size_is_refused(kwargs, fragment):
    with pytest.raises(InputError, match=rf"Argument: {fragment}\n"):
        nd.jacobian(tf.sin, [np.ones(3)], **kwargs)


_FLOAT32 = _POINT + r"""
import numpy as np
import tensorflow as tf
from natgrad_diag.step.jacobian import natgrad_map_jacobian
e1, e2 = natgrad_map_point(9)
for sym in (True, False):
    J32 = natgrad_map_jacobian(tf.cast(e1, tf.float32), tf.cast(e2, tf.float32), symmetric=sym, chunk_size=16)
    J64 = natgrad_map_jacobian(e1, e2, symmetric=sym, chunk_size=16)
    assert J32.compact.dtype == np.float32
    print(float(np.max(np.abs(J32.compact - J64.compact)) / np.max(np.abs(J64.compact))))
"""


@pytest.mark.slow
def test_natgrad_map_jacobian__float32_runs_and_agrees_with_float64():
    """TensorFlow's pfor crashes the process on a float32 Cholesky gradient: run it in a subprocess."""
    out = subprocess.run([sys.executable, "-c", _FLOAT32], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    errors = [float(v) for v in out.stdout.split()]
    assert len(errors) == 2 and max(errors) < 1e-5


# ---- the closed-form natgrad-map Jacobian ------------------------------------------------------------


@pytest.mark.parametrize("M,L", [(1, 1), (1, 3), (4, 2), (7, 1)])
@pytest.mark.parametrize("symmetric", [True, False], ids=["vech", "general"])
def test_natgrad_map_jacobian__closed_form_equals_tensorflow(M, L, symmetric):
    """The closed-form JVP columns against TensorFlow's own Jacobian (tape.jacobian, and the autodiff path)."""
    eta1, eta2 = _eta(M, L, seed=10 * M + L)
    J = natgrad_map_jacobian(eta1, eta2, symmetric=symmetric, chunk_size=3)
    A = natgrad_map_jacobian(eta1, eta2, symmetric=symmetric, method="autodiff")
    want = _tape_blocks(_gpflow_map, [eta1, eta2])
    np.testing.assert_allclose(J.compact, A.compact, rtol=1e-11, atol=1e-12)
    for i in range(2):
        for j in range(2):
            np.testing.assert_allclose(J.block(i, j), want[i][j], rtol=1e-11, atol=1e-12, err_msg=f"block {i},{j}")
    assert J.compact.shape == (M * L + L * M * M, M * L + L * (M * (M + 1) // 2 if symmetric else M * M))


def test_natgrad_map_jacobian__closed_form_float32_against_float64():
    eta1, eta2 = _eta(4, 2, seed=3)
    J64 = natgrad_map_jacobian(eta1, eta2)
    J32 = natgrad_map_jacobian(eta1.astype(np.float32), eta2.astype(np.float32))
    assert J32.dtype == np.float32
    np.testing.assert_allclose(J32.compact, J64.compact, rtol=1e-3, atol=1e-4)


def test_natgrad_map_jacobian__not_positive_definite_is_named():
    from natgrad_diag.exceptions import SingularCovarianceError

    eta1 = np.array([[2.0], [0.0]])
    eta2 = np.eye(2)[None]  # S = eta2 - eta1 eta1ᵀ has eigenvalue 1 - 4 < 0
    with pytest.raises(SingularCovarianceError, match=r"latent GP 0(.|\n)*Argument:\s+eta2"):
        natgrad_map_jacobian(eta1, eta2)
    with pytest.raises(InputError, match=r"Argument: method\n"):
        natgrad_map_jacobian(eta1, eta2, method="magic")


def test_block_jacobian_from_compact__leaves_the_callers_array_writeable_and_refuses_a_wrong_shape():
    A = np.array([[2.0, 0.0], [1.0, 3.0]])
    J = nd.BlockJacobian.from_compact(A, ["y"], ["x"], [(2,)], [(2,)])
    A[0, 0] = 5.0  # the caller's array is still theirs to write
    assert not J.compact.flags.writeable
    with pytest.raises(ShapeMismatchError, match=r"Argument:\s+compact(.|\n)*\[2, 2\](.|\n)*\[3, 3\]"):
        nd.BlockJacobian.from_compact(np.arange(9.0).reshape(3, 3), ["y"], ["x"], [(2,)], [(2,)])
