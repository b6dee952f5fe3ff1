"""The ``step_health`` oracle: is the new q(u) usable, the loss after the step, and the γ of the grid with the lowest
measured loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from natgrad_diag.checks.bounds import finite, maxabs
from natgrad_diag.checks.evaluator import Context, Evaluator, Run, Step
from natgrad_diag.checks.report import GammaTrial, HealthResult, Outcome
from natgrad_diag.report.records import Check, format_number, status_of
from natgrad_diag.tolerance import rounding_bound
from natgrad_diag.typing import Array

__all__ = ["GAMMA_GRID", "best_gamma", "health", "stage", "suggest", "ticks"]

#: Step lengths tried, largest first, for the suggested gamma.
GAMMA_GRID = (1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001)


def health(new_q_mu: Array | None, new_q_sqrt: Array | None, dtype: Any) -> tuple[bool, str, dict[str, float]]:
    """Is the new q(u) usable: finite, q_sqrt [L, M, M] lower-triangular with a positive diagonal, S = q_sqrt q_sqrtᵀ PD.

    Returns:
        (healthy, why not, further numbers).

    Examples:
        >>> ok, why, nums = health(np.zeros((2, 1)), np.eye(2)[None], np.float64)
        >>> ok, why
        (True, '')
        >>> health(np.zeros((2, 1)), -np.eye(2)[None], np.float64)[1]
        'the new q_sqrt has a non-positive diagonal entry q_sqrt[0, 0, 0] = -1'
    """
    if new_q_mu is None or new_q_sqrt is None:
        return False, "no new parameters (the step failed)", {}
    if not finite(new_q_mu, new_q_sqrt):
        n_bad = int(np.sum(~np.isfinite(new_q_mu)) + np.sum(~np.isfinite(new_q_sqrt)))
        return False, f"{n_bad} NaN/Inf value(s) in the new q_mu or q_sqrt", {}
    eps = float(np.finfo(dtype).eps)
    scale = max(maxabs(new_q_sqrt), 1.0)
    upper = maxabs(np.triu(new_q_sqrt, 1))
    diag = np.diagonal(new_q_sqrt, axis1=-2, axis2=-1)
    nums = {"max |upper triangle of new q_sqrt|": upper, "min diagonal of new q_sqrt": float(diag.min())}
    if upper > 100 * eps * scale:
        return False, f"the new q_sqrt is not lower-triangular (max |upper entry| {format_number(upper)})", nums
    if not (diag > 0).all():
        l_idx, m_idx = (int(i) for i in np.argwhere(diag <= 0)[0])
        return False, f"the new q_sqrt has a non-positive diagonal entry q_sqrt[{l_idx}, {m_idx}, {m_idx}] = {format_number(float(diag[l_idx, m_idx]))}", nums
    S = np.matmul(new_q_sqrt, np.swapaxes(new_q_sqrt, -1, -2)).astype(dtype)
    try:
        np.linalg.cholesky(S)
    except np.linalg.LinAlgError:
        return False, f"S = q_sqrt q_sqrtᵀ is not numerically positive definite in {np.dtype(dtype).name} (Cholesky failed)", nums
    ratio = float((diag.max(axis=-1) / diag.min(axis=-1)).max())
    nums["cond(S) lower bound (max/min diag of q_sqrt)²"] = ratio**2
    return True, "", nums


def best_gamma(trials: tuple[GammaTrial, ...] | list[GammaTrial], loss_before: float, dtype: Any) -> float | None:
    """The γ whose healthy step has the lowest loss after it, among those that lower the loss; ties to the smaller γ.

    Two losses tie when they differ by at most the rounding of one loss evaluation,
    ``rounding_bound(dtype, condition=1, scale=max|loss|)`` = 100·ε·max|loss| (the loss is a sum of N terms each
    computed to a few ε; 100 absorbs N up to the size where its rounding matters).

    Examples:
        >>> t = [GammaTrial(1.0, True, 5.0), GammaTrial(0.1, True, 2.0), GammaTrial(0.01, True, 2.0), GammaTrial(0.5, False, None)]
        >>> best_gamma(t, 10.0, np.float64)
        0.01
        >>> best_gamma([GammaTrial(1.0, True, 11.0)], 10.0, np.float64) is None
        True
    """
    usable = sorted((t.gamma, t.loss) for t in trials if t.healthy and t.loss is not None and t.loss < loss_before)
    if not usable:
        return None
    tie = rounding_bound(dtype, condition=1.0, scale=max(abs(loss) for _, loss in usable))
    best = usable[0]
    for g, loss in usable[1:]:  # smallest γ first: a larger γ replaces it only when its loss is lower beyond a tie
        if loss < best[1] - tie:
            best = (g, loss)
    return best[0]


def _trial(ev: Evaluator, gamma: float, step: Step) -> GammaTrial:
    """One step length, measured by the loss after ``gamma_steps`` = k steps from the current q(u) (the evaluator's
    :meth:`~natgrad_diag.checks.evaluator.Evaluator.trial`); a trial fails at the first unhealthy step."""
    k = ev.ctx.gamma_steps
    loss, why = ev.trial(step.g_mu, step.g_sq, gamma, k, lambda mu, sq: health(mu, sq, ev.ctx.np_dtype)[:2])
    return _measured(gamma, loss, why, step, k)


def _measured(gamma: float, loss: float | None, why: str, step: Step, k: int) -> GammaTrial:
    if loss is None:
        return GammaTrial(gamma, False, None, why, k)
    return GammaTrial(gamma, True, loss, "lowers the loss" if loss < step.loss else "raises the loss", k)


def _own_trial(ev: Evaluator, step: Step, healthy: bool, loss_after: float | None, why: str) -> GammaTrial:
    """The step at γ itself as a trial (already taken: nothing is computed when ``gamma_steps`` is 1)."""
    gamma, k = ev.ctx.gamma, ev.ctx.gamma_steps
    if healthy and loss_after is not None:
        return _trial(ev, gamma, step) if k > 1 else _measured(gamma, loss_after, "", step, 1)
    return _measured(gamma, None, f"step 1 of {k}: {why or step.error or 'unhealthy step'}" if k > 1 else step.error or "unhealthy step", step, k)


def suggest(
    ev: Evaluator, step: Step, healthy: bool, loss_after: float | None, advance: Callable[..., Any], why: str = "",
) -> tuple[float | None, tuple[GammaTrial, ...]]:  # fmt: skip
    """The γ of :data:`GAMMA_GRID` whose step is healthy and has the lowest loss after it (see :func:`best_gamma`).

    With ``ev.whole_grid`` (full mode) the loss after one step is measured for every γ of the grid (the step at γ
    itself is reused when γ is on the grid). Otherwise (fast mode, which the monitor runs every few training steps)
    γ is kept when its step is healthy and lowers the loss (one trial, nothing else computed), and every γ of the
    grid below γ is measured when it is not (the trials then start with γ's own). With ``gamma_steps`` = k > 1
    every γ tried (γ's own included) is measured by the loss after k steps from the current q(u), hyperparameters
    held fixed; a trial fails if any of its k steps does (``why``: why the step at γ is unhealthy).
    """
    gamma = ev.ctx.gamma
    if not ev.ctx.search:
        own = _own_trial(ev, step, healthy, loss_after, why)
        return (gamma if own.healthy and own.loss is not None and own.loss < step.loss else None), (own,)
    own = _own_trial(ev, step, healthy, loss_after, why) if not ev.whole_grid or gamma in GAMMA_GRID else None
    trials: list[GammaTrial] = []
    grid = list(GAMMA_GRID)
    if not ev.whole_grid and own is not None:
        if own.healthy and own.loss is not None and own.loss < step.loss:
            return gamma, (own,)
        grid, trials = [g for g in GAMMA_GRID if g < gamma], [own]
    for g in grid:
        trials.append(own if ev.whole_grid and g == gamma and own is not None else _trial(ev, g, step))
        advance()
    return best_gamma(trials, step.loss, ev.ctx.np_dtype), tuple(trials)


def _health_check(ctx: Context, step: Step, healthy: bool, why: str, loss_after: float | None, suggested: float | None) -> Check:
    f32_note = " In float32 the Cholesky factorisations of the step are fragile: try float64." if ctx.np_dtype == np.float32 and not healthy else ""
    k = ctx.gamma_steps
    after = f" after {k} steps" if k > 1 else ""
    by = f" (the lowest loss after {k} steps)" if k > 1 else ""
    hint = f" Suggested gamma: {suggested:g}{by}." if suggested is not None else f" No gamma of the grid gives a healthy step that lowers the loss{after}."
    if healthy:
        assert loss_after is not None  # stage passes healthy=True only with loss_after set
        change = loss_after - step.loss
        claim = f"the step with gamma = {ctx.gamma:g} keeps q(u) valid: finite, q_sqrt lower-triangular with a positive diagonal, S positive definite"
        detail = f"loss {step.loss!r} → {loss_after!r} ({'lower' if change < 0 else 'HIGHER'} by {format_number(abs(change))}).{hint}"
    else:
        claim = f"the step with gamma = {ctx.gamma:g} keeps q(u) valid"
        detail = f"{why.rstrip('.')}.{f32_note}{hint}"
    return Check(name="step_health", claim=claim, status=status_of(healthy), detail=detail)


def ticks(ev: Evaluator) -> int:
    """Progress-bar ticks of this stage beyond its own: one per γ of the grid when the whole grid is measured."""
    return len(GAMMA_GRID) if ev.whole_grid else 0


def stage(run: Run) -> Outcome:
    """``step_health``: is the step at γ healthy and does it lower the loss; search the grid for a suggestion.

    The loss after the step is the one after GPflow's step when the evaluator computed it, else the loss at
    natgrad-diag's new q(u).
    """
    ev, step = run.ev, run.step
    healthy, why, nums = health(step.new_q_mu, step.new_q_sqrt, ev.ctx.np_dtype)
    if step.error:
        healthy, why = False, step.error
    loss_after = run.gp.loss_after if not step.error else None
    # health() is True only when the step has new parameters: the last two conditions restate that for mypy
    if healthy and loss_after is None and step.new_q_mu is not None and step.new_q_sqrt is not None:
        loss_after = ev.loss_at(step.new_q_mu, step.new_q_sqrt)
        if loss_after is None:
            healthy, why = False, "the loss after the step is not finite"
    suggested, trials = suggest(ev, step, healthy, loss_after if healthy else None, run.advance, why)
    check = _health_check(ev.ctx, step, healthy, why, loss_after, suggested)
    result = HealthResult(loss_after if healthy else None, suggested, trials, "" if healthy else why)
    return Outcome(checks=(check,), numbers=tuple(nums.items()), health=result)
