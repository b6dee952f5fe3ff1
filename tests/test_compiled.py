"""The fast natgrad_trace paths (LAPACK for XiNat/XiSqrtMeanVar, a tf.function for other ξ): same numbers as the
eager path and GPflow, same errors; the tf.function is traced once per key, the LAPACK path never."""

from __future__ import annotations

import copy
import dataclasses

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import NaturalGradient, XiNat, XiSqrtMeanVar
from hypothesis import given, settings
from hypothesis import strategies as st

import natgrad_diag as nd
from natgrad_diag.exceptions import NonFiniteError, ShapeMismatchError, SingularCovarianceError, StepFailedError
from natgrad_diag.step import trace as trace_module
from natgrad_diag._compile import trace_count
from natgrad_diag.tolerance import rounding_bound
from tests.conftest import random_q


class XiNatTF(XiNat):
    """XiNat under another class: no closed form (step_backend says autodiff), so the tf.function path runs."""


class XiSqrtMeanVarTF(XiSqrtMeanVar):
    """XiSqrtMeanVar under another class: the tf.function path."""


XI = {"XiNat": XiNat, "XiSqrtMeanVar": XiSqrtMeanVar, "XiNatTF": XiNatTF, "XiSqrtMeanVarTF": XiSqrtMeanVarTF}
ARRAY_FIELDS = [f.name for f in dataclasses.fields(nd.NatGradTrace) if f.name not in ("gamma", "xi_transform")]


def _setup(M: int, L: int, seed: int, scale: float = 0.1):
    q_mu, q_sqrt = random_q(M, L, seed=seed)
    p_mu = gpflow.Parameter(q_mu)
    p_sq = gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular())
    rng = np.random.default_rng(seed + 100)
    g_mu = tf.constant(rng.normal(size=p_mu.unconstrained_variable.shape) * scale)
    g_sq = tf.constant(rng.normal(size=p_sq.unconstrained_variable.shape) * scale)
    return p_mu, p_sq, g_mu, g_sq


def _compiled_only(**kwargs):
    """natgrad_trace(compiled=True), failing if it fell back to the eager reference path."""

    def _no_eager(*a, **k):
        pytest.fail("the compiled path fell back to the eager path")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trace_module, "_natgrad_trace_eager", _no_eager)
        return nd.natgrad_trace(**kwargs, compiled=True)


def _assert_same_trace(a: nd.NatGradTrace, b: nd.NatGradTrace) -> None:
    """Equal to rounding. The tf.function path runs the eager path's operations (Grappler may reorder a sum:
    1e-13 relative); the LAPACK path computes the same record by other, backward-stable formulas, so the
    two differ by a forward error of order ε·κ(S)·scale (Higham 2002, §1.6; GPflow's step forms S⁻¹ by
    triangular inverses): rounding_bound's 100·ε·κ(S)·scale, κ(S) the worst over the L latent GPs."""
    S = b.q_sqrt @ np.transpose(b.q_sqrt, (0, 2, 1))
    kappa = float(np.max(np.linalg.cond(S)))
    for name in ARRAY_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape and x.dtype == y.dtype, name
        scale = max(1.0, float(np.max(np.abs(y), initial=0.0)))
        atol = max(1e-13 * scale, rounding_bound(y.dtype, condition=kappa, scale=scale))
        np.testing.assert_allclose(x, y, rtol=0, atol=atol, err_msg=name)
    assert (a.gamma, a.xi_transform) == (b.gamma, b.xi_transform)


@pytest.mark.parametrize("xi_name", list(XI))
@pytest.mark.parametrize("L", [1, 3])
def test_natgrad_trace__compiled_equals_eager(xi_name, L):
    p_mu, p_sq, g_mu, g_sq = _setup(5, L, seed=L)
    eager = nd.natgrad_trace(p_mu, p_sq, g_mu, g_sq, gamma=0.3, xi_transform=XI[xi_name](), compiled=False)
    comp = _compiled_only(q_mu=p_mu, q_sqrt=p_sq, q_mu_grad=g_mu, q_sqrt_grad=g_sq, gamma=0.3, xi_transform=XI[xi_name]())
    _assert_same_trace(comp, eager)


@settings(max_examples=15)
@given(M=st.integers(1, 6), L=st.integers(1, 3), seed=st.integers(0, 10_000), gamma=st.sampled_from([1.0, 0.5, 0.01]))
def test_natgrad_trace__compiled_equals_eager__property(M, L, seed, gamma):
    p_mu, p_sq, g_mu, g_sq = _setup(M, L, seed=seed, scale=0.05)
    _assert_same_trace(
        _compiled_only(q_mu=p_mu, q_sqrt=p_sq, q_mu_grad=g_mu, q_sqrt_grad=g_sq, gamma=gamma),
        nd.natgrad_trace(p_mu, p_sq, g_mu, g_sq, gamma=gamma, compiled=False),
    )


