"""natgrad_diag.step.lapack against GPflow's optimizer, the autodiff record and the explicit Jacobian.

Oracles: GPflow's public ``NaturalGradient.minimize`` on Parameters (the new q_mu, q_sqrt); the eager autodiff
record ``natgrad_tensors`` (every key; its ``dtheta_deta`` is the literal ``tape.gradient`` with the default
seed); the explicit Jacobian of ``expectation_to_meanvarsqrt`` contracted by hand (``natgrad_map_jacobian(...)
.vjp``) for ∂L/∂η; ``np.linalg.inv`` for Λ.

Tolerances: the LAPACK record and each oracle are backward-stable computations of the same quantities by
different formulas, so they differ by a forward error of order ε·κ·scale (Higham 2002, §1.6), κ the
condition number that amplifies rounding: GPflow's and TensorFlow's paths invert S (C⁻¹, S⁻¹ = C⁻ᵀC⁻¹) and
recover S as η₂ − η₁η₁ᵀ, so κ = κ(S)·(1 + max m²/‖S‖₂) (Higham 2002, §8 and §10); ``scale`` is the
largest entry of the compared array. Measured here (M ≤ 50, κ up to 6·10⁸): ≤ 0.5·ε·κ·scale in float64 and
float32, so the bound 10·ε·κ·scale (``rounding_bound(..., factor=10)``) leaves a margin of 20 and still fails a
formula wrong by one part in 10⁵ at the worst κ. float32 uses the same rule with its ε.
"""

from __future__ import annotations

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import NaturalGradient as GPflowNaturalGradient
from gpflow.optimizers import XiNat, XiSqrtMeanVar
from hypothesis import given, settings
from hypothesis import strategies as st

import natgrad_diag as nd
from natgrad_diag.exceptions import StepFailedError
from natgrad_diag.step.lapack import natgrad_record_lapack
from natgrad_diag.step.jacobian import natgrad_map_jacobian
from natgrad_diag.step import trace as trace_module
from natgrad_diag.step.trace import constrained_arrays, natgrad_tensors
from natgrad_diag.tolerance import rounding_bound
from test_closed_form import make_grads  # ∂L/∂m and G with ‖P + Pᵀ‖₂ = 0.5: B stays well conditioned for γ ≤ 1
from test_closed_form import make_q as _closed_form_make_q

XIS = {"nat": XiNat, "sqrtmeanvar": XiSqrtMeanVar}
KEYS = (
    "eta1", "eta2", "dL_deta1", "dL_deta2", "dtheta_deta1", "dtheta_deta2",
    "xi1", "xi2", "nat_dL_xi1", "nat_dL_xi2", "new_q_mu", "new_q_sqrt",
)  # fmt: skip
# (M, L, κ(S)): M = 1..50, L = 1..3, well- and ill-conditioned q(u)
CASES = [(1, 1, 1.0), (2, 3, 4.0), (7, 2, 1e4), (20, 1, 1e8), (50, 3, 10.0), (50, 1, 1e6)]


def make_q(M: int, L: int, seed: int, *, condition: float, signs: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """test_closed_form's states (S with eigenvalues log-spaced from 1 to 1/condition), with the signs of about half
    of q_sqrt's columns flipped by default (GPflow does not constrain q_sqrt's diagonal)."""
    return _closed_form_make_q(M, L, seed, condition=condition, signs=signs)


def kappa(q_mu: np.ndarray, q_sqrt: np.ndarray) -> float:
    """κ(S)·(1 + max m²/‖S‖₂), the worst over the latent GPs (module docstring)."""
    S = q_sqrt.astype(np.float64) @ np.swapaxes(q_sqrt, 1, 2).astype(np.float64)
    norm = np.linalg.norm(S, 2, axis=(1, 2)).max()
    return float(np.linalg.cond(S).max() * (1.0 + np.max(q_mu.astype(np.float64) ** 2) / norm))


def assert_close(got: np.ndarray, want: np.ndarray, *, dtype: type, condition: float, name: str) -> None:
    """|got − want| ≤ 10·ε·κ·scale, scale = max(1, max|want|) (module docstring)."""
    want = np.asarray(want)
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=0, atol=rounding_bound(dtype, condition=condition, scale=scale, factor=10.0), err_msg=name)


