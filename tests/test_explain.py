"""The explanation's claims, each re-derived by an independent route."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import XiNat, XiSqrtMeanVar

import natgrad_diag as nd
from natgrad_diag.step.jacobian import natgrad_map_jacobian
from tests.conftest import random_q


@pytest.fixture(scope="module")
def explanation() -> nd.Explanation:
    return nd.explain_output_gradients()


def test_explain__seed_scenario__every_claim_holds(explanation):
    assert explanation.passed
    names = [c.name for c in explanation.checks]
    assert names == [
        "a_vjp_equals_contraction",
        "b_default_seed_is_summed_gradient",
        "b_default_seed_split",
        "c_split",
        "c_naive_product_differs",
        "d_diagonal_counter_example",
        "e_onehot_row",
    ]


def test_explain__numbers_against_explicit_jacobian_contracted_by_hand(explanation):
    t = explanation.trace
    J = natgrad_map_jacobian(t.eta1, t.eta2)  # rows mean then varsqrt, columns eta1 then eta2
    v = np.concatenate([t.dL_dmean.ravel(), t.dL_dvarsqrt.ravel()])
    jtv = v @ J.matrix
    jt1 = np.ones_like(v) @ J.matrix
    n1 = t.eta1.size
    np.testing.assert_allclose(t.dL_deta1.ravel(), jtv[:n1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.dL_deta2.ravel(), jtv[n1:], rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.dtheta_deta1.ravel(), jt1[:n1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.dtheta_deta2.ravel(), jt1[n1:], rtol=0, atol=1e-12)
    # the naive product (Jᵀ·1) ⊙ v, contracted by hand, is what the explanation reports, and it is wrong by a lot
    naive = (jt1[:n1] * v[:n1]).reshape(t.eta1.shape)
    np.testing.assert_allclose(explanation.naive_product, naive, rtol=0, atol=1e-12)
    assert np.max(np.abs(naive.ravel() - jtv[:n1])) > 0.3


def test_explain__split_mean_path_is_dL_dmean_and_varsqrt_path_is_the_rest(explanation):
    t = explanation.trace
    np.testing.assert_allclose(explanation.mean_path, t.dL_dmean, rtol=0, atol=1e-15)
    np.testing.assert_allclose(explanation.mean_path + explanation.varsqrt_path, t.dL_deta1, rtol=0, atol=1e-12)
    # In the seed scenario dL/dvarsqrt = I and S = I, m = q_mu: the varsqrt path is −m exactly
    # (d/dm of tr chol(η₂ − m mᵀ) at S = I is −m), so dL/deta1 = 0.33·m − m.
    np.testing.assert_allclose(explanation.varsqrt_path, -t.eta1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.dL_deta1, (0.33 - 1.0) * t.eta1, rtol=0, atol=1e-12)


def test_explain__onehot_row_equals_finite_difference_row(explanation):
    """Row varsqrt[0,4,0] of J, by central differences of the numpy map (symmetric η₂ tangents)."""
    t = explanation.trace
    row = explanation.onehot_row
    eps = 1e-6

    def vs40(e1, e2):
        S = e2[0] - np.outer(e1[:, 0], e1[:, 0])
        return np.linalg.cholesky(S)[4, 0]

    M = 5
    for i in range(M):
        d = np.zeros_like(t.eta1)
        d[i, 0] = eps
        fd = (vs40(t.eta1 + d, t.eta2) - vs40(t.eta1 - d, t.eta2)) / (2 * eps)
        assert row[i] == pytest.approx(fd, abs=1e-7)
    # η₂ part: symmetric tangent E_ij + E_ji gives row[ij] + row[ji]
    r2 = row[M:].reshape(M, M)
    for i in range(M):
        for j in range(i + 1):
            d = np.zeros_like(t.eta2)
            d[0, i, j] += eps
            if i != j:
                d[0, j, i] += eps
            fd = (vs40(t.eta1, t.eta2 + d) - vs40(t.eta1, t.eta2 - d)) / (2 * eps)
            got = r2[i, j] + r2[j, i] if i != j else r2[i, i]
            assert got == pytest.approx(fd, abs=1e-7)


def test_explain__counter_example_is_cos_times_v(explanation):
    ce = explanation.counter_example
    np.testing.assert_allclose(ce.naive, np.cos(ce.x) * ce.v, rtol=1e-15)
    np.testing.assert_allclose(ce.vjp, np.cos(ce.x) * ce.v, rtol=1e-15)
    assert ce.jacobian_is_diagonal


def test_explain__str_is_the_lesson_with_computed_numbers(explanation):
    text = str(explanation)
    t = explanation.trace
    assert "Jᵀ·v" in text and "Jᵀ·1" in text and "the mean path plus the varsqrt path" in text
    assert f"{t.dL_deta1[0, 0]:.4g}" in text and f"{t.dtheta_deta1[0, 0]:.4g}" in text
    assert "Verdict: all checks hold." in text
    import re

    assert re.findall(r"^(PASS|FAIL) ", text, flags=re.M) == ["PASS"] * len(explanation.checks)
    assert "J from tape.jacobian is 30 × 30" in " ".join(text.split())  # paragraphs wrap at 80 columns


def test_explain__to_dict_has_tensors_in_their_shapes(explanation):
    d = explanation.to_dict()
    assert np.array(d["dL_deta1"]).shape == (5, 1)
    assert np.array(d["dL_deta2"]).shape == (1, 5, 5)
    assert np.array(d["naive_product"]).shape == (5, 1)
    assert {c["name"] for c in d["checks"]} >= {"a_vjp_equals_contraction", "e_onehot_row"}
    assert all(set(c) >= {"name", "passed", "max_abs_error"} for c in d["checks"])


@pytest.mark.parametrize("xi", [XiNat(), XiSqrtMeanVar()], ids=["XiNat", "XiSqrtMeanVar"])
def test_explain__random_scenario_L3__checks_hold(xi):
    import gpflow

    q_mu, q_sqrt = random_q(4, 3, seed=11)
    p_mu, p_sqrt = gpflow.Parameter(q_mu), gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular())
    rng = np.random.default_rng(0)
    g = (tf.constant(rng.normal(size=(4, 3)) * 0.1), tf.constant(rng.normal(size=(3, 10)) * 0.1))
    e = nd.explain_output_gradients((p_mu, p_sqrt, *g), xi_transform=xi, gamma=0.1)
    assert e.passed, str(e)
    assert e.trace.xi_transform == type(xi).__name__
    # claim (a) re-derived: the explicit closed-form Jacobian contracted by hand with the trace's seed
    t = e.trace
    J = natgrad_map_jacobian(t.eta1, t.eta2)
    jtv = np.concatenate([t.dL_dmean.ravel(), t.dL_dvarsqrt.ravel()]) @ J.matrix
    np.testing.assert_allclose(t.dL_deta1.ravel(), jtv[: t.eta1.size], rtol=0, atol=1e-12)
    np.testing.assert_allclose(e.mean_path + e.varsqrt_path, t.dL_deta1, rtol=0, atol=1e-12)


def test_explain__at_gpflows_initial_q_mu_of_zero_the_naive_product_is_right_and_the_lesson_says_so():
    """q_mu = 0, q_sqrt = I (an SVGP as GPflow creates it): eta1 = 0, where chol(eta2 − eta1·eta1ᵀ) is flat in eta1, so
    dL/deta1 = dL/dmean and the naive product is right. The claim that it differs failed there (a false alarm on a
    fresh model). Oracle: the closed-form Jacobian's ∂varsqrt/∂eta1 block, and Jᵀ·v contracted by hand."""
    M, rng = 3, np.random.default_rng(2)
    g_mu, g_sq = rng.normal(size=(M, 1)), np.tril(rng.normal(size=(1, M, M)))
    e = nd.explain_output_gradients((np.zeros((M, 1)), np.eye(M)[None], g_mu, g_sq), gamma=0.1)
    assert e.passed, str(e)
    c = next(c for c in e.checks if c.name == "c_naive_product_differs")
    assert c.status == "pass" and not c.expect_difference and c.claim.startswith("∂varsqrt/∂eta1 = 0 here (eta1 = 0)")
    t = e.trace
    J = natgrad_map_jacobian(t.eta1, t.eta2)
    assert not np.any(J.block(1, 0))
    jtv = np.concatenate([t.dL_dmean.ravel(), t.dL_dvarsqrt.ravel()]) @ J.matrix
    np.testing.assert_allclose(t.naive_product1.ravel(), jtv[:M], rtol=0, atol=1e-12)
    assert "Here the naive product happens to equal Jᵀ·v" in str(e)
    seeded = nd.explain_output_gradients()  # the question's numbers: varsqrt depends on eta1, and the naive product is wrong
    assert next(c for c in seeded.checks if c.name == "c_naive_product_differs").expect_difference and seeded.passed


def test_explain__a_failed_claim_is_reported_not_raised():
    """An Explanation built on a tampered trace reports the broken claim (a) instead of raising."""
    import dataclasses

    t = nd.natgrad_trace(*nd.seed_scenario())
    tampered = dataclasses.replace(t, dL_deta1=t.dL_deta1 + 1e-3)
    e = nd.explain_output_gradients(tampered)
    failed = {c.name for c in e.checks if not c.passed}
    assert "a_vjp_equals_contraction" in failed and "c_split" in failed
    assert not e.passed and "check(s) FAILED" in str(e)
