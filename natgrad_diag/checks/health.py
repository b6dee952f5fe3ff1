"""The ``step_health`` oracle: does training with the checked γ hold for k steps, and which γ trains best.

A verdict about a step length must hold over the steps that follow, so γ is judged by k = ``gamma_steps`` steps
(default 5) from the current q(u), hyperparameters held fixed, by GPflow's own update (the thing being checked). It
fails at the first step that raises, leaves the valid set (:func:`health`) or raises the loss by more than one
evaluation of it resolves (:func:`rounding`; for a stochastic loss, its measured :func:`noise`).

The suggestion searches a log grid around γ, above and below it (:data:`GAMMA_GRID` and γ itself), by bracketing:
from γ upwards while the loss after k steps keeps falling beyond a tie, else downwards; from a failing γ downwards
to the first healthy γ and on while the loss keeps falling.

**Stability.** GPflow's XiNat step is θ ← θ − γ·∇ηL(θ) (θ natural, η expectation parameters). Its Jacobian is
I − γA with A = ∂(∇ηL)/∂θ = H·F, H = ∂²L/∂η² and F = ∂η/∂θ the Fisher matrix (positive definite). A's eigenvalues are
those of the symmetric F^½·H·F^½, so real; near a fixed point a perturbation along the eigenvector of λ is multiplied by
1 − γλ at every step, and the iteration cannot converge to it when γ·λmax > 2, however well the first k steps went:
a perturbation of rounding size takes many steps to show (a trained MultiClass SVGP has λmax = 2.80, and GPflow's
optimizer with γ = 1 lowered the loss for 23 steps and blew up at step 27). This is the condition 0 < γλ < 2 of
gradient descent on a quadratic (J. Nocedal, S. Wright, Numerical Optimization, 2nd ed., 2006, ch. 3). A Gaussian
likelihood gives A = I (E_q log p(y|f) is linear in η): one γ = 1 step to the optimum, γ < 2, and no estimate. At a
fixed point the linearised step of another ξ (XiSqrtMeanVar) is similar to I − γA, with the same eigenvalues.

A is local: far from the optimum it changes as q(u) moves (a Student-t SVGP has λ = 37 at its prior and 1.27 at its
optimum; γ = 0.3 trains from the prior), so λ is estimated at the current q(u) and where the best trial's k steps
lead; γ fails when it exceeds 2/λ at both, unless λ falls by more than :data:`STEADY` between them (a transient the
steps leave: 14 after one γ = 0.3 step from that prior). λ may rise: 9.1 here and 64 after γ = 0.3's 5 steps on a
MultiClass SVGP in training, where GPflow's optimizer with 0.3 does not settle and with 0.1 converges.

λ is estimated by power iteration on A, each A·v and F·v by central differences of ∇ηL and η along v (two gradient
evaluations), as the generalised Rayleigh quotient ρ(v) = ⟨Fv, Av⟩/⟨Fv, v⟩ = wᵀ(F^½HF^½)w/wᵀw (w = F^½v), which
never exceeds λmax; when the eigenvalue of largest magnitude is negative (a loss not convex in η: a Student-t
likelihood with outliers), the iteration finds it instead, so it runs again on A − ρI, whose largest eigenvalue is
λmax − ρ. So γ·(ρ − error) > 2 shows the instability (error: the differences' truncation, ∝ h², from the step h
against 2h, and their rounding, ∝ 1/h, from h against h/2, where it is twice h's: at κ(S) = 1e8 ρ was 15.6 at h, −58
at h/2 and 1.0 from 8h up); a γ below it may still be unstable, and the trials judge it as before.

When λ where the steps lead exceeds 2/γ but λ here does not (λ falling by more than :data:`STEADY`, or rising from
below 2/γ), the linearisation cannot decide, so γ is tried for :data:`LOOK_AHEAD`·k steps, and fails when they break
or leave the loss above where it started (docs/natgrad-checks.md: a Student-t SVGP with outliers, NaN at step 14).
A stochastic loss (GPflow's Softmax) has no λ (finite differences of it measure its noise), so every γ whose k steps
held is tried so: a trained Softmax SVGP held 5 steps of γ = 1.5, and GPflow's optimizer with it reached NaN at step 8.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.checks.bounds import finite, maxabs
from natgrad_diag.checks.conjugate import conjugate_applicable
from natgrad_diag.checks.evaluator import Context, Evaluator, Point, Run, Step, Trial
from natgrad_diag.checks.report import GammaTrial, HealthResult, Outcome
from natgrad_diag.report.records import Check, format_number, loss_rose, status_of
from natgrad_diag.typing import Array

__all__ = [
    "GAMMA_GRID", "LOOK_AHEAD", "MAX_ITERATIONS", "NOISE_SAMPLES", "STEADY", "STOCHASTIC", "Stability", "best_gamma", "estimate_stability", "health",
    "judge_stability", "noise", "other_xi", "rayleigh_bound", "rounding", "search", "sigmas", "spread", "stage",
]  # fmt: skip

#: The step lengths the search may try besides γ itself, largest first: half-decades from 10 to 0.001.
GAMMA_GRID = (10.0, 3.0, 1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001)


def health(new_q_mu: Array | None, new_q_sqrt: Array | None, dtype: Any) -> tuple[bool, str, dict[str, float]]:
    """(healthy, why not, further numbers): is the new q(u) usable, i.e. finite, q_sqrt [L, M, M] lower-triangular with
    a positive diagonal and S = q_sqrt q_sqrtᵀ PD?

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
    upper, diag = maxabs(np.triu(new_q_sqrt, 1)), np.diagonal(new_q_sqrt, axis1=-2, axis2=-1)
    nums = {"max |upper triangle of new q_sqrt|": upper, "min diagonal of new q_sqrt": float(diag.min())}
    if upper > 100 * float(np.finfo(dtype).eps) * max(maxabs(new_q_sqrt), 1.0):
        return False, f"the new q_sqrt is not lower-triangular (max |upper entry| {format_number(upper)})", nums
    if not (diag > 0).all():
        l_idx, m_idx = (int(i) for i in np.argwhere(diag <= 0)[0])
        return False, f"the new q_sqrt has a non-positive diagonal entry q_sqrt[{l_idx}, {m_idx}, {m_idx}] = {format_number(float(diag[l_idx, m_idx]))}", nums
    try:
        np.linalg.cholesky(np.matmul(new_q_sqrt, np.swapaxes(new_q_sqrt, -1, -2)).astype(dtype))
    except np.linalg.LinAlgError:
        return False, f"S = q_sqrt q_sqrtᵀ is not numerically positive definite in {np.dtype(dtype).name} (Cholesky failed)", nums
    nums["cond(S) lower bound (max/min diag of q_sqrt)²"] = float((diag.max(axis=-1) / diag.min(axis=-1)).max()) ** 2
    return True, "", nums


