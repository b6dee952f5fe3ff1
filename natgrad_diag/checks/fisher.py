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

from natgrad_diag.checks.bounds import bounded_check, maxabs, natgrad_bound, scale
from natgrad_diag.checks.evaluator import Evaluator, Run, Step
from natgrad_diag.checks.report import Outcome
from natgrad_diag.exceptions import error_line
from natgrad_diag.report.records import Check, format_number, max_abs_diff
from natgrad_diag.typing import Array

__all__ = ["check_fisher_explicit", "check_fisher_matrix_free", "stage", "ticks", "vech_maps"]


def ticks(ev: Evaluator) -> int:
    """Progress-bar ticks of this stage beyond its own: the two explicit Jacobians."""
    return 2 if ev.explicit_jacobians else 0


def stage(run: Run) -> Outcome:
    """``fisher_identity``: explicit Jacobians when the evaluator forms them (matrix-free when F would exceed the
    memory limit), else matrix-free; or why it was skipped."""
    from natgrad_diag.exceptions import MemoryLimitError

    ev, step = run.ev, run.step
    why = ev.ctx.skipped("fisher_identity")
    if why or step.dL_deta1 is None:
        return Outcome(skipped=(("fisher_identity", why or "∂L/∂η could not be computed at the current q(u)"),))
    if not ev.explicit_jacobians:
        return Outcome(checks=(check_fisher_matrix_free(ev, step),))
    try:
        return check_fisher_explicit(ev, step, run.advance)
    except MemoryLimitError as e:
        c = check_fisher_matrix_free(ev, step)
        note = f"the explicit F would exceed the memory limit ({e.detail}); checked matrix-free instead; {c.detail}"
        return Outcome(checks=(dataclasses.replace(c, detail=note),))


def vech_maps(M: int) -> tuple[Array, Array, Array]:
    """For vech (row-major lower triangle, P = M(M+1)/2 entries): the vech position of every (i, j) of a
    symmetric M×M matrix [M·M], the flat positions of the lower triangle [P], and the dual weights [P]
    (1 on the diagonal, 2 off it).

    Examples:
        >>> full_pos, lower_flat, weights = vech_maps(2)
        >>> full_pos.tolist(), lower_flat.tolist(), weights.tolist()
        ([0, 1, 1, 2], [0, 2, 3], [1.0, 2.0, 1.0])
    """
    rows, cols = np.tril_indices(M)
    pos = np.zeros((M, M), dtype=np.int64)
    pos[rows, cols] = np.arange(rows.size)
    pos[cols, rows] = np.arange(rows.size)
    return pos.ravel(), rows * M + cols, np.where(rows == cols, 1.0, 2.0)


def _theta2_of_vech(b: Any) -> Any:
    """θ₂ [L, M, M] symmetric from its vech b [L, P]."""
    import tensorflow as tf

    P = int(b.shape[-1])
    M = int(round((np.sqrt(8 * P + 1) - 1) / 2))
    full_pos, _, _ = vech_maps(M)
    return tf.reshape(tf.gather(b, full_pos, axis=1), [-1, M, M])


def _fisher_eta_of_theta(a: Any, b: Any) -> tuple[Any, Any]:
    """(θ₁ [M, L], vech θ₂ [L, P]) ↦ (η₁ [M, L], dual-vech η₂ [L, P]); its Jacobian is the Fisher matrix."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import natural_to_expectation

    M = int(a.shape[0])
    _, lower_flat, weights = vech_maps(M)
    e1, e2 = natural_to_expectation(a, _theta2_of_vech(b))
    return e1, tf.gather(tf.reshape(e2, [-1, M * M]), lower_flat, axis=1) * tf.constant(weights, e2.dtype)


def _fisher_msqrt_of_theta(a: Any, b: Any) -> tuple[Any, Any]:
    """(θ₁ [M, L], vech θ₂ [L, P]) ↦ (m [M, L], L_S [L, M, M]) by GPflow's natural_to_meanvarsqrt."""
    from gpflow.optimizers.natgrad import natural_to_meanvarsqrt

    mean_varsqrt: tuple[Any, Any] = natural_to_meanvarsqrt(a, _theta2_of_vech(b))
    return mean_varsqrt


