"""The ``custom_step`` oracle: the user's own natural-gradient step against GPflow's, and the mistake it matches.

The user's optimizer (GPflow's ``minimize(loss_fn, var_list)``, or an update function wrapped by :func:`as_optimizer`)
runs once on a scratch copy; its new q(u) must equal what ``gpflow.optimizers.NaturalGradient`` assigns at the same γ
and ξ, to the ``reproduction`` bound. Else the mistake of :data:`MISTAKES` (tabled in docs/natgrad-checks.md) it
matches to rounding is named, each computed independently from the same gradients with GPflow's step (maths in
:mod:`natgrad_diag.step`). A mistake that gives GPflow's step here (γ = 1 for the γ mistakes) is not named.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from natgrad_diag._validate import input_error
from natgrad_diag.checks.bounds import Bound, Conditioning, bounded_check, finite
from natgrad_diag.checks.causes import FIX
from natgrad_diag.checks.evaluator import Context, GpflowStep, Run, Step, theta_gradients
from natgrad_diag.checks.health import noise
from natgrad_diag.checks.report import Outcome
from natgrad_diag.checks.reproduction import both_fail, differences, step_bound
from natgrad_diag.exceptions import NatGradDiagError, error_line
from natgrad_diag.report.records import Check, format_number, max_abs_diff
from natgrad_diag.step import trace
from natgrad_diag.tolerance import eps
from natgrad_diag.typing import Array

__all__ = ["MISTAKES", "as_optimizer", "optimizer_settings", "restored", "stage", "who"]

_EXPLAIN = "output_gradients=[dL_dmean, dL_dvarsqrt] gives Jᵀ·v, the chain rule; see natgrad_diag.explain_output_gradients()"

#: Words of TensorFlow's errors for a step that fails numerically (a γ too long), not a broken optimizer.
_NUMERICAL = ("Cholesky", "NaN", "Inf", "not invertible")

_TRACE = "compare your update with natgrad_diag.natgrad_trace(q_mu, q_sqrt, q_mu_grad, q_sqrt_grad, gamma=..., xi_transform=...), GPflow's step line by line."

#: name -> (what the step did, the fix).
MISTAKES: dict[str, tuple[str, str]] = {
    "default_seed": (
        "dL/deta = (Jᵀ·1)⊙v, the default seed's gradient dtheta_deta (output_gradients=None: the gradient of the sum "
        "of all outputs) times (dL_dmean, dL_dvarsqrt) elementwise, which is the chain rule only for a diagonal J",
        f"compute dL_deta1, dL_deta2 = tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=[dL_dmean, dL_dvarsqrt]): {_EXPLAIN}.",
    ),
    "varsqrt_path": (
        "dL/deta1 = dL/dmean: the path through varsqrt = chol(eta2 − eta1·eta1ᵀ), which depends on eta1 too, is dropped",
        f"take dL_deta1 from one tape.gradient of both targets (mean, varsqrt) w.r.t. eta1: {_EXPLAIN}.",
    ),
    "varsqrt_seed": (
        "the seed is (dL_dmean, 0): q_sqrt's gradient dL_dvarsqrt is dropped from output_gradients",
        "seed both targets: output_gradients=[dL_dmean, dL_dvarsqrt].",
    ),
    "natural_coordinates": (
        "dL/deta is the gradient in the natural parameters θ (through natural_to_meanvarsqrt), the ordinary gradient, "
        "not the natural gradient F⁻¹·∇θL",
        "differentiate w.r.t. the expectation parameters: eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt), "
        "meanvarsqrt = expectation_to_meanvarsqrt(eta1, eta2); ∇ηL there is θ's natural gradient (Salimbeni et al. 2018, eq. 10).",
    ),
    "gamma_twice": ("γ applied twice: the step with γ²", "multiply the natural gradient by γ once: xi_new = xi − γ·nat_dL_xi."),
    "gamma_missing": ("γ not applied: the step with γ = 1", "multiply the natural gradient by γ: xi_new = xi − γ·nat_dL_xi."),
    "ascent": ("the sign flipped: ξ + γ·nat_dL_xi, a step up the loss", "subtract: xi_new = xi − γ·nat_dL_xi (the loss is minimised)."),
    "unconstrained": (
        "the gradients of the unconstrained variables used as dL/dmean, dL/dvarsqrt (no _to_constrained)",
        "map them first: dL_dmean = transform.forward(q_mu_grad), as GPflow's _to_constrained does.",
    ),
    "wrong_xi": ("the other ξ's step (XiNat's maths with XiSqrtMeanVar, or the reverse)", "use xi_transform in both the "
                 "forward map and the update; if your minimize call passes ξ in var_list, give the check (or the monitor) that ξ as xi_transform."),
    "transposed": ("q_sqrt assigned transposed (a triangular() parameter reads its entries in the lower triangle's order)", "assign the lower-triangular factor itself, not its transpose."),
}


def optimizer_settings(optimizer: Any, gamma: Any, xi_transform: Any) -> tuple[Any, Any]:
    """(γ, ξ) of ``optimizer``: its ``gamma`` (float, tensor or tf.Variable), else ``gamma``; ``xi_transform`` when
    given (the ξ a training loop passes in var_list, ``minimize(loss, [(q_mu, q_sqrt, xi)])``, which overrides the
    optimizer's own as GPflow's NaturalGradient takes it), else the optimizer's ``xi_transform``."""
    g = getattr(optimizer, "gamma", None)
    g = gamma if g is None else float(g.numpy()) if hasattr(g, "numpy") else g
    return g, xi_transform or getattr(optimizer, "xi_transform", None)