def rounding(loss: float, dtype: Any, noise: float = 0.0) -> float:
    """What one evaluation of the loss resolves, √ε·max(|loss|, 1): closer losses tie, and a step may raise the loss
    by this much and still be healthy. The loss is a difference of terms (a sum of N expected log-likelihoods, the KL)
    each rounded to ε of its own size, which near a converged q(u) exceeds |loss| by orders of magnitude; √ε allows
    terms ~10⁶ times the loss in float64 (~10³ in float32), far below a real rise (percent, for a diverging γ).

    A stochastic loss (``noise`` = σ̂ > 0, :func:`noise`) resolves no better than its noise: the difference of two
    evaluations has standard deviation √2·σ, and with σ̂ from :data:`NOISE_SAMPLES` evaluations (9 degrees of freedom)
    a difference above 6·√2·σ̂ arises from noise alone with probability 10⁻⁴ (Student's t), so that is the bound.
    """
    return max(float(np.sqrt(np.finfo(dtype).eps)) * max(abs(loss), 1.0), 6.0 * float(np.sqrt(2.0)) * noise)


#: The evaluations at the current q(u) from which :func:`noise` estimates a stochastic loss's standard deviation.
NOISE_SAMPLES = 10


def noise(ev: Evaluator, step: Step) -> float:
    """The standard deviation σ̂ of the loss, 0.0 for a deterministic loss (the usual case), measured once per
    evaluator (``ev.noise``) and only where a verdict would turn on a difference of losses, so a deterministic model
    that passes pays nothing for it.

    It is measured at the current q(u) and where ``step`` lands: a loss can be deterministic at one and not at the
    other (a GPflux deep GP whose output layer starts at q_mu = 0, q_sqrt = I predicts the same whatever its hidden
    layer samples, until a step moves it). At each, :func:`spread` tells a stochastic loss (a Monte Carlo likelihood
    such as GPflow's Softmax draws new samples at each evaluation) and measures σ̂. Both are kept (``ev.noise_at``;
    where the step lands: the current one's when it failed) and the larger returned.
    """
    if ev.noise is None:
        points: list[tuple[tuple[Array, Array], float | None]] = [(ev.q_arrays, step.loss)]
        if step.new_q_mu is not None and step.new_q_sqrt is not None:
            points.append(((step.new_q_mu, step.new_q_sqrt), None))
        found = [spread(functools.partial(ev.loss_at, *q, eager=True), first, ev.ctx.np_dtype) for q, first in points]
        ev.noise_at, ev.noise = (found[0], found[-1]), max(found)
    return ev.noise


