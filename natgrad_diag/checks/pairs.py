"""The (q_mu, q_sqrt) pairs a step moves (found on a GPflow or GPflux model, or given as a var_list), and
check_natgrad(loss_fn, var_list=[(q_mu, q_sqrt), ...]): the checks for any loss and any pairs, pair by pair.

``NaturalGradient.minimize(loss_fn, var_list)`` takes the gradients of ``loss_fn`` w.r.t. every pair's unconstrained
variables at the current parameters (one tape), then updates each pair with its own gradients. The checks do the
same, pair by pair, each pair's step with the others held fixed:

- ``reproduction``: natgrad-diag's step (:func:`natgrad_diag.natgrad_trace`) equals what GPflow's own update
  (``NaturalGradient._natgrad_apply_gradients``) assigns to the pair;
- ``step_health``: the new q_sqrt is finite, lower-triangular with a positive diagonal and S positive definite, and
  the loss after the step; the γ of the grid with the lowest loss after one step is suggested
  (:func:`natgrad_diag.checks.health.best_gamma`).

The loss closes over the user's parameters, so there is no copy to step on: GPflow's update and the losses after a
step are computed on the parameters themselves, which are restored bit for bit (their unconstrained variables) before
the function returns, also when it raises. What the loss itself changes when called (the running means of
Keras metrics that GPflux's layers update at every call) is the loss's own side effect and is not undone. The Fisher-identity, ξ forward-mode and conjugate checks need a model
(:func:`natgrad_diag.check_natgrad` with an SVGP or VGP) and are listed as skipped."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.checks.bounds import measure_conditioning, natgrad_tolerances, with_overrides
from natgrad_diag.checks.context import Context
from natgrad_diag.checks.health import GAMMA_GRID, best_gamma, health
from natgrad_diag.checks.report import GammaTrial, NatGradReport
from natgrad_diag.checks.reproduction import check_reproduction
from natgrad_diag.checks.step import GpflowStep, Step
from natgrad_diag.exceptions import InputError, UnsupportedModelError, error_line
from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section, status_of
from natgrad_diag.typing import Array

__all__ = ["NatGradPairsReport", "Pair", "check_pairs", "variational_pairs"]


#: (name of q_mu, q_mu [M, L], name of q_sqrt, q_sqrt [L, M, M]); the names are Python expressions for the user.
Pair = tuple[str, Any, str, Any]


def _is_parameter(p: Any) -> bool:
    import gpflow

    return isinstance(p, gpflow.Parameter)


def variational_pairs(model: Any = None, var_list: Any = None) -> list[Pair]:
    """Every (q_mu, q_sqrt) pair of ``var_list`` (as ``NaturalGradient.minimize`` takes it) or of ``model``.

    A model with ``q_mu`` and ``q_sqrt`` (SVGP, VGP) has one pair, ``model.q_mu`` and ``model.q_sqrt``; a GPflux
    ``DeepGP`` has one per ``GPLayer`` in ``model.f_layers``, ``model.f_layers[i].q_mu`` and ``.q_sqrt``.

    Raises:
        UnsupportedModelError: no pair found, or a pair that is not two gpflow.Parameter objects.
    """
    if var_list is not None:
        pairs = []
        for i, item in enumerate(var_list):
            if (
                not isinstance(item, (tuple, list))
                or len(item) not in (2, 3)
                or not all(_is_parameter(p) for p in item[:2])
            ):
                raise UnsupportedModelError(
                    "var_list must hold (q_mu, q_sqrt) pairs of gpflow.Parameter, as NaturalGradient.minimize takes them.",
                    context=[
                        ("Argument", f"var_list[{i}]"),
                        ("Expected", "(q_mu [M, L], q_sqrt [L, M, M]) or (q_mu, q_sqrt, xi_transform)"),
                        ("Got", type(item).__name__),
                    ],
                    remedy="pass var_list=[(layer.q_mu, layer.q_sqrt), ...].",
                )
            pairs.append((f"var_list[{i}][0]", item[0], f"var_list[{i}][1]", item[1]))
        return pairs
    if _is_parameter(getattr(model, "q_mu", None)) and _is_parameter(getattr(model, "q_sqrt", None)):
        return [("model.q_mu", model.q_mu, "model.q_sqrt", model.q_sqrt)]
    layers = getattr(model, "f_layers", None) or ()
    pairs = [
        (f"model.f_layers[{i}].q_mu", layer.q_mu, f"model.f_layers[{i}].q_sqrt", layer.q_sqrt)
        for i, layer in enumerate(layers)
        if _is_parameter(getattr(layer, "q_mu", None)) and _is_parameter(getattr(layer, "q_sqrt", None))
    ]
    if not pairs:
        raise UnsupportedModelError(
            "found no variational q(u) = N(q_mu, q_sqrt q_sqrtᵀ) to take natural-gradient steps on.",
            context=[
                ("Argument", "model"),
                ("Expected", "a GPflow SVGP/VGP or a GPflux DeepGP with GPLayers"),
                ("Got", type(model).__name__),
            ],
            remedy="pass var_list=[(q_mu, q_sqrt), ...] with the pairs your NaturalGradient.minimize call takes.",
        )
    return pairs


_SKIPPED = (
    (
        "fisher_identity",
        "the var_list form checks reproduction and step health; pass an SVGP or VGP for the Fisher identity",
    ),
    ("conjugate_optimality", "needs a GPflow model with a Gaussian likelihood (SVGP or VGP), not a loss function"),
    ("gradient_mapping", "checked on GPflow models only"),
)


@dataclass(frozen=True)
class NatGradPairsReport(Report):
    """The checks of each (q_mu, q_sqrt) pair of a var_list: ``pairs[i]`` is pair i's :class:`NatGradReport`."""

    pairs: tuple[NatGradReport, ...]

    @property
    def title(self) -> str:  # type: ignore[override]
        return f"Natural-gradient checks on {len(self.pairs)} (q_mu, q_sqrt) pair(s) of a var_list"

    @property
    def checks(self) -> tuple[Check, ...]:  # type: ignore[override]
        return tuple(
            dataclasses.replace(c, name=f"pair {i}: {c.name}") for i, r in enumerate(self.pairs) for c in r.checks
        )

    def sections(self) -> tuple[Section, ...]:
        return tuple(
            Section(f"{r.model_name}: {s.heading}", s.text, s.tables) for r in self.pairs for s in r.sections()
        )

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["pairs"] = [r.to_dict() for r in self.pairs]
        return d