def check_fisher_explicit(ev: Evaluator, step: Step, advance: Callable[..., Any]) -> Outcome:
    """F⁻¹·∇θL = ∇ηL with explicit Jacobians, in coordinates where F is a true (symmetric) Fisher matrix.

    θ = (θ₁, vech θ₂) (lower triangle of the symmetric θ₂) and η' = (η₁, dual-vech η₂) (diagonal, and twice the
    strict lower triangle), so that ⟨θ, η'⟩ = θ₁ᵀη₁ + tr(θ₂η₂). Then F = ∂η'/∂θ = ∂²A/∂θ² and
    ∇_η' L = (∂L/∂η₁, vech(∂L/∂η₂)) for GPflow's symmetric ∂L/∂η₂. All L latent GPs at once (F is block-diagonal).
    """
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

    from natgrad_diag.autodiff.dense import jacobian

    ctx = ev.ctx
    M, L = ctx.M, ctx.L
    nat1, nat2 = meanvarsqrt_to_natural(*ev.q_tensors())
    _, lower_flat, _ = vech_maps(M)
    # The oracle runs in float64 whatever the model's dtype (float32 is compared with float32 tolerances).
    w1 = tf.cast(nat1, tf.float64)
    w2 = tf.gather(tf.reshape(tf.cast(nat2, tf.float64), [L, M * M]), lower_flat, axis=1)
    F = jacobian(_fisher_eta_of_theta, [w1, w2], input_names=("theta1", "vech_theta2"), output_names=("eta1", "dual_vech_eta2")).matrix
    advance()
    K = jacobian(_fisher_msqrt_of_theta, [w1, w2], input_names=("theta1", "vech_theta2"), output_names=("mean", "varsqrt"))
    advance()
    # the stage calls this only when the step computed ∂L/∂η (dL_deta1 and dL_deta2)
    assert step.dL_deta1 is not None and step.dL_deta2 is not None
    grad_theta = np.concatenate([np.ravel(g) for g in K.vjp([step.dL_dmean, step.dL_dvarsqrt])])
    want = np.concatenate([np.ravel(step.dL_deta1), np.ravel(step.dL_deta2.reshape(L, M * M)[:, lower_flat])])
    F64 = F.astype(np.float64)
    try:
        got = np.linalg.solve(F64, grad_theta.astype(np.float64))
        cond = float(np.linalg.cond(F64))
    except np.linalg.LinAlgError:
        got, cond = np.full_like(want, np.inf), float("inf")
    err = maxabs(got - want)
    # Solving with F loses ε·κ(F) relative to ∇ηL's scale (Higham 2002, §7.1); the check is inconclusive
    # ("warn") when that rounding term alone exceeds 1e-2 of the scale.
    bound = natgrad_bound(ctx.np_dtype, condition=cond, condition_name="κ(F)", scale=scale([want]), rtol=ctx.tol.fisher_rtol, atol=ctx.tol.atol)
    sym = maxabs(F64 - F64.T) / max(maxabs(F64), 1e-300)
    n = L * (M + M * (M + 1) // 2)
    claim = (
        "F⁻¹·∇θL = ∇ηL: the explicit Fisher matrix F = ∂η/∂θ (natural_to_expectation) solved against "
        "∇θL (the explicit Jacobian of natural_to_meanvarsqrt contracted with ∂L/∂(m, L_S)) gives the "
        "∂L/∂η of GPflow's step"
    )
    detail = f"F is {n} × {n}; cond(F) = {format_number(cond)}, F symmetric to {format_number(sym)} (relative)"
    check = bounded_check("fisher_identity", claim, err, bound, detail)
    return Outcome(checks=(check,), numbers=(("cond(F)", cond), ("max |F − Fᵀ| / max |F|", sym)))


def check_fisher_matrix_free(ev: Evaluator, step: Step) -> Check:
    """F·∇ηL = ∇θL matrix-free: one closed-form product with F and one vector-Jacobian product."""
    import tensorflow as tf

    ctx = ev.ctx
    try:
        out = ev.fisher_products(step)
    except tf.errors.InvalidArgumentError as e:
        return Check(name="fisher_identity", claim="F·∇ηL = ∇θL (matrix-free)", status="fail", detail=f"could not evaluate: {error_line(e)}")
    want = (out["grad_theta1"], out["grad_theta2"])
    err = max_abs_diff((out["F_u1"], out["F_u2"]), want)
    # matrix-free: no solve, only products of M×M matrices, whose rounding is M·ε of the size of their terms
    # (Higham 2002, §3.5): the condition number of the rounding term is M.
    bound = natgrad_bound(ctx.np_dtype, condition=ctx.M, condition_name="M (products)", scale=scale(want), rtol=ctx.tol.fisher_rtol, atol=ctx.tol.atol)
    claim = (
        "F·∇ηL = ∇θL, matrix-free: the Fisher matrix F = ∂η/∂θ applied in closed form (dS = 2·S U₂ S, ...) to "
        "GPflow's ∂L/∂η equals the vector-Jacobian product of natural_to_meanvarsqrt with ∂L/∂(m, L_S)"
    )
    return bounded_check("fisher_identity", claim, err, bound, "equivalent to F⁻¹·∇θL = ∇ηL without forming F (fast mode)")
