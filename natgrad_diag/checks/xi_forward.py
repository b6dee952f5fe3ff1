"""The ``xi_forward_mode`` oracle (ξ ≠ θ): GPflow's double-backward product (∂ξ/∂θ)·∇ηL against a direct JVP."""

from __future__ import annotations

from natgrad_diag.autodiff.dense import jacobian
from natgrad_diag.checks.bounds import bounded_check, finite, natgrad_bound, scale
from natgrad_diag.checks.evaluator import Run
from natgrad_diag.checks.report import Outcome
from natgrad_diag.exceptions import MemoryLimitError, error_line
from natgrad_diag.report.records import Check, format_number, max_abs_diff

__all__ = ["stage"]


def stage(run: Run) -> Outcome:
    """``xi_forward_mode`` (ξ ≠ θ only): GPflow's (∂ξ/∂θ)·∇ηL (differentiating twice) against
    tf.autodiff.ForwardAccumulator, and with explicit Jacobians against ∂ξ/∂θ contracted with ∇ηL (in float64)."""
    import tensorflow as tf
    from gpflow.optimizers import XiNat

    ev, step, ctx = run.ev, run.step, run.ev.ctx
    if isinstance(ctx.xi, XiNat):
        return Outcome()
    if step.nat_dL_xi1 is None or not finite(step.dL_deta1, step.dL_deta2):
        return Outcome(skipped=(("xi_forward_mode", "GPflow's product could not be computed (the step failed)"),))
    try:
        want = ev.xi_product(step)
    except tf.errors.InvalidArgumentError as e:
        why = f"could not evaluate: {error_line(e)}"
        return Outcome(checks=(Check("xi_forward_mode", "(∂ξ/∂θ)·∇ηL by forward mode", "fail", detail=why),))
    err = max_abs_diff((step.nat_dL_xi1, step.nat_dL_xi2), want)
    wscale = scale(want)
    detail = f"vs ForwardAccumulator: {format_number(err)}"
    if ev.explicit_jacobians:
        from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

        # the oracle in float64, eager on every call (a bound method is a new function each time: the same rounding)
        nat1, nat2 = (tf.cast(t, tf.float64) for t in meanvarsqrt_to_natural(*ev.q_tensors()))
        try:
            J = jacobian(ctx.xi.naturals_to_xi, [nat1, nat2], input_names=("nat1", "nat2"), output_names=("xi1", "xi2"), symmetric=(False, True), compiled=False)
        except MemoryLimitError as e:
            detail += f"; explicit Jacobian skipped ({e.detail})"
        else:
            want_j = J.jvp([step.dL_deta1, step.dL_deta2])
            err_j = max_abs_diff((step.nat_dL_xi1, step.nat_dL_xi2), want_j)
            detail += f"; vs the explicit Jacobian ∂ξ/∂θ contracted with ∇ηL: {format_number(err_j)}"
            err = max(err, err_j)
            wscale = max(wscale, scale(want_j))
    # ξ(θ) maps through S = (−2θ₂)⁻¹ (natural_to_meanvarsqrt): its derivatives carry ε·κ(S) of rounding.
    bound = natgrad_bound(ctx.np_dtype, condition=run.cond.kappa_S, condition_name="κ(S)", scale=wscale, rtol=ctx.tol.fisher_rtol, atol=ctx.tol.atol)
    claim = (f"GPflow's forward-mode product (differentiating twice, for {type(ctx.xi).__name__}) equals a direct "
             "JVP (∂ξ/∂θ)·∇ηL from tf.autodiff.ForwardAccumulator")
    return Outcome(checks=(bounded_check("xi_forward_mode", claim, err, bound, detail),))
