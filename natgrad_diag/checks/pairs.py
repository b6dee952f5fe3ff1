"""The (q_mu, q_sqrt) pairs a step moves (of a GPflow or GPflux model, or a var_list), and
check_natgrad(loss_fn, var_list=[(q_mu, q_sqrt), ...]): the checks for any loss and any pairs, pair by pair.

As ``NaturalGradient.minimize(loss_fn, var_list)`` does, the gradients of ``loss_fn`` w.r.t. every pair come from one
tape; each pair's step is then checked with the others held fixed (``reproduction``, ``custom_step``, ``step_health``
with the γ search) on a :class:`PairEvaluator`. There is no copy to step on: the parameters themselves are stepped and
restored bit for bit (also when it raises); what the loss itself changes when called (the running means of Keras
metrics in GPflux's layers) is not undone. The checks that need a model are listed as skipped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from natgrad_diag.checks import custom_step, health, reproduction
from natgrad_diag.checks.custom_step import restored
from natgrad_diag.checks.bounds import finite, measure_conditioning, natgrad_tolerances, with_overrides
from natgrad_diag.checks.evaluator import (
    Context, Evaluator, GpflowStep, Healthy, Rise, Run, Step, finite_loss, gpflow_update, gradients, raised, resolve_mode,
    nat_gradient_at, step_from_gradients, Trial, traced, trial_steps,
)  # fmt: skip
from natgrad_diag.checks.report import HealthResult, NatGradReport, Outcome
from natgrad_diag._validate import call_fn, dtype_name, input_error, shape_str
from natgrad_diag.exceptions import ShapeMismatchError, UnconnectedGradientError, UnsupportedModelError, error_line
from natgrad_diag.report.records import Check, format_number, loss_rose
from natgrad_diag.step.trace import _validate_gamma, resolve_xi_transform
from natgrad_diag.typing import Array

__all__ = ["STOCHASTIC", "Pair", "PairEvaluator", "check_pairs", "refuse_misplaced", "trainable_note", "variational_pairs",
           "verify_step"]

#: How :func:`verify_step`'s detail starts when the loss is stochastic (its only "warn" the guard reports as that).
STOCHASTIC = "cannot verify: the loss is stochastic"

#: (name of q_mu, q_mu [M, L], name of q_sqrt, q_sqrt [L, M, M]); the names are Python expressions for the user.
Pair = tuple[str, Any, str, Any]


def _is_parameter(*ps: Any) -> bool:
    import gpflow

    return all(isinstance(p, gpflow.Parameter) for p in ps)


def variational_pairs(model: Any = None, var_list: Any = None) -> list[Pair]:
    """Every (q_mu, q_sqrt) pair of ``var_list`` (as ``NaturalGradient.minimize`` takes it) or of ``model``.

    A model with ``q_mu`` and ``q_sqrt`` (SVGP, VGP) has one pair, ``model.q_mu`` and ``model.q_sqrt``; a GPflux
    ``DeepGP`` has one per ``GPLayer`` in ``model.f_layers``, ``model.f_layers[i].q_mu`` and ``.q_sqrt``.

    Raises:
        UnsupportedModelError: no pair found, or a pair that is not two gpflow.Parameter objects.
    """
    if var_list is not None:
        for i, item in enumerate(var_list if isinstance(var_list, (list, tuple)) else [var_list]):
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3) or not _is_parameter(*item[:2]):
                raise input_error(
                    "var_list must hold (q_mu, q_sqrt) pairs of gpflow.Parameter, as NaturalGradient.minimize takes them.",
                    f"var_list[{i}]", "(q_mu [M, L], q_sqrt [L, M, M]) or (q_mu, q_sqrt, xi_transform)",
                    type(item).__name__, "pass var_list=[(layer.q_mu, layer.q_sqrt), ...].", kind=UnsupportedModelError,
                )  # fmt: skip
        return [(f"var_list[{i}][0]", item[0], f"var_list[{i}][1]", item[1]) for i, item in enumerate(var_list)]
    if _is_parameter(getattr(model, "q_mu", None), getattr(model, "q_sqrt", None)):
        return [("model.q_mu", model.q_mu, "model.q_sqrt", model.q_sqrt)]
    pairs = [
        (f"model.f_layers[{i}].q_mu", layer.q_mu, f"model.f_layers[{i}].q_sqrt", layer.q_sqrt)
        for i, layer in enumerate(getattr(model, "f_layers", None) or ())
        if _is_parameter(getattr(layer, "q_mu", None), getattr(layer, "q_sqrt", None))
    ]
    if not pairs:
        raise input_error(
            "found no variational q(u) = N(q_mu, q_sqrt q_sqrtᵀ) to take natural-gradient steps on.", "model",
            "a GPflow SVGP/VGP or a GPflux DeepGP with GPLayers", type(model).__name__,
            "pass var_list=[(q_mu, q_sqrt), ...] with the pairs your NaturalGradient.minimize call takes.",
            kind=UnsupportedModelError,
        )
    return pairs


def trainable_note(pairs: list[Pair]) -> str:
    """"" when no q_mu or q_sqrt of ``pairs`` is trainable; else the sentence naming them, with the fix."""
    names = [n for mu_name, mu, sq_name, sq in pairs for n, p in ((mu_name, mu), (sq_name, sq)) if p.trainable]
    if not names:
        return ""
    fix = "; ".join(f"gpflow.set_trainable({n}, False)" for n in names)
    return (
        f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} trainable: an optimizer over the model's trainable variables "
        f"(e.g. Adam) then moves q(u) too and undoes the natural-gradient step. Exclude them from it: {fix}."
    )


def pair_context(q_mu: Any, xi: Any, gamma: float, overrides: dict[str, float | None], **options: Any) -> Context:
    """The context of one q(u)'s checks (no model or data): q_mu's dtype's tolerances with ``overrides``, M and L."""
    np_dtype = np.dtype(q_mu.dtype.as_numpy_dtype)
    tol = with_overrides(natgrad_tolerances(np_dtype), **overrides)
    M, L = (int(n) for n in q_mu.shape)
    return Context(model=None, data=None, xi=xi, gamma=gamma, tol=tol, np_dtype=np_dtype, M=M, L=L, **options)