def _function_arity(fn: Any) -> int:
    """6 for ``fn(self, q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform)`` (GPflow's method), 5 without self."""
    sig = None
    with contextlib.suppress(TypeError, ValueError):
        sig = inspect.signature(fn)
        for n in ((6, 5) if next(iter(sig.parameters), "") == "self" else (5,)):
            with contextlib.suppress(TypeError):
                sig.bind(*range(n))
                return n
    raise input_error(
        "an update function must take GPflow's arguments (q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform).",
        "optimizer", "fn(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform), optionally with self first",
        f"{getattr(fn, '__name__', type(fn).__name__)}{sig if sig is not None else ''}",
        "give the function GPflow's NaturalGradient._natgrad_apply_gradients signature; it assigns q_mu and q_sqrt "
        "or returns (dL_deta1, dL_deta2).",
    )


def as_optimizer(optimizer: Any, *, gamma: Any, xi_transform: Any) -> tuple[Any, Any, Any]:
    """(optimizer, its γ, its ξ) (:func:`optimizer_settings`): ``optimizer`` itself when it has ``minimize``; an update
    function wrapped into a GPflow ``NaturalGradient`` (with ``gamma``, ``xi_transform``) whose update calls it; an
    :class:`InputError` otherwise.

    The function gets GPflow's arguments (and the optimizer as ``self`` when its first parameter is ``self``). It
    assigns q_mu and q_sqrt and returns None, or returns (dL_deta1 [M, L], dL_deta2 [L, M, M]), from which GPflow's
    step is completed (:func:`step_from_eta`).
    """
    if callable(getattr(optimizer, "minimize", None)) and not isinstance(optimizer, type):
        return (optimizer, *optimizer_settings(optimizer, gamma, xi_transform))
    if not callable(optimizer) or isinstance(optimizer, type):
        raise input_error(
            "optimizer must be a natural-gradient optimizer instance or an update function.", "optimizer",
            "an object with minimize(loss_fn, var_list), e.g. a NaturalGradient subclass instance, or "
            "fn(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform)", repr(optimizer)[:80],
            "pass the instance whose minimize() your training loop calls (MyNatGrad(gamma=0.1), not MyNatGrad).",
        )  # fmt: skip
    arity = _function_arity(optimizer)
    import gpflow

    from natgrad_diag._gpflow import override_natgrad_apply_gradients

    class FunctionStep(gpflow.optimizers.NaturalGradient):  # type: ignore[misc, unused-ignore]
        def update(self, q_mu_grad: Any, q_sqrt_grad: Any, q_mu: Any, q_sqrt: Any, xi: Any = None) -> None:
            xi = self.xi_transform if xi is None else xi
            before = (q_mu.numpy(), q_sqrt.numpy())
            args = (q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi)
            out = optimizer(self, *args) if arity == 6 else optimizer(*args)
            if out is None:
                return
            shapes = [tuple(q_mu.shape), tuple(q_sqrt.shape)]
            if not isinstance(out, (tuple, list)) or len(out) != 2 or [tuple(np.shape(o)) for o in out] != shapes:
                raise input_error(
                    "the update function returned neither None nor (dL_deta1, dL_deta2).", "optimizer",
                    f"None (after assigning q_mu, q_sqrt) or (dL_deta1 {list(shapes[0])}, dL_deta2 {list(shapes[1])})",
                    type(out).__name__ if not isinstance(out, (tuple, list)) else f"{len(out)} value(s) of shape {[list(np.shape(o)) for o in out]}",
                    "return the expectation-parameter gradients of q_mu and q_sqrt, or assign the new values and return None.",
                )  # fmt: skip
            new_mu, new_sq = step_from_eta(before[0], before[1], out[0], out[1], self.gamma, xi)
            q_mu.assign(new_mu)
            q_sqrt.assign(new_sq)

    override_natgrad_apply_gradients(FunctionStep, FunctionStep.update)
    wrapped = FunctionStep(gamma, xi_transform or gpflow.optimizers.XiNat(), name=getattr(optimizer, "__name__", "update"))
    wrapped.function = optimizer
    return (wrapped, *optimizer_settings(wrapped, gamma, xi_transform))


