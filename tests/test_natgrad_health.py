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


def test_gamma_grid__is_decreasing_half_decades_from_10_to_0_001():
    assert GAMMA_GRID[0] == 10.0 and GAMMA_GRID[-1] == 0.001 and all(a > b for a, b in zip(GAMMA_GRID, GAMMA_GRID[1:]))
    assert all(2.9 < a / b < 3.4 for a, b in zip(GAMMA_GRID, GAMMA_GRID[1:]))  # 10/3 or 3: a log grid


# --------------------------------------------------------------------------------------------------
# best_gamma: the lowest loss after k steps among the γ that held, ties to the smaller γ
# --------------------------------------------------------------------------------------------------


def test_best_gamma__lowest_loss_wins_and_ties_go_to_the_smaller_gamma():
    from natgrad_diag.checks.health import best_gamma
    from natgrad_diag.checks.report import GammaTrial

    trials = [GammaTrial(1.0, True, 9.0), GammaTrial(0.5, True, 3.0), GammaTrial(0.2, True, 3.0 * (1 + 1e-9)), GammaTrial(0.1, True, 4.0)]
    assert best_gamma(trials, np.float64) == 0.2  # 0.5 and 0.2 tie within what one evaluation resolves (√ε·3 ≈ 4.5e-8)
    trials[1] = GammaTrial(0.5, True, 2.9)
    assert best_gamma(trials, np.float64) == 0.5  # lower beyond rounding: the larger γ wins
    assert best_gamma([GammaTrial(1.0, False, None), GammaTrial(0.1, True, 10.5)], np.float64) == 0.1  # the only one that held
    assert best_gamma([GammaTrial(1.0, False, None)], np.float64) is None


@pytest.mark.slow
def test_suggested_gamma__is_a_local_minimum_of_gpflows_losses_on_the_grid():
    """Heteroskedastic notebook model, one step per γ: every γ the search measured has GPflow's loss after its step,
    but for those λ finds unstable whose 4 steps by GPflow's optimizer break or end above the start (γ = 3: NaN at step
    2; γ = 1: 409 → 115 → 5746), the suggestion is the lowest of them (ties to the smaller γ), and its grid neighbours
    are no better by GPflow's optimizer (the search stopped at a bracket)."""
    from _user_models import gpflow_loss_after, gpflow_losses, heteroskedastic_svgp, same_bits, variables_of

    from natgrad_diag import check_natgrad

    model, data = heteroskedastic_svgp()
    before = variables_of(model)
    report = check_natgrad(model, data, gamma=1.0, mode="full", progress=False, gamma_steps=1)
    assert same_bits(before, variables_of(model))
    oracle = {g: gpflow_loss_after(model, data, g) for g in GAMMA_GRID}
    for g, loss in report.gamma_losses.items():
        if next(t for t in report.gamma_trials if t.gamma == g).reason.startswith("unstable: the step held, but 4 steps did not"):
            four = gpflow_losses(model, data, g, 4)
            assert loss is None and oracle[g] is not None and (np.isnan(four[-1]) or max(four) > four[0]), g
            continue
        # |ours − GPflow's|: both evaluate the same loss at steps equal to 1e-10 (the reproduction bound), and the
        # loss's derivative times 1e-10 is far below 1e-6 relative
        assert (loss is None) == (oracle[g] is None or oracle[g] > report.loss_before), g
        if loss is not None:
            assert loss == pytest.approx(oracle[g], rel=1e-6), g
    s_ = report.suggested_gamma
    i = GAMMA_GRID.index(s_)
    for neighbour in GAMMA_GRID[max(i - 1, 0):i + 2]:
        assert oracle[neighbour] is None or oracle[neighbour] >= oracle[s_] * (1 - 1e-12), neighbour
    assert report.to_dict()["gamma_losses"][f"{s_:g}"] == report.gamma_losses[s_]


