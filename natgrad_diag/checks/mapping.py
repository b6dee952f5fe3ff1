"""The ``gradient_mapping`` oracle: GPflow's map of unconstrained to constrained gradients against the chain rule.

GPflow's natural gradient maps ∂L/∂u (u the unconstrained variable) to the constrained parameter c = T.forward(u)
with ``_to_constrained(grad, T) = T.forward(grad)``. The chain rule says ∂L/∂c = (∂u/∂c)ᵀ·∂L/∂u, the VJP of
T.inverse at c; the two agree only for linear isometric transforms (identity, FillTriangular).
"""

from __future__ import annotations

import sys
import types
import warnings
from typing import Any

import numpy as np

from natgrad_diag.checks.bounds import maxabs
from natgrad_diag.checks.evaluator import Run
from natgrad_diag.checks.report import Outcome
from natgrad_diag.report.records import Check, format_number, status_of
from natgrad_diag.tolerance import Tolerance
from natgrad_diag.typing import Array

__all__ = ["is_isometric", "stage"]


def _user_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the first caller outside natgrad_diag."""
    level = 1
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("natgrad_diag"):
        frame = frame.f_back
        level += 1
    return level


def is_isometric(transform: Any) -> bool:
    """Whether GPflow's gradient mapping is exact for the bijector ``transform``: Identity or FillTriangular."""
    import tensorflow_probability as tfp

    return type(transform) in (tfp.bijectors.Identity, tfp.bijectors.FillTriangular)


#: The warning for a transform whose gradient GPflow maps wrongly.
_WARNING = (
    "{name} has the transform {transform}: GPflow's natural gradient maps its gradient with "
    "_to_constrained(grad, transform) = transform.forward(grad), which is the chain rule only for linear "
    "isometric transforms (identity, FillTriangular); here it is off by up to {err}, so "
    "the step is not a natural-gradient step. Use gpflow.utilities.triangular() for q_sqrt and no transform for q_mu."
)


def _correct_gradient(param: Any, g: Array, dtype: Any) -> tuple[Array, Array, Array]:
    """(∂L/∂c by the chain rule, the mask of entries of c that move with u, the VJP of forward mapping it back)."""
    import tensorflow as tf

    T = param.transform
    # fresh tensors: tfp bijectors cache forward/inverse pairs by tensor, which would hide the ops from the tape
    c = tf.identity(tf.convert_to_tensor(param))
    u = tf.identity(tf.convert_to_tensor(param.unconstrained_variable))
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(c)
        u_of_c = T.inverse(c)
    correct = tape.gradient(u_of_c, c, output_gradients=tf.constant(g), unconnected_gradients=tf.UnconnectedGradients.ZERO)
    # only the entries of c that move with u carry gradient (FillTriangular's upper triangle is fixed at 0)
    tangent = tf.constant(np.random.default_rng(0).uniform(0.5, 1.5, size=u.shape).astype(dtype))
    with tf.autodiff.ForwardAccumulator(primals=u, tangents=tangent) as acc:
        moving = acc.jvp(T.forward(u), unconnected_gradients=tf.UnconnectedGradients.ZERO).numpy() != 0
    correct = tf.where(moving, correct, tf.zeros_like(correct))
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(u)
        c_of_u = T.forward(u)
    return correct.numpy(), moving, tape.gradient(c_of_u, u, output_gradients=correct).numpy()


def stage(run: Run) -> Outcome:
    """GPflow's map against the chain rule for q_mu and q_sqrt, and that the VJP of T.forward at u maps the correct
    ∂L/∂c back to ∂L/∂u (the consistency number). A failure is also warned (attributed to the caller). Without
    explicit Jacobians (fast mode) a linear isometric transform is not recomputed: the map is exact by construction.
    """
    ctx, step = run.ev.ctx, run.step
    parts, details, margins, found = [], [], [], []
    for name, param, g, gp in (("q_mu", ctx.model.q_mu, step.g_mu, step.dL_dmean), ("q_sqrt", ctx.model.q_sqrt, step.g_sq, step.dL_dvarsqrt)):
        if (T := param.transform) is None:
            parts.append(f"{name}: identity (exact)")
        elif not run.ev.explicit_jacobians and is_isometric(T):
            parts.append(f"{name}: {type(T).__name__} (linear isometric: exact, not recomputed in fast mode)")
        else:
            correct, moving, back = _correct_gradient(param, g, ctx.np_dtype)
            err = maxabs(np.where(moving, gp - correct, 0.0))
            margins.append((err, Tolerance(rtol=ctx.tol.rtol, atol=ctx.tol.atol).bound(correct)))
            parts.append(f"{name}: {type(T).__name__} ({'' if is_isometric(T) else 'not '}linear isometric), error {format_number(err)}")
            details.append(f"{name}: VJP of forward maps the correct ∂L/∂{name} back to ∂L/∂u to {format_number(maxabs(back - g))}")
            if not err <= margins[-1][1]:
                found.append(_WARNING.format(name=name, transform=type(T).__name__, err=format_number(err)))
                warnings.warn(found[-1], UserWarning, stacklevel=_user_stacklevel())
    worst, bound = max(reversed(margins), key=lambda m: m[0] - m[1], default=(0.0, 0.0))  # the last of equal margins
    claim = ("GPflow's _to_constrained(grad, transform) equals the correct map to constrained gradients "
             "(the VJP of the bijector's inverse, (∂u/∂c)ᵀ·∂L/∂u) for q_mu and q_sqrt")
    status = status_of(all(e <= b for e, b in margins))
    return Outcome(checks=(Check("gradient_mapping", claim, status, worst, bound or None, "; ".join(parts + details)),),
                   warnings=tuple(found))
