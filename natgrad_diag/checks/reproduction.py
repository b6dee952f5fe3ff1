"""The ``reproduction`` oracle: natgrad-diag's step against what gpflow.optimizers.NaturalGradient assigns to a copy."""

from __future__ import annotations

from typing import Any

from natgrad_diag.checks.bounds import Bound, Conditioning, bounded_check, natgrad_bound, scale
from natgrad_diag.checks.evaluator import Context, Evaluator, GpflowStep, Run, Step
from natgrad_diag.checks.report import Outcome
from natgrad_diag.report.records import Check, format_number, max_abs_diff, status_of
from natgrad_diag.typing import Array

__all__ = ["check_reproduction", "stage", "step_bound"]


def stage(run: Run) -> Outcome:
    return Outcome(checks=(check_reproduction(run.ev, run.step, run.gp, run.cond),))


def step_bound(ctx: Context, cond: Conditioning, sizes: list[Any]) -> Bound:
    """The bound on two routes to one step whose new (q_mu, q_sqrt) are ``sizes``: GPflow's route amplifies rounding
    by κ_η·κ(S_new)·cancellation (:attr:`~natgrad_diag.checks.bounds.Conditioning.step_condition`)."""
    return natgrad_bound(ctx.np_dtype, condition=cond.step_condition, condition_name="κ_η·κ(S_new)·cancellation",
                         scale=scale(sizes), rtol=ctx.tol.rtol, atol=ctx.tol.atol)


def both_fail(label: str, error: str, gp_error: str) -> str:
    """The detail of a step that failed on one route or both."""
    return f"{label}: {(error or 'step succeeded').rstrip('.')}; GPflow: {(gp_error or 'step succeeded').rstrip('.')}."


def differences(got: tuple[Array, Array], want: tuple[Array, Array]) -> str:
    """"q_mu: <max |Δ|>, q_sqrt: <max |Δ|>" of two new (q_mu [M, L], q_sqrt [L, M, M])."""
    mu, sq = (format_number(max_abs_diff(a, b)) for a, b in zip(got, want))
    return f"q_mu: {mu}, q_sqrt: {sq}"


def check_reproduction(ev: Evaluator, step: Step, gp: GpflowStep, cond: Conditioning) -> Check:
    """|ours − GPflow's| ≤ rounding + atol + rtol·s for the new q_mu [M, L] and q_sqrt [L, M, M], s = max|GPflow's|.

    The two steps (computed as ``ev.compares`` says) differ only in rounding, which GPflow's route amplifies by
    κ_η·κ(S_new)·cancellation: the rounding term is 100·ε·that·s (:func:`step_bound`). When either step fails, the
    check passes only if both fail (they must agree on whether γ is too long).
    """
    ctx = ev.ctx
    if step.new_q_mu is None or step.new_q_sqrt is None or step.error or gp.q_mu is None or gp.q_sqrt is None:
        agree = (step.new_q_mu is None or bool(step.error)) and bool(gp.error)
        claim = ("natgrad-diag and gpflow.optimizers.NaturalGradient both find that this step fails" if agree else
                 "natgrad-diag's step and GPflow's NaturalGradient agree on whether the step succeeds")  # fmt: skip
        return Check("reproduction", claim, status_of(agree), detail=both_fail("natgrad-diag", step.error, gp.error))
    ours, gpflows = (step.new_q_mu, step.new_q_sqrt), (gp.q_mu, gp.q_sqrt)
    claim = (f"the step natgrad-diag computes (natgrad_tensors, {type(ctx.xi).__name__}, gamma = {ctx.gamma:g}) equals "
             f"what gpflow.optimizers.NaturalGradient assigns to {'a copy of the model' if ctx.model else 'the pair (restored after)'}")
    if ours[0].shape != gpflows[0].shape or ours[1].shape != gpflows[1].shape:
        return Check(name="reproduction", claim=claim, status="fail", detail="the two steps' shapes differ")
    detail = (
        f"{ev.compares}; {differences(ours, gpflows)}; κ(S) = {format_number(cond.kappa_S)}, "
        f"κ_η = {format_number(cond.kappa_eta or cond.kappa_S)}, "
        f"κ(S_new) = {format_number(cond.kappa_S_new)}, cancellation {format_number(cond.cancellation)}"
    )
    return bounded_check("reproduction", claim, max_abs_diff(ours, gpflows), step_bound(ctx, cond, list(gpflows)), detail)
