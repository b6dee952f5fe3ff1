"""natgrad_diag.checks.health.health: the verdict on a new q(u), on matrices whose answer is known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from natgrad_diag.checks.health import GAMMA_GRID, health


def _q(M: int = 3, L: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    q_sqrt = np.tril(rng.normal(size=(L, M, M)), -1) + np.eye(M) * rng.uniform(0.5, 2.0, size=(L, 1, M))
    return rng.normal(size=(M, L)), q_sqrt


def test_health__a_lower_triangular_factor_with_a_positive_diagonal_is_healthy():
    q_mu, q_sqrt = _q()
    ok, why, nums = health(q_mu, q_sqrt, np.float64)
    assert ok and why == ""
    diag = np.diagonal(q_sqrt, axis1=-2, axis2=-1)
    assert nums["min diagonal of new q_sqrt"] == diag.min()
    assert nums["cond(S) lower bound (max/min diag of q_sqrt)²"] == pytest.approx(((diag.max(-1) / diag.min(-1)).max()) ** 2, rel=1e-15)
    assert nums["max |upper triangle of new q_sqrt|"] == 0.0


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        pytest.param(lambda s: s.__setitem__((1, 0, 2), 0.5), "not lower-triangular", id="upper-entry"),
        pytest.param(lambda s: s.__setitem__((1, 2, 2), -0.1), "non-positive diagonal entry q_sqrt[1, 2, 2] = -0.1", id="negative-diagonal"),
        pytest.param(lambda s: s.__setitem__((0, 1, 1), np.nan), "1 NaN/Inf value(s)", id="nan"),
    ],
)
def test_health__names_what_is_wrong(edit, reason):
    q_mu, q_sqrt = _q()
    edit(q_sqrt)
    ok, why, _ = health(q_mu, q_sqrt, np.float64)
    assert not ok and reason in why


def test_health__a_step_that_failed_has_no_parameters():
    assert health(None, None, np.float64)[:2] == (False, "no new parameters (the step failed)")


def test_health__an_upper_entry_at_rounding_level_is_tolerated():
    """100·ε·max|q_sqrt| is the bound: a Cholesky-based step leaves at most rounding in the upper triangle."""
    q_mu, q_sqrt = _q()
    q_sqrt[0, 0, 1] = 10 * np.finfo(np.float64).eps
    assert health(q_mu, q_sqrt, np.float64)[0]


def test_gamma_grid__is_decreasing_and_starts_at_one():
    assert GAMMA_GRID[0] == 1.0 and all(a > b for a, b in zip(GAMMA_GRID, GAMMA_GRID[1:]))


# --------------------------------------------------------------------------------------------------
# best_gamma: the γ whose healthy step has the lowest measured loss after it
# --------------------------------------------------------------------------------------------------


def test_best_gamma__lowest_loss_wins_and_ties_go_to_the_smaller_gamma():
    from natgrad_diag.checks.health import best_gamma
    from natgrad_diag.checks.report import GammaTrial

    trials = [GammaTrial(1.0, True, 9.0), GammaTrial(0.5, True, 3.0), GammaTrial(0.2, True, 3.0 * (1 + 1e-15)), GammaTrial(0.1, True, 4.0)]
    assert best_gamma(trials, 10.0, np.float64) == 0.2  # 0.5 and 0.2 tie within rounding
    trials[1] = GammaTrial(0.5, True, 2.9)
    assert best_gamma(trials, 10.0, np.float64) == 0.5  # lower beyond rounding: the larger γ wins
    assert best_gamma([GammaTrial(1.0, False, None), GammaTrial(0.1, True, 10.5)], 10.0, np.float64) is None


@pytest.mark.slow
def test_suggested_gamma__has_the_lowest_loss_of_the_grid_by_gpflows_optimizer():
    """Heteroskedastic notebook model: γ = 1 lowers the loss, but less than smaller steps do (the old rule's pick)."""
    import gpflow
    from _user_models import gpflow_loss_after, heteroskedastic_svgp, same_bits, variables_of

    from natgrad_diag import check_natgrad

    model, data = heteroskedastic_svgp()
    before = variables_of(model)
    report = check_natgrad(model, data, gamma=1.0, mode="full", progress=False)
    assert same_bits(before, variables_of(model))
    losses = report.gamma_losses
    assert sorted(losses) == sorted(GAMMA_GRID)
    oracle = {g: gpflow_loss_after(model, data, g) for g in GAMMA_GRID}
    for g in GAMMA_GRID:
        # |ours − GPflow's|: both evaluate the same loss at steps equal to 1e-10 (the reproduction bound), and the
        # loss's derivative times 1e-10 is far below 1e-6 relative
        assert (losses[g] is None) == (oracle[g] is None), g
        if oracle[g] is not None:
            assert losses[g] == pytest.approx(oracle[g], rel=1e-6), g
    healthy = {g: v for g, v in oracle.items() if v is not None and v < report.loss_before}
    best = min(healthy.values())
    assert report.suggested_gamma == min(g for g, v in healthy.items() if v <= best * (1 + 1e-12))
    assert report.suggested_gamma < 1.0 and oracle[1.0] < report.loss_before  # not "the largest that lowers"
    assert report.to_dict()["gamma_losses"]["0.1"] == losses[0.1]
    assert isinstance(model, gpflow.models.SVGP)