class PairEvaluator(Evaluator):
    """The evaluator of one (q_mu, q_sqrt) pair of a loss function: every computation (natgrad_trace, GPflow's update,
    the eager k-step trials) on the pair itself, restored."""

    compares = "natgrad_trace against GPflow's update of the pair"

    def __init__(self, ctx: Context, loss: Callable[[], Any], pair: Pair, grads: tuple[Any, Any], loss_before: float) -> None:
        super().__init__(ctx)
        self.loss, self.grads, self.loss_before = loss, grads, loss_before
        _, self.q_mu, _, self.q_sqrt = pair
        self.variables = [self.q_mu.unconstrained_variable, self.q_sqrt.unconstrained_variable]

    @functools.cached_property
    def q_arrays(self) -> tuple[Array, Array]:
        """The pair's q_mu [M, L] and q_sqrt [L, M, M] as arrays (the var_list form has no model)."""
        return self.q_mu.numpy(), self.q_sqrt.numpy()

    @functools.cached_property
    def _trial_steps(self) -> tuple[Callable[..., dict[str, Any]], ...]:
        """The trials' steps on the pair itself, natgrad-diag's and GPflow's own (eager)."""
        return trial_steps(self.q_mu, self.q_sqrt, self.ctx.xi, lambda data: gradients(self.loss, self.variables))

    def _steps(self) -> tuple[Step, GpflowStep]:
        ctx, (g_mu, g_sq), q_mu, q_sqrt = self.ctx, self.grads, self.q_mu, self.q_sqrt
        step = traced(step_from_gradients(q_mu, q_sqrt, self.loss_before, g_mu, g_sq), q_mu, q_sqrt, g_mu, g_sq, ctx, compiled=None)
        with restored(self.variables):
            return step, gpflow_update(ctx, g_mu, g_sq, q_mu, q_sqrt, self.loss)

    def loss_at(self, q_mu: Array, q_sqrt: Array, *, eager: bool = True) -> float | None:  # your loss, eager
        def loss() -> Any:
            self.q_mu.assign(q_mu)
            self.q_sqrt.assign(q_sqrt)
            return self.loss()

        with restored(self.variables):
            return finite_loss(loss)

    def trial(self, g_mu: Array, g_sq: Array, gamma: float, k: int, healthy: Healthy, before: float, rise: Rise, *, own: bool = False) -> Trial:
        import tensorflow as tf

        dtype = self.q_mu.dtype
        with restored(self.variables):
            args = ((), tf.constant(g_mu, dtype), tf.constant(g_sq, dtype), tf.constant(gamma, dtype))
            return self.keep_reached(gamma, self._trial(args, k, healthy, before, rise, own), self.q_mu, self.q_sqrt)

    def sync(self) -> None:
        """Nothing: the pair itself is used, restored after each computation."""

    def nat_gradient_at(self, theta1: Array, theta2: Array) -> tuple[Array, ...]:
        with restored(self.variables):
            return tuple(np.asarray(t) for t in nat_gradient_at(self.q_mu, self.q_sqrt, self.loss, theta1, theta2))