def who(optimizer: Any) -> str:
    """How a report names ``optimizer``: its class, or the wrapped update function."""
    fn = getattr(optimizer, "function", None)
    return f"{getattr(fn, '__qualname__', 'the update function')}()" if fn is not None else type(optimizer).__name__


def _variables(value: Any, depth: int = 0) -> list[Any]:
    """The tf.Variables in ``value``, its attributes and containers (three levels deep)."""
    import tensorflow as tf

    if isinstance(value, tf.Variable):
        return [value]
    if depth > 3 or isinstance(value, (str, bytes, type, tf.Tensor, np.ndarray)):
        return []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple, set)) else getattr(value, "__dict__", {}).values()
    return [v for item in list(items) for v in _variables(item, depth + 1)]


@contextlib.contextmanager
def restored(variables: list[Any]) -> Iterator[None]:
    """Put every variable back to its value on entry, bit for bit, on exit."""
    saved = [np.array(v.numpy(), copy=True) for v in variables]
    try:
        yield
    finally:
        for v, value in zip(variables, saved):
            v.assign(value)


@contextlib.contextmanager
def preserved(optimizer: Any) -> Iterator[None]:
    """Put ``optimizer`` back as it was on exit: its attributes (new ones removed), the contents of its lists, dicts,
    sets and arrays, and the values of its tf.Variables (γ, slots, counters), bit for bit."""
    state = dict(getattr(optimizer, "__dict__", {}))
    contents = {k: v.copy() for k, v in state.items() if isinstance(v, (np.ndarray, list, dict, set))}
    with restored(_variables(optimizer)):
        try:
            yield
        finally:
            if state:
                optimizer.__dict__.clear()
                optimizer.__dict__.update(state)
            for k, c in contents.items():
                if isinstance(c, np.ndarray):
                    state[k][...] = c
                elif isinstance(c, list):
                    state[k][:] = c
                else:  # dict, set
                    state[k].clear()
                    state[k].update(c)


