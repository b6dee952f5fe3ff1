"""Taking the step on the model's current q(u): natgrad-diag's (full or fast mode), GPflow's on a copy, ∂L/∂η."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from natgrad_diag.exceptions import error_line
from natgrad_diag.checks.bounds import finite
from natgrad_diag.checks.context import Context
from natgrad_diag.checks.engine import FastEngine
from natgrad_diag.checks.tensors import direction_tensors, loss_and_grads
from natgrad_diag.typing import Array

__all__ = ["GpflowStep", "Step", "fill_direction", "gpflow_step_full", "take_step_fast", "take_step_full"]


@dataclass(frozen=True)
class Step:
    """One natural-gradient step as natgrad-diag computes it, as arrays (None where it could not be computed).

    Attributes:
        loss: the training loss before the step.
        g_mu, g_sq: gradients w.r.t. q_mu's and q_sqrt's unconstrained variables.
        dL_dmean, dL_dvarsqrt: [M, L], [L, M, M], GPflow's constrained gradients.
        dL_deta1, dL_deta2: [M, L], [L, M, M], ∂L/∂η.
        nat_dL_xi1, nat_dL_xi2: the natural gradient in ξ coordinates.
        new_q_mu, new_q_sqrt: [M, L], [L, M, M], the step's new parameters.
        error: why the step failed ("" when it did not).
    """

    loss: float
    g_mu: Array
    g_sq: Array
    dL_dmean: Array
    dL_dvarsqrt: Array
    dL_deta1: Array | None = None
    dL_deta2: Array | None = None
    nat_dL_xi1: Array | None = None
    nat_dL_xi2: Array | None = None
    new_q_mu: Array | None = None
    new_q_sqrt: Array | None = None
    error: str = ""

    @property
    def gradients_finite(self) -> bool:
        """Whether the loss and its gradients are finite."""
        return finite(self.loss, self.g_mu, self.g_sq)


@dataclass(frozen=True)
class GpflowStep:
    """What ``gpflow.optimizers.NaturalGradient`` assigns to a copy (None when it fails), and the loss after it."""

    q_mu: Array | None
    q_sqrt: Array | None
    error: str = ""
    loss_after: float | None = None


def _step_from_gradients(ctx: Context, loss: Any, g_mu: Any, g_sq: Any) -> Step:
    from natgrad_diag._gpflow import to_constrained

    return Step(
        loss=float(loss.numpy()), g_mu=g_mu.numpy(), g_sq=g_sq.numpy(),
        dL_dmean=to_constrained(g_mu, ctx.model.q_mu.transform).numpy(),
        dL_dvarsqrt=to_constrained(g_sq, ctx.model.q_sqrt.transform).numpy(),
    )  # fmt: skip


def _nan_error(ctx: Context) -> str:
    return f"with gamma = {ctx.gamma:g} the step produced NaN or Inf in the new q_mu or q_sqrt."


def take_step_full(ctx: Context) -> Step:
    """The step by :func:`natgrad_diag.natgrad_trace` on the model's parameters (always eager, every intermediate).

    Always eager (``compiled=False``), as :func:`gpflow_step_full` runs GPflow's step: the two are compared like
    with like, so the verdict does not depend on whether an earlier call compiled the step.
    """
    import tensorflow as tf

    from natgrad_diag.exceptions import StepFailedError
    from natgrad_diag.step.trace import natgrad_trace

    loss, g_mu, g_sq = loss_and_grads(ctx.model, ctx.data)
    step = _step_from_gradients(ctx, loss, g_mu, g_sq)
    if not step.gradients_finite:
        return step
    try:
        t = natgrad_trace(ctx.model.q_mu, ctx.model.q_sqrt, g_mu, g_sq, gamma=ctx.gamma, xi_transform=ctx.xi, compiled=False)
    except StepFailedError as e:
        return dataclasses.replace(step, error=e.detail)
    except tf.errors.InvalidArgumentError as e:  # a custom ξ transform failing before the step
        return dataclasses.replace(step, error=error_line(e))
    return dataclasses.replace(
        step, dL_deta1=t.dL_deta1, dL_deta2=t.dL_deta2, nat_dL_xi1=t.nat_dL_xi1, nat_dL_xi2=t.nat_dL_xi2,
        new_q_mu=t.new_q_mu, new_q_sqrt=t.new_q_sqrt,
    )  # fmt: skip


def _piece_by_piece(ctx: Context, engine: FastEngine, data: Any, gamma: Any) -> tuple[Step, GpflowStep, dict[str, Any]]:
    """After a failure inside the compiled run: the engine's pieces one by one, to say which part failed."""
    import tensorflow as tf

    g = engine.grads_only(data)
    step = _step_from_gradients(ctx, g["loss"], g["g_mu"], g["g_sq"])
    if not step.gradients_finite:
        return step, GpflowStep(None, None), {}
    try:
        o = {k: v.numpy() for k, v in engine.ours(g["g_mu"], g["g_sq"], gamma).items()}
    except tf.errors.InvalidArgumentError as e:
        step = dataclasses.replace(step, error=f"with gamma = {ctx.gamma:g} the updated covariance is not positive definite ({error_line(e)}).")
    else:
        fields = ("dL_deta1", "dL_deta2", "nat_dL_xi1", "nat_dL_xi2", "new_q_mu", "new_q_sqrt")
        step = dataclasses.replace(step, **{k: o[k] for k in fields})
        if not finite(step.new_q_mu, step.new_q_sqrt):
            step = dataclasses.replace(step, error=_nan_error(ctx))
    try:
        gp = {k: v.numpy() for k, v in engine.gpflow_apply(data, g["g_mu"], g["g_sq"], gamma).items()}
    except tf.errors.InvalidArgumentError as e2:
        return step, GpflowStep(None, None, error_line(e2)), {}
    return step, GpflowStep(gp["gp_q_mu"], gp["gp_q_sqrt"], "", float(gp["loss_after"])), {}