def sigmas(ev: Evaluator) -> tuple[float, float]:
    """The σ̂ a comparison of two losses uses: √((σ₀² + σ₁²)/2) between the current q(u) and a step from it (6·√2 times
    it is 6 standard deviations of their difference), σ₁ between points further on and between the losses after k
    steps. σ₀, σ₁: :func:`noise` at the current q(u) and where one step lands; a loss evaluated where q(u) has
    shrunk is far less noisy than at a fresh q(u) (σ̂ 3 at a fresh Softmax SVGP, 0.3 a step later), so the first's
    bound would pass real rises further on."""
    s0, s1 = ev.noise_at
    return float(np.sqrt((s0**2 + s1**2) / 2)), s1


def spread(evaluate: Callable[[], float | None], first: float | None, dtype: Any) -> float:
    """σ̂ of the loss ``evaluate()`` computes at one point by :func:`noise`'s test: 0.0 when a second evaluation
    agrees with ``first`` (None: evaluate it) to :func:`rounding`, else the sample standard deviation of
    :data:`NOISE_SAMPLES` evaluations."""
    first = evaluate() if first is None else first
    again = evaluate()
    if first is None or again is None or abs(again - first) <= rounding(first, dtype):
        return 0.0
    values = [first, again, *(evaluate() for _ in range(NOISE_SAMPLES - 2))]
    return float(np.std([v for v in values if v is not None], ddof=1))


def best_gamma(trials: tuple[GammaTrial, ...] | list[GammaTrial], dtype: Any, noise: float = 0.0, keep: float | None = None) -> float | None:
    """The γ with the lowest loss after its k steps among the trials healthy for all k; ties (:func:`rounding`) go to
    ``keep`` (the γ checked) when it is among them, else to the smaller γ; None when no trial is healthy. At the
    optimum every γ ties, and the suggestion is the γ in use rather than one notch below it at every check.

    Examples:
        >>> t = [GammaTrial(1.0, True, 5.0), GammaTrial(0.1, True, 2.0), GammaTrial(0.01, True, 2.0), GammaTrial(3.0, False, None)]
        >>> best_gamma(t, np.float64), best_gamma(t, np.float64, keep=0.1), best_gamma(t, np.float64, keep=1.0)
        (0.01, 0.1, 0.01)
        >>> best_gamma([GammaTrial(1.0, False, None)], np.float64) is None
        True
    """
    if not (usable := sorted((t.gamma, t.loss) for t in trials if t.healthy and t.loss is not None)):
        return None
    tie = rounding(max(abs(loss) for _, loss in usable), dtype, noise)
    # smallest γ first: a larger γ replaces the best only when its loss is lower beyond a tie
    best = functools.reduce(lambda best, t: t if t[1] < best[1] - tie else best, usable)
    kept = dict(usable).get(keep) if keep is not None else None
    return keep if kept is not None and kept <= best[1] + tie else best[0]