_SKIPPED = (
    ("fisher_identity", "the var_list form checks reproduction and step health; pass an SVGP or VGP for the Fisher identity"),
    ("conjugate_optimality", "needs a GPflow model with a Gaussian likelihood (SVGP or VGP), not a loss function"),
    ("gradient_mapping", "checked on GPflow models only"),
)


def _check_pair(ev: PairEvaluator, names: tuple[str, str], mode: str) -> NatGradReport:
    """Reproduction and step health of one pair's step, with the γ search, as a NatGradReport."""
    step, gp = (taken := ev.take()).step, taken.gp
    found = Outcome()
    if not step.gradients_finite:  # as the model form: one failed check naming what is not finite, no step judged
        bad = [f"{name} ({int(np.sum(~np.isfinite(g)))} NaN/Inf)" for name, g in zip(names, (step.g_mu, step.g_sq)) if not finite(g)]
        msg = (f"the loss's gradient is not finite at the current q(u) (the loss itself is finite), with respect to "
               f"{', '.join(bad)}; no natural-gradient step can be taken from here (GPflow's refuses to assign its NaN)")
        check = Check(name="finite_gradients", claim="the loss and its gradients are finite", status="fail", detail=msg)
        found = Outcome(checks=(check,), health=HealthResult(None, None, (), msg))
    else:  # no model in the var_list form: κ(S) and the cancellation from the pair itself (no Kuu)
        cond = measure_conditioning(None, *ev.q_arrays, step.new_q_sqrt)
        for stage in (reproduction.stage, custom_step.stage, health.stage):
            found += stage(Run(ev, step, gp, cond, lambda *args: None, found.checks))
    h = found.health
    assert h is not None  # the health stage always says what it found
    ctx = ev.ctx
    return NatGradReport(
        model_name=", ".join(names), likelihood="loss_fn", num_inducing=ctx.M, num_latent=ctx.L, num_data=None,
        dtype=np.dtype(ctx.np_dtype).name, whiten=None, xi_transform=type(ctx.xi).__name__, gamma=ctx.gamma, mode=mode,
        loss_before=step.loss, loss_after=h.loss_after, suggested_gamma=h.suggested, step_error=h.step_error,
        gamma_trials=h.trials, skipped=_SKIPPED, warnings=(), numbers=found.numbers, checks=found.checks,
        new_q_mu=step.new_q_mu if not step.error else None, new_q_sqrt=step.new_q_sqrt if not step.error else None,
    )  # fmt: skip


def refuse_misplaced(pairs: list[Pair]) -> None:
    """A pair given as (q_sqrt [L, M, M], q_mu [M, L]) is refused as swapped (other shapes: ``validate_q``'s errors),
    and a parameter in two pairs as repeated: ``NaturalGradient.minimize`` would step it twice in one call."""
    seen: dict[int, str] = {}
    for i, (mu_name, q_mu, sq_name, q_sqrt) in enumerate(pairs):
        mu, sq = tuple(q_mu.shape), tuple(q_sqrt.shape)
        if len(sq) == 2 and mu == (sq[1], sq[0], sq[0]):
            raise input_error(f"var_list[{i}] holds (q_sqrt, q_mu): the pair is swapped.", f"var_list[{i}]",
                              "(q_mu [M, L], q_sqrt [L, M, M])", f"shapes {list(mu)} then {list(sq)}",
                              "pass each pair as NaturalGradient.minimize takes it: (q_mu, q_sqrt), q_mu first.",
                              kind=ShapeMismatchError)  # fmt: skip
        for name, p in ((mu_name, q_mu), (sq_name, q_sqrt)):
            if (first := seen.setdefault(id(p), name)) != name:
                raise input_error(f"{name} is {first} again: NaturalGradient.minimize would step it twice in one call.",
                                  name, "each q_mu and q_sqrt in one pair only", f"the parameter of {first}",
                                  "list each (q_mu, q_sqrt) pair once.")  # fmt: skip


