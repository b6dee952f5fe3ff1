"""natgrad_diag.checks.bounds: the checks' tolerances, judged by the verdicts they give at the documented bounds."""

from __future__ import annotations

import numpy as np
import pytest

from natgrad_diag.checks.api import Tolerances, natgrad_tolerances
from natgrad_diag.checks.bounds import with_overrides


#: The documented defaults (assert_natgrad_step_matches_gpflow's docstring, docs/natgrad-checks.md: "≤ 1e-10 in float64
#: plus GPflow's rounding"; bounds.FISHER_WIDENING: the Fisher identity's rtol is 100·rtol in float64, 10·rtol in
#: float32), written out by hand: dtype → (rtol = atol, fisher_rtol).
DOCUMENTED = {np.float64: (1e-10, 1e-8), np.float32: (1e-4, 1e-3)}


def _evaluator(dtype):
    from gpflow.optimizers import XiNat

    from natgrad_diag.checks.evaluator import Context, Evaluator

    ctx = Context(model=None, data=None, xi=XiNat(), gamma=1.0, tol=natgrad_tolerances(dtype), np_dtype=dtype, M=3, L=1)
    return Evaluator(ctx)


def _step(dtype):
    from natgrad_diag.checks.evaluator import Step

    z = np.zeros((1, 3, 3), dtype)
    return Step(loss=0.0, g_mu=np.zeros((3, 1), dtype), g_sq=z, dL_dmean=np.zeros((3, 1), dtype), dL_dvarsqrt=z)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_reproduction__verdict_flips_at_the_documented_bound(dtype):
    """|ours − GPflow's| ≤ 100·ε·κ·s + atol + rtol·s, s = max|GPflow's|, κ = 1 here: pass just below, fail just above."""
    import dataclasses

    from natgrad_diag.checks.bounds import Conditioning
    from natgrad_diag.checks.evaluator import GpflowStep
    from natgrad_diag.checks.reproduction import check_reproduction

    rtol, _ = DOCUMENTED[dtype]
    cond = Conditioning(kappa_S=1.0, kappa_S_new=1.0, cancellation=1.0, kappa_Kuu=None, min_eig_Kuu=None, kappa_F=1.0, kappa_eta=1.0)
    gp_mu, gp_sq = np.full((3, 1), 2.0), np.eye(3)[None]  # s = 2
    bound = 100 * np.finfo(dtype).eps * 2.0 + rtol + rtol * 2.0
    statuses = []
    for delta in (0.99 * bound, 1.01 * bound):
        step = dataclasses.replace(_step(dtype), new_q_mu=gp_mu + delta, new_q_sqrt=gp_sq)
        check = check_reproduction(_evaluator(dtype), step, GpflowStep(gp_mu, gp_sq), cond)
        assert check.tolerance == pytest.approx(bound, rel=1e-12)
        statuses.append(check.status)
    assert statuses == ["pass", "fail"]


@pytest.mark.parametrize("terms", [4.0, 400.0], ids=["no_cancellation", "terms_100_times_the_result"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_fisher_identity__verdict_flips_at_the_documented_bound(dtype, terms):
    """Matrix-free: |F·∇ηL − ∇θL| ≤ max|∇θL|·fisher_rtol + 100·ε·M·max(terms, max|∇θL|) + atol, M = 3, ``terms`` the
    size of the products' terms (their rounding is M·ε of it, Higham 2002, §3.5)."""
    from natgrad_diag.checks.fisher import check_fisher_matrix_free

    rtol, fisher_rtol = DOCUMENTED[dtype]
    bound = 4.0 * fisher_rtol + 100 * np.finfo(dtype).eps * 3 * terms + rtol  # max|∇θL| = 4
    grad1, grad2 = np.full((3, 1), 4.0), np.ones((1, 3, 3))
    statuses = []
    for delta in (0.99 * bound, 1.01 * bound):
        ev = _evaluator(dtype)
        ev.fisher_products = lambda step, d=delta: dict(F_u1=grad1 + d, F_u2=grad2, grad_theta1=grad1, grad_theta2=grad2, terms=terms)
        check = check_fisher_matrix_free(ev, _step(dtype))
        assert check.tolerance == pytest.approx(bound, rel=1e-12)
        statuses.append(check.status)
    assert statuses == ["pass", "fail"]


def test_with_overrides__replaces_only_what_is_given():
    base = natgrad_tolerances(np.float64)
    tol = with_overrides(base, rtol=1e-3, atol=None, fisher_rtol=2, conjugate_rtol=None)
    assert tol == Tolerances(rtol=1e-3, atol=base.atol, fisher_rtol=2.0, conjugate_rtol=base.conjugate_rtol)
    assert isinstance(tol.fisher_rtol, float)
