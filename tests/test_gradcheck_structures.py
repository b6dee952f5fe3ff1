"""Tests of natgrad_diag.gradcheck's structures: symmetric and lower-triangular inputs, by closed forms."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import natgrad as ng

import natgrad_diag as nd
from natgrad_diag.exceptions import JacobianMismatchError
from tests.gradcheck_points import gpflow_points


def test_check_gradients__eta2_general_fails_with_hint_symmetric_passes() -> None:
    eta1, eta2 = gpflow_points(4, 2, seed=7)["expectation"]
    general = nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2], structure="general")
    symmetric = nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2], structure={"eta2": "symmetric"})
    assert symmetric.passed and symmetric.structures == ("general", "symmetric")
    assert [r.passed for r in general.rows] == [True, True, True, False]
    bad = general.row("varsqrt", "eta2")
    # TensorFlow's Cholesky gradient is symmetrised: below the diagonal a one-entry difference is 2·g_ab
    assert bad.worst_entry.startswith("∂varsqrt[")
    a, b = (int(k) for k in bad.worst_entry.split("/∂eta2[")[1].rstrip("]").split(",")[1:])
    assert a > b
    np.testing.assert_allclose(bad.numerical, 2 * bad.analytical, rtol=1e-6)
    assert "looks symmetric" in bad.hint and "structure='symmetric'" in bad.hint
    with pytest.raises(JacobianMismatchError, match="structure='symmetric'") as info:
        nd.assert_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2], structure="general", mode="fast")
    assert "input 1 (eta2" in str(info.value)


@tf.custom_gradient
def _lower_entry_symmetrised(S: tf.Tensor):  # noqa: ANN202
    """y = S[1, 0] (reads one entry below the diagonal), with a symmetrised gradient like Cholesky's."""

    def grad(dy: tf.Tensor) -> tf.Tensor:
        E = tf.constant([[0.0, 0.5], [0.5, 0.0]], S.dtype)
        return dy * E

    return S[1, 0], grad


def test_check_gradients__symmetrised_gradient_closed_form() -> None:
    S = np.array([[2.0, 0.3], [0.3, 1.0]])
    general = nd.check_gradients(_lower_entry_symmetrised, [S], structure="general")
    # closed form: ∂y/∂S[1,0] = 1 and ∂y/∂S[0,1] = 0 (numerical) against g = 0.5 on both (analytical);
    # both entries are off by 0.5
    expected = {"∂y0/∂x0[1,0]": (1.0, 0.5), "∂y0/∂x0[0,1]": (0.0, 0.5)}
    row = general.rows[0]
    assert not row.passed and row.worst_entry in expected
    np.testing.assert_allclose([row.numerical, row.analytical], expected[row.worst_entry], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(row.max_abs_error, 0.5, rtol=1e-9)
    symmetric = nd.check_gradients(_lower_entry_symmetrised, [S], structure="symmetric")
    assert symmetric.passed and symmetric.rows[0].compared == 3  # (0,0), (1,0)+(0,1), (1,1)


@tf.custom_gradient
def _tril_double_wrong(A: tf.Tensor):  # noqa: ANN202
    """2·tril(A) (ignores the upper triangle), with a gradient that leaks above the diagonal."""

    def grad(dy: tf.Tensor) -> tf.Tensor:
        return 2.0 * dy  # should be 2·tril(dy)

    return 2.0 * tf.linalg.band_part(A, -1, 0), grad


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__lower_triangular_needs_zero_gradient_above_diagonal(mode: str) -> None:
    A = np.tril(np.arange(1.0, 10.0).reshape(3, 3))
    report = nd.check_gradients(_tril_double_wrong, [A], structure="lower_triangular", mode=mode)
    row = report.rows[0]
    assert not row.passed
    assert row.worst_entry.endswith("(above diagonal)")
    # closed form: 2·tril ignores A[a, b], a < b: numerical 0; the leaked gradient is 2
    np.testing.assert_allclose([row.numerical, row.analytical], [0.0, 2.0], atol=1e-9)
    if mode == "fast":
        assert "strictly upper" in row.method


def test_check_gradients__lower_triangular_passes_where_gradient_is_masked() -> None:
    # GPflow's meanvarsqrt_to_natural reads q_sqrt through triangular_solve (lower triangle only)
    m, A = gpflow_points(3, 2, seed=1)["meanvarsqrt"]
    report = nd.check_gradients(ng.meanvarsqrt_to_natural, [m, A])
    assert report.structures == ("general", "lower_triangular") and report.passed
    grads = tf.GradientTape  # the analytical gradient above the diagonal is exactly zero (TensorFlow masks it)
    x = [tf.constant(m), tf.constant(A)]
    with grads() as tape:
        tape.watch(x)
        out = ng.meanvarsqrt_to_natural(*x)
    g = tape.gradient(out, x[1]).numpy()
    assert np.all(np.triu(g, 1) == 0)


def test_symmetric_structure__a_point_that_is_not_symmetric_is_refused_and_one_symmetric_to_rounding_is_not():
    """Only g_ab + g_ba is compared: fn(X) = Σ A ⊙ X with the gradient Aᵀ (by hand ∂/∂X = A) passed at a point that
    is not symmetric, where it is wrong. At a symmetric point (B·Bᵀ formed in floating point) Aᵀ and A give the same
    change along every E_ab + E_ba, so there it passes, rightly."""
    import tensorflow as tf

    import natgrad_diag as nd
    from natgrad_diag.exceptions import InputError

    rng = np.random.default_rng(0)
    A = rng.normal(size=(4, 4))

    @tf.custom_gradient
    def fn(X):
        return tf.reduce_sum(A * X), lambda dy: dy * tf.transpose(tf.constant(A))

    with pytest.raises(InputError, match=r"not symmetric(.|\n)*Argument:\s+structure for x0"):
        nd.check_gradients(fn, [rng.normal(size=(4, 4))], structure="symmetric")
    B = rng.normal(size=(4, 7))
    assert nd.check_gradients(fn, [B @ B.T], structure="symmetric").passed