def autodiff_record(q_mu, q_sqrt, dL_dmean, G, gamma, xi):
    """The eager record by TensorFlow's autodiff (GPflow's functions; the literal tape.gradient for Jᵀ·1)."""
    ts = [tf.constant(x) for x in (q_mu, q_sqrt, dL_dmean, G)]
    out = natgrad_tensors(*ts, tf.constant(gamma, ts[0].dtype), XIS[xi](), default_seed="tape")
    return {k: v.numpy() for k, v in out.items()}


def gpflow_step(q_mu, q_sqrt, dL_dmean, G, gamma, xi):
    """GPflow's own step through its public minimize, on Parameters with triangular(): loss ⟨∂L/∂m, m⟩ + ⟨G, L_S⟩."""
    mu = gpflow.Parameter(q_mu)
    sqrt = gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular())
    g_mu, g_sqrt = tf.constant(dL_dmean), tf.constant(G)
    GPflowNaturalGradient(gamma).minimize(lambda: tf.reduce_sum(g_mu * mu) + tf.reduce_sum(g_sqrt * sqrt), [(mu, sqrt, XIS[xi]())])
    return mu.numpy(), sqrt.numpy()


# ------------------------------------------------------------------------------------------------
# float64 against the three oracles
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
@pytest.mark.parametrize("M, L, condition", CASES, ids=[f"M{m}-L{l}-k{c:g}" for m, l, c in CASES])
def test_natgrad_record_lapack__equals_the_autodiff_record(M, L, condition, xi):
    q_mu, q_sqrt = make_q(M, L, seed=M + L, condition=condition)
    dL_dmean, G = make_grads(q_sqrt, seed=M)
    got = natgrad_record_lapack(q_mu, q_sqrt, dL_dmean, G, 0.5, xi)
    want = autodiff_record(q_mu, q_sqrt, dL_dmean, G, 0.5, xi)
    k = kappa(q_mu, q_sqrt)
    for key in KEYS:
        assert got[key].shape == want[key].shape and got[key].dtype == np.float64, key
        assert_close(got[key], want[key], dtype=np.float64, condition=k, name=key)


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
@pytest.mark.parametrize("M, L, condition", CASES, ids=[f"M{m}-L{l}-k{c:g}" for m, l, c in CASES])
def test_natgrad_record_lapack__new_q_equals_gpflows_optimizer(M, L, condition, xi):
    q_mu, q_sqrt = make_q(M, L, seed=2 * M + L, condition=condition)
    dL_dmean, G = make_grads(q_sqrt, seed=M + 7)
    gamma = 1.0 if M % 2 else 0.1
    got = natgrad_record_lapack(q_mu, q_sqrt, dL_dmean, G, gamma, xi)
    want_mu, want_sqrt = gpflow_step(q_mu, q_sqrt, dL_dmean, G, gamma, xi)
    k = kappa(q_mu, q_sqrt)
    assert_close(got["new_q_mu"], want_mu, dtype=np.float64, condition=k, name="new_q_mu")
    assert_close(got["new_q_sqrt"], want_sqrt, dtype=np.float64, condition=k, name="new_q_sqrt")
    assert np.all(np.triu(got["new_q_sqrt"], 1) == 0)  # lower triangular, as GPflow's triangular() reads it