@dataclass(frozen=True)
class Applied:
    """What the user's optimizer did to one (q_mu, q_sqrt): the new q_mu [M, L] and q_sqrt [L, M, M] (None when it
    failed), why it failed (TensorFlow's numerical error, ""), and the other variables it changed."""

    q_mu: Array | None
    q_sqrt: Array | None
    error: str = ""
    changed: tuple[str, ...] = ()


def _apply(optimizer: Any, loss: Callable[[], Any], q_mu: Any, q_sqrt: Any, others: dict[str, Any], xi: Any, gamma: float | None = None) -> Applied:
    """``optimizer.minimize(loss, [(q_mu, q_sqrt)])`` once (``[(q_mu, q_sqrt, xi)]`` when the optimizer has another
    ``xi_transform``; with its ``gamma`` set to ``gamma`` when given), the optimizer preserved, and which of ``others``
    (name -> tf.Variable) it changed, read before the optimizer is put back. The caller restores every variable."""
    import tensorflow as tf

    before = {n: np.array(v.numpy(), copy=True) for n, v in others.items()}
    with preserved(optimizer):
        if gamma is not None and isinstance(optimizer.gamma, tf.Variable):
            optimizer.gamma.assign(gamma)
        elif gamma is not None:
            optimizer.gamma = gamma
        try:
            optimizer.minimize(loss, [(q_mu, q_sqrt) if xi is getattr(optimizer, "xi_transform", xi) else (q_mu, q_sqrt, xi)])
        except NatGradDiagError:
            raise
        except Exception as e:
            if isinstance(e, tf.errors.InvalidArgumentError) and any(k in str(e) for k in _NUMERICAL):
                return Applied(None, None, error_line(e))  # a numerical failure: GPflow's Cholesky or NaN guard
            function = getattr(optimizer, "function", None) is not None  # an update function as_optimizer wrapped
            call = (f"{who(optimizer).removesuffix('()')}(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform)"
                    if function else f"{who(optimizer)}.minimize(loss_fn, var_list)")
            expected = ("an update function that assigns q_mu and q_sqrt or returns (dL_deta1, dL_deta2)" if function
                        else "minimize(loss_fn, [(q_mu, q_sqrt)]) that updates q_mu and q_sqrt")
            raise input_error(f"{call} raised {error_line(e, with_type=True)}", "optimizer", expected, type(e).__name__,
                              "call it yourself once on a copy of the model (gpflow.utilities.deepcopy) to see where it fails.") from e
        changed = tuple(n for n, v in others.items() if v.numpy().tobytes() != before[n].tobytes())
        mu, sq = q_mu.numpy(), q_sqrt.numpy()
    if not finite(mu, sq):
        return Applied(None, None, "NaN or Inf in its new q_mu or q_sqrt", changed)
    return Applied(mu, sq, "", changed)


def step_from_eta(q_mu: Any, q_sqrt: Any, dL_deta1: Any, dL_deta2: Any, gamma: Any, xi: Any) -> tuple[Any, Any]:
    """GPflow's new (q_mu [M, L], q_sqrt [L, M, M]) by :func:`natgrad_diag.step.trace.step_from_eta`, every input
    (arrays, tensors, a Python float γ) made a tensor of q_mu's dtype."""
    import tensorflow as tf

    q_mu, q_sqrt = tf.convert_to_tensor(q_mu), tf.convert_to_tensor(q_sqrt)
    d1, d2 = (tf.cast(tf.convert_to_tensor(d), q_mu.dtype) for d in (dL_deta1, dL_deta2))
    g = tf.cast(tf.convert_to_tensor(gamma, dtype_hint=q_mu.dtype), q_mu.dtype)  # a Python float stays float64
    out = trace.step_from_eta(q_mu, q_sqrt, d1, d2, g, xi)
    return out["new_q_mu"], out["new_q_sqrt"]