def _trial(ev: Evaluator, gamma: float, step: Step, *, own: bool = False, k: int = 0, rises: bool = True) -> GammaTrial:
    """γ measured by up to k = ``gamma_steps`` (or ``k``) steps from the current q(u) (the evaluator's
    :meth:`~natgrad_diag.checks.evaluator.Evaluator.trial`), stopped at the first failing step; a rise of the loss
    fails a step unless ``rises=False``."""
    k, dtype = k or ev.ctx.gamma_steps, ev.ctx.np_dtype

    def run() -> Trial:
        rise = (rounding(step.loss, dtype, sigmas(ev)[0]), rounding(step.loss, dtype, sigmas(ev)[1])) if rises else (np.inf, np.inf)
        return ev.trial(step.g_mu, step.g_sq, gamma, k, lambda mu, sq: health(mu, sq, dtype)[:2], step.loss, rise, own=own)

    losses, why, failed = run()
    if failed is not None and ev.noise is None and "the loss rose" in why and noise(ev, step):
        losses, why, failed = run()  # the rise is within the loss's noise: the trial again, to a stochastic loss's bound
    if failed is not None:
        return GammaTrial(gamma, False, None, why, k, losses, failed)
    return GammaTrial(gamma, True, losses[-1], "lowers the loss" if losses[-1] < step.loss else "keeps the loss", k, losses)


def _unstable(ev: Evaluator, measured: dict[float, GammaTrial], step: Step, proven: bool) -> float | None:
    """Fail the healthy trials of ``measured`` whose γ is unstable (:func:`judge_stability`, else :func:`_look_ahead`), λ
    estimated once per evaluator; the smallest γ failed so (None when none was)."""
    if ev.stability is None and hasattr(ev.ctx.model, "likelihood") and not conjugate_applicable(ev.ctx):
        ev.stability = Stability(1.0)  # E_q log p(y | f) is linear in η without a mixing kernel: A = I, λ = 1
    if ev.stability is None and ev.noise:  # a stochastic loss (measured already): finite differences of it say nothing
        ev.stability = Stability(None, stochastic=True)
    if ev.stability is None:
        reached = [t for t in measured.values() if t.healthy and t.loss is not None and t.gamma in ev.reached]
        if not reached:
            return None
        best = min(reached, key=lambda t: t.loss or 0.0).gamma
        ev.stability = estimate_stability(ev, ev.reached[best], max(t.gamma for t in reached))
    if ev.stability.stochastic:
        noise(ev, step)  # the look-ahead's bound on the loss is its noise
    judged = {g: _look_ahead(ev, judge_stability(t, ev.stability), step, own=g == ev.ctx.gamma or not proven) for g, t in measured.items()}
    failed = {g: t for g, t in judged.items() if t is not measured[g]}
    measured.update(failed)
    return min(failed, default=None)


def _look_ahead(ev: Evaluator, trial: GammaTrial, step: Step, *, own: bool) -> GammaTrial:
    """``trial``, failed when λ where its steps lead exceeds 2/γ (:func:`judge_stability` could not decide) and
    :data:`LOOK_AHEAD`·k steps of γ break or leave the loss above where it started (module docstring)."""
    st, k, blind = ev.stability, trial.steps, ev.stability.stochastic  # blind: no λ, so every γ that held looks ahead
    if not trial.healthy or (not blind and (st.end is None or trial.gamma * (st.end - st.error) <= 2)):
        return trial
    if trial.gamma not in ev.looked:
        far = _trial(ev, trial.gamma, step, own=own, k=LOOK_AHEAD * k, rises=False)
        top = step.loss + rounding(step.loss, ev.ctx.np_dtype, sigmas(ev)[0])
        j = next((j for j, loss in enumerate(far.losses, 1) if loss > top), None)
        ev.looked[trial.gamma] = (f"step {j} of {LOOK_AHEAD * k}: the loss is above where it started ({format_number(step.loss)} → "
                                  f"{format_number(far.losses[j - 1])})" if j else "" if far.healthy else far.reason)
    if not (why := ev.looked[trial.gamma]):
        return trial
    reason = (f"unstable: {f'the {k} steps' if k > 1 else 'the step'} held, but {LOOK_AHEAD * k} steps did not ({why})" + (
        "" if blind else f"; where they lead λ ≥ {st.end:.4g} (the largest eigenvalue of ∂(∇ηL)/∂θ) exceeds 2/γ = {2 / trial.gamma:.3g}"))
    return dataclasses.replace(trial, healthy=False, loss=None, reason=reason)