def _scalar_loss(value: Any) -> Any:
    """``loss_fn``'s value, when it is a finite real scalar tensor (else an InputError naming ``loss_fn``)."""
    import tensorflow as tf

    tensor = isinstance(value, (tf.Tensor, tf.Variable))
    ok = tensor and value.dtype.is_floating and value.shape.num_elements() == 1
    if not ok or not np.isfinite(value.numpy()).all():
        got = f"{dtype_name(value)} {shape_str(value)}" if tensor else repr(value)[:60]
        raise input_error("loss_fn must return the loss, one finite float tensor, computed from the pairs.", "loss_fn",
                          "a finite float64 (or float32) scalar tensor", got + (" (not finite)" if ok else ""),
                          "return the training loss, e.g. loss_fn=model.training_loss_closure(data) (a sum or mean, not per-point "
                          "values; a missing `return` gives None).")  # fmt: skip
    return value


def check_pairs(
    loss_fn: Any, var_list: Any, *, data: Any = None, gamma: float = 1.0, xi_transform: Any = None,
    mode: str = "auto", rtol: float | None = None, atol: float | None = None, gamma_steps: int = 5, gamma_search: bool = True,
    optimizer: Any = None, named: list[Pair] | None = None,
) -> NatGradReport:  # fmt: skip
    """The checks of :mod:`natgrad_diag.checks.pairs` on every (q_mu [M, L], q_sqrt [L, M, M]) pair.

    Args:
        loss_fn: the loss ``NaturalGradient.minimize`` minimises: ``loss_fn()``, or ``loss_fn(data)`` given ``data``.
        var_list: [(q_mu, q_sqrt), ...] or with a third element, the pair's ξ transform (as GPflow takes it).
        mode: the report's mode ("auto": full when M·L ≤ 50 for every pair); every pair is checked eagerly.
        gamma, xi_transform, rtol, atol, gamma_steps, gamma_search: as :func:`natgrad_diag.check_natgrad` takes them.
        optimizer: the user's optimizer (already wrapped), stepped on each pair alone for ``custom_step``; or None.
        named: var_list's pairs as :func:`variational_pairs` names them for a model (a GPflux DeepGP's layers).

    Returns:
        A :class:`NatGradReport` whose ``pairs`` are the pairs' reports; the parameters are bit-identical afterwards.
    """
    if not callable(loss_fn):
        raise input_error(
            "with var_list, the first argument must be the loss function.", "loss_fn", "a callable returning the loss",
            type(loss_fn).__name__, "call check_natgrad(loss_fn, var_list=[(q_mu, q_sqrt)]) with the closure you pass "
            "to NaturalGradient.minimize.",
        )
    try:
        var_list = list(var_list)  # read once: a generator is empty on its second read
    except TypeError:
        var_list = [var_list]  # not iterable: variational_pairs names it
    if not var_list:
        raise input_error(
            "var_list is empty: there is no (q_mu, q_sqrt) pair to check.", "var_list",
            "[(q_mu, q_sqrt), ...] with at least one pair", "[]",
            "pass the pairs your NaturalGradient.minimize call takes: var_list=[(model.q_mu, model.q_sqrt)].",
        )
    pairs = named or variational_pairs(var_list=var_list)
    refuse_misplaced(pairs)
    default_xi, g = resolve_xi_transform(xi_transform), _validate_gamma(gamma)
    xis = [resolve_xi_transform(item[2]) if len(item) > 2 else default_xi for item in var_list]
    loss = (lambda: loss_fn(data)) if data is not None else loss_fn
    resolved = resolve_mode(mode, [(int(p[1].shape[0]), int(p[1].shape[1])) for p in pairs])
    variables = [v for _, q_mu, _, q_sqrt in pairs for v in (q_mu.unconstrained_variable, q_sqrt.unconstrained_variable)]
    with restored(variables):
        remedy = "call loss_fn yourself to see the error; it must return the training loss of the pairs' model."
        value, grads = gradients(lambda: _scalar_loss(call_fn(loss, [], "loss_fn", at=" on data" * (data is not None), remedy=remedy)), variables, unconnected="none")
        for name, grad in zip((n for p in pairs for n in (p[0], p[2])), grads):
            if grad is None:
                raise input_error(f"loss_fn does not depend on {name}: GPflow's NaturalGradient.minimize has no gradient to step it with.",
                                  name, "a parameter loss_fn's value is computed from", "no path from it to the loss",
                                  "pass the loss of the model that holds the pair, or leave the pair out of var_list.",
                                  kind=UnconnectedGradientError)  # fmt: skip
        reports = []
        for i, (pair, xi) in enumerate(zip(pairs, xis)):
            ctx = pair_context(pair[1], xi, g, dict(rtol=rtol, atol=atol), gamma_steps=gamma_steps, search=gamma_search, optimizer=optimizer)
            ev = PairEvaluator(ctx, loss, pair, (grads[2 * i], grads[2 * i + 1]), float(value.numpy()))
            reports.append(_check_pair(ev, (pair[0], pair[2]), resolved))
    if len(pairs) == 1:  # nothing to step together: the pair's suggestion is the γ to train the var_list with
        return NatGradReport.of_pairs(tuple(reports), resolved, suggested=reports[0].suggested_gamma)
    together = [(q_mu, q_sqrt, xi) for (_, q_mu, _, q_sqrt), xi in zip(pairs, xis)]
    joint, suggested = _joint_health(loss, together, variables, g, gamma_steps, gamma_search)
    return NatGradReport.of_pairs(tuple(reports), resolved, joint=joint, suggested=suggested)


