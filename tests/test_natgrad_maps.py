"""The O(M⁴) closed-form natgrad-map Jacobian against tape.jacobian, central differences and the autodiff path;
its input validation."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from natgrad_diag.exceptions import (
    DTypeMismatchError,
    InputError,
    NonFiniteError,
    ShapeMismatchError,
    SingularCovarianceError,
)
from natgrad_diag.step.jacobian import natgrad_map_jacobian
from tests.conftest import np_meanvarsqrt, random_q


def _eta(M: int, L: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    q_mu, q_sqrt = random_q(M, L, seed=seed)
    eta2 = q_sqrt @ np.transpose(q_sqrt, (0, 2, 1)) + np.einsum("ml,nl->lmn", q_mu, q_mu)
    return q_mu, eta2


def _tape_blocks(e1: np.ndarray, e2: np.ndarray) -> list[list[np.ndarray]]:
    """The oracle: TensorFlow's tape.jacobian of GPflow's expectation_to_meanvarsqrt, eagerly."""
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    xs = [tf.constant(e1), tf.constant(e2)]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xs)
        ys = expectation_to_meanvarsqrt(*xs)
    zero = tf.UnconnectedGradients.ZERO
    return [[tape.jacobian(y, x, unconnected_gradients=zero).numpy() for x in xs] for y in ys]


@pytest.mark.parametrize("M,L", [(2, 3), (5, 3), (6, 2), (9, 1)])
@pytest.mark.parametrize("symmetric", [True, False], ids=["vech", "general"])
def test_natgrad_map_jacobian__closed_form_equals_tape_jacobian_up_to_three_latents(M, L, symmetric):
    """Tolerance: both are O(M) products of well-conditioned factors (κ(S) < 50 here): 1e-11 is ~10⁴ ε."""
    e1, e2 = _eta(M, L, seed=100 * M + L)
    J = natgrad_map_jacobian(e1, e2, symmetric=symmetric)
    want = _tape_blocks(e1, e2)
    for i in range(2):
        for j in range(2):
            np.testing.assert_allclose(J.block(i, j), want[i][j], rtol=1e-11, atol=1e-12, err_msg=f"block {i},{j}")
    # varsqrt is lower triangular, so its rows above the diagonal are zero in every column
    upper = np.triu(np.ones((M, M), dtype=bool), 1)
    assert not np.any(J.block(1, 0)[:, upper]) and not np.any(J.block(1, 1)[:, upper])


@pytest.mark.parametrize("symmetric", [True, False], ids=["vech", "general"])
def test_natgrad_map_jacobian__closed_form_equals_autodiff_method(symmetric):
    e1, e2 = _eta(7, 2, seed=5)
    J = natgrad_map_jacobian(e1, e2, symmetric=symmetric)
    A = natgrad_map_jacobian(e1, e2, symmetric=symmetric, method="autodiff")
    assert J.compact.shape == A.compact.shape
    np.testing.assert_allclose(J.compact, A.compact, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("symmetric", [True, False], ids=["vech", "general"])
def test_natgrad_map_jacobian__every_column_matches_central_differences(symmetric):
    """Every stored column (η₁ and η₂, L = 2) against numpy central differences of (mean, chol(η₂ − η₁η₁ᵀ)).

    Step 1e-5 on entries of size ~1: truncation O(h²·|f'''|) ~ 1e-10, rounding O(ε/h) ~ 1e-11; atol 1e-7
    leaves a wide margin while a wrong column (an error of size ~0.1) cannot pass.
    """
    M, L = 4, 2
    e1, e2 = _eta(M, L, seed=21)
    J = natgrad_map_jacobian(e1, e2, symmetric=symmetric)
    h = 1e-5

    def flat(a1: np.ndarray, a2: np.ndarray) -> np.ndarray:
        m, vs = np_meanvarsqrt(a1, a2)
        return np.concatenate([m.ravel(), vs.ravel()])

    tangents = []
    for m in range(M):
        for l in range(L):
            d1 = np.zeros_like(e1)
            d1[m, l] = 1.0
            tangents.append((d1, np.zeros_like(e2)))
    pairs = list(zip(*np.tril_indices(M))) if symmetric else [(a, b) for a in range(M) for b in range(M)]
    for l in range(L):
        for a, b in pairs:
            d2 = np.zeros_like(e2)
            if symmetric:  # the stored column is the tangent E_ab + E_ba (E_aa on the diagonal)
                d2[l, a, b] = d2[l, b, a] = 1.0
            else:  # TensorFlow's symmetrised gradient: the column of (a, b) is the tangent ½(E_ab + E_ba)
                d2[l, a, b] += 0.5
                d2[l, b, a] += 0.5
            tangents.append((np.zeros_like(e1), d2))
    assert len(tangents) == J.compact.shape[1]
    for c, (d1, d2) in enumerate(tangents):
        fd = (flat(e1 + h * d1, e2 + h * d2) - flat(e1 - h * d1, e2 - h * d2)) / (2 * h)
        np.testing.assert_allclose(J.compact[:, c], fd, rtol=1e-6, atol=1e-7, err_msg=J.compact_col_labels[c])


def test_natgrad_map_jacobian__ill_conditioned_q_matches_autodiff_to_the_rounding_bound():
    """κ(S) ~ 1e6: both paths round with ε·κ; the bound 1e4·ε·κ·max|J| is what the test allows."""
    rng = np.random.default_rng(3)
    M = 8
    Q, _ = np.linalg.qr(rng.normal(size=(M, M)))
    S = Q @ np.diag(np.logspace(0, -6, M)) @ Q.T
    e1 = rng.normal(size=(M, 1))
    e2 = (S + e1 @ e1.T)[None]
    e2 = 0.5 * (e2 + np.swapaxes(e2, -1, -2))
    J = natgrad_map_jacobian(e1, e2)
    A = natgrad_map_jacobian(e1, e2, method="autodiff")
    bound = 1e4 * np.finfo(np.float64).eps * 1e6 * np.max(np.abs(A.compact))
    assert np.max(np.abs(J.compact - A.compact)) <= bound


# ---- input validation ------------------------------------------------------------------------------


def _message(excinfo: pytest.ExceptionInfo) -> str:
    return str(excinfo.value)


@pytest.mark.parametrize("method", ["closed_form", "autodiff"])
def test_natgrad_map_jacobian__nan_or_inf_is_refused_with_the_argument_named(method):
    e1, e2 = _eta(3, 1, seed=0)
    bad1 = e1.copy()
    bad1[1, 0] = np.nan
    with pytest.raises(NonFiniteError) as ei:
        natgrad_map_jacobian(bad1, e2, method=method)
    assert "eta1 contains 1 NaN and 0 Inf" in _message(ei) and "Argument: eta1" in _message(ei)
    bad2 = e2.copy()
    bad2[0, 2, 2] = np.inf
    with pytest.raises(NonFiniteError, match=r"eta2 contains 0 NaN and 1 Inf(.|\n)*Argument:\s+eta2"):
        natgrad_map_jacobian(e1, bad2, method=method)


def test_natgrad_map_jacobian__mismatched_m_or_l_is_refused():
    e1, e2 = _eta(3, 2, seed=1)
    with pytest.raises(ShapeMismatchError) as ei:
        natgrad_map_jacobian(e1[:2], e2)  # M = 2 against eta2's M = 3
    msg = _message(ei)
    assert "eta2 does not match eta1." in msg and "Argument: eta2" in msg
    assert "[L, M, M] = [2, 2, 2]" in msg and "[2, 3, 3]" in msg
    with pytest.raises(ShapeMismatchError, match="eta2 does not match eta1"):
        natgrad_map_jacobian(e1, e2[:1])  # L = 1 against eta1's L = 2
    with pytest.raises(ShapeMismatchError, match=r"eta1 has the wrong rank(.|\n)*\[M, L\]"):
        natgrad_map_jacobian(e1[:, 0], e2)
    with pytest.raises(ShapeMismatchError, match=r"eta2 has the wrong rank(.|\n)*\[L, M, M\]"):
        natgrad_map_jacobian(e1, e2[0])


def test_natgrad_map_jacobian__non_symmetric_eta2_is_refused_but_rounding_is_not():
    e1, e2 = _eta(4, 2, seed=2)
    bad = e2.copy()
    bad[1, 3, 0] += 1e-3
    with pytest.raises(InputError) as ei:
        natgrad_map_jacobian(e1, bad)
    msg = _message(ei)
    assert "eta2 is not symmetric." in msg and "Argument: eta2" in msg
    assert "|eta2[1, 0, 3] − eta2[1, 3, 0]| = 0.001" in msg
    # an asymmetry of a few ε·max|η₂| is the rounding of forming η₂, and passes
    ok = e2.copy()
    ok[0, 2, 1] += 4 * np.finfo(np.float64).eps * np.max(np.abs(e2))
    natgrad_map_jacobian(e1, ok)


def test_natgrad_map_jacobian__not_positive_definite_or_mixed_dtypes_are_refused():
    e1 = np.array([[2.0], [0.0]])
    with pytest.raises(SingularCovarianceError, match=r"latent GP 0(.|\n)*Argument:\s+eta2"):
        natgrad_map_jacobian(e1, np.eye(2)[None], method="autodiff")  # S = eta2 − eta1 eta1ᵀ has eigenvalue −3
    e1, e2 = _eta(3, 1, seed=4)
    with pytest.raises(DTypeMismatchError, match=r"eta2 has another dtype than eta1(.|\n)*float64"):
        natgrad_map_jacobian(e1, e2.astype(np.float32))
    e1, e2 = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[[2, 0], [0, 3]], [[3, 1], [1, 2]]])  # an integer eta2
    np.testing.assert_array_equal(natgrad_map_jacobian(e1, e2).matrix, natgrad_map_jacobian(e1, e2.astype(float)).matrix)
    f32 = e1.astype(np.float32)  # integers take the float's dtype (no DTypeMismatchError against float32)
    np.testing.assert_array_equal(natgrad_map_jacobian(f32, e2).matrix, natgrad_map_jacobian(f32, e2.astype(np.float32)).matrix)
    with pytest.raises(DTypeMismatchError, match=r"eta1 is not real numbers(.|\n)*complex128"):
        natgrad_map_jacobian(e1 + 0j, e2)
    with pytest.raises(InputError, match=r"symmetric must be True or False(.|\n)*Got: +'no'"):  # a truthy string
        natgrad_map_jacobian(e1, e2, symmetric="no")