def mistaken_steps(
    q_mu: Any, q_sqrt: Any, step: Step, transform: Any, gamma: float, xi: Any, gp: tuple[Array, Array]
) -> Iterator[tuple[str, tuple[Array, Array] | None]]:
    """(name, new (q_mu [M, L], q_sqrt [L, M, M])) of each mistake of :data:`MISTAKES` that can be computed here, one
    at a time (None for a mistake whose step fails: Cholesky, NaN or Inf), from ``step``'s unconstrained and
    constrained gradients; ``transform`` q_sqrt's; ``gp`` GPflow's new (q_mu, q_sqrt) (for ``transposed``). A mistake
    that is the right step for this set-up at every point (``unconstrained`` under identity transforms, ``transposed``
    at M = 1) is left out: no point could tell it apart."""
    import tensorflow as tf
    from gpflow.optimizers import XiNat, XiSqrtMeanVar
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation

    from natgrad_diag.step.closed_form import expectation_gradients

    grads = (step.g_mu, step.g_sq, step.dL_dmean, step.dL_dvarsqrt)
    g_mu, g_sq, d_mean, d_varsqrt = (tf.constant(np.asarray(a)) for a in grads)
    q_mu, q_sqrt = tf.constant(np.asarray(q_mu)), tf.constant(np.asarray(q_sqrt))
    right = expectation_gradients(q_mu, q_sqrt, d_mean, d_varsqrt)
    eta = meanvarsqrt_to_expectation(q_mu, q_sqrt)
    with tf.GradientTape(watch_accessed_variables=False) as tape:  # Jᵀ·1 as the question computes it: no seed
        tape.watch(eta)
        targets = expectation_to_meanvarsqrt(*eta)
    ones1, ones2 = tape.gradient(targets, list(eta))
    other = XiSqrtMeanVar() if isinstance(xi, XiNat) else XiNat() if isinstance(xi, XiSqrtMeanVar) else None
    plans: dict[str, Callable[[], Any]] = {
        "default_seed": lambda: step_from_eta(q_mu, q_sqrt, ones1 * d_mean, ones2 * d_varsqrt, gamma, xi),
        "varsqrt_path": lambda: step_from_eta(q_mu, q_sqrt, d_mean, right[1], gamma, xi),
        "varsqrt_seed": lambda: step_from_eta(q_mu, q_sqrt, d_mean, tf.zeros_like(d_varsqrt), gamma, xi),
        "natural_coordinates": lambda: step_from_eta(q_mu, q_sqrt, *theta_gradients(q_mu, q_sqrt, d_mean, d_varsqrt), gamma, xi),
        "gamma_twice": lambda: step_from_eta(q_mu, q_sqrt, *right, gamma * gamma, xi),
        "gamma_missing": lambda: step_from_eta(q_mu, q_sqrt, *right, 1.0, xi),
        "ascent": lambda: step_from_eta(q_mu, q_sqrt, *right, -gamma, xi),
    }
    if g_mu.shape == q_mu.shape and g_sq.shape == q_sqrt.shape and not all(map(np.array_equal, grads[:2], grads[2:])):
        plans["unconstrained"] = lambda: step_from_eta(q_mu, q_sqrt, *expectation_gradients(q_mu, q_sqrt, g_mu, g_sq), gamma, xi)
    if other is not None:
        plans["wrong_xi"] = lambda: step_from_eta(q_mu, q_sqrt, *right, gamma, other)
    for name, plan in plans.items():
        try:
            mu, sq = (np.asarray(t) for t in plan())
        except tf.errors.InvalidArgumentError:
            mu = sq = np.full(1, np.nan)
        yield name, ((mu, sq) if finite(mu, sq) else None)
    if gp[1].shape[-1] > 1:  # M = 1: a transpose is the identity
        flipped = np.swapaxes(gp[1], -1, -2)
        # what the parameter holds after assign(flipped); through numpy, or TFP's bijector cache hands back flipped itself
        yield "transposed", (gp[0], flipped if transform is None else np.asarray(transform.forward(np.asarray(transform.inverse(flipped)))))