@pytest.mark.parametrize("xi_name", list(XI))
def test_natgrad_trace__compiled_step_equals_gpflow_optimizer_and_is_read_only(xi_name):
    """Oracle: GPflow's public NaturalGradient on deep copies, with a linear loss with these gradients."""
    p_mu, p_sq, g_mu, g_sq = _setup(6, 2, seed=4)
    before = [p_mu.unconstrained_variable.numpy().copy(), p_sq.unconstrained_variable.numpy().copy()]
    t = _compiled_only(q_mu=p_mu, q_sqrt=p_sq, q_mu_grad=g_mu, q_sqrt_grad=g_sq, gamma=0.5, xi_transform=XI[xi_name]())
    mu_c, sq_c = copy.deepcopy(p_mu), copy.deepcopy(p_sq)

    def loss() -> tf.Tensor:
        return tf.reduce_sum(g_mu * mu_c.unconstrained_variable) + tf.reduce_sum(g_sq * sq_c.unconstrained_variable)

    NaturalGradient(gamma=0.5, xi_transform=XI[xi_name]()).minimize(loss, [(mu_c, sq_c)])
    np.testing.assert_allclose(t.new_q_mu, mu_c.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.new_q_sqrt, sq_c.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(p_mu.unconstrained_variable.numpy(), before[0])
    np.testing.assert_array_equal(p_sq.unconstrained_variable.numpy(), before[1])


def test_natgrad_trace__compiled_default_seed_is_tape_gradient_with_no_output_gradients():
    """dtheta_deta from the compiled step against the user's literal tape.gradient(meanvarsqrt, [eta1, eta2])."""
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation

    p_mu, p_sq, g_mu, g_sq = _setup(4, 2, seed=8)
    t = _compiled_only(q_mu=p_mu, q_sqrt=p_sq, q_mu_grad=g_mu, q_sqrt_grad=g_sq)
    with tf.GradientTape(persistent=True) as tape:
        eta1, eta2 = meanvarsqrt_to_expectation(tf.convert_to_tensor(p_mu), tf.convert_to_tensor(p_sq))
        mvs = expectation_to_meanvarsqrt(eta1, eta2)
    d1, d2 = tape.gradient(mvs, [eta1, eta2])
    np.testing.assert_allclose(t.dtheta_deta1, d1.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.dtheta_deta2, d2.numpy(), rtol=0, atol=1e-12)


# ---- tracing ----------------------------------------------------------------------------------------


def test_natgrad_trace__repeated_calls_of_one_shape_trace_once():
    """The tf.function path (a ξ without a closed form): one trace per (shapes, dtype, ξ, transforms)."""
    xi, other = XiNatTF(), XiSqrtMeanVarTF()
    p_mu, p_sq, g_mu, g_sq = _setup(7, 2, seed=0)
    nd.natgrad_trace(p_mu, p_sq, g_mu, g_sq, compiled=True, xi_transform=xi)
    before = trace_count("natgrad_tensors")
    for k in range(5):  # new values, new gamma, new Parameters: same shapes, dtype and transforms
        a = _setup(7, 2, seed=k + 1)
        nd.natgrad_trace(*a, gamma=0.1 * (k + 1), compiled=True, xi_transform=xi)
    assert trace_count("natgrad_tensors") == before
    nd.natgrad_trace(*_setup(8, 2, seed=0), compiled=True, xi_transform=xi)  # a new M
    nd.natgrad_trace(*_setup(7, 2, seed=0), compiled=True, xi_transform=other)  # a new ξ class
    assert trace_count("natgrad_tensors") == before + 2


def test_natgrad_trace__default_runs_eagerly_once_then_compiles_once():
    """The tf.function path: a one-off call runs eagerly, the second call traces, later calls reuse it."""
    xi = XiNatTF()
    shape_args = _setup(9, 1, seed=3)  # a shape no other test uses
    before = trace_count("natgrad_tensors")
    first = nd.natgrad_trace(*shape_args, xi_transform=xi)
    assert trace_count("natgrad_tensors") == before  # a one-off call pays no tracing
    second = nd.natgrad_trace(*shape_args, xi_transform=xi)
    assert trace_count("natgrad_tensors") == before + 1
    for _ in range(3):
        nd.natgrad_trace(*shape_args, xi_transform=xi)
    assert trace_count("natgrad_tensors") == before + 1
    _assert_same_trace(second, first)


@pytest.mark.parametrize("xi_name", ["XiNat", "XiSqrtMeanVar"])
def test_natgrad_trace__closed_form_xi_take_lapack_from_the_first_call_and_never_trace(xi_name):
    """compiled=None (the default): XiNat and XiSqrtMeanVar skip the eager path from the first call, trace nothing."""
    args = _setup(11, 2, seed=5)  # a shape no other test uses
    before = trace_count("natgrad_tensors")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trace_module, "_natgrad_trace_eager", lambda *a, **k: pytest.fail("the first call ran eagerly"))
        first = nd.natgrad_trace(*args, xi_transform=XI[xi_name]())
        again = nd.natgrad_trace(*args, xi_transform=XI[xi_name](), compiled=True)
    assert trace_count("natgrad_tensors") == before
    _assert_same_trace(first, nd.natgrad_trace(*args, xi_transform=XI[xi_name](), compiled=False))
    _assert_same_trace(again, first)