@contextmanager
def _restored(variables: list[Any]) -> Iterator[None]:
    """Put every variable back to its value on entry, bit for bit, on exit."""
    saved = [np.array(v.numpy(), copy=True) for v in variables]
    try:
        yield
    finally:
        for v, value in zip(variables, saved):
            v.assign(value)


def _loss_after(
    loss: Callable[[], Any], q_mu: Any, q_sqrt: Any, new_mu: Array, new_sq: Array
) -> float | None:
    import tensorflow as tf

    try:
        q_mu.assign(new_mu)
        q_sqrt.assign(new_sq)
        value = float(loss().numpy())
    except (tf.errors.InvalidArgumentError, ValueError):
        return None
    return value if np.isfinite(value) else None


def _ours(
    ctx: Context, q_mu: Any, q_sqrt: Any, g_mu: Any, g_sq: Any, gamma: float
) -> tuple[Array | None, Array | None, str]:
    """natgrad-diag's new (q_mu, q_sqrt) at ``gamma``, or why the step failed."""
    import tensorflow as tf

    from natgrad_diag.exceptions import StepFailedError
    from natgrad_diag.step.trace import natgrad_trace

    try:
        t = natgrad_trace(q_mu, q_sqrt, g_mu, g_sq, gamma=gamma, xi_transform=ctx.xi)
    except StepFailedError as e:
        return None, None, e.detail
    except tf.errors.InvalidArgumentError as e:
        return None, None, error_line(e)
    return t.new_q_mu, t.new_q_sqrt, ""


def _gpflow(ctx: Context, q_mu: Any, q_sqrt: Any, g_mu: Any, g_sq: Any) -> GpflowStep:
    """GPflow's own update applied to the pair (restored by the caller)."""
    import gpflow
    import tensorflow as tf

    from natgrad_diag._gpflow import natgrad_apply_gradients

    try:
        natgrad_apply_gradients(gpflow.optimizers.NaturalGradient(ctx.gamma, ctx.xi), g_mu, g_sq, q_mu, q_sqrt, ctx.xi)
    except tf.errors.InvalidArgumentError as e:
        return GpflowStep(None, None, error_line(e))
    mu, sq = q_mu.numpy(), q_sqrt.numpy()
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(sq))):
        return GpflowStep(None, None, "NaN or Inf in the new q_mu or q_sqrt")
    return GpflowStep(mu, sq)


