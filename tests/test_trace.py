"""natgrad_trace against GPflow's own functions, GPflow's optimizer, and numpy finite differences."""

from __future__ import annotations

import copy

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import NaturalGradient, XiNat, XiSqrtMeanVar
from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation

import natgrad_diag as nd
from natgrad_diag.exceptions import (
    DTypeMismatchError,
    InputError,
    NonFiniteError,
    ShapeMismatchError,
    SingularCovarianceError,
    StepFailedError,
    UnsupportedModelError,
)
from tests.conftest import np_meanvarsqrt, random_q

XI = {"XiNat": XiNat, "XiSqrtMeanVar": XiSqrtMeanVar}


def _params(q_mu: np.ndarray, q_sqrt: np.ndarray) -> tuple[gpflow.Parameter, gpflow.Parameter]:
    return gpflow.Parameter(q_mu), gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular())


def _grads(q_mu: gpflow.Parameter, q_sqrt: gpflow.Parameter, seed: int, scale: float = 0.1) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(seed)
    return (
        tf.constant(rng.normal(size=q_mu.unconstrained_variable.shape) * scale),
        tf.constant(rng.normal(size=q_sqrt.unconstrained_variable.shape) * scale),
    )


def test_seed_scenario__is_the_users_setup_and_fresh_each_call():
    a, b = nd.seed_scenario(), nd.seed_scenario()
    assert a.q_mu is not b.q_mu and a.q_sqrt is not b.q_sqrt
    np.testing.assert_array_equal(a.q_mu.numpy(), [[0.93350756], [0.15833747], [0.23830378], [0.28742445], [0.14999759]])
    np.testing.assert_array_equal(a.q_sqrt.numpy(), np.eye(5)[None])
    assert a.q_mu.dtype == tf.float64 and a.q_sqrt.unconstrained_variable.shape == (1, 15)
    np.testing.assert_array_equal(a.q_mu_grad.numpy(), a.q_mu.numpy() * 0.33)
    np.testing.assert_array_equal(a.q_sqrt_grad.numpy(), a.q_sqrt.unconstrained_variable.numpy())


def test_natgrad_trace__seed_scenario_equals_the_users_snippet():
    """The user's code, run as written with GPflow's functions, gives the trace's numbers."""
    s = nd.seed_scenario()
    q_mu, q_sqrt = s.q_mu, s.q_sqrt
    q_mu_grad = q_mu.unconstrained_variable * 0.33
    q_sqrt_grad = q_sqrt.unconstrained_variable
    dL_dmean = gpflow.base._to_constrained(q_mu_grad, q_mu.transform)
    dL_dvarsqrt = gpflow.base._to_constrained(q_sqrt_grad, q_sqrt.transform)
    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch([q_mu.unconstrained_variable, q_sqrt.unconstrained_variable])
        eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt)
        meanvarsqrt = expectation_to_meanvarsqrt(eta1, eta2)
    dL_deta1, dL_deta2 = tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=[dL_dmean, dL_dvarsqrt])
    dtheta_deta1, dtheta_deta2 = tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=None)

    t = nd.natgrad_trace(*s)
    for name, want in [
        ("eta1", eta1), ("eta2", eta2), ("dL_dmean", dL_dmean), ("dL_dvarsqrt", dL_dvarsqrt),
        ("dL_deta1", dL_deta1), ("dL_deta2", dL_deta2),
        ("dtheta_deta1", dtheta_deta1), ("dtheta_deta2", dtheta_deta2),
    ]:  # fmt: skip
        np.testing.assert_allclose(getattr(t, name), want.numpy(), rtol=0, atol=1e-14, err_msg=name)
    # And the naive product really differs in this scenario.
    assert np.max(np.abs(t.dtheta_deta1 * q_mu_grad.numpy() - t.dL_deta1)) > 0.1


