"""The ``reproduction`` oracle: natgrad-diag's step against what gpflow.optimizers.NaturalGradient assigns to a copy."""

from __future__ import annotations

from natgrad_diag.natgrad.context import Context
from natgrad_diag.natgrad.step import GpflowStep, Step
from natgrad_diag.report.records import Check, close_check, format_number, max_abs_diff

__all__ = ["check_reproduction"]


def check_reproduction(ctx: Context, step: Step, gp: GpflowStep) -> Check:
    """|ours − GPflow's| ≤ atol + rtol·max|GPflow's| for the new q_mu [M, L] and q_sqrt [L, M, M].

    When either step fails, the check passes only if both fail (they must agree on whether γ is too long).
    """
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
            passed=agree,
            detail=f"natgrad-diag: {(step.error or 'step succeeded').rstrip('.')}; GPflow: {(gp.error or 'step succeeded').rstrip('.')}.",
        )
    return close_check(
        "reproduction",
        f"the step natgrad-diag computes (natgrad_tensors, {type(ctx.xi).__name__}, gamma = {ctx.gamma:g}) equals "
        "what gpflow.optimizers.NaturalGradient assigns to a copy of the model",
        (step.new_q_mu, step.new_q_sqrt), (gp.q_mu, gp.q_sqrt), rtol=tol.rtol, atol=tol.atol,
        detail=f"q_mu: {format_number(max_abs_diff(step.new_q_mu, gp.q_mu))}, q_sqrt: {format_number(max_abs_diff(step.new_q_sqrt, gp.q_sqrt))}",
    )  # fmt: skip
