"""The ``fisher_identity`` oracle: F⁻¹·∇θL = ∇ηL with explicit Jacobians (full mode), or F·∇ηL = ∇θL matrix-free (fast).

For an exponential family the Fisher information in the natural parameters θ is F = ∂η/∂θ = ∂²A/∂θ² (A the
log-partition), so F⁻¹·∇θL = F⁻¹·Fᵀ·∇ηL = ∇ηL: GPflow's ∂L/∂η is the natural gradient (Salimbeni, Eleftheriadis and
Hensman 2018, equation [10]).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from natgrad_diag._compile import compiled
from natgrad_diag.autodiff.blocks import vech_layout
from natgrad_diag.autodiff.dense import jacobian
from natgrad_diag.checks.bounds import bounded_check, maxabs, natgrad_bound, scale
from natgrad_diag.checks.evaluator import Evaluator, Run, Step
from natgrad_diag.checks.report import Outcome
from natgrad_diag.exceptions import MemoryLimitError, error_line
from natgrad_diag.report.records import Check, format_number, max_abs_diff
from natgrad_diag.typing import Array

__all__ = ["check_fisher_explicit", "check_fisher_matrix_free", "stage", "ticks"]


def ticks(ev: Evaluator) -> int:
    """Progress-bar ticks of this stage beyond its own: the two explicit Jacobians."""
    return 2 if ev.explicit_jacobians else 0


def stage(run: Run) -> Outcome:
    """``fisher_identity``: with explicit Jacobians when the evaluator forms them (matrix-free when F would exceed
    the memory limit), else matrix-free; or why it was skipped."""
    ev, step = run.ev, run.step
    if (why := ev.ctx.skipped("fisher_identity")) or step.dL_deta1 is None:
        return Outcome(skipped=(("fisher_identity", why or "∂L/∂η could not be computed at the current q(u)"),))
    if not ev.explicit_jacobians:
        return Outcome(checks=(check_fisher_matrix_free(ev, step),))
    try:
        return check_fisher_explicit(ev, step, run.advance)
    except MemoryLimitError as e:
        c = check_fisher_matrix_free(ev, step)
        note = f"the explicit F would exceed the memory limit ({e.detail}); checked matrix-free instead; {c.detail}"
        return Outcome(checks=(dataclasses.replace(c, detail=note),))


def _vech(M: int) -> tuple[Array, Array, Array]:
    """For vech (row-major lower triangle): the vech position of every (i, j) of a symmetric M×M matrix, the flat
    positions of the lower triangle, and the dual weights (1 on the diagonal, 2 off it)."""
    rows, cols = np.tril_indices(M)
    return vech_layout((M, M))[0], rows * M + cols, np.where(rows == cols, 1.0, 2.0)


def _of_vech(fn: Callable[..., Any], M: int, dual_vech_out: bool) -> Any:
    """``fn`` of (θ₁ [M, L], vech θ₂ [L, M(M+1)/2]), its second output as dual-vech η₂ when ``dual_vech_out``: one
    function per arguments, from :mod:`natgrad_diag._compile`'s cache, so each check reuses its Jacobian's trace."""
    import tensorflow as tf

    full, lower, weights = _vech(M)

    def of_vech(a: Any, b: Any) -> tuple[Any, Any]:
        out1, out2 = fn(a, tf.reshape(tf.gather(b, full, axis=1), [-1, M, M]))
        if dual_vech_out:
            out2 = tf.gather(tf.reshape(out2, [-1, M * M]), lower, axis=1) * tf.constant(weights, out2.dtype)
        return out1, out2

    return compiled(("of_vech", fn, M, dual_vech_out), lambda: of_vech)


def check_fisher_explicit(ev: Evaluator, step: Step, advance: Callable[..., Any]) -> Outcome:
    """F⁻¹·∇θL = ∇ηL with explicit Jacobians, in coordinates where F is a true (symmetric) Fisher matrix.

    θ = (θ₁, vech θ₂) (lower triangle of the symmetric θ₂) and η' = (η₁, dual-vech η₂) (diagonal, and twice the
    strict lower triangle), so that ⟨θ, η'⟩ = θ₁ᵀη₁ + tr(θ₂η₂). Then F = ∂η'/∂θ = ∂²A/∂θ² (natural_to_expectation)
    and ∇_η' L = (∂L/∂η₁, vech(∂L/∂η₂)) for GPflow's symmetric ∂L/∂η₂; ∇θL is the explicit Jacobian of
    natural_to_meanvarsqrt contracted with ∂L/∂(m, L_S). All L latent GPs at once (F is block-diagonal). Solving with F
    loses ε·κ(F) relative to ∇ηL's scale (Higham 2002, §7.1). The oracle runs in float64 whatever the model's dtype.
    """
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural, natural_to_expectation, natural_to_meanvarsqrt

    ctx, M, L = ev.ctx, ev.ctx.M, ev.ctx.L
    assert step.dL_deta1 is not None and step.dL_deta2 is not None  # the stage checks it
    nat1, nat2 = meanvarsqrt_to_natural(*ev.q_tensors())
    lower = _vech(M)[1]
    theta = [tf.cast(nat1, tf.float64), tf.gather(tf.reshape(tf.cast(nat2, tf.float64), [L, M * M]), lower, axis=1)]
    names = ("theta1", "vech_theta2")  # compiled on every call, the first too: the same rounding each time
    F = jacobian(_of_vech(natural_to_expectation, M, True), theta, input_names=names, output_names=("eta1", "dual_vech_eta2"), compiled=True).matrix
    advance()
    K = jacobian(_of_vech(natural_to_meanvarsqrt, M, False), theta, input_names=names, output_names=("mean", "varsqrt"), compiled=True)
    advance()
    grad_theta = np.concatenate([np.ravel(g) for g in K.vjp([step.dL_dmean, step.dL_dvarsqrt])]).astype(np.float64)
    want = np.concatenate([np.ravel(step.dL_deta1), np.ravel(step.dL_deta2.reshape(L, M * M)[:, lower])])
    try:
        got, cond = np.linalg.solve(F, grad_theta), float(np.linalg.cond(F))
    except np.linalg.LinAlgError:
        got, cond = np.full_like(want, np.inf), float("inf")
    bound = natgrad_bound(ctx.np_dtype, condition=cond, condition_name="κ(F)", scale=scale([want]), rtol=ctx.tol.fisher_rtol, atol=ctx.tol.atol)
    sym = maxabs(F - F.T) / max(maxabs(F), 1e-300)
    claim = ("F⁻¹·∇θL = ∇ηL: the explicit Fisher matrix F = ∂η/∂θ (natural_to_expectation) solved against ∇θL "
             "(the explicit Jacobian of natural_to_meanvarsqrt contracted with ∂L/∂(m, L_S)) gives GPflow's ∂L/∂η")
    detail = f"F is {F.shape[0]} × {F.shape[1]}; cond(F) = {format_number(cond)}, F symmetric to {format_number(sym)} (relative)"
    check = bounded_check("fisher_identity", claim, maxabs(got - want), bound, detail)
    return Outcome(checks=(check,), numbers=(("cond(F)", cond), ("max |F − Fᵀ| / max |F|", sym)))


def check_fisher_matrix_free(ev: Evaluator, step: Step) -> Check:
    """F·∇ηL = ∇θL matrix-free (:meth:`~natgrad_diag.checks.evaluator.Evaluator.fisher_products`): no solve, only
    products of M×M matrices, whose rounding is M·ε of the size of their terms (Higham 2002, §3.5). Those terms can be
    far larger than F·∇ηL, which they sum with cancellation (a trained MultiClass SVGP: 2.4e4 against 0.1), so the
    rounding term's condition number is M·terms/scale."""
    import tensorflow as tf

    ctx = ev.ctx
    try:
        out = ev.fisher_products(step)
    except tf.errors.InvalidArgumentError as e:
        return Check(name="fisher_identity", claim="F·∇ηL = ∇θL (matrix-free)", status="fail", detail=f"could not evaluate: {error_line(e)}")
    want = (out["grad_theta1"], out["grad_theta2"])
    size = scale(want)
    cancel = max(float(out["terms"]) / max(size, float(np.finfo(np.float64).tiny)), 1.0)
    bound = natgrad_bound(ctx.np_dtype, condition=ctx.M * cancel, condition_name="M·terms/scale (products)", scale=size, rtol=ctx.tol.fisher_rtol, atol=ctx.tol.atol)
    claim = ("F·∇ηL = ∇θL, matrix-free: the Fisher matrix F = ∂η/∂θ applied in closed form (dS = 2·S U₂ S, ...) to "
             "GPflow's ∂L/∂η equals the vector-Jacobian product of natural_to_meanvarsqrt with ∂L/∂(m, L_S)")
    err = max_abs_diff((out["F_u1"], out["F_u2"]), want)
    return bounded_check("fisher_identity", claim, err, bound, "equivalent to F⁻¹·∇θL = ∇ηL without forming F (fast mode)")