def judge(
    applied: Applied, gp: GpflowStep, before: tuple[Array, Array], step: Step, transform: Any, ctx: Context,
    cond: Conditioning, label: str, retry: Callable[[float], Applied] | None = None,
) -> Check:
    """The ``custom_step`` check of the user's new q(u) ``applied`` against GPflow's ``gp``, both from ``before`` =
    (q_mu [M, L], q_sqrt [L, M, M]) with ``step``'s gradients: |yours − GPflow's| ≤ the ``reproduction`` bound, else
    the mistake it matches, where it differs most and by how much.

    A mistake matches when its step is within max(10·bound, √ε·scale) of the user's (the rounding of a second route
    through GPflow's maps) and GPflow's is not: mistakes differ from each other by far more, the step's own size. A
    step that fails where GPflow's holds matches no step; ``retry(γ')`` (the user's step again at γ') then takes it at
    γ/10 and γ/100, where the mistakes that fail too may hold, to name the one it is.
    """
    mistakes = partial(mistaken_steps, *before, step, transform, ctx.gamma, ctx.xi)
    claim = (f"the step {label} takes ({type(ctx.xi).__name__}, gamma = {ctx.gamma:g}) equals what "
             "gpflow.optimizers.NaturalGradient assigns")
    if applied.changed:
        detail = f"{label} also changed {', '.join(applied.changed)}; a natural-gradient step moves q_mu and q_sqrt only (the check restored them)."
        return Check("custom_step", claim, "fail", detail=detail + FIX + "update only the (q_mu, q_sqrt) pairs minimize() is given.")
    if applied.q_mu is None or applied.q_sqrt is None or gp.q_mu is None or gp.q_sqrt is None:
        detail = both_fail(label, applied.error, gp.error)
        if applied.q_mu is None and gp.q_mu is None:
            return Check("custom_step", f"{label} and gpflow.optimizers.NaturalGradient both find that this step fails", "pass", detail=detail)
        if gp.q_mu is None or gp.q_sqrt is None:
            return Check("custom_step", claim, "fail", detail=detail + FIX + "use a smaller gamma, and check your update at it.")
        failing = [n for n, s in mistakes((gp.q_mu, gp.q_sqrt)) if s is None]  # candidates: a NaN matches no step
        if failing and retry is not None and (found := _at_smaller_gamma(retry, before, step, transform, ctx, cond, failing)):
            name, smaller = found
            detail += f" Its step fails where GPflow's holds; at gamma = {smaller:g}, where it holds, it is the mistake '{name}': {MISTAKES[name][0]}."
            return Check("custom_step", claim, "fail", detail=detail + FIX + MISTAKES[name][1])
        if len(failing) == 1:
            detail += (f" Its step fails where GPflow's holds, as the mistake '{failing[0]}' does here "
                       f"({MISTAKES[failing[0]][0]}): the likely cause, though a NaN cannot confirm it.")
        elif failing:
            detail += (f" Its step fails where GPflow's holds. Of the known mistakes, {', '.join(map(repr, failing))} fail "
                       f"here too ({'; '.join(MISTAKES[n][0] for n in failing)}): the cause may be one of them, or "
                       "anything else that gives NaN.")
        fix = f"{MISTAKES[failing[0]][1]} If that is not it, {_TRACE}" if len(failing) == 1 else _TRACE
        return Check("custom_step", claim, "fail", detail=detail + FIX + fix)
    got, want = (applied.q_mu, applied.q_sqrt), (gp.q_mu, gp.q_sqrt)
    if got[0].shape != want[0].shape or got[1].shape != want[1].shape:
        shapes = f"{list(got[0].shape)}, {list(got[1].shape)} against GPflow's {list(want[0].shape)}, {list(want[1].shape)}"
        return Check("custom_step", claim, "fail", detail=f"the new q_mu, q_sqrt have shapes {shapes}.")
    (bound, near), err, parts = _match_distance(ctx, cond, want), max_abs_diff(got, want), differences(got, want)
    if err <= bound.total:  # a pass that a mistake would also get here (γ = 1, q_mu = 0, S = I) only warns
        check = bounded_check("custom_step", claim, err, bound, parts)
        blind = [n for n, s in mistakes(want) if s is not None and max_abs_diff(want, s) <= near]
        if not blind or check.status != "pass":
            return check
        return Check("custom_step", claim, "warn", err, bound.total, f"{check.detail}; but here the step of the "
                     f"mistake(s) {', '.join(blind)} is GPflow's too, so this point cannot rule them out.{FIX}check again "
                     "at another gamma (γ = 1 hides γ's mistakes) or after a few training steps (q_mu = 0 or q_sqrt = I "
                     "hide the others).")
    blocks = [(f"q_mu[:, {l}]", l, float(np.max(np.abs(got[0][:, l] - want[0][:, l])))) for l in range(want[0].shape[1])]
    blocks += [(f"q_sqrt[{l}]", l, float(np.max(np.abs(got[1][l] - want[1][l])))) for l in range(want[1].shape[0])]
    block, latent, diff = max(blocks, key=lambda b: b[2])  # the block (q_mu[:, l] or q_sqrt[l]) that differs most
    where = (f"It differs from GPflow's step most in {block} (latent GP {latent}): {format_number(diff)} > tolerance "
             f"{format_number(bound.total)} ({parts}).")
    dist = {}
    for name, s in mistakes(want):
        if s is not None and max_abs_diff(want, s) > near:
            dist[name] = max_abs_diff(got, s)
            if dist[name] <= near:
                break  # a second match would be the same step to rounding
    if not dist:
        return Check("custom_step", claim, "fail", err, bound.total, where)
    d, name = min((d, n) for n, d in dist.items())
    if d <= near:
        what, fix = MISTAKES[name]
        detail = f"{label}'s step is the mistake '{name}' (to within {format_number(d)}): {what}. {where}{FIX}{fix}"
    else:
        detail = (
            f"{label}'s step differs from the natural-gradient step and matches none of the known mistakes (the nearest, "
            f"'{name}', is {format_number(d)} away). {where}{FIX}{_TRACE}"
        )
    return Check("custom_step", claim, "fail", err, bound.total, detail)


