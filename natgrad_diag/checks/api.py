"""Natural-gradient checks on a real GPflow SVGP or VGP model, without touching it.

GPflow's step (equation [10] of Salimbeni, Eleftheriadis and Hensman, AISTATS 2018; the maths in
:mod:`natgrad_diag.step`) is a natural-gradient step because of the Fisher identity for exponential families,
F⁻¹·∇θL = ∇ηL with F = ∂η/∂θ (:mod:`natgrad_diag.checks.fisher`). :func:`check_natgrad` runs the checks of
:data:`STAGES` (one oracle module each, whose docstring has its maths and sources) on one evaluator
(:mod:`natgrad_diag.checks.evaluator`), eager in full mode and compiled in fast mode, chosen once from the mode here.

References:
    Salimbeni, Eleftheriadis, Hensman (2018), Natural Gradients in Practice: Non-Conjugate Variational
    Inference in Gaussian Process Models, AISTATS. Titsias (2009), Variational Learning of Inducing Variables in
    Sparse Gaussian Processes, AISTATS (the bound SGPR computes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag._validate import input_error, require_bool, validate_data, validate_model
from natgrad_diag.checks import conjugate, custom_step, fisher, health, loss_gradient, mapping, reproduction, xi_forward
from natgrad_diag.checks.bounds import Conditioning, Tolerances, before_step, measure_conditioning, natgrad_tolerances, new_extremes
from natgrad_diag.checks.causes import FIX, diagnose
from natgrad_diag.checks.evaluator import (
    Context, Evaluator, Point, Run, Step, dtype_context, evaluator, gpflow_update, loss_and_grads, resolve_mode, step_from_gradients,
)  # fmt: skip
from natgrad_diag.checks.pairs import check_pairs, pair_context, trainable_note, variational_pairs
from natgrad_diag.checks.report import HealthResult, NatGradReport, Outcome
from natgrad_diag.exceptions import NatGradCheckError
from natgrad_diag.progress import progress_bar
from natgrad_diag.report.records import Check, format_number
from natgrad_diag.step.trace import _validate_gamma, resolve_xi_transform
from natgrad_diag.typing import Array

__all__ = [
    "MAX_GAMMA_STEPS", "NatGradReport", "STAGES", "Tolerances", "assert_natgrad",
    "assert_natgrad_step_matches_gpflow", "check_natgrad", "natgrad_tolerances", "validate_gamma_steps",
]  # fmt: skip

#: mode="auto" runs the conjugate checks (two eager steps and the collapsed bound, O(M³)) in fast mode up to this M·L.
AUTO_CONJUGATE_MAX_ML = 1000

#: fast mode checks the Fisher identity (matrix-free, about one more step's cost) up to this M unless told.
FAST_FISHER_MAX_M = 256

#: The largest ``gamma_steps`` accepted: each γ of the grid costs k steps, so 1000 steps × 10 γ is already far
#: more than a diagnostic should spend (a training run, not a check).
MAX_GAMMA_STEPS = 1000


@dataclass(frozen=True)
class Stage:
    """One stage of the checks: ``run`` returns what it adds to the report; ``ticks`` its progress-bar ticks beyond
    the one every stage has; ``probes`` the q(u)s where it needs the loss, which the evaluator computes with the step
    (:meth:`Evaluator.take`) and hands back in ``Run.probes``."""

    run: Callable[[Run], Outcome]
    ticks: Callable[[Evaluator], int] = lambda ev: 0
    probes: Callable[[Evaluator], list[Point]] = lambda ev: []


#: The checks, in the order they run and are reported. Adding a check is one oracle module (a ``stage(run) ->
#: Outcome``) and one line here.
STAGES: tuple[Stage, ...] = (
    Stage(reproduction.stage),
    Stage(custom_step.stage),
    Stage(loss_gradient.stage, probes=loss_gradient.probes),
    Stage(fisher.stage, fisher.ticks),
    Stage(xi_forward.stage),
    Stage(lambda run: Outcome(numbers=run.cond.numbers())),  # κ(S), κ(S_new), κ(Kuu), κ(F) among the numbers
    Stage(conjugate.stage),
    Stage(health.stage),  # no ticks beyond its own: the γ search's length is not known in advance
    Stage(mapping.stage),
)


def validate_gamma_steps(gamma_steps: Any) -> int:
    """``gamma_steps`` as an int in [1, :data:`MAX_GAMMA_STEPS`]; an :class:`InputError` naming it otherwise (a bool
    is not a step count).

    Examples:
        >>> validate_gamma_steps(5)
        5
    """
    is_bool = isinstance(gamma_steps, (bool, np.bool_))
    is_int = isinstance(gamma_steps, (int, np.integer)) and not is_bool
    if not is_int or not 1 <= int(gamma_steps) <= MAX_GAMMA_STEPS:
        too_many = f" (each γ of the grid costs gamma_steps steps; more than {MAX_GAMMA_STEPS} is a training run, not a check)"
        why = " (a bool is not a step count)" if is_bool else too_many if is_int and int(gamma_steps) > MAX_GAMMA_STEPS else ""
        raise input_error(f"gamma_steps must be an integer from 1 to {MAX_GAMMA_STEPS}{why}.", "gamma_steps",
                          f"an int, 1 ≤ gamma_steps ≤ {MAX_GAMMA_STEPS}", repr(gamma_steps),
                          "pass gamma_steps=5 (the default: the loss after five steps), or gamma_steps=1 for one step.")
    return int(gamma_steps)


def _skip(mode: str, resolved: str, M: int, L: int, fisher: bool | None) -> tuple[tuple[str, str], ...]:
    """The checks a run in ``resolved`` mode leaves out for their cost, with why."""
    out = []
    if resolved == "fast" and not (M <= FAST_FISHER_MAX_M if fisher is None else bool(fisher)):
        why = f"fast mode skips it for M > {FAST_FISHER_MAX_M} (it costs about one more step); pass fisher=True, or run mode='full' on a smaller model"
        out.append(("fisher_identity", why))
    if resolved == "fast" and not (mode == "auto" and M * L <= AUTO_CONJUGATE_MAX_ML):
        why = (f"skipped for M·L > {AUTO_CONJUGATE_MAX_ML} in auto mode (two more eager steps and an O(M³) collapsed bound); run mode='full'"
               if mode == "auto" else "skipped in fast mode (two more steps and a collapsed bound); run mode='full' or mode='auto'")
        out.append(("conjugate_optimality", why))
    return tuple(out)


#: Checks run one at a time in a process: fast mode's compiled pieces share one scratch copy per model, and the
#: var_list form steps the user's own variables (restored afterwards): two threads would overwrite each other's values.
_ONE_CHECK_AT_A_TIME = threading.RLock()


def check_natgrad(
    model: Any, data: Any = None, *, gamma: float = 1.0, xi_transform: Any = None, mode: str = "auto",
    rtol: float | None = None, atol: float | None = None, fisher_rtol: float | None = None,
    conjugate_rtol: float | None = None, fisher: bool | None = None, progress: bool = True, var_list: Any = None,
    gamma_steps: int = 5, gamma_search: bool = True, optimizer: Any = None,
) -> NatGradReport:  # fmt: skip
    """Check GPflow's natural-gradient step on ``model`` against independent oracles; never changes the model.

    The checks are those of :data:`STAGES`: ``reproduction`` (against ``gpflow.optimizers.NaturalGradient``),
    ``loss_gradient``, ``fisher_identity`` (F⁻¹·∇θL = ∇ηL, F = ∂η/∂θ), ``xi_forward_mode`` (ξ ≠ θ only),
    ``conjugate_optimality`` and ``conjugate_fixed_point`` (Gaussian likelihood), ``step_health`` with a suggested γ,
    and ``gradient_mapping``. Full mode runs eagerly (but for the losses on its scratch copy), forms explicit
    Jacobians (per latent GP, (M + M(M+1)/2)² entries) and searches the whole γ grid; fast mode calls compiled pieces
    cached per model (a second call does not retrace), checks the Fisher identity matrix-free and skips the conjugate
    checks (auto mode keeps them up to M·L = :data:`AUTO_CONJUGATE_MAX_ML`).

    Args:
        model: an SVGP or VGP (any likelihood, L ≥ 1, whitened or not), q_mu [M, L] and q_sqrt [L, M, M]; or a
            GPflux DeepGP, checked in the var_list form on its GPLayers' pairs with −ELBO on ``data`` as the loss
            (GPflow's scale: Keras ``fit`` steps −ELBO/N, so its NatGradModel's γ is N times the γ checked here).
        data: (X [N, D], Y [N, P]) for SVGP (the full batch for the conjugate checks); None for VGP.
        gamma, xi_transform: the step length γ > 0 to check; a ``gpflow.optimizers.XiTransform`` (None: ``XiNat()``).
        mode: "auto" (full when M·L ≤ 50), "full" or "fast".
        rtol, atol, fisher_rtol, conjugate_rtol: override :func:`natgrad_tolerances` for the model's dtype.
        fisher: Fisher identity in fast mode (≈ one more step); None: if M ≤ :data:`FAST_FISHER_MAX_M`. Full: always.
        progress: show a progress bar (on a terminal) in full mode.
        var_list: [(q_mu, q_sqrt), ...] as NaturalGradient.minimize takes it; ``model`` is then the loss
            (:mod:`natgrad_diag.checks.pairs`).
        gamma_steps: k, 1 to 1000: ``step_health`` judges γ over k steps (each keeps q(u) valid and does not raise
            the loss beyond rounding), and the γ search measures each γ by the loss after k steps.
        gamma_search: search γ for a suggestion; False judges the checked γ alone (what the training monitor runs
            between its searches).
        optimizer: your own natural-gradient optimizer (anything with ``minimize(loss_fn, var_list)``), or an update
            function with GPflow's ``(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform)`` that assigns or returns
            (dL_deta1, dL_deta2): the ``custom_step`` check runs it once on a scratch copy and compares its step with
            GPflow's at its γ (``optimizer.gamma`` replaces ``gamma``) and ξ (``xi_transform`` when given, passed
            as ``minimize(loss, [(q_mu, q_sqrt, xi_transform)])`` as a training loop does; else
            ``optimizer.xi_transform``), naming the mistake it matches (:mod:`natgrad_diag.checks.custom_step`). It
            is bit-identical afterwards.

    Returns:
        A frozen :class:`NatGradReport`; ``report.passed`` is the verdict. Failed checks never raise. Calls from
        several threads run one at a time (each gets its own report; the checks share scratch copies).

    Raises:
        UnsupportedModelError: not an SVGP/VGP-like model, or q_diag=True.
        InputError: bad data, gamma, mode, xi_transform, gamma_steps or optimizer (no ``minimize``, a function of
            other arguments, or one that raises anything but TensorFlow's numerical errors); a pair listed twice.
        UnconnectedGradientError: in the var_list form, a loss that does not depend on a pair's q_mu or q_sqrt.

    Warns:
        UserWarning: q_mu or q_sqrt has a transform for which GPflow's gradient mapping is wrong.

    Example:
        >>> import gpflow, numpy as np
        >>> X = np.linspace(0.0, 1.0, 8)[:, None]
        >>> Y = np.sin(6.0 * X)
        >>> kernel, likelihood = gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian()
        >>> model = gpflow.models.SVGP(kernel, likelihood, X[::2].copy(), num_data=8)
        >>> check_natgrad(model, (X, Y), progress=False).passed
        True
    """
    k = validate_gamma_steps(gamma_steps)
    require_bool(progress, "progress")
    if fisher is not None:
        require_bool(fisher, "fisher")
    if optimizer is not None:
        optimizer, gamma, xi_transform = custom_step.as_optimizer(optimizer, gamma=gamma, xi_transform=xi_transform)
    named = None  # a GPflux DeepGP: the var_list form on its GPLayers' pairs, named as the model holds them
    if var_list is None and not hasattr(model, "q_mu") and getattr(model, "f_layers", None):
        if data is None:
            raise input_error("a GPflux DeepGP's ELBO needs the data.", "data", "(X [N, D], Y [N, P])", "None",
                              "pass the training data: check_natgrad(deep_gp, (X, Y)).")
        named, deep_gp = variational_pairs(model), model
        var_list, model = [(p[1], p[3]) for p in named], lambda batch: -deep_gp.elbo(batch)
    with _ONE_CHECK_AT_A_TIME:
        if var_list is not None:  # any loss and any (q_mu, q_sqrt) pairs: natgrad_diag.checks.pairs
            return check_pairs(model, var_list, data=data, gamma=gamma, xi_transform=xi_transform, mode=mode, rtol=rtol, atol=atol, gamma_steps=k,
                               gamma_search=require_bool(gamma_search, "gamma_search"), optimizer=optimizer, named=named)
        overrides = dict(rtol=rtol, atol=atol, fisher_rtol=fisher_rtol, conjugate_rtol=conjugate_rtol)
        with _checking(model, data, gamma, xi_transform, overrides) as ctx:
            resolved = resolve_mode(mode, [(ctx.M, ctx.L)])
            skip = _skip(mode, resolved, ctx.M, ctx.L, fisher)
            ctx = dataclasses.replace(ctx, gamma_steps=k, search=require_bool(gamma_search, "gamma_search"), skip=skip, optimizer=optimizer)
            ev = evaluator(ctx, compiled=resolved == "fast")
            total = 1 + sum(1 + stage.ticks(ev) for stage in STAGES)
            with progress_bar(total if resolved == "full" else None, "natgrad check", enabled=progress and resolved == "full") as advance:
                return _run(ev, resolved, advance)


@contextlib.contextmanager
def _checking(model: Any, data: Any, gamma: Any, xi_transform: Any, overrides: dict[str, float | None]) -> Iterator[Context]:
    """The validated :class:`Context` of a check of ``model``, inside GPflow's config for the model's dtype."""
    validate_model(model)
    xi, g = resolve_xi_transform(xi_transform), _validate_gamma(gamma)
    ctx = pair_context(model.q_mu, xi, g, overrides)  # the tolerances are validated before the data
    with dtype_context(ctx.np_dtype):
        yield dataclasses.replace(ctx, model=model, data=validate_data(model, data, ctx.np_dtype))


def _run(ev: Evaluator, mode: str, advance: Callable[..., Any]) -> NatGradReport:
    """The step, then every stage of :data:`STAGES` in turn, as one report. The conditioning is measured in a second
    thread, κ(Kuu) and κ(S) beside the gradients and κ(S_new) beside GPflow's update; the losses the stages need are
    computed with that update."""
    ctx, m = ev.ctx, ev.ctx.model
    asked = [stage.probes(ev) for stage in STAGES]
    new: list[Future[tuple[Array | None, Array | None]]] = []
    with ThreadPoolExecutor(1) as pool:
        before = pool.submit(before_step, m, *ev.q_arrays)
        taken = ev.take([p for points in asked for p in points], lambda step: new.append(pool.submit(new_extremes, step.new_q_sqrt)))
    step, gp, losses = taken.step, taken.gp, iter(taken.losses)
    advance()
    if not step.gradients_finite:
        import gpflow

        bad = [n.lstrip(".") for n, p in gpflow.utilities.parameter_dict(m).items() if not np.all(np.isfinite(p.numpy()))]
        msg = "the training loss or its gradient is not finite at the current parameters" + (
            f"; these parameters hold NaN or Inf: {', '.join(bad)}" if bad else
            " — in float32 this is usually a failed Cholesky of K or Kuu (GPflow's jitter is too small for float32); "
            "use float64 or raise gpflow.config's jitter" if ctx.np_dtype == np.float32 else
            "; the model is already broken before any step")  # fmt: skip
        check = Check(name="finite_gradients", claim="the loss and its gradients are finite", status="fail", detail=msg)
        return _report(ctx, mode, step, Outcome(checks=(check,), health=HealthResult(None, None, (), msg)), None)
    step, cond = ev.fill_direction(step), before.result().after(new[0].result())
    found = Outcome()
    for stage, points in zip(STAGES, asked):
        probes = tuple((p, next(losses)) for p in points)
        found += stage.run(Run(ev, step, gp, _with_measured_fisher(cond, found), advance, found.checks, probes))
        advance()
    return _report(ctx, mode, step, found, _with_measured_fisher(cond, found))


def _with_measured_fisher(cond: Conditioning, found: Outcome) -> Conditioning:
    """``cond`` with κ(F) as the explicit Fisher check measured it on F (when it ran)."""
    kappa_F = dict(found.numbers).get("cond(F)")
    return cond if kappa_F is None or not np.isfinite(kappa_F) else dataclasses.replace(cond, kappa_F=float(kappa_F), kappa_F_measured=True)


def _report(ctx: Context, mode: str, step: Step, found: Outcome, cond: Conditioning | None) -> NatGradReport:
    import gpflow

    m, h = ctx.model, found.health or HealthResult(None, None, (), "")
    N = int(ctx.data[0].shape[0]) if ctx.data is not None else int(m.data[0].shape[0]) if hasattr(m, "data") else None
    dtype, ok = np.dtype(ctx.np_dtype).name, not step.error
    causes = diagnose(found.checks, cond, dtype=dtype, jitter=gpflow.config.default_jitter(), suggested_gamma=h.suggested, other_xi=h.other, minibatch=conjugate.minibatch(ctx))
    return NatGradReport(
        model_name=type(m).__name__, likelihood=type(m.likelihood).__name__, num_inducing=ctx.M, num_latent=ctx.L, num_data=N,
        dtype=dtype, whiten=bool(getattr(m, "whiten", True)), xi_transform=type(ctx.xi).__name__, gamma=ctx.gamma, mode=mode,
        loss_before=step.loss if np.isfinite(step.loss) else None, loss_after=h.loss_after, suggested_gamma=h.suggested,
        step_error=h.step_error, gamma_trials=h.trials, skipped=found.skipped,
        warnings=found.warnings + tuple(filter(None, [trainable_note(variational_pairs(m))])), numbers=tuple((k, float(v)) for k, v in found.numbers), checks=found.checks, causes=causes,
        new_q_mu=step.new_q_mu if ok else None, new_q_sqrt=step.new_q_sqrt if ok else None, dL_deta1=step.dL_deta1, dL_deta2=step.dL_deta2,
    )  # fmt: skip


def assert_natgrad(model: Any, data: Any = None, **kwargs: Any) -> NatGradReport:
    """:func:`check_natgrad`, raising :class:`NatGradCheckError` if any check fails; returns the report otherwise.

    Raises:
        NatGradCheckError: names each failed check with its numbers and tolerance.
    """
    __tracebackhide__ = True  # pytest shows the user's call as the failing line
    report = check_natgrad(model, data, **kwargs)
    if not report.passed:
        failed = [c for c in report.checks if c.status == "fail"]
        raise NatGradCheckError(
            f"{len(failed)} of {len(report.checks)} check(s) failed on {report.model_name} "
            f"({report.xi_transform}, gamma = {report.gamma:g}).",
            context=[(c.name, _describe(c)) for c in failed],
            remedy=_remedy(failed, report),
        )
    return report


def _describe(c: Check) -> str:
    tol = "" if c.tolerance is None else f" > tolerance {format_number(c.tolerance)}"
    nums = "" if c.max_abs_error is None else f" (max abs error {format_number(c.max_abs_error)}{tol})"
    return f"{c.claim}{nums}" + (f"\n{c.detail}" if c.detail else "")


def _remedy(failed: list[Check], report: NatGradReport) -> str:
    if causes := [c for c in report.causes if c.name != "minibatch"]:
        return " ".join(f"{c.name}: {c.fix}" for c in causes)
    names = {c.name for c in failed}
    if "step_health" in names or "finite_gradients" in names:
        if report.suggested_gamma is not None:
            return f"use gamma = {report.suggested_gamma:g} (of the grid's healthy steps, the one with the lowest loss after it)."
        return "use a smaller gamma, or float64 if you are in float32."
    if "gradient_mapping" in names:
        return "give q_mu no transform and q_sqrt gpflow.utilities.triangular(), as GPflow's models do."
    return "print the report (str(check_natgrad(...))) for every number; report a reproduction mismatch as a bug."


def assert_natgrad_step_matches_gpflow(
    model: Any, data: Any = None, *, gamma: float = 1.0, xi_transform: Any = None, atol: float | None = None, rtol: float | None = None,
    optimizer: Any = None,
) -> Check:  # fmt: skip
    """Assert that natgrad-diag's step, or your ``optimizer``'s, equals the one ``gpflow.optimizers.NaturalGradient`` applies.

    GPflow's update runs eagerly on a scratch copy of ``model``; natgrad-diag's step is
    :func:`natgrad_diag.natgrad_trace` on the model's own parameters; ``optimizer`` (as :func:`check_natgrad` takes
    it) steps once on the scratch copy. The model and the optimizer are not changed.

    Args:
        model, data, gamma, xi_transform, optimizer: as for :func:`check_natgrad`.
        atol, rtol: |ours − GPflow's| ≤ atol + rtol·max|GPflow's| (default 1e-10 each in float64, 1e-4 in float32).

    Returns:
        The ``reproduction`` (or ``custom_step``) :class:`~natgrad_diag.report.records.Check`: "pass", or "warn".

    Raises:
        NatGradCheckError: the steps differ, or only one of them fails; for an optimizer, naming the mistake it makes.
        UnsupportedModelError, InputError: as :func:`check_natgrad`.
    """
    __tracebackhide__ = True  # pytest shows the user's call as the failing line
    if optimizer is not None:
        optimizer, gamma, xi_transform = custom_step.as_optimizer(optimizer, gamma=gamma, xi_transform=xi_transform)
    with _checking(model, data, gamma, xi_transform, dict(rtol=rtol, atol=atol)) as ctx:
        ev = evaluator(dataclasses.replace(ctx, optimizer=optimizer), compiled=False)
        if optimizer is None:
            step, gp = (taken := ev.take()).step, taken.gp
            if not step.gradients_finite and not step.error:
                step = dataclasses.replace(step, error="the loss or its gradient is not finite")
            check = reproduction.check_reproduction(ev, step, gp, measure_conditioning(model, *ev.q_arrays, step.new_q_sqrt))
        else:  # GPflow's step alone: the optimizer's is compared with it, natgrad-diag's is not needed
            loss, (g_mu, g_sq) = loss_and_grads(model, ctx.data)
            step = step_from_gradients(model.q_mu, model.q_sqrt, loss, g_mu, g_sq)
            scratch = ev.sync()
            gp = gpflow_update(ctx, step.g_mu, step.g_sq, scratch.q_mu, scratch.q_sqrt, lambda: float("nan"))  # no loss after it
            cond = measure_conditioning(model, *ev.q_arrays, gp.q_sqrt)
            check = custom_step.stage(Run(ev, step, gp, cond, lambda *args: None)).checks[0]
    if check.status == "fail":  # "warn": rounding can decide (as for assert_natgrad, not a failure)
        who = "natgrad-diag's step" if optimizer is None else f"the step of {custom_step.who(optimizer)}"
        fix = check.detail.partition(FIX)[2]
        raise NatGradCheckError(
            f"{who} and GPflow's NaturalGradient differ on {type(model).__name__} ({type(ctx.xi).__name__}, gamma = {ctx.gamma:g}).",
            context=[("Check", check.name), ("Expected", "GPflow's new q_mu, q_sqrt"), ("Actual", _describe(check).partition(FIX)[0])],
            remedy=fix or "if the difference is just above the tolerance, pass a larger atol; otherwise report it with the model.",
        )
    return check