@pytest.mark.parametrize("M, L, condition", CASES[:5], ids=[f"M{m}-L{l}-k{c:g}" for m, l, c in CASES[:5]])
def test_natgrad_record_lapack__dL_deta_is_the_explicit_jacobian_contracted_by_hand(M, L, condition):
    """∂L/∂η = Jᵀ·v with J = ∂(mean, varsqrt)/∂(η₁, η₂) built explicitly (not by TensorFlow's backward pass)."""
    q_mu, q_sqrt = make_q(M, L, seed=3 * M + L, condition=condition)
    dL_dmean, G = make_grads(q_sqrt, seed=M + 11)
    got = natgrad_record_lapack(q_mu, q_sqrt, dL_dmean, G, 0.5, "sqrtmeanvar")
    S = q_sqrt @ np.swapaxes(q_sqrt, 1, 2)
    eta2 = S + np.einsum("ml,nl->lmn", q_mu, q_mu)
    want1, want2 = natgrad_map_jacobian(q_mu, eta2).vjp([dL_dmean, G])
    k = kappa(q_mu, q_sqrt)
    assert_close(got["eta2"], eta2, dtype=np.float64, condition=1.0, name="eta2")  # a product: no inverse
    assert_close(got["dL_deta1"], want1, dtype=np.float64, condition=k, name="dL_deta1")
    assert_close(got["dL_deta2"], want2, dtype=np.float64, condition=k, name="dL_deta2")


@pytest.mark.parametrize("M, L, condition", [(5, 2, 4.0), (30, 1, 1e6)])
def test_natgrad_record_lapack__xinat_xi_is_the_inverse_covariance(M, L, condition):
    """ξ = θ = (Λm, −½Λ), Λ = S⁻¹ by np.linalg.inv (an inverse's error is ε·κ(S) relative to ‖Λ‖)."""
    q_mu, q_sqrt = make_q(M, L, seed=M, condition=condition)
    dL_dmean, G = make_grads(q_sqrt, seed=1)
    got = natgrad_record_lapack(q_mu, q_sqrt, dL_dmean, G, 0.5, "nat")
    lam = np.linalg.inv(q_sqrt @ np.swapaxes(q_sqrt, 1, 2))
    k = kappa(q_mu, q_sqrt)
    assert_close(got["xi2"], -0.5 * lam, dtype=np.float64, condition=k, name="xi2")
    assert_close(got["xi1"], np.einsum("lmn,nl->ml", lam, q_mu), dtype=np.float64, condition=k, name="xi1")
    for key in ("eta2", "dL_deta2", "dtheta_deta2", "xi2"):  # symmetric to the bit, as TensorFlow's
        np.testing.assert_array_equal(got[key], np.swapaxes(got[key], 1, 2), err_msg=key)


# ------------------------------------------------------------------------------------------------
# float32, read-only, reproducible, failures
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
@pytest.mark.parametrize("M, L, condition", [(1, 1, 1.0), (6, 3, 10.0), (25, 2, 1e3)])
def test_natgrad_record_lapack__float32_equals_the_float32_autodiff_record(M, L, condition, xi):
    q_mu, q_sqrt = (x.astype(np.float32) for x in make_q(M, L, seed=M, condition=condition))
    dL_dmean, G = (x.astype(np.float32) for x in make_grads(q_sqrt.astype(np.float64), seed=M + 3))
    got = natgrad_record_lapack(q_mu, q_sqrt, dL_dmean, G, 0.5, xi)
    want = autodiff_record(q_mu, q_sqrt, dL_dmean, G, 0.5, xi)
    k = kappa(q_mu, q_sqrt)
    for key in KEYS:
        assert got[key].dtype == np.float32, key
        assert_close(got[key], want[key], dtype=np.float32, condition=k, name=key)


@pytest.mark.parametrize("M", [1, 2, 9])
@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
def test_natgrad_record_lapack__reads_only_and_gives_the_same_bits_twice(M, xi):
    """No input is written (M = 1 included: a 1×1 array is both C- and Fortran-ordered, so a careless
    ``overwrite_*`` would write through a view), and a second call is bit-identical (one BLAS thread)."""
    from threadpoolctl import threadpool_info

    q_mu, q_sqrt = make_q(M, 2, seed=M, condition=100.0)
    dL_dmean, G = make_grads(q_sqrt, seed=M)
    inputs = [q_mu, q_sqrt, dL_dmean, G]
    before = [x.copy() for x in inputs]
    threads = [i["num_threads"] for i in threadpool_info()]
    first = natgrad_record_lapack(*inputs, 0.3, xi)
    second = natgrad_record_lapack(*inputs, 0.3, xi)
    for x, y in zip(inputs, before):
        np.testing.assert_array_equal(x, y)
    for key in KEYS:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)
        assert not any(np.shares_memory(first[key], x) for x in inputs), key
    assert [i["num_threads"] for i in threadpool_info()] == threads  # the thread limit is given back