def _fd_dL_deta(t: nd.NatGradTrace, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Central differences of ℓ(η) = <dL/dmean, mean(η)> + <dL/dvarsqrt, varsqrt(η)>, numpy forward map.

    For η₂ the tangent is symmetric (E_ij + E_ji, or E_ii), so the directional derivative equals
    g_ij + g_ji (g_ii on the diagonal) of a symmetric gradient g.
    """

    def ell(e1: np.ndarray, e2: np.ndarray) -> float:
        m, vs = np_meanvarsqrt(e1, e2)
        return float(np.sum(t.dL_dmean * m) + np.sum(t.dL_dvarsqrt * vs))

    g1 = np.zeros_like(t.eta1)
    for idx in np.ndindex(*t.eta1.shape):
        d = np.zeros_like(t.eta1)
        d[idx] = eps
        g1[idx] = (ell(t.eta1 + d, t.eta2) - ell(t.eta1 - d, t.eta2)) / (2 * eps)
    g2 = np.zeros_like(t.eta2)
    L, M, _ = t.eta2.shape
    for l in range(L):
        for i in range(M):
            for j in range(i + 1):
                d = np.zeros_like(t.eta2)
                d[l, i, j] += eps
                if i != j:
                    d[l, j, i] += eps
                dd = (ell(t.eta1, t.eta2 + d) - ell(t.eta1, t.eta2 - d)) / (2 * eps)
                if i == j:
                    g2[l, i, i] = dd
                else:
                    g2[l, i, j] = g2[l, j, i] = dd / 2
    return g1, g2


@pytest.mark.parametrize("M,L", [(5, 1), (3, 3), (1, 2)])
def test_natgrad_trace__dL_deta_matches_finite_differences(M, L):
    q_mu, q_sqrt = _params(*random_q(M, L, seed=M + 10 * L))
    t = nd.natgrad_trace(q_mu, q_sqrt, *_grads(q_mu, q_sqrt, seed=1, scale=1.0), gamma=1e-3)
    g1, g2 = _fd_dL_deta(t)
    np.testing.assert_allclose(t.dL_deta1, g1, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(t.dL_deta2, g2, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("xi_name", ["XiNat", "XiSqrtMeanVar"])
@pytest.mark.parametrize("L", [1, 3])
@pytest.mark.parametrize("gamma", [1.0, 0.1])
def test_natgrad_trace__new_params_equal_gpflow_natural_gradient(xi_name, L, gamma):
    """GPflow's public optimizer, on copies, with a linear loss whose gradients are the given ones."""
    M = 4
    q_mu, q_sqrt = _params(*random_q(M, L, seed=L))
    g_mu, g_sq = _grads(q_mu, q_sqrt, seed=2)
    before = [q_mu.unconstrained_variable.numpy().copy(), q_sqrt.unconstrained_variable.numpy().copy()]

    t = nd.natgrad_trace(q_mu, q_sqrt, g_mu, g_sq, gamma=gamma, xi_transform=XI[xi_name]())

    mu_c, sq_c = copy.deepcopy(q_mu), copy.deepcopy(q_sqrt)

    def loss() -> tf.Tensor:
        return tf.reduce_sum(g_mu * mu_c.unconstrained_variable) + tf.reduce_sum(g_sq * sq_c.unconstrained_variable)

    NaturalGradient(gamma=gamma, xi_transform=XI[xi_name]()).minimize(loss, [(mu_c, sq_c)])
    np.testing.assert_allclose(t.new_q_mu, mu_c.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.new_q_sqrt, sq_c.numpy(), rtol=0, atol=1e-12)
    assert np.max(np.abs(t.new_q_mu - q_mu.numpy())) > 1e-3  # the step moved something
    # Read-only: bit-identical parameters.
    np.testing.assert_array_equal(q_mu.unconstrained_variable.numpy(), before[0])
    np.testing.assert_array_equal(q_sqrt.unconstrained_variable.numpy(), before[1])


def test_natgrad_trace__seed_scenario_step_equals_gpflow():
    s = nd.seed_scenario()
    t = nd.natgrad_trace(*s, gamma=1.0)
    mu_c, sq_c = copy.deepcopy(s.q_mu), copy.deepcopy(s.q_sqrt)
    NaturalGradient(gamma=1.0)._natgrad_apply_gradients(s.q_mu_grad, s.q_sqrt_grad, mu_c, sq_c)
    np.testing.assert_allclose(t.new_q_mu, mu_c.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.new_q_sqrt, sq_c.numpy(), rtol=0, atol=1e-12)
    # Closed form for XiNat: θ₂' = θ₂ − dL/dη₂ = −½I − ½I = −I, so S' = ½I and q_sqrt' = I/√2.
    np.testing.assert_allclose(t.new_q_sqrt, np.eye(5)[None] / np.sqrt(2), atol=1e-12)


def test_natgrad_trace__accepts_plain_arrays_with_identity_transform():
    q_mu, q_sqrt = random_q(3, 2, seed=5)
    rng = np.random.default_rng(0)
    g_mu, g_sq = rng.normal(size=(3, 2)) * 0.1, np.tril(rng.normal(size=(2, 3, 3))) * 0.1
    t = nd.natgrad_trace(q_mu, q_sqrt, g_mu, g_sq)
    np.testing.assert_array_equal(t.dL_dmean, g_mu)
    np.testing.assert_array_equal(t.dL_dvarsqrt, g_sq)
    np.testing.assert_allclose(t.eta2, q_sqrt @ np.transpose(q_sqrt, (0, 2, 1)) + np.einsum("ml,nl->lmn", q_mu, q_mu), atol=1e-13)


# ---------------------------------------------------------------------------------------------- bad input


def test_natgrad_trace__mismatched_M__names_q_sqrt_and_both_shapes():
    q_mu = gpflow.Parameter(np.zeros((5, 1)))
    q_sqrt = gpflow.Parameter(np.eye(4)[None], transform=gpflow.utilities.triangular())
    with pytest.raises(ShapeMismatchError) as e:
        nd.natgrad_trace(q_mu, q_sqrt, np.zeros((5, 1)), np.zeros((1, 10)))
    assert str(e.value) == (
        "Shape mismatch. q_mu and q_sqrt disagree on M (inducing points) or L (latent GPs).\n"
        "  Argument: q_sqrt\n"
        "    Expected: [L, M, M] = [1, 5, 5] (from q_mu [5, 1])\n"
        "    Actual:   [1, 4, 4]\n"
        "  To fix: pass the q_mu and q_sqrt of the same variational distribution."
    )
    assert isinstance(e.value, ValueError) and isinstance(e.value, nd.NatGradDiagError)


def test_natgrad_trace__an_m_by_m_q_sqrt_without_the_latent_axis_is_not_called_q_diag():
    q_mu = gpflow.Parameter(np.zeros((5, 1)))
    q_sqrt = gpflow.Parameter(np.eye(5))  # [M, M]: the L axis forgotten, not q_diag's [M, L]
    with pytest.raises(ShapeMismatchError, match=r"Expected: \[L, M, M\] = \[1, 5, 5\](.|\n)*q_sqrt\[None\]") as e:
        nd.natgrad_trace(q_mu, q_sqrt, np.zeros((5, 1)), np.zeros((5, 5)))
    assert "q_diag" not in str(e.value)


def test_natgrad_trace__q_diag__says_gpflow_does_not_support_it():
    q_mu = gpflow.Parameter(np.zeros((5, 1)))
    q_sqrt = gpflow.Parameter(np.ones((5, 1)), transform=gpflow.utilities.positive())
    with pytest.raises(UnsupportedModelError, match=r"q_diag=True.*full\s+covariance"):
        nd.natgrad_trace(q_mu, q_sqrt, np.zeros((5, 1)), np.zeros((5, 1)))


def test_natgrad_trace__gradient_of_wrong_shape__names_the_unconstrained_shape():
    s = nd.seed_scenario()
    with pytest.raises(ShapeMismatchError) as e:
        nd.natgrad_trace(s.q_mu, s.q_sqrt, s.q_mu_grad, np.zeros((1, 5, 5)))
    msg = str(e.value)
    assert "q_sqrt_grad" in msg and "[1, 15]" in msg and "[1, 5, 5]" in msg and "unconstrained" in msg


def test_natgrad_trace__float32_gradient_for_float64_parameters():
    s = nd.seed_scenario()
    with pytest.raises(DTypeMismatchError, match=r"q_mu_grad(.|\n)*float64(.|\n)*float32"):
        nd.natgrad_trace(s.q_mu, s.q_sqrt, tf.cast(s.q_mu_grad, tf.float32), s.q_sqrt_grad)


@pytest.mark.parametrize("where", ["q_mu", "q_sqrt", "q_mu_grad", "q_sqrt_grad"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_natgrad_trace__non_finite_input__names_the_argument(where, bad):
    s = nd.seed_scenario()
    # plain arrays: identity transforms, so q_sqrt_grad is [L, M, M]
    args = {"q_mu": s.q_mu.numpy(), "q_sqrt": s.q_sqrt.numpy(), "q_mu_grad": s.q_mu_grad.numpy(), "q_sqrt_grad": np.zeros((1, 5, 5))}
    args[where] = args[where].copy()
    args[where].flat[0] = bad
    with pytest.raises(NonFiniteError) as e:
        nd.natgrad_trace(args["q_mu"], args["q_sqrt"], args["q_mu_grad"], args["q_sqrt_grad"])
    assert f"Argument: {where}\n" in str(e.value)


def test_natgrad_trace__zero_on_q_sqrt_diagonal__reported_not_nan():
    q_mu = gpflow.Parameter(np.zeros((3, 1)))
    q_sqrt = gpflow.Parameter(np.diag([1.0, 0.0, 1.0])[None], transform=gpflow.utilities.triangular())
    with pytest.raises(SingularCovarianceError, match=r"q_sqrt\[0, 1, 1\]"):
        nd.natgrad_trace(q_mu, q_sqrt, np.zeros((3, 1)), np.zeros((1, 6)))


def test_natgrad_trace__step_leaving_pd_cone__raises_step_failed_with_gamma():
    s = nd.seed_scenario()
    # θ₂' = −½I − γ·½I·(−3) ... a gradient of −3·I on dL/dvarsqrt pushes θ₂ past zero.
    big = -3.0 * s.q_sqrt_grad
    with pytest.raises(StepFailedError, match=r"gamma = 1(.|\n)*smaller gamma"):
        nd.natgrad_trace(s.q_mu, s.q_sqrt, s.q_mu_grad, big, gamma=1.0)


@pytest.mark.parametrize("gamma", [0.0, -1.0, float("nan"), "big", "1", True])
def test_natgrad_trace__bad_gamma(gamma):
    """A string is refused even when float() reads it (check_natgrad(gamma="1") ran with γ = 1), as a bool is."""
    with pytest.raises(InputError, match=r"Argument: gamma\n"):
        nd.natgrad_trace(*nd.seed_scenario(), gamma=gamma)


def test_natgrad_trace__xi_transform_class_instead_of_instance():
    with pytest.raises(InputError, match=r"xi_transform=XiNat\(\)"):
        nd.natgrad_trace(*nd.seed_scenario(), xi_transform=XiNat)