def take_step_fast(ctx: Context, engine: FastEngine) -> tuple[Step, GpflowStep, dict[str, Any]]:
    """The step, GPflow's step and the Fisher products (the third value) from the compiled engine."""
    import tensorflow as tf

    gamma = tf.constant(ctx.gamma, dtype=ctx.model.q_mu.dtype)
    data = ctx.data if ctx.data is not None else ()
    try:
        out = engine.run(data, gamma)
    except tf.errors.InvalidArgumentError:
        return _piece_by_piece(ctx, engine, data, gamma)
    step = Step(
        loss=float(out["loss"]), g_mu=out["g_mu"], g_sq=out["g_sq"], dL_dmean=out["dL_dmean"], dL_dvarsqrt=out["dL_dvarsqrt"],
        dL_deta1=out["dL_deta1"], dL_deta2=out["dL_deta2"], nat_dL_xi1=out["nat_dL_xi1"], nat_dL_xi2=out["nat_dL_xi2"],
        new_q_mu=out["new_q_mu"], new_q_sqrt=out["new_q_sqrt"],
    )  # fmt: skip
    if step.gradients_finite and not finite(step.new_q_mu, step.new_q_sqrt):
        step = dataclasses.replace(step, error=_nan_error(ctx))
    if finite(out["gp_q_mu"], out["gp_q_sqrt"]):
        gp = GpflowStep(out["gp_q_mu"], out["gp_q_sqrt"], "", float(out["loss_after"]))
    else:
        gp = GpflowStep(None, None, "NaN or Inf in the new q_mu or q_sqrt", float(out["loss_after"]))
    fisher: dict[str, Any] = {k: out[k] for k in ("F_u1", "F_u2", "grad_theta1", "grad_theta2") if k in out}
    return step, gp, fisher


def gpflow_step_full(ctx: Context) -> GpflowStep:
    """GPflow's NaturalGradient.minimize on a deep copy; the copy's new q_mu, q_sqrt (or why it failed)."""
    import gpflow
    import tensorflow as tf

    copy_ = gpflow.utilities.deepcopy(ctx.model)
    opt = gpflow.optimizers.NaturalGradient(gamma=ctx.gamma, xi_transform=ctx.xi)
    try:
        opt.minimize(lambda: ctx.loss_fn(copy_), [(copy_.q_mu, copy_.q_sqrt)])
    except tf.errors.InvalidArgumentError as e:
        return GpflowStep(None, None, error_line(e))
    mu, sq = copy_.q_mu.numpy(), copy_.q_sqrt.numpy()
    if not finite(mu, sq):
        return GpflowStep(None, None, "NaN or Inf in the new q_mu or q_sqrt")
    return GpflowStep(mu, sq)


def fill_direction(ctx: Context, step: Step) -> Step:
    """``step`` with ∂L/∂η computed when the step itself failed (the direction does not depend on γ)."""
    import tensorflow as tf
    from gpflow.optimizers import XiNat

    if step.dL_deta1 is not None:
        return step
    try:
        d1, d2 = direction_tensors(
            tf.convert_to_tensor(ctx.model.q_mu), tf.convert_to_tensor(ctx.model.q_sqrt),
            tf.constant(step.dL_dmean), tf.constant(step.dL_dvarsqrt),
        )  # fmt: skip
    except tf.errors.InvalidArgumentError:
        return step
    d1, d2 = d1.numpy(), d2.numpy()
    nat = (d1, d2) if isinstance(ctx.xi, XiNat) else (step.nat_dL_xi1, step.nat_dL_xi2)
    return dataclasses.replace(step, dL_deta1=d1, dL_deta2=d2, nat_dL_xi1=nat[0], nat_dL_xi2=nat[1])