@pytest.mark.slow
def test_check_natgrad__xisqrtmeanvar_gamma_1_states_each_failure_with_its_check_and_step():
    """``natgrad-diag check --xi meanvar`` (the CLI's demo SVGP, γ = 1). Oracle: GPflow's own optimizer on a copy,
    whose first step is finite with a negative q_sqrt diagonal and whose NaN (GPflow refuses to assign it) comes steps
    later, within conjugate_convergence's walk. The evidence names step_health's step 1 with GPflow's entry, and the
    NaN at the step of the walk where GPflow's optimizer raises, not as the one step."""
    import gpflow
    import tensorflow as tf
    from gpflow.optimizers.natgrad import XiSqrtMeanVar

    from natgrad_diag import check_natgrad
    from natgrad_diag.checks.conjugate import CONVERGENCE_STEPS
    from natgrad_diag.demo import make_model
    from natgrad_diag.report.records import format_number

    model, data = make_model("svgp", "gaussian")
    copy, q_sqrts = gpflow.utilities.deepcopy(model), []
    opt = gpflow.optimizers.NaturalGradient(1.0, XiSqrtMeanVar())
    for _ in range(CONVERGENCE_STEPS):
        try:
            opt.minimize(lambda: copy.training_loss(data), [(copy.q_mu, copy.q_sqrt)])
        except tf.errors.InvalidArgumentError:
            break
        q_sqrts.append(copy.q_sqrt.numpy())
    assert 1 <= len(q_sqrts) < CONVERGENCE_STEPS and all(np.isfinite(q).all() for q in q_sqrts)  # NaN after step 1
    diag = np.diagonal(q_sqrts[0], axis1=-2, axis2=-1)
    l_, m_ = np.argwhere(diag <= 0)[0]
    entry = f"non-positive diagonal entry q_sqrt[{l_}, {m_}, {m_}] = {format_number(float(diag[l_, m_]))}"
    report = check_natgrad(model, data, gamma=1.0, xi_transform=XiSqrtMeanVar(), progress=False)
    cause = next(c for c in report.causes if c.name == "step_too_long")
    health_part = f"step_health: gamma = 1 fails at step 1: the new q_sqrt has a {entry}; conjugate_convergence: "
    assert cause.evidence.startswith(health_part)
    walk_part = cause.evidence[len(health_part):]
    failed = len(q_sqrts) + 1  # GPflow's step that raised
    assert walk_part.startswith(f"step {failed} of its {CONVERGENCE_STEPS}-step walk failed: ") and "NaN or Inf" in walk_part
    assert report.lead.count(entry) == 1  # said once, by the cause


@pytest.mark.parametrize("mode", ["full", pytest.param("fast", marks=pytest.mark.slow)])
def test_check_natgrad__where_no_gamma_trains_with_one_xi_the_fix_names_the_other_and_a_gamma_that_trains(mode):
    """A non-whitened SVGP whose q(u) is far wider than its prior (q_sqrt = 10·I, q_mu = 10): GPflow's XiSqrtMeanVar
    step breaks q(u) at every γ of the grid, and the fix said "use a smaller gamma". It names XiNat and the γ its
    search measured. Oracle: GPflow's own NaturalGradient on copies. With XiSqrtMeanVar every grid γ fails within k
    steps (q_sqrt's diagonal not positive, a raise, or a rise of the loss); with XiNat and the γ named, 4k steps keep
    q_sqrt's diagonal positive, the first lowers the loss and none raises it beyond rounding."""
    import gpflow
    import tensorflow as tf
    from _user_models import same_bits, variables_of
    from gpflow.optimizers import XiNat, XiSqrtMeanVar

    from natgrad_diag import check_natgrad
    from natgrad_diag.demo import make_model

    model, data = make_model("svgp", "gaussian", num_inducing=8, num_data=40, whiten=False)
    model.q_sqrt.assign(10.0 * np.eye(8)[None])
    model.q_mu.assign(np.full((8, 1), 10.0))

    def gpflow_losses(xi, gamma, steps):  # the loss after each step, None from the first that breaks q(u) or raises
        copy, losses = gpflow.utilities.deepcopy(model), []
        opt = gpflow.optimizers.NaturalGradient(gamma, xi)
        for _ in range(steps):
            try:
                opt.minimize(lambda: copy.training_loss(data), [(copy.q_mu, copy.q_sqrt)])
            except tf.errors.InvalidArgumentError:
                return [*losses, None]
            if not np.all(np.diagonal(copy.q_sqrt.numpy(), axis1=-2, axis2=-1) > 0):
                return [*losses, None]
            losses.append(float(copy.training_loss(data)))
        return losses

    start = float(model.training_loss(data))
    for gamma in GAMMA_GRID:  # every γ of the grid fails with XiSqrtMeanVar within k = 5 steps
        losses = gpflow_losses(XiSqrtMeanVar(), gamma, 5)
        assert None in losses or any(b > a for a, b in zip([start, *losses], losses)), gamma
    before = variables_of(model)
    report = check_natgrad(model, data, gamma=1.0, xi_transform=XiSqrtMeanVar(), mode=mode, progress=False)
    assert report.suggested_gamma is None and same_bits(before, variables_of(model))  # read-only, both searches too
    cause = next(c for c in report.causes if c.name == "step_too_long")
    assert cause.fix.startswith("use xi_transform=XiNat() with gamma = "), cause.fix
    named = float(cause.fix.split("with gamma = ")[1].split(":")[0])
    health = next(c for c in report.checks if c.name == "step_health")
    assert f"no gamma of the grid holds for 5 steps with XiSqrtMeanVar; with XiNat, gamma = {named:g} trains" in health.detail
    pair = check_natgrad(lambda: model.training_loss(data), var_list=[(model.q_mu, model.q_sqrt, XiSqrtMeanVar())],
                         gamma=1.0, mode=mode, progress=False).pairs[0]  # the var_list form searches its own ξ alone
    assert pair.suggested_gamma is None and "holds for 5 steps." in next(c for c in pair.checks if c.name == "step_health").detail
    losses = gpflow_losses(XiNat(), named, 20)
    tie = np.sqrt(np.finfo(np.float64).eps) * start  # what one evaluation resolves (the checks' rounding bound)
    assert None not in losses and losses[0] < start and all(b <= a + tie for a, b in zip(losses, losses[1:]))