def search(ev: Evaluator, step: Step, own: GammaTrial, proven: bool) -> tuple[float | None, tuple[GammaTrial, ...]]:
    """The suggested γ (:func:`best_gamma`) and every trial measured, by bracketing on :data:`GAMMA_GRID` and γ
    (module docstring); ``own`` is γ's trial; ``proven``: natgrad-diag's closed form takes the other γ's steps (cheaper;
    the ``reproduction`` check found it equal to GPflow's step), else GPflow's own update does (e.g. where GPflow's
    step loses precision and the closed form does not)."""
    grid = sorted({*GAMMA_GRID, own.gamma})
    measured = {own.gamma: own}

    def better(i: int, than: GammaTrial | None) -> tuple[bool, GammaTrial]:
        t = measured[grid[i]] = measured.get(grid[i]) or _trial(ev, grid[i], step, own=not proven)
        tie = rounding(step.loss, ev.ctx.np_dtype, sigmas(ev)[1])
        return t.healthy and t.loss is not None and (than is None or than.loss is None or t.loss < than.loss - tie), t

    def walk(i: int, direction: int, best: GammaTrial | None) -> GammaTrial | None:
        while 0 <= i + direction < len(grid):
            ok, t = better(i + direction, best)
            if not ok and (best is not None or t.healthy):  # worse than the best so far (or healthy but no better)
                break
            i += direction
            best = t if ok else best
        return best

    i0 = grid.index(own.gamma)
    if not own.healthy or walk(i0, +1, own) is own:  # downwards when γ fails or no larger γ did better
        walk(i0, -1, own if own.healthy else None)
    if (unstable := _unstable(ev, measured, step, proven)) is not None:  # the stable γ are below the smallest unstable one
        walk(grid.index(unstable), -1, None)
        _unstable(ev, measured, step, proven)
    trials = tuple(measured[g] for g in sorted(measured, reverse=True))
    return best_gamma(trials, ev.ctx.np_dtype, sigmas(ev)[1], keep=own.gamma), trials


def other_xi(ev: Evaluator, step: Step) -> tuple[str, float, float] | None:
    """Where no γ of the grid trains with GPflow's XiNat or XiSqrtMeanVar: the search (:func:`search`) with the other
    one, by GPflow's own update, as (its name, the γ it suggests, the loss after its k steps); None when none trains
    with it either, ξ is neither, or in the var_list form (whose reports name no causes). (From a q(u) far wider than
    the prior of a non-whitened SVGP, XiSqrtMeanVar's step breaks q_sqrt at every γ down to 0.001; XiNat's trains.)"""
    from gpflow.optimizers import XiNat, XiSqrtMeanVar

    xi = ev.ctx.xi
    if ev.ctx.model is None or not isinstance(xi, (XiNat, XiSqrtMeanVar)):
        return None
    other = type(ev)(dataclasses.replace(ev.ctx, xi=XiNat() if isinstance(xi, XiSqrtMeanVar) else XiSqrtMeanVar()))
    suggested, trials = search(other, step, _trial(other, ev.ctx.gamma, step, own=True), proven=False)
    best = next((t for t in trials if t.gamma == suggested), None)
    return None if best is None or best.loss is None else (type(other.ctx.xi).__name__, best.gamma, best.loss)