def test_natgrad_record_lapack__failing_xinat_step_raises_and_natgrad_trace_gives_the_eager_error():
    """γ too long: B = I + γ(P + Pᵀ) is not positive definite. The record raises StepFailedError; natgrad_trace's
    fast path then defers to the eager path, so compiled=True and compiled=False raise the same message."""
    q_mu, q_sqrt = make_q(4, 1, seed=0, condition=4.0, signs=False)
    dL_dmean, G = make_grads(q_sqrt, seed=0)
    G = -40.0 * G  # ‖P + Pᵀ‖₂ = 20
    with pytest.raises(StepFailedError, match="not positive definite"):
        natgrad_record_lapack(q_mu, q_sqrt, dL_dmean, G, 1.0, "nat")
    p_mu = gpflow.Parameter(q_mu)
    p_sq = gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular())
    g_sq = p_sq.transform.inverse(tf.constant(G))  # the unconstrained gradient whose _to_constrained is G
    np.testing.assert_array_equal(p_sq.transform.forward(g_sq).numpy(), G)
    messages = []
    for compiled in (True, False):
        with pytest.raises(StepFailedError) as e:
            nd.natgrad_trace(p_mu, p_sq, tf.constant(dL_dmean), g_sq, gamma=1.0, compiled=compiled)
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    assert "gamma = 1" in messages[0]


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
def test_natgrad_record_lapack__entries_of_G_above_the_diagonal_do_not_enter(xi):
    """Only tril(G) enters, as in GPflow's Cholesky gradient: the record with noise above G's diagonal is the
    autodiff record of the same G (which TensorFlow reads through its Cholesky gradient)."""
    q_mu, q_sqrt = make_q(6, 2, seed=4, condition=100.0)
    dL_dmean, G = make_grads(q_sqrt, seed=4)
    noisy = G + np.triu(np.random.default_rng(5).normal(size=G.shape), 1)
    got = natgrad_record_lapack(q_mu, q_sqrt, dL_dmean, noisy, 0.5, xi)
    want = autodiff_record(q_mu, q_sqrt, dL_dmean, noisy, 0.5, xi)
    clean = natgrad_record_lapack(q_mu, q_sqrt, dL_dmean, G, 0.5, xi)
    k = kappa(q_mu, q_sqrt)
    for key in KEYS:
        assert_close(got[key], want[key], dtype=np.float64, condition=k, name=key)
        np.testing.assert_array_equal(got[key], clean[key], err_msg=key)  # the products meet exact zeros of C


def test_natgrad_record_lapack__unknown_xi():
    q_mu, q_sqrt = make_q(2, 1, seed=0, condition=1.0)
    with pytest.raises(ValueError, match="Expected xi 'nat' or 'sqrtmeanvar', got 'natural' instead"):
        natgrad_record_lapack(q_mu, q_sqrt, q_mu, q_sqrt, 0.1, "natural")


# ------------------------------------------------------------------------------------------------
# a property over random shapes, seeds, signs and conditioning
# ------------------------------------------------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(
    M=st.integers(1, 12),
    L=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    log_condition=st.integers(0, 8),
    xi=st.sampled_from(["nat", "sqrtmeanvar"]),
    gamma=st.sampled_from([1.0, 0.5, 0.01]),
)
def test_natgrad_record_lapack__property__equals_the_autodiff_record(M, L, seed, log_condition, xi, gamma):
    q_mu, q_sqrt = make_q(M, L, seed=seed, condition=10.0**log_condition)
    dL_dmean, G = make_grads(q_sqrt, seed=seed + 1)
    got = natgrad_record_lapack(q_mu, q_sqrt, dL_dmean, G, gamma, xi)
    want = autodiff_record(q_mu, q_sqrt, dL_dmean, G, gamma, xi)
    k = kappa(q_mu, q_sqrt)
    for key in KEYS:
        assert_close(got[key], want[key], dtype=np.float64, condition=k, name=key)