def _joint_trial(loss: Callable[[], Any], var_list: list[Any], variables: list[Any], gamma: float, k: int) -> tuple[str, list[float]]:
    """Up to k steps of GPflow's own ``NaturalGradient(gamma).minimize(loss, var_list)`` on every pair together, the
    variables restored afterwards: why the first failing step fails ("" when all k hold) and the loss after each step
    taken. A step fails when it raises, leaves a pair's q(u) invalid (:func:`~natgrad_diag.checks.health.health`), gives
    a non-finite loss or raises the loss beyond :func:`~natgrad_diag.checks.health.rounding` (with the loss's
    :func:`~natgrad_diag.checks.health.spread` there, measured when it rises)."""
    import gpflow
    import tensorflow as tf

    opt, losses = gpflow.optimizers.NaturalGradient(gamma), list[float]()
    dtype = var_list[0][0].numpy().dtype
    with restored(variables):
        before = finite_loss(loss)
        for j in range(1, k + 1):
            at = f"step {j} of {k}: " if k > 1 else ""
            try:
                opt.minimize(loss, var_list)
            except tf.errors.InvalidArgumentError as e:
                return at + raised(error_line(e)), losses
            for i, (q_mu, q_sqrt, _) in enumerate(var_list):
                ok, why, _ = health.health(q_mu.numpy(), q_sqrt.numpy(), dtype)
                if not ok:
                    return f"{at}pair {i}: {why}", losses
            if (after := finite_loss(loss)) is None or before is None:
                return at + "the loss after it is not finite", losses
            rise = health.rounding(before, dtype)
            if after > before + rise and after > before + health.rounding(before, dtype, health.spread(lambda: finite_loss(loss), after, dtype)):
                return at + loss_rose(before, after), losses
            losses.append(before := after)
    return "", losses


def _joint_health(loss: Callable[[], Any], var_list: list[Any], variables: list[Any], gamma: float, k: int, search: bool) -> tuple[Check, float | None]:
    """``joint_step_health``: the pairs' own checks hold each pair's step with the others fixed, but
    ``NaturalGradient.minimize(loss, var_list)`` steps them all at once, and one pair's step changes what the others'
    gradients see (a deep GP's hidden layer moves its output layer's inputs). So γ is also judged by k steps of GPflow's
    own optimizer on every pair together (:func:`_joint_trial`); when they fail, the largest γ of the grid below γ whose
    k joint steps hold is suggested (None: none, or ``gamma_search=False``). Pairs GPflow's ``minimize`` refuses in
    one call (one M for all) leave it inconclusive."""
    from check_shapes.exceptions import CheckShapesError

    steps = f"{k} steps" if k > 1 else "one step"
    claim = (f"{steps} of GPflow's NaturalGradient(gamma = {gamma:g}) on all {len(var_list)} pairs together, as "
             "NaturalGradient.minimize(loss_fn, var_list) takes them, keep every q(u) valid and never raise the loss "
             "beyond what one evaluation resolves")
    try:
        why, losses = _joint_trial(loss, var_list, variables, gamma, k)
    except CheckShapesError as e:
        return Check("joint_step_health", claim, "warn", detail=f"GPflow's minimize refuses these pairs in one call ({error_line(e)}"
                     "): step them with one minimize per pair, whose steps the pairs' own checks judge."), None
    if not why:
        return Check("joint_step_health", claim, "pass", detail=f"loss after {steps}: {format_number(losses[-1])}"), None
    below = (g for g in sorted(health.GAMMA_GRID, reverse=True) if g < gamma) if search else iter(())
    suggested = next((g for g in below if not _joint_trial(loss, var_list, variables, g, k)[0]), None)
    found = (f"gamma = {suggested:g} holds for {steps} together" if suggested is not None else
             f"no gamma of the grid below {gamma:g} holds for {steps} together" if search else "no γ searched (gamma_search=False)")
    return Check("joint_step_health", claim, "fail", detail=f"gamma = {gamma:g} fails together at {why}; {found}."), suggested