def _health_check(ctx: Context, step: Step, sigma: tuple[float, float], own: GammaTrial, suggested: float | None, trials: tuple[GammaTrial, ...],
                  other: tuple[str, float, float] | None) -> Check:  # fmt: skip
    k = ctx.gamma_steps
    steps = f"{k} steps" if k > 1 else "the step"
    claim = (f"{steps} with gamma = {ctx.gamma:g} keep q(u) valid (finite, q_sqrt lower-triangular with a positive "
             "diagonal, S positive definite) and never raise the loss beyond what one evaluation resolves "
             + (f"(for this stochastic loss 6 standard deviations of a difference: σ̂ = {format_number(sigma[0])} at the "
                f"current q(u) and {format_number(sigma[1])} a step on, each from {NOISE_SAMPLES} evaluations)" if max(sigma)
                else "(√ε·max(|loss|, 1))"))
    best = next((t for t in trials if t.gamma == suggested), None)
    trains = f"gamma = {suggested:g} trains (loss {format_number(best.loss)} after {k} step{'s' if k > 1 else ''})" if best is not None and best.loss is not None else ""
    if own.healthy:
        detail = f"loss {step.loss!r} → {own.loss!r} after {steps}."
        if trains and suggested != ctx.gamma:
            detail += f" Suggested: {trains}."
    else:
        f32 = " In float32 the Cholesky factorisations of the step are fragile: try float64." if ctx.np_dtype == np.float32 else ""
        at = f" at step {own.failed_step}" if k > 1 and own.failed_step else ""
        why = own.reason.split(": ", 1)[1] if k > 1 and own.reason.startswith("step ") else own.reason
        instead = f" with {type(ctx.xi).__name__}; with {other[0]}, gamma = {other[1]:g} trains (loss {format_number(other[2])} after {k} step{'s' if k > 1 else ''})" if other else ""
        detail = f"gamma = {ctx.gamma:g} fails{at}: {why.rstrip('.')}; " + (trains or (f"no gamma of the grid holds for {steps}{instead}" if ctx.search else "no γ searched (gamma_search=False)")) + "." + f32
    return Check(name="step_health", claim=claim, status=status_of(own.healthy), detail=detail)


def stage(run: Run) -> Outcome:
    """``step_health``: γ's k steps by GPflow's own update (the first is GPflow's step the other checks looked at;
    when it failed, nothing more is taken), then the search for a suggestion unless ``gamma_search=False``."""
    ev, step, ctx = run.ev, run.step, run.ev.ctx
    new = (run.gp.q_mu, run.gp.q_sqrt) if run.gp.q_mu is not None else (step.new_q_mu, step.new_q_sqrt)
    ok, why, nums = health(*new, ctx.np_dtype)
    if step.error or run.gp.error or not ok:
        first = step.error or (f"GPflow's step raised: {run.gp.error}" if run.gp.error else why)
        own = GammaTrial(ctx.gamma, False, None, f"step 1 of {ctx.gamma_steps}: {first}" if ctx.gamma_steps > 1 else first, ctx.gamma_steps, (), 1)
    elif ctx.gamma_steps == 1 and run.gp.loss_after is not None:  # GPflow's one step is already taken: its loss
        after = run.gp.loss_after
        if after > step.loss + rounding(step.loss, ctx.np_dtype, sigmas(ev)[0]):
            noise(ev, step)  # is the rise the loss's noise?
        rose = after > step.loss + rounding(step.loss, ctx.np_dtype, sigmas(ev)[0])
        why = loss_rose(step.loss, after) if rose else ""
        own = GammaTrial(ctx.gamma, not why, None if why else after, why or "lowers the loss", 1, (after,), 1 if why else None)
    else:
        own = _trial(ev, ctx.gamma, step, own=True)
    proven = any(c.name == "reproduction" and c.passed for c in run.earlier)
    if ctx.search:
        suggested, trials = search(ev, step, own, proven)
        own = next(t for t in trials if t.gamma == ctx.gamma)
        other = other_xi(ev, step) if suggested is None else None
    else:
        _unstable(ev, alone := {ctx.gamma: own}, step, proven)
        own = alone[ctx.gamma]
        suggested, trials, other = own.gamma if own.healthy else None, (own,), None
    check = _health_check(ctx, step, ev.noise_at, own, suggested, trials, other)
    nums.update(ev.stability.numbers() if ev.stability is not None else {})
    result = HealthResult(own.losses[0] if own.healthy and own.losses else None, suggested, trials, "" if own.healthy else own.reason, other)
    return Outcome(checks=(check,), numbers=tuple(nums.items()), health=result)


