"""Step health: is the new q(u) usable, the loss after the step, and the γ of the grid with the lowest measured loss."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.checks.bounds import finite, maxabs
from natgrad_diag.checks.context import Context
from natgrad_diag.checks.report import GammaTrial, Outcome
from natgrad_diag.checks.step import Step
from natgrad_diag.checks.tensors import loss_and_grads, step_tensors
from natgrad_diag.report.records import Check, format_number, status_of
from natgrad_diag.typing import Array

__all__ = ["GAMMA_GRID", "HealthResult", "best_gamma", "check_step_health", "health", "loss_at", "suggest"]

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


def loss_at(ctx: Context, scratch: Any, new_q_mu: Array, new_q_sqrt: Array) -> float | None:
    """The training loss of the scratch copy with q(u) set to the new parameters (None if not finite)."""
    import tensorflow as tf

    try:
        scratch.q_mu.assign(new_q_mu)
        scratch.q_sqrt.assign(new_q_sqrt)
        value = float(ctx.loss_fn(scratch).numpy())
    except (tf.errors.InvalidArgumentError, ValueError):
        return None
    return value if np.isfinite(value) else None


def _trial(ctx: Context, scratch: Any, gamma: float, loss_before: float, g: tuple[Any, Any, Any]) -> GammaTrial:
    """One step length: take the step (GPflow's maths via natgrad_tensors), check health and the loss."""
    import tensorflow as tf

    try:
        out = step_tensors(ctx.model, g[1], g[2], tf.constant(gamma, ctx.model.q_mu.dtype), ctx.xi)
    except tf.errors.InvalidArgumentError:
        return GammaTrial(gamma, False, None, "Cholesky failed")
    new_mu, new_sq = out["new_q_mu"].numpy(), out["new_q_sqrt"].numpy()
    ok, why, _ = health(new_mu, new_sq, ctx.np_dtype)
    if not ok:
        return GammaTrial(gamma, False, None, why)
    loss = loss_at(ctx, scratch, new_mu, new_sq)
    if loss is None:
        return GammaTrial(gamma, False, None, "the loss after the step is not finite")
    return GammaTrial(gamma, True, loss, "lowers the loss" if loss < loss_before else "raises the loss")


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
    from natgrad_diag.tolerance import rounding_bound

    usable = sorted((t for t in trials if t.healthy and t.loss is not None and t.loss < loss_before), key=lambda t: t.gamma)
    if not usable:
        return None
    tie = rounding_bound(dtype, condition=1.0, scale=max(abs(t.loss) for t in usable))  # type: ignore[arg-type]
    best = usable[0]
    for t in usable[1:]:  # smallest γ first: a larger γ replaces it only when its loss is lower beyond a tie
        if t.loss < best.loss - tie:  # type: ignore[operator]
            best = t
    return best.gamma


def _own_trial(ctx: Context, step: Step, healthy: bool, loss_after: float | None, why: str = "") -> GammaTrial:
    """The step at γ itself as a trial (already taken: nothing is computed when ``ctx.gamma_steps`` is 1)."""
    k = ctx.gamma_steps
    if not (healthy and loss_after is not None):
        if k > 1:
            return GammaTrial(ctx.gamma, False, None, f"step 1 of {k}: {why or step.error or 'unhealthy step'}", k)
        return GammaTrial(ctx.gamma, False, None, step.error or "unhealthy step")
    if k > 1:
        return _trial_k(ctx, ctx.gamma, step)
    return GammaTrial(ctx.gamma, True, loss_after, "lowers the loss" if loss_after < step.loss else "raises the loss")


def _trial_k(ctx: Context, gamma: float, step: Step) -> GammaTrial:
    """One step length measured by the loss after ``ctx.gamma_steps`` steps (:mod:`natgrad_diag.checks.gamma_steps`)."""
    from natgrad_diag.checks.gamma_steps import runner

    k = ctx.gamma_steps
    run = runner(ctx.model, ctx.xi, ctx.data is not None)
    loss, why = run.trial(ctx.model, ctx.data, step.g_mu, step.g_sq, gamma, k, lambda mu, sq: health(mu, sq, ctx.np_dtype)[:2])
    if loss is None:
        return GammaTrial(gamma, False, None, why, k)
    return GammaTrial(gamma, True, loss, "lowers the loss" if loss < step.loss else "raises the loss", k)


def suggest(
    ctx: Context, scratch: Any, step: Step, healthy: bool, loss_after: float | None, advance: Callable[..., Any], why: str = "",
) -> tuple[float | None, tuple[GammaTrial, ...]]:  # fmt: skip
    """The γ of :data:`GAMMA_GRID` whose step is healthy and has the lowest loss after it (see :func:`best_gamma`).

    Full mode measures the loss after one step for every γ of the grid (the step at γ itself is reused when γ is on
    the grid). Fast mode, where the monitor runs it every few training steps, keeps γ when its step is healthy and
    lowers the loss (one trial, nothing else computed) and otherwise measures every γ of the grid below γ (the trials
    then start with γ's own). With ``ctx.gamma_steps`` = k > 1, in both modes every γ tried (γ's own included) is
    measured by the loss after k steps from the current q(u), hyperparameters held fixed
    (:mod:`natgrad_diag.checks.gamma_steps`); a trial fails if any of its k steps does (``why``: why the step at γ
    is unhealthy, for its trial's reason).
    """
    # γ's own trial: always in fast mode, in full mode only when γ is on the grid (k steps are not free)
    own = _own_trial(ctx, step, healthy, loss_after, why) if ctx.mode == "fast" or ctx.gamma in GAMMA_GRID else None
    if ctx.mode == "fast" and own is not None:
        if own.healthy and own.loss is not None and own.loss < step.loss:
            return ctx.gamma, (own,)
        grid = [g for g in GAMMA_GRID if g < ctx.gamma]
        trials = [own]
    else:
        grid = list(GAMMA_GRID)
        trials = []
    grads: list[Any] = []
    for g in grid:
        if ctx.mode == "full" and g == ctx.gamma and own is not None:
            t = own
        elif ctx.gamma_steps > 1:
            t = _trial_k(ctx, g, step)
        else:
            if not grads:
                grads.append(loss_and_grads(ctx.model, ctx.data))
            t = _trial(ctx, scratch, g, step.loss, grads[0])
        trials.append(t)
        advance()
    return best_gamma(trials, step.loss, ctx.np_dtype), tuple(trials)


@dataclass(frozen=True)
class HealthResult:
    """The ``step_health`` check with what the report needs beside it.

    Attributes:
        outcome: the check and the health numbers.
        loss_after: the loss after the step (None if the step is unhealthy).
        suggested: the suggested γ (None if no γ of the grid is healthy and lowers the loss).
        trials: the step lengths tried.
        step_error: why the step is unhealthy ("" when it is healthy).
    """

    outcome: Outcome
    loss_after: float | None
    suggested: float | None
    trials: tuple[GammaTrial, ...]
    step_error: str


def _health_check(ctx: Context, step: Step, healthy: bool, why: str, loss_after: float | None, suggested: float | None) -> Check:
    f32_note = " In float32 the Cholesky factorisations of the step are fragile: try float64." if ctx.np_dtype == np.float32 and not healthy else ""
    k = ctx.gamma_steps
    after = f" after {k} steps" if k > 1 else ""
    by = f" (the lowest loss after {k} steps)" if k > 1 else ""
    hint = f" Suggested gamma: {suggested:g}{by}." if suggested is not None else f" No gamma of the grid gives a healthy step that lowers the loss{after}."
    if healthy:
        assert loss_after is not None  # check_step_health passes healthy=True only with loss_after set
        change = loss_after - step.loss
        claim = f"the step with gamma = {ctx.gamma:g} keeps q(u) valid: finite, q_sqrt lower-triangular with a positive diagonal, S positive definite"
        detail = f"loss {step.loss!r} → {loss_after!r} ({'lower' if change < 0 else 'HIGHER'} by {format_number(abs(change))}).{hint}"
    else:
        claim = f"the step with gamma = {ctx.gamma:g} keeps q(u) valid"
        detail = f"{why.rstrip('.')}.{f32_note}{hint}"
    return Check(name="step_health", claim=claim, status=status_of(healthy), detail=detail)


def check_step_health(ctx: Context, step: Step, scratch: Any, loss_after: float | None, engine: Any, advance: Callable[..., Any]) -> HealthResult:
    """Is the step at γ healthy and does it lower the loss; search the grid for a suggestion when needed.

    ``scratch`` is a copy of the model on which losses are evaluated (the engine's in fast mode); ``loss_after``
    is the loss after GPflow's step when the engine already computed it.
    """
    healthy, why, nums = health(step.new_q_mu, step.new_q_sqrt, ctx.np_dtype)
    if step.error:
        healthy, why = False, step.error
    # health() is True only when the step has new parameters: the last two conditions restate that for mypy
    if healthy and loss_after is None and step.new_q_mu is not None and step.new_q_sqrt is not None:
        loss_after = loss_at(ctx, scratch, step.new_q_mu, step.new_q_sqrt)
        if loss_after is None:
            healthy, why = False, "the loss after the step is not finite"
    if engine is not None and not (healthy and loss_after is not None and loss_after < step.loss):
        engine.sync(ctx.model)  # the grid search evaluates the loss on the scratch copy
    suggested, trials = suggest(ctx, scratch, step, healthy, loss_after if healthy else None, advance, why)
    check = _health_check(ctx, step, healthy, why, loss_after, suggested)
    outcome = Outcome(checks=(check,), numbers=tuple(nums.items()))
    return HealthResult(outcome, loss_after if healthy else None, suggested, trials, "" if healthy else why)