# ------------------------------------------------------------------------------------------------
# the LAPACK path's inputs: GPflow's transforms reproduced bit for bit
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("M, L", [(1, 1), (2, 3), (17, 2)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_constrained_arrays__are_gpflows_transforms_bit_for_bit(M, L, dtype):
    """The fast path's numpy gather for triangular() (and the identity) against TFP's own forward, which the eager
    path runs (param.numpy(), gpflow.base._to_constrained)."""
    q_mu, q_sqrt = (x.astype(dtype) for x in make_q(M, L, seed=M, condition=10.0))
    p_mu, p_sq = gpflow.Parameter(q_mu), gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular())
    rng = np.random.default_rng(M)
    g_mu = tf.constant(rng.normal(size=q_mu.shape).astype(dtype))
    g_sq = tf.constant(rng.normal(size=p_sq.unconstrained_variable.shape).astype(dtype))
    tensors = (p_mu.unconstrained_variable, p_sq.unconstrained_variable, g_mu, g_sq)
    got = constrained_arrays(tensors, p_mu.transform, p_sq.transform)
    want = [p_mu.numpy(), p_sq.numpy(), gpflow.base._to_constrained(g_mu, p_mu.transform).numpy(),
            gpflow.base._to_constrained(g_sq, p_sq.transform).numpy()]  # fmt: skip
    assert got is not None
    for name, a, b in zip(("q_mu", "q_sqrt", "dL_dmean", "dL_dvarsqrt"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_natgrad_trace__lapack_path_shares_no_memory_with_the_users_arrays():
    """q_mu and its gradient as numpy arrays (identity transform), q_sqrt with triangular(): the LAPACK path runs,
    and the frozen trace does not change when the user's arrays do."""
    q_mu, q_sqrt = make_q(5, 2, seed=1, condition=10.0)
    p_sq = gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular())
    g_mu = 0.01 * np.random.default_rng(2).normal(size=q_mu.shape)
    g_sq = tf.constant(0.01 * np.random.default_rng(3).normal(size=p_sq.unconstrained_variable.shape))
    with pytest.MonkeyPatch.context() as mp:  # the LAPACK path, not the eager one
        mp.setattr(trace_module, "_natgrad_trace_eager", lambda *a, **k: pytest.fail("the eager path ran"))
        trace = nd.natgrad_trace(q_mu, p_sq, g_mu, g_sq, gamma=0.5, compiled=True)
    kept = {name: np.array(getattr(trace, name)) for name in ("q_mu", "dL_dmean", "eta1", "xi1")}
    q_mu += 1.0
    g_mu += 1.0
    for name, value in kept.items():
        np.testing.assert_array_equal(getattr(trace, name), value, err_msg=name)


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
@pytest.mark.parametrize("M, L, condition", [(1, 1, 1.0), (7, 2, 1e4), (20, 3, 1e6)])
def test_natgrad_record_lapack__full_false_gives_the_step_and_dL_deta_only_against_the_autodiff_record(M, L, condition, xi):
    # The fast check's record (full=False): the step and ∂L/∂η against the autodiff record, and η, Jᵀ·1, ξ left out.
    q_mu, q_sqrt = make_q(M, L, seed=3 * M + L, condition=condition)
    dL_dmean, G = make_grads(q_sqrt, seed=M + 11)
    got = natgrad_record_lapack(q_mu, q_sqrt, dL_dmean, G, 0.3, xi, full=False)
    want = autodiff_record(q_mu, q_sqrt, dL_dmean, G, 0.3, xi)
    assert set(got) == {"dL_deta1", "dL_deta2", "nat_dL_xi1", "nat_dL_xi2", "new_q_mu", "new_q_sqrt"}
    k = kappa(q_mu, q_sqrt)
    for key, value in got.items():
        assert value.shape == want[key].shape, key
        assert_close(value, want[key], dtype=np.float64, condition=k, name=key)