# --- stability -----------------------------------------------------------------------------------------------


#: Power iterations at most; they stop earlier when ρ changes by less than 1% (a lower bound at any point).
MAX_ITERATIONS = 30

#: Why :func:`rayleigh_bound` gives no λ for a stochastic loss (then every γ that held looks ahead).
STOCHASTIC = "the gradient of the loss differs between two evaluations (a stochastic loss)"

#: A γ whose k steps held but which λ where they lead finds unstable is tried for this many times k steps.
LOOK_AHEAD = 4

#: How far λ may fall from the current q(u) to where the trials lead for the linearisation to decide.
STEADY = 0.1


@dataclass(frozen=True)
class Stability:
    """ρ ≤ λmax of ∂(∇ηL)/∂θ at the current q(u) (``start``) and where the best trial's steps led (``end``), the larger
    finite-difference error, and ``lam``, the smaller, which the verdict uses: None when one is not estimated, no γ that
    held exceeds 2/λ at ``end`` or λ falls by more than :data:`STEADY` between them. ``stochastic``: none can be, the
    loss's gradient differs between two evaluations."""

    lam: float | None
    start: float | None = None
    end: float | None = None
    error: float = 0.0
    stochastic: bool = False

    def numbers(self) -> dict[str, float]:
        """The report's "Further numbers" rows."""
        rows = {"λ ≤ λmax of ∂(∇ηL)/∂θ here": self.start, "λ ≤ λmax where the best γ's steps lead": self.end,
                "± the error of those λ (finite differences)": self.error or None}
        return {k: v for k, v in rows.items() if v is not None}


def estimate_stability(ev: Evaluator, reached: Point, gamma: float) -> Stability:
    """λ where the best trial's steps led (``reached``) and, unless ``gamma`` (the largest γ that held) is stable by
    it, at the model's q(u) (:func:`rayleigh_bound`, started from the first's vector), and the λ the verdict uses."""
    end, e1, why, v = rayleigh_bound(ev, *reached)
    if why == STOCHASTIC:
        return Stability(None, stochastic=True)
    if end is None or gamma * (end - e1) <= 2:  # no γ that held can fail: the second estimate is not needed
        return Stability(None, None, end, e1)
    start, e0, _, _ = rayleigh_bound(ev, *ev.q_arrays, start=v)
    if start is None or end < (1 - STEADY) * start:
        return Stability(None, start, end)
    return Stability(min(start, end), start, end, max(e0, e1))