def _match_distance(ctx: Context, cond: Conditioning, want: tuple[Array, Array]) -> tuple[Bound, float]:
    """The ``reproduction`` bound on GPflow's new (q_mu, q_sqrt) ``want``, and the distance within which a mistake's
    step is the user's: max(10·bound, √ε·scale), the rounding of a second route through GPflow's maps."""
    bound = step_bound(ctx, cond, list(want))
    return bound, max(10 * bound.total, float(np.sqrt(eps(bound.dtype))) * bound.scale)


def _at_smaller_gamma(
    retry: Callable[[float], Applied], before: tuple[Array, Array], step: Step, transform: Any, ctx: Context,
    cond: Conditioning, candidates: list[str],
) -> tuple[str, float] | None:
    """(the candidate mistake, γ') that the user's step ``retry(γ')`` is at γ' = γ/10 or γ/100, where it holds: within
    :func:`judge`'s distance of that mistake's step and not of GPflow's; None when it holds at neither (or its γ cannot
    be set, or it raises there) or matches none."""
    import tensorflow as tf

    from natgrad_diag.step.closed_form import expectation_gradients

    right = expectation_gradients(*(tf.constant(np.asarray(a)) for a in (*before, step.dL_dmean, step.dL_dvarsqrt)))
    for smaller in (ctx.gamma / 10, ctx.gamma / 100):
        try:
            applied = retry(smaller)
        except (NatGradDiagError, AttributeError, TypeError):  # a read-only gamma, or an error only at γ'
            return None
        if applied.q_mu is None or applied.q_sqrt is None:
            continue
        new_mu, new_sq = step_from_eta(*before, *right, smaller, ctx.xi)
        got, want = (applied.q_mu, applied.q_sqrt), (np.asarray(new_mu), np.asarray(new_sq))
        near = _match_distance(ctx, cond, want)[1]
        for name, s in mistaken_steps(*before, step, transform, smaller, ctx.xi, want):
            if name in candidates and s is not None and max_abs_diff(got, s) <= near < max_abs_diff(want, s):
                return name, smaller
    return None


