"""The ``reproduction`` oracle: natgrad-diag's step against what gpflow.optimizers.NaturalGradient assigns to a copy."""

from __future__ import annotations

from natgrad_diag.checks.bounds import Conditioning, bounded_check, natgrad_bound, scale
from natgrad_diag.checks.evaluator import Evaluator, GpflowStep, Run, Step
from natgrad_diag.checks.report import Outcome
from natgrad_diag.report.records import Check, format_number, max_abs_diff, status_of

__all__ = ["check_reproduction", "stage"]


def stage(run: Run) -> Outcome:
    """The ``reproduction`` check of the run's two steps."""
    return Outcome(checks=(check_reproduction(run.ev, run.step, run.gp, run.cond),))


def check_reproduction(ev: Evaluator, step: Step, gp: GpflowStep, cond: Conditioning) -> Check:
    """|ours − GPflow's| ≤ rounding + atol + rtol·s for the new q_mu [M, L] and q_sqrt [L, M, M], s = max|GPflow's|.

    The evaluator says how the two were computed (``ev.compares``): both eager in full mode (natgrad-diag's record
    follows GPflow's lines), or natgrad-diag's closed form by LAPACK (:mod:`natgrad_diag.step.lapack`, where it
    applies) against GPflow's compiled step in fast mode. They differ only in rounding, which GPflow's route amplifies
    by κ_η·κ(S_new)·cancellation (:attr:`~natgrad_diag.checks.bounds.Conditioning.step_condition`): the rounding
    term is 100·ε·that·s. When either step fails, the check passes only if both fail (they must agree on whether γ
    is too long).
    """
    ctx = ev.ctx
    tol = ctx.tol
    ours_failed = step.new_q_mu is None or bool(step.error)
    if ours_failed or gp.error:
        agree = ours_failed and bool(gp.error)
        return Check(
            name="reproduction",
            claim=(
                "natgrad-diag and gpflow.optimizers.NaturalGradient both find that this step fails"
                if agree else "natgrad-diag's step and GPflow's NaturalGradient agree on whether the step succeeds"
            ),
            status=status_of(agree),
            detail=f"natgrad-diag: {(step.error or 'step succeeded').rstrip('.')}; GPflow: {(gp.error or 'step succeeded').rstrip('.')}.",
        )
    # Neither step failed: both hold their new q_mu and q_sqrt (the comparisons below rely on it).
    assert step.new_q_mu is not None and step.new_q_sqrt is not None
    assert gp.q_mu is not None and gp.q_sqrt is not None
    claim = (
        f"the step natgrad-diag computes (natgrad_tensors, {type(ctx.xi).__name__}, gamma = {ctx.gamma:g}) equals "
        "what gpflow.optimizers.NaturalGradient assigns to a copy of the model"
    )
    if step.new_q_mu.shape != gp.q_mu.shape or step.new_q_sqrt.shape != gp.q_sqrt.shape:
        return Check(name="reproduction", claim=claim, status="fail", detail="the two steps' shapes differ")
    err = max_abs_diff((step.new_q_mu, step.new_q_sqrt), (gp.q_mu, gp.q_sqrt))
    bound = natgrad_bound(
        ctx.np_dtype, condition=cond.step_condition, condition_name="κ_η·κ(S_new)·cancellation",
        scale=scale([gp.q_mu, gp.q_sqrt]), rtol=tol.rtol, atol=tol.atol,
    )  # fmt: skip
    detail = (
        f"{ev.compares}; q_mu: {format_number(max_abs_diff(step.new_q_mu, gp.q_mu))}, "
        f"q_sqrt: {format_number(max_abs_diff(step.new_q_sqrt, gp.q_sqrt))}; κ(S) = {format_number(cond.kappa_S)}, "
        f"κ_η = {format_number(cond.kappa_eta or cond.kappa_S)}, "
        f"κ(S_new) = {format_number(cond.kappa_S_new)}, cancellation {format_number(cond.cancellation)}"
    )
    return bounded_check("reproduction", claim, err, bound, detail)