def rayleigh_bound(ev: Evaluator, q_mu: Array, q_sqrt: Array, *, start: list[Array] | None = None) -> tuple[float | None, float, str, list[Array]]:
    """(ρ, its error, "", the last vector) at q(u) = (q_mu [M, L], q_sqrt [L, M, M]), the scratch copy's other
    variables the model's, by :func:`_power` from ``start`` or a seeded random vector (the same answer on every call),
    shifted when ρ < 0 (module docstring); (None, 0, why, []) for a loss whose gradient two
    evaluations disagree on (a stochastic loss) or where a perturbed θ cannot be evaluated."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

    theta = [np.asarray(t) for t in meanvarsqrt_to_natural(tf.constant(q_mu), tf.constant(q_sqrt))]
    # θ₂ = −S⁻¹/2: a perturbation of norm h moves its eigenvalue nearest zero, −1/(2λmax(S)), by h at most
    h = float(np.finfo(q_mu.dtype).eps) ** (1 / 3) / (2 * max(float(np.linalg.norm(q_sqrt, 2, axis=(-2, -1)).max()) ** 2, 1e-300))
    ev.sync()
    try:
        first, again = ev.nat_gradient_at(*theta), ev.nat_gradient_at(*theta)
        if not all(np.array_equal(a, b) and np.isfinite(a).all() for a, b in zip(first, again)):
            return None, 0.0, STOCHASTIC, []
        rng = np.random.default_rng(0)
        rho, v = _power(ev, theta, start or [rng.standard_normal(t.shape) for t in theta], h)
        if rho < 0:  # λ of largest magnitude is negative: λmax − ρ is the largest of A − ρI's (shifted) eigenvalues
            rho, v = _power(ev, theta, [rng.standard_normal(t.shape) for t in theta], h, shift=rho)
        rho2, rho_half = (_rayleigh(ev, theta, v, f * h)[0] for f in (2, 0.5))  # the same v
    except Exception as e:  # noqa: BLE001 - a Cholesky of a perturbed θ or the user's loss failing: no estimate
        return None, 0.0, f"a perturbed q(u) could not be evaluated ({type(e).__name__})", []
    if not np.all(np.isfinite([rho, rho2, rho_half])):
        return None, 0.0, "the finite differences were not finite", []
    return rho, max(abs(rho2 - rho) / 3, abs(rho_half - rho)), "", v


def _power(ev: Evaluator, theta: list[Array], v: list[Array], h: float, shift: float = 0.0) -> tuple[float, list[Array]]:
    """(ρ, the last vector) of power iteration on A − shift·I from ``v`` (its eigenvalues λ − shift, its eigenvectors
    A's), until ρ changes by less than 1% or :data:`MAX_ITERATIONS`."""
    rho = prev = np.nan
    for k in range(1, MAX_ITERATIONS + 1):
        v = [v[0], (v[1] + np.swapaxes(v[1], -1, -2)) / 2]
        norm = np.sqrt(sum(float(np.sum(x**2)) for x in v))
        v = [x / norm for x in v]
        rho, av = _rayleigh(ev, theta, v, h)
        if not np.isfinite(rho) or abs(rho - prev) <= 1e-2 * abs(rho) or k == MAX_ITERATIONS:
            break
        prev, v = rho, [a - shift * x for a, x in zip(av, v)]
    return rho, v


def _rayleigh(ev: Evaluator, theta: list[Array], v: list[Array], h: float) -> tuple[float, list[Array]]:
    """ρ(v) = ⟨Fv, Av⟩/⟨Fv, v⟩ and A·v (its second block symmetrised), both by central differences with step h."""
    plus = ev.nat_gradient_at(*(t + h * x for t, x in zip(theta, v)))
    minus = ev.nat_gradient_at(*(t - h * x for t, x in zip(theta, v)))
    d = [(p - m) / (2 * h) for p, m in zip(plus, minus)]  # A·v (two blocks), then F·v (two blocks)
    av = [d[0], (d[1] + np.swapaxes(d[1], -1, -2)) / 2]
    fv = d[2:]
    return float(sum(np.sum(f * a) for f, a in zip(fv, av)) / sum(np.sum(f * x) for f, x in zip(fv, v))), av


def judge_stability(trial: GammaTrial, stability: Stability) -> GammaTrial:
    """``trial`` failed as unstable when its k steps held but γ·(ρ − error) > 2 (module docstring)."""
    lam = stability.lam
    if not trial.healthy or lam is None or trial.gamma * (lam - stability.error) <= 2:
        return trial
    reason = (f"unstable: the {trial.steps} step{'s' if trial.steps > 1 else ''} held, but near here the step "
              f"multiplies a perturbation by 1 − γλ ≤ {1 - trial.gamma * lam:.3g} at every step (λ ≥ {lam:.4g} is the "
              f"largest eigenvalue of ∂(∇ηL)/∂θ), so training with it cannot settle: it oscillates or blows up later; "
              f"stable γ < 2/λ ≤ {2 / lam:.3g}")
    return dataclasses.replace(trial, healthy=False, loss=None, reason=reason)