def _surrogate(step: Step, q_mu: Any, q_sqrt: Any) -> Callable[[], Any]:
    """The loss the user's step sees when the real one is stochastic: ⟨dL/dmean, q_mu⟩ + ⟨dL/dvarsqrt, q_sqrt⟩.

    Its gradients at the current q(u) are the step's own, dL/dmean [M, L] and dL/dvarsqrt [L, M, M] in the constrained
    parameters and, by the same chain rule through the transforms (linear: q_sqrt's FillTriangular), g_mu and g_sq in
    the unconstrained ones; it draws no samples, so the user's step and GPflow's see the same gradients and differ only
    by their mistakes (a step evaluating the real loss would differ by the loss's Monte Carlo noise).
    """
    import tensorflow as tf

    d_mean, d_varsqrt = tf.constant(step.dL_dmean), tf.constant(step.dL_dvarsqrt)
    return lambda: tf.reduce_sum(d_mean * q_mu) + tf.reduce_sum(d_varsqrt * q_sqrt)


def stage(run: Run) -> Outcome:
    """The ``custom_step`` check when the run has an optimizer (``ctx.optimizer``); nothing otherwise.

    A stochastic loss (:func:`~natgrad_diag.checks.health.noise`) is replaced by its first-order :func:`_surrogate`.
    On a model, the optimizer steps on the evaluator's scratch copy (its other variables must stay as they are, and
    the model's own variables too: one the optimizer reaches by itself is restored and named); in the var_list form
    it steps on the pair itself, and every variable the loss reads is restored.
    """
    import gpflow
    import tensorflow as tf

    ev, opt = run.ev, run.ev.ctx.optimizer
    if opt is None:
        return Outcome()
    stochastic = noise(ev, run.step)  # measured first: it moves the scratch copy's q(u)
    if ev.scratch is not None:  # a model: step on the scratch copy, watching the model's own variables too
        model, scratch = ev.ctx.model, ev.sync()
        q_mu, q_sqrt = model.q_mu, model.q_sqrt
        own = {f"the model's {n}": p.unconstrained_variable for n, p in gpflow.utilities.parameter_dict(model).items()}
        others = {n: p.unconstrained_variable for n, p in gpflow.utilities.parameter_dict(scratch).items() if p is not scratch.q_mu and p is not scratch.q_sqrt}
        loss = _surrogate(run.step, scratch.q_mu, scratch.q_sqrt) if stochastic else lambda: ev.ctx.loss(scratch)

        def attempt(gamma: float | None = None) -> Applied:
            try:
                with restored(list(own.values())):
                    return _apply(opt, loss, scratch.q_mu, scratch.q_sqrt, {**others, **own}, ev.ctx.xi, gamma)
            finally:  # also when it raises (a retry that gives up): the later checks read the scratch copy
                ev.sync()
    else:  # the var_list form: the pair itself (a PairEvaluator)
        pev: Any = ev
        q_mu, q_sqrt = pev.q_mu, pev.q_sqrt
        with tf.GradientTape() as tape:
            pev.loss()
        pair = pev.variables  # q_mu's and q_sqrt's unconstrained variables
        others = {f"{v.name}#{i}": v for i, v in enumerate(tape.watched_variables()) if all(v is not p for p in pair)}
        loss = _surrogate(run.step, q_mu, q_sqrt) if stochastic else pev.loss

        def attempt(gamma: float | None = None) -> Applied:
            with restored([*others.values(), *pair]):
                return _apply(opt, loss, q_mu, q_sqrt, others, ev.ctx.xi, gamma)
    applied = attempt()
    before = (q_mu.numpy(), q_sqrt.numpy())
    return Outcome(checks=(judge(applied, run.gp, before, run.step, q_sqrt.transform, ev.ctx, run.cond, who(opt), attempt if hasattr(opt, "gamma") else None),))