# ---- errors: the compiled path defers to the eager one, so messages are identical ---------------------


def _error(args, kwargs, compiled):
    with pytest.raises(Exception) as e:
        nd.natgrad_trace(*args, compiled=compiled, **kwargs)
    return type(e.value), str(e.value)


def test_natgrad_trace__compiled_errors_are_the_eager_errors():
    p_mu, p_sq, g_mu, g_sq = _setup(4, 1, seed=2)
    bad_grad = g_sq.numpy().copy()
    bad_grad[0, 3] = np.nan
    nan_case = ((p_mu, p_sq, g_mu, tf.constant(bad_grad)), {})
    sq = np.tril(np.eye(4))[None].copy()
    sq[0, 2, 2] = 0.0
    singular = ((p_mu, gpflow.Parameter(sq, transform=gpflow.utilities.triangular()), g_mu, g_sq), {})
    shape = ((p_mu, p_sq, g_mu, tf.zeros((1, 4, 4), tf.float64)), {})
    too_far = ((p_mu, p_sq, g_mu * 0, -50.0 * tf.ones_like(g_sq)), {"gamma": 1.0})
    for (args, kwargs), kind in [(nan_case, NonFiniteError), (singular, SingularCovarianceError), (shape, ShapeMismatchError), (too_far, StepFailedError)]:
        t_c, m_c = _error(args, kwargs, compiled=True)
        t_e, m_e = _error(args, kwargs, compiled=False)
        assert t_c is t_e is kind
        assert m_c == m_e


@settings(max_examples=20)
@given(M=st.integers(1, 7), L=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_default_seed_gradient__closed_form_equals_tape_gradient_with_a_seed_of_ones(M, L, seed):
    """The compiled path's Jᵀ·1 against TensorFlow's own backward pass with output_gradients=None."""
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    from natgrad_diag.step.closed_form import default_seed_gradient

    q_mu, q_sqrt = random_q(M, L, seed=seed)
    eta1 = tf.constant(q_mu)
    eta2 = tf.constant(q_sqrt @ np.transpose(q_sqrt, (0, 2, 1)) + np.einsum("ml,nl->lmn", q_mu, q_mu))
    with tf.GradientTape() as tape:
        tape.watch([eta1, eta2])
        mvs = expectation_to_meanvarsqrt(eta1, eta2)
    want1, want2 = tape.gradient(mvs, [eta1, eta2])
    got1, got2 = default_seed_gradient(eta1, mvs[1])
    scale = max(1.0, float(np.max(np.abs(want2.numpy()))))
    np.testing.assert_allclose(got1.numpy(), want1.numpy(), rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(got2.numpy(), want2.numpy(), rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("kind", ["numpy", "variable", "tensor"])
def test_natgrad_trace__compiled_accepts_arrays_variables_and_tensors(kind):
    """Identity transform: the compiled step on plain values equals the eager one, and reads only."""
    q_mu, q_sqrt = random_q(4, 2, seed=6)
    rng = np.random.default_rng(3)
    g_mu, g_sq = rng.normal(size=(4, 2)) * 0.1, np.tril(rng.normal(size=(2, 4, 4))) * 0.1
    wrap = {"numpy": np.array, "variable": tf.Variable, "tensor": tf.constant}[kind]
    args = dict(q_mu=wrap(q_mu), q_sqrt=wrap(q_sqrt), q_mu_grad=wrap(g_mu), q_sqrt_grad=wrap(g_sq), gamma=0.2)
    comp = _compiled_only(**args)
    _assert_same_trace(comp, nd.natgrad_trace(**args, compiled=False))
    np.testing.assert_array_equal(np.asarray(args["q_sqrt"]), q_sqrt)