def _pair_grads(loss: Callable[[], Any], q_mu: Any, q_sqrt: Any) -> tuple[Any, Any]:
    """The loss's gradients w.r.t. the pair's unconstrained variables (GPflow's tape, as ``minimize``)."""
    import tensorflow as tf

    variables = [q_mu.unconstrained_variable, q_sqrt.unconstrained_variable]
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(variables)
        value = loss()
    g_mu, g_sq = tape.gradient(value, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return g_mu, g_sq


def _trial(
    ctx: Context, loss: Callable[[], Any], pair: Any, grads: Any, gamma: float, loss_before: float
) -> GammaTrial:
    """The loss after ``ctx.gamma_steps`` = k steps with ``gamma`` from the pair's current value (restored after).

    Each step is natgrad-diag's (:func:`_ours`) from the gradient at the previous step's q(u), the other pairs and
    every other variable held; the trial fails at the first step that is unhealthy or leaves a non-finite loss,
    and with k > 1 its reason names the step ("step 2 of 5: ...").
    """
    _, q_mu, _, q_sqrt = pair
    k = ctx.gamma_steps
    value: float | None = None
    with _restored([q_mu.unconstrained_variable, q_sqrt.unconstrained_variable]):
        g = grads
        for j in range(1, k + 1):
            at = f"step {j} of {k}: " if k > 1 else ""
            if j > 1:
                g = _pair_grads(loss, q_mu, q_sqrt)
                if not (np.all(np.isfinite(g[0].numpy())) and np.all(np.isfinite(g[1].numpy()))):
                    return GammaTrial(gamma, False, None, f"{at}the gradient of the loss before it is not finite", k)
            new_mu, new_sq, why = _ours(ctx, q_mu, q_sqrt, g[0], g[1], gamma)
            ok, why_not, _ = health(new_mu, new_sq, ctx.np_dtype)
            if not ok:
                return GammaTrial(gamma, False, None, at + (why or why_not), k)
            value = _loss_after(loss, q_mu, q_sqrt, new_mu, new_sq)  # type: ignore[arg-type]
            if value is None:
                return GammaTrial(gamma, False, None, f"{at}the loss after the step is not finite", k)
    assert value is not None  # k ≥ 1 steps, each returned early or set it
    return GammaTrial(gamma, True, value, "lowers the loss" if value < loss_before else "raises the loss", k)


def _check_pair(ctx: Context, loss: Callable[[], Any], pair: Any, grads: Any, loss_before: float) -> NatGradReport:
    """Reproduction and step health of one pair's step, the γ grid's losses, as a NatGradReport."""
    from natgrad_diag._gpflow import to_constrained

    mu_name, q_mu, sq_name, q_sqrt = pair
    g_mu, g_sq = grads
    with _restored([q_mu.unconstrained_variable, q_sqrt.unconstrained_variable]):
        gp = _gpflow(ctx, q_mu, q_sqrt, g_mu, g_sq)
    new_mu, new_sq, error = _ours(ctx, q_mu, q_sqrt, g_mu, g_sq, ctx.gamma)
    step = Step(
        loss=loss_before, g_mu=g_mu.numpy(), g_sq=g_sq.numpy(),
        dL_dmean=to_constrained(g_mu, q_mu.transform).numpy(), dL_dvarsqrt=to_constrained(g_sq, q_sqrt.transform).numpy(),
        new_q_mu=new_mu, new_q_sqrt=new_sq, error=error,
    )  # fmt: skip
    # no model in the var_list form: κ(S) and the cancellation from the pair itself (no Kuu)
    cond = measure_conditioning(None, q_mu.numpy(), q_sqrt.numpy(), new_sq)
    found = [check_reproduction(ctx, step, gp, cond)]
    grid = list(GAMMA_GRID) if ctx.mode == "full" else [ctx.gamma]
    trials = [_trial(ctx, loss, pair, grads, g, loss_before) for g in grid]
    if ctx.mode != "full" and not (trials[0].healthy and trials[0].loss < loss_before):  # type: ignore[operator]
        trials += [_trial(ctx, loss, pair, grads, g, loss_before) for g in GAMMA_GRID if g < ctx.gamma]
    own = next((t for t in trials if t.gamma == ctx.gamma), None) or _trial(
        ctx, loss, pair, grads, ctx.gamma, loss_before
    )
    suggested = best_gamma(trials, loss_before, ctx.np_dtype)
    hint = (
        f" Suggested gamma: {suggested:g}."
        if suggested is not None
        else " No gamma of the grid gives a healthy step that lowers the loss."
    )
    detail = (
        f"loss {loss_before!r} → {own.loss!r}.{hint}" if own.healthy else f"{(error or own.reason).rstrip('.')}.{hint}"
    )
    found.append(
        Check(
            name="step_health",
            claim=f"the step with gamma = {ctx.gamma:g} keeps q(u) valid",
            status=status_of(own.healthy),
            detail=detail,
        )
    )
    return NatGradReport(
        model_name=f"{mu_name}, {sq_name}", likelihood="loss_fn", num_inducing=ctx.M, num_latent=ctx.L, num_data=None,
        dtype=np.dtype(ctx.np_dtype).name, whiten=False, xi_transform=type(ctx.xi).__name__, gamma=ctx.gamma,
        mode=ctx.mode, loss_before=loss_before, loss_after=own.loss if own.healthy else None, suggested_gamma=suggested,
        step_error="" if own.healthy else (error or own.reason), gamma_trials=tuple(trials), skipped=_SKIPPED,
        warnings=(), numbers=(), checks=tuple(found), new_q_mu=new_mu, new_q_sqrt=new_sq,
    )  # fmt: skip


def check_pairs(
    loss_fn: Any, var_list: Any, *, data: Any = None, gamma: float = 1.0, xi_transform: Any = None,
    mode: str = "auto", rtol: float | None = None, atol: float | None = None, gamma_steps: int = 1,
) -> NatGradPairsReport:  # fmt: skip
    """The checks of :mod:`natgrad_diag.checks.pairs` on every (q_mu [M, L], q_sqrt [L, M, M]) pair.

    Args:
        loss_fn: the loss ``NaturalGradient.minimize`` minimises: a zero-argument callable, or ``loss_fn(data)``
            when ``data`` is given.
        var_list: [(q_mu, q_sqrt), ...] or with a third element, the pair's ξ transform (as GPflow takes it).
        data: passed to ``loss_fn`` when not None.
        gamma, xi_transform, rtol, atol: as :func:`natgrad_diag.check_natgrad`.
        mode: "full" measures the loss after one step for every γ of the grid; "fast" only when the step at γ is
            unhealthy or raises the loss; "auto": full when M·L ≤ 50 for every pair.
        gamma_steps: k: each γ tried is measured by the loss after k steps of its pair (eager; validated by
            :func:`~natgrad_diag.checks.gamma_steps.validate_gamma_steps`).

    Returns:
        A :class:`NatGradPairsReport`; the parameters are bit-identical afterwards.
    """
    import tensorflow as tf

    from natgrad_diag.checks.gamma_steps import validate_gamma_steps
    from natgrad_diag.step.trace import _validate_gamma, resolve_xi_transform

    k = validate_gamma_steps(gamma_steps)
    if not callable(loss_fn):
        raise InputError(
            "with var_list, the first argument must be the loss function.",
            context=[
                ("Argument", "loss_fn"),
                ("Expected", "a callable returning the loss"),
                ("Got", type(loss_fn).__name__),
            ],
            remedy="call check_natgrad(loss_fn, var_list=[(q_mu, q_sqrt)]) with the closure you pass to NaturalGradient.minimize.",
        )
    pairs = variational_pairs(var_list=var_list)
    default_xi, g = resolve_xi_transform(xi_transform), _validate_gamma(gamma)
    xis = [resolve_xi_transform(item[2]) if len(item) > 2 else default_xi for item in var_list]
    loss = (lambda: loss_fn(data)) if data is not None else loss_fn
    if mode not in ("auto", "full", "fast"):
        raise InputError(
            "mode must be 'auto', 'full' or 'fast'.",
            context=[("Argument", "mode"), ("Got", repr(mode))],
            remedy="pass mode='auto'.",
        )
    variables = [
        v for _, q_mu, _, q_sqrt in pairs for v in (q_mu.unconstrained_variable, q_sqrt.unconstrained_variable)
    ]
    with _restored(variables):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            value = loss()
        grads = tape.gradient(value, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        reports = []
        for i, (pair, xi) in enumerate(zip(pairs, xis)):
            np_dtype = np.dtype(pair[1].dtype.as_numpy_dtype)
            M, L = int(pair[1].shape[0]), int(pair[1].shape[1])
            resolved = (
                mode
                if mode != "auto"
                else ("full" if all(int(p[1].shape[0]) * int(p[1].shape[1]) <= 50 for p in pairs) else "fast")
            )
            tol = with_overrides(natgrad_tolerances(np_dtype), rtol=rtol, atol=atol)
            ctx = Context(
                model=None, data=None, xi=xi, gamma=g, mode=resolved, tol=tol, np_dtype=np_dtype, M=M, L=L, fisher=False,
                gamma_steps=k,
            )  # fmt: skip
            reports.append(_check_pair(ctx, loss, pair, (grads[2 * i], grads[2 * i + 1]), float(value.numpy())))
    return NatGradPairsReport(pairs=tuple(reports))
