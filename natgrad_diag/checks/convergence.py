"""The ``conjugate_convergence`` oracle: with the user's γ < 1 or ξ ≠ θ, k steps approach the conjugate optimum.

With a Gaussian likelihood, ∂L/∂η = θ − θ* (θ* the optimum's natural parameters), so XiNat's step θ ← θ − γ·∂L/∂η
gives θ_{k+1} − θ* = (1 − γ)·(θ_k − θ*): the distance to the optimum in natural parameters shrinks by exactly
(1 − γ) per step (Salimbeni, Eleftheriadis and Hensman 2018, §3). Other ξ (XiSqrtMeanVar) have no closed-form rate;
the check asks that the distance shrinks at every step and reports the observed rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from natgrad_diag.checks.conditioning import Conditioning
from natgrad_diag.checks.context import Context
from natgrad_diag.checks.report import Outcome
from natgrad_diag.checks.tensors import loss_and_grads
from natgrad_diag.checks.tolerances import bounded_check, natgrad_bound
from natgrad_diag.report.records import Check, format_number
from natgrad_diag.typing import Array

__all__ = ["CONVERGENCE_STEPS", "check_convergence", "natural_distance"]

#: Steps taken by default (each is one eager step on a copy: seconds for M up to a few hundred).
CONVERGENCE_STEPS = 5


def _naturals(model: Any) -> Array:
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

    t1, t2 = meanvarsqrt_to_natural(tf.convert_to_tensor(model.q_mu), tf.convert_to_tensor(model.q_sqrt))
    naturals: Array = np.concatenate([np.ravel(t1.numpy()), np.ravel(t2.numpy())]).astype(np.float64)
    return naturals


def natural_distance(a: Array, b: Array) -> float:
    """‖a − b‖₂ over the concatenated natural parameters (θ₁, θ₂)."""
    return float(np.linalg.norm(a - b))


def _step(ctx: Context, model: Any, gamma: float, xi: Any) -> None:
    from natgrad_diag.step.trace import natgrad_trace

    _, g_mu, g_sq = loss_and_grads(model, ctx.data)
    t = natgrad_trace(model.q_mu, model.q_sqrt, g_mu, g_sq, gamma=gamma, xi_transform=xi, compiled=False)
    model.q_mu.assign(t.new_q_mu)
    model.q_sqrt.assign(t.new_q_sqrt)


def check_convergence(ctx: Context, cond: Conditioning | None, *, steps: int = CONVERGENCE_STEPS) -> Outcome:
    """``steps`` steps with the user's γ and ξ on a copy, their distance to θ* (one XiNat γ = 1 step) per step.

    XiNat: every ratio d_{k+1}/d_k equals 1 − γ within 100·ε·κ(F)·max_k ‖θ_k‖/d_{k+1} (the rounding of θ_k
    relative to the distance measured) + rtol. Other ξ: every ratio is below 1 (the distance shrinks); the observed
    rate (d_k/d_0)^(1/k) is reported.
    """
    import gpflow
    import tensorflow as tf
    from gpflow.optimizers import XiNat

    from natgrad_diag.exceptions import StepFailedError

    star_model, walker = gpflow.utilities.deepcopy(ctx.model), gpflow.utilities.deepcopy(ctx.model)
    try:
        _step(ctx, star_model, 1.0, XiNat())
        star = _naturals(star_model)
        thetas = [_naturals(walker)]
        for _ in range(steps):
            _step(ctx, walker, ctx.gamma, ctx.xi)
            thetas.append(_naturals(walker))
    except (StepFailedError, tf.errors.InvalidArgumentError) as e:
        why = getattr(e, "detail", "") or str(e).splitlines()[0]
        return Outcome(checks=(Check("conjugate_convergence", "k steps approach the conjugate optimum", False, detail=f"a step failed: {why}"),))
    d = [natural_distance(t, star) for t in thetas]
    scale_theta = max(float(np.linalg.norm(t)) for t in thetas + [star])
    if d[0] <= 1e3 * np.finfo(ctx.np_dtype).eps * scale_theta:
        return Outcome(skipped=(("conjugate_convergence", "q(u) is already at the conjugate optimum"),))
    ratios = [d[k + 1] / d[k] for k in range(steps)]
    observed = (d[-1] / d[0]) ** (1.0 / steps)
    nums = f"distances {', '.join(format_number(x) for x in d)}; ratios {', '.join(format_number(r) for r in ratios)}; observed rate {format_number(observed)} per step"
    numbers = (("observed contraction rate per step", observed),)
    if isinstance(ctx.xi, XiNat):
        want = 1.0 - ctx.gamma
        err = max(abs(r - want) for r in ratios)
        rel = scale_theta / max(min(d[1:]), 1e-300)
        bound = natgrad_bound(
            ctx.np_dtype, condition=(cond.kappa_F if cond is not None else 1.0) * rel, condition_name="κ(F)·‖θ‖/d",
            scale=1.0, rtol=ctx.tol.conjugate_rtol, atol=0.0,
        )  # fmt: skip
        claim = (
            f"{steps} XiNat steps with γ = {ctx.gamma:g} contract the distance to the conjugate optimum in natural "
            f"parameters by 1 − γ = {want:g} per step"
        )
        return Outcome(checks=(bounded_check("conjugate_convergence", claim, err, bound, nums),), numbers=numbers)
    worst = max(ratios)
    claim = (
        f"{steps} {type(ctx.xi).__name__} steps with γ = {ctx.gamma:g} approach the conjugate optimum: the distance in "
        "natural parameters shrinks at every step"
    )
    return Outcome(checks=(Check("conjugate_convergence", claim, bool(worst < 1.0), worst, 1.0, nums),), numbers=numbers)