def verify_step(optimizer: Any, loss_fn: Callable[[], Any], var_list: Any, before: list[Array], *, rtol: float | None = None, atol: float | None = None) -> tuple[Check, ...]:
    """The ``custom_step`` check of a step ``optimizer`` has just taken on ``var_list`` = [(q_mu, q_sqrt) or
    (q_mu, q_sqrt, xi_transform), ...] of ``gpflow.Parameter`` s: for the training guard.

    ``before`` holds every pair's unconstrained variables (q_mu's, then q_sqrt's) from before the step. From there
    come the gradients of ``loss_fn`` (one tape) and GPflow's update of each pair at the optimizer's γ and ξ; the
    parameters then get their values after the step back. The optimizer is not run again.

    Returns:
        One ``custom_step`` :class:`Check` per pair (its detail names the mistake when the step is not GPflow's), each
        "warn" when a step differs and ``loss_fn`` is stochastic (a second evaluation at the q(u) before the step differs
        beyond :func:`~natgrad_diag.checks.health.rounding`; it runs only then).
    """
    from gpflow.optimizers import XiNat

    variables = [p.unconstrained_variable for item in var_list for p in item[:2]]
    if len(before) != len(variables) or any(np.shape(b) != tuple(v.shape) for b, v in zip(before, variables)):
        raise input_error("before must hold the unconstrained values of every pair's q_mu and q_sqrt.", "before",
                          f"{len(variables)} arrays of shapes {[tuple(v.shape) for v in variables]}", f"{len(before)} arrays",
                          "snapshot [v.numpy() for v in (q_mu.unconstrained_variable, q_sqrt.unconstrained_variable)] per pair before the step.")
    gamma, default_xi = custom_step.optimizer_settings(optimizer, None, None)
    got = [custom_step.Applied(mu.numpy(), sq.numpy()) for mu, sq, *_ in var_list]
    checks = []
    with restored(variables):
        for v, b in zip(variables, before):
            v.assign(b)
        loss, grads = gradients(loss_fn, variables)
        for i, (q_mu, q_sqrt, *xi) in enumerate(var_list):
            ctx = pair_context(q_mu, (xi or [None])[0] or default_xi or XiNat(), float(gamma), dict(rtol=rtol, atol=atol))
            start = (q_mu.numpy(), q_sqrt.numpy())
            step = step_from_gradients(q_mu, q_sqrt, loss, grads[2 * i], grads[2 * i + 1])
            with restored(variables[2 * i:2 * i + 2]):
                gp = gpflow_update(ctx, grads[2 * i], grads[2 * i + 1], q_mu, q_sqrt, loss_fn)
            cond = measure_conditioning(None, *start, gp.q_sqrt)
            label = custom_step.who(optimizer) + (f" (pair {i})" if len(var_list) > 1 else "")
            checks.append(custom_step.judge(got[i], gp, start, step, q_sqrt.transform, ctx, cond, label))
        # a step that differs may have drawn other samples: a second evaluation at the same q(u) tells (only then)
        again = finite_loss(loss_fn) if any(not c.passed for c in checks) else float(loss)
    if again is None or abs(again - float(loss)) > health.rounding(float(loss), loss.dtype.as_numpy_dtype):
        return tuple(Check("custom_step", "the step just taken is GPflow's natural-gradient step from the same gradients", status="warn", detail=(
            f"{STOCHASTIC} (two evaluations at the q(u) before the step gave {float(loss)!r} "
            f"and {again!r}), so the gradients the step used cannot be drawn again; check the optimizer once with "
            "check_natgrad(model, data, optimizer=...), which gives it and GPflow's step the same gradients"))
            for _ in var_list)  # fmt: skip
    return tuple(checks)
