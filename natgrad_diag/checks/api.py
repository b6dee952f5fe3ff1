"""Natural-gradient checks on a real GPflow SVGP or VGP model, without touching it.

For q(u) = N(m, S), m = q_mu [M, L], S = L_S L_Sᵀ with L_S = q_sqrt [L, M, M], the natural parameters
are θ = (S⁻¹m, −½S⁻¹) and the expectation parameters η = (m, S + m mᵀ). GPflow's step (equation [10] of
Salimbeni, Eleftheriadis and Hensman, "Natural Gradients in Practice", AISTATS 2018) is

    ξ_new = ξ − γ · (∂ξ/∂θ) · ∂L/∂η,

and it is a natural-gradient step because of the Fisher identity for exponential families: the Fisher
information in θ is F = ∂η/∂θ = ∂²A/∂θ² (A the log-partition), so

    F⁻¹ · ∇θL = F⁻¹ · Fᵀ · ∇ηL = ∇ηL                        (F symmetric).

:func:`check_natgrad` checks, on the user's model (one module per oracle: ``reproduction``, ``fisher``,
``xi_forward``, ``conjugate``, ``health``, ``mapping``; this module runs them in order and builds the report):

a. ``reproduction``: natgrad-diag's step equals the one ``gpflow.optimizers.NaturalGradient`` applies to a copy;
b. ``fisher_identity``: F⁻¹·∇θL = ∇ηL with explicit Jacobians (full mode) or F·∇ηL = ∇θL matrix-free (fast
   mode); ``xi_forward_mode`` (ξ ≠ θ): GPflow's double-backward product equals a direct JVP of ξ(θ);
c. ``conjugate_optimality`` and ``conjugate_fixed_point`` (Gaussian likelihood): one step with γ = 1 reaches
   SGPR's bound (SVGP) or GPR's marginal likelihood with noise σ² + jitter (VGP), and a second step stays there;
d. ``step_health``: the new q_sqrt is finite, lower-triangular with a positive diagonal, S is positive definite;
   of a grid of γ, the healthy step with the lowest loss after it is suggested (ties to the smaller γ);
e. ``gradient_mapping``: GPflow's ``_to_constrained(grad, transform)`` is the right map from unconstrained to
   constrained gradients only for linear isometric transforms (identity, FillTriangular).

References:
    Salimbeni, Eleftheriadis, Hensman (2018), Natural Gradients in Practice: Non-Conjugate Variational
    Inference in Gaussian Process Models, AISTATS. Titsias (2009), Variational Learning of Inducing Variables in
    Sparse Gaussian Processes, AISTATS (the bound SGPR computes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.exceptions import InputError, NatGradCheckError
from natgrad_diag.checks.bounds import Conditioning, Tolerances, measure_conditioning, natgrad_tolerances, with_overrides
from natgrad_diag.checks.conjugate import check_conjugate, conjugate_applicable
from natgrad_diag._validate import validate_data, validate_model
from natgrad_diag.checks.context import Context, dtype_context
from natgrad_diag.checks.engine import FastEngine, fast_engine
from natgrad_diag.checks.fisher import check_fisher_fast, check_fisher_full
from natgrad_diag.checks.health import GAMMA_GRID, check_step_health
from natgrad_diag.checks.loss_gradient import NUM_DIRECTIONS, NUM_DIRECTIONS_FAST, check_loss_gradient
from natgrad_diag.checks.mapping import check_gradient_mapping
from natgrad_diag.checks.report import GammaTrial, NatGradReport, Outcome
from natgrad_diag.checks.reproduction import check_reproduction
from natgrad_diag.checks.step import GpflowStep, Step, fill_direction, gpflow_step_full, take_step_fast, take_step_full
from natgrad_diag.checks.xi_forward import check_xi_forward
from natgrad_diag.report.records import Check, format_number

__all__ = [
    "GAMMA_GRID",
    "NatGradReport",
    "Tolerances",
    "assert_natgrad",
    "assert_natgrad_step_matches_gpflow",
    "check_natgrad",
    "natgrad_tolerances",
]

#: mode="auto" runs the full checks (explicit Jacobians) when M·L is at most this.
AUTO_FULL_MAX_ML = 50

#: mode="auto" runs the conjugate checks (two eager steps and the collapsed bound, O(M³)) in fast mode up to this M·L.
AUTO_CONJUGATE_MAX_ML = 1000

#: fast mode checks the Fisher identity (matrix-free, about one more step's cost) up to this M unless told.
FAST_FISHER_MAX_M = 256

_MODES = ("auto", "full", "fast")


def _resolve_mode(mode: Any, M: int, L: int) -> str:
    if mode not in _MODES:
        raise InputError(
            "mode must be 'auto', 'full' or 'fast'.",
            context=[("Argument", "mode"), ("Expected", "'auto' | 'full' | 'fast'"), ("Got", repr(mode))],
            remedy="pass mode='auto' (full checks for small M·L, fast otherwise).",
        )
    if mode == "auto":
        return "full" if M * L <= AUTO_FULL_MAX_ML else "fast"
    return str(mode)


def check_natgrad(
    model: Any,
    data: Any = None,
    *,
    gamma: float = 1.0,
    xi_transform: Any = None,
    mode: str = "auto",
    rtol: float | None = None,
    atol: float | None = None,
    fisher_rtol: float | None = None,
    conjugate_rtol: float | None = None,
    fisher: bool | None = None,
    progress: bool = True,
    var_list: Any = None,
    gamma_steps: int = 1,
) -> NatGradReport:
    """Check GPflow's natural-gradient step on ``model`` against independent oracles; never changes the model.

    The checks (see the module docstring for the maths): ``reproduction`` (against
    ``gpflow.optimizers.NaturalGradient`` on a copy), ``fisher_identity`` (F⁻¹·∇θL = ∇ηL, F = ∂η/∂θ),
    ``xi_forward_mode`` (ξ ≠ θ only), ``conjugate_optimality`` and ``conjugate_fixed_point`` (Gaussian
    likelihood, full mode), ``step_health`` with a suggested γ, and ``gradient_mapping``.

    Full mode forms explicit Jacobians (per latent GP, (M + M(M+1)/2)² entries), searches the γ grid and runs the
    conjugate checks; fast mode compiles the step, GPflow's step and a matrix-free Fisher check with tf.function
    (cached per model, so a second call does not retrace) and skips the conjugate checks.

    Args:
        model: an SVGP or VGP (any likelihood, L ≥ 1, whitened or not), q_mu [M, L] and q_sqrt [L, M, M].
        data: (X [N, D], Y [N, P]) for SVGP (the full batch for the conjugate checks); None for VGP.
        gamma, xi_transform: the step length γ > 0 to check; a ``gpflow.optimizers.XiTransform`` (None: ``XiNat()``).
        mode: "auto" (full when M·L ≤ 50), "full" or "fast".
        rtol, atol, fisher_rtol, conjugate_rtol: override :func:`natgrad_tolerances` for the model's dtype.
        fisher: Fisher identity in fast mode (≈ one more step); None: if M ≤ :data:`FAST_FISHER_MAX_M`. Full: always.
        progress: show a progress bar (on a terminal) in full mode.
        var_list: [(q_mu, q_sqrt), ...] as NaturalGradient.minimize takes it; ``model`` is then the loss (pairs_check).
        gamma_steps: k, 1 to 1000: the γ search measures each γ by the loss after k steps (:mod:`.gamma_steps`).

    Returns:
        A frozen :class:`NatGradReport`; ``report.passed`` is the verdict. Failed checks never raise.

    Raises:
        UnsupportedModelError: not an SVGP/VGP-like model, or q_diag=True.
        InputError: bad data, gamma, mode, xi_transform or gamma_steps.

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
    from natgrad_diag.checks.gamma_steps import validate_gamma_steps
    from natgrad_diag.step.trace import _validate_gamma, resolve_xi_transform
    from natgrad_diag.progress import progress_bar

    k = validate_gamma_steps(gamma_steps)
    if var_list is not None:  # any loss and any (q_mu, q_sqrt) pairs: natgrad_diag.checks.pairs
        from natgrad_diag.checks.pairs import check_pairs

        return check_pairs(model, var_list, data=data, gamma=gamma, xi_transform=xi_transform, mode=mode, rtol=rtol, atol=atol, gamma_steps=k)  # type: ignore[return-value]
    validate_model(model)
    xi = resolve_xi_transform(xi_transform)
    g = _validate_gamma(gamma)
    np_dtype = np.dtype(model.q_mu.dtype.as_numpy_dtype)
    M, L = int(model.q_mu.shape[0]), int(model.q_mu.shape[1])
    resolved = _resolve_mode(mode, M, L)
    tol = with_overrides(natgrad_tolerances(np_dtype), rtol=rtol, atol=atol, fisher_rtol=fisher_rtol, conjugate_rtol=conjugate_rtol)
    with dtype_context(np_dtype):
        tf_data = validate_data(model, data, np_dtype)
        run_fisher = resolved == "full" or (M <= FAST_FISHER_MAX_M if fisher is None else bool(fisher))
        ctx = Context(model=model, data=tf_data, xi=xi, gamma=g, mode=resolved, tol=tol, np_dtype=np_dtype, M=M, L=L, fisher=run_fisher, requested_mode=mode, gamma_steps=k)
        n_stages = 6 + (2 if resolved == "full" else 0) + (len(GAMMA_GRID) if resolved == "full" else 0)
        with progress_bar(n_stages if resolved == "full" else None, "natgrad check", enabled=progress and resolved == "full") as advance:
            return _run_checks(ctx, advance)


@dataclass(frozen=True)
class _Taken:
    """The step and what the later stages need from taking it."""

    step: Step
    gp: GpflowStep
    fisher_out: dict[str, Any]
    engine: FastEngine | None
    scratch: Any
    loss_after: float | None


def _take(ctx: Context) -> _Taken:
    """The step in full mode (eager, GPflow's step on a fresh copy) or fast mode (the compiled engine)."""
    import gpflow

    if ctx.mode != "fast":
        step = take_step_full(ctx)
        gp = gpflow_step_full(ctx) if step.gradients_finite else GpflowStep(None, None)
        return _Taken(step, gp, {}, None, gpflow.utilities.deepcopy(ctx.model), None)
    engine = fast_engine(ctx.model, ctx.xi, ctx.data is not None, ctx.fisher)
    step, gp, fisher_out = take_step_fast(ctx, engine)
    la = gp.loss_after
    loss_after = float(la) if la is not None and np.isfinite(la) and not step.error else None
    return _Taken(step, gp, fisher_out, engine, engine.scratch, loss_after)


def _gradients_not_finite(ctx: Context, step: Step) -> NatGradReport:
    f32 = ctx.np_dtype == np.float32
    msg = (
        "the training loss or its gradient is not finite at the current parameters"
        + (" — in float32 this is usually a failed Cholesky of K or Kuu (GPflow's jitter is too small for float32); "
           "use float64 or raise gpflow.config's jitter" if f32 else "; the model is already broken before any step")
    )  # fmt: skip
    check = Check(name="finite_gradients", claim="the loss and its gradients are finite", status="fail", detail=msg)
    return _report(ctx, step, Outcome(checks=(check,)), None, None, (), msg)


def _fisher_stage(ctx: Context, step: Step, taken: _Taken, advance: Callable[..., Any]) -> Outcome:
    """The ``fisher_identity`` check in the mode's form, or why it was skipped."""
    from natgrad_diag.exceptions import MemoryLimitError

    if not ctx.fisher:
        why = (
            f"fast mode skips it for M > {FAST_FISHER_MAX_M} (it costs about one more step); pass fisher=True, "
            "or run mode='full' on a smaller model"
        )
        return Outcome(skipped=(("fisher_identity", why),))
    if step.dL_deta1 is None:
        return Outcome(skipped=(("fisher_identity", "∂L/∂η could not be computed at the current q(u)"),))
    if ctx.mode == "fast":
        return Outcome(checks=(check_fisher_fast(ctx, step, taken.engine, taken.fisher_out),))
    try:
        return check_fisher_full(ctx, step, advance)
    except MemoryLimitError as e:
        c = check_fisher_fast(ctx, step, None, {})
        note = f"the explicit F would exceed the memory limit ({e.detail}); checked matrix-free instead; {c.detail}"
        return Outcome(checks=(dataclasses.replace(c, detail=note),))


def _xi_stage(ctx: Context, step: Step, cond: Conditioning) -> Outcome:
    """The ``xi_forward_mode`` check (ξ ≠ θ only)."""
    from gpflow.optimizers import XiNat

    if isinstance(ctx.xi, XiNat):
        return Outcome()
    if step.nat_dL_xi1 is None:
        return Outcome(skipped=(("xi_forward_mode", "GPflow's product could not be computed (the step failed)"),))
    return Outcome(checks=(check_xi_forward(ctx, step, cond.kappa_S),))


def _conjugate_stage(ctx: Context, cond: Conditioning) -> Outcome:
    """The conjugate checks (Gaussian likelihood, full mode), or why they were skipped."""
    why_not = conjugate_applicable(ctx)
    if why_not:
        return Outcome(skipped=(("conjugate_optimality", why_not),))
    affordable = ctx.requested_mode == "auto" and ctx.M * ctx.L <= AUTO_CONJUGATE_MAX_ML
    if ctx.mode == "fast" and not affordable:
        why = "skipped in fast mode (two more steps and a collapsed bound); run mode='full' or mode='auto'"
        if ctx.requested_mode == "auto":
            why = f"skipped for M·L > {AUTO_CONJUGATE_MAX_ML} in auto mode (two more eager steps and an O(M³) collapsed bound); run mode='full'"
        return Outcome(skipped=(("conjugate_optimality", why),))
    batch = _minibatch(ctx)
    if batch:  # the full data's optimum is out of reach; the batch's is checked
        why = f"against the full data's optimum: needs the full batch ({batch.split(':')[0]}); checked against the batch-scaled objective instead"
        return Outcome(skipped=(("conjugate_optimality", why),)) + check_conjugate(ctx, cond) + _convergence(ctx, cond)
    return check_conjugate(ctx, cond) + _convergence(ctx, cond)


def _convergence(ctx: Context, cond: Conditioning) -> Outcome:
    """The user's γ and ξ over k steps (γ < 1 or ξ ≠ XiNat only: one XiNat γ = 1 step is the conjugate check)."""
    from gpflow.optimizers import XiNat

    from natgrad_diag.checks.conjugate import check_convergence

    if isinstance(ctx.xi, XiNat) and ctx.gamma == 1.0:
        return Outcome()
    return check_convergence(ctx, cond)


def _conditioning(ctx: Context, step: Step) -> Conditioning:
    """κ(S), κ(S_new), κ(Kuu) and an estimate of κ(F), measured once per call."""
    return measure_conditioning(ctx.model, ctx.model.q_mu.numpy(), ctx.model.q_sqrt.numpy(), step.new_q_sqrt)


def _loss_gradient(ctx: Context, step: Step, taken: _Taken) -> Check:
    """The ``loss_gradient`` check: three random directions in full mode, one (compiled) in fast mode."""
    k = NUM_DIRECTIONS_FAST if ctx.mode == "fast" else NUM_DIRECTIONS
    return check_loss_gradient(ctx, step, taken.engine, num_directions=k)


def _with_measured_fisher(cond: Conditioning, found: Outcome) -> Conditioning:
    """``cond`` with κ(F) as the full Fisher check measured it on the explicit F (when it ran)."""
    kappa_F = dict(found.numbers).get("cond(F)")
    if kappa_F is None or not np.isfinite(kappa_F):
        return cond
    return dataclasses.replace(cond, kappa_F=float(kappa_F), kappa_F_measured=True)


def _run_checks(ctx: Context, advance: Callable[..., Any]) -> NatGradReport:
    """Every stage in turn (reproduction, Fisher and ξ, conjugate, step health with γ, gradient mapping)."""
    taken = _take(ctx)
    step = taken.step
    advance()
    if not step.gradients_finite:
        return _gradients_not_finite(ctx, step)
    cond = _conditioning(ctx, step)
    found = Outcome(checks=(check_reproduction(ctx, step, taken.gp, cond), _loss_gradient(ctx, step, taken)))
    advance()
    step = fill_direction(ctx, step)
    found += _fisher_stage(ctx, step, taken, advance) + _xi_stage(ctx, step, cond)
    advance()
    cond = _with_measured_fisher(cond, found)
    found += Outcome(numbers=cond.numbers()) + _conjugate_stage(ctx, cond)
    advance()
    health = check_step_health(ctx, step, taken.scratch, taken.loss_after, taken.engine, advance)
    found += health.outcome
    advance()
    found += check_gradient_mapping(ctx, step)
    advance()
    return _report(ctx, step, found, health.loss_after, health.suggested, health.trials, health.step_error, cond)


def _minibatch(ctx: Context) -> str:
    """'' for full-batch data, else the sentence saying the conjugate optimum is the batch's."""
    num_data = getattr(ctx.model, "num_data", None)
    if ctx.data is None or num_data is None or int(num_data) == int(ctx.data[0].shape[0]):
        return ""
    return f"model.num_data = {int(num_data)} but {int(ctx.data[0].shape[0])} rows were passed: the loss, its gradients and the conjugate optimum are the batch's."


def _report(
    ctx: Context, step: Step, found: Outcome, loss_after: float | None, suggested: float | None, trials: tuple[GammaTrial, ...], step_error: str,
    cond: Conditioning | None = None,
) -> NatGradReport:  # fmt: skip
    import gpflow

    from natgrad_diag.checks.causes import diagnose

    m = ctx.model
    if isinstance(m, gpflow.models.SVGP):
        N = int(ctx.data[0].shape[0])
    elif hasattr(m, "data"):
        N = int(m.data[0].shape[0])
    else:
        N = None
    return NatGradReport(
        model_name=type(m).__name__,
        likelihood=type(m.likelihood).__name__,
        num_inducing=ctx.M,
        num_latent=ctx.L,
        num_data=N,
        dtype=np.dtype(ctx.np_dtype).name,
        whiten=bool(getattr(m, "whiten", True)),
        xi_transform=type(ctx.xi).__name__,
        gamma=ctx.gamma,
        mode=ctx.mode,
        loss_before=step.loss if np.isfinite(step.loss) else None,
        loss_after=loss_after,
        suggested_gamma=suggested,
        step_error=step_error,
        gamma_trials=trials,
        skipped=found.skipped,
        warnings=found.warnings,
        numbers=tuple((k, float(v)) for k, v in found.numbers),
        checks=found.checks,
        new_q_mu=step.new_q_mu if not step.error else None,
        new_q_sqrt=step.new_q_sqrt if not step.error else None,
        dL_deta1=step.dL_deta1,
        dL_deta2=step.dL_deta2,
        causes=diagnose(
            found.checks, cond, dtype=np.dtype(ctx.np_dtype).name, jitter=gpflow.config.default_jitter(), suggested_gamma=suggested, minibatch=_minibatch(ctx),
        ),
    )


def assert_natgrad(model: Any, data: Any = None, **kwargs: Any) -> NatGradReport:
    """:func:`check_natgrad`, raising :class:`NatGradCheckError` if any check fails; returns the report otherwise.

    Raises:
        NatGradCheckError: names each failed check with its numbers and tolerance.
    """
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
    nums = ""
    if c.max_abs_error is not None:
        nums = f" (max abs error {format_number(c.max_abs_error)}"
        nums += f" > tolerance {format_number(c.tolerance)})" if c.tolerance is not None else ")"
    return f"{c.claim}{nums}" + (f"\n{c.detail}" if c.detail else "")


def _remedy(failed: list[Check], report: NatGradReport) -> str:
    causes = [c for c in report.causes if c.name != "minibatch"]
    if causes:
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
    model: Any,
    data: Any = None,
    *,
    gamma: float = 1.0,
    xi_transform: Any = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> Check:
    """Assert that natgrad-diag's step equals the one ``gpflow.optimizers.NaturalGradient`` applies.

    GPflow's optimizer runs ``minimize`` on a deep copy of ``model``; natgrad-diag's step is
    :func:`natgrad_diag.natgrad_trace` on the model's own parameters. The model is not changed.

    Args:
        model: an SVGP or VGP (see :func:`check_natgrad`).
        data: (X, Y) for SVGP, None for VGP.
        gamma: the step length γ > 0.
        xi_transform: a ``gpflow.optimizers.XiTransform`` instance; None means ``XiNat()``.
        atol, rtol: |ours − GPflow's| ≤ atol + rtol·max|GPflow's| (default 1e-10 each in float64, 1e-4 in float32).

    Returns:
        The passing ``reproduction`` :class:`~natgrad_diag.report.records.Check`.

    Raises:
        NatGradCheckError: the steps differ, or only one of them fails.
        UnsupportedModelError, InputError: as :func:`check_natgrad`.
    """
    from natgrad_diag.step.trace import _validate_gamma, resolve_xi_transform

    validate_model(model)
    xi = resolve_xi_transform(xi_transform)
    g = _validate_gamma(gamma)
    np_dtype = np.dtype(model.q_mu.dtype.as_numpy_dtype)
    tol = with_overrides(natgrad_tolerances(np_dtype), rtol=rtol, atol=atol)
    with dtype_context(np_dtype):
        tf_data = validate_data(model, data, np_dtype)
        M, L = int(model.q_mu.shape[0]), int(model.q_mu.shape[1])
        ctx = Context(model=model, data=tf_data, xi=xi, gamma=g, mode="full", tol=tol, np_dtype=np_dtype, M=M, L=L)
        step = take_step_full(ctx)
        if not step.gradients_finite and not step.error:
            step = dataclasses.replace(step, error="the loss or its gradient is not finite")
        check = check_reproduction(ctx, step, gpflow_step_full(ctx))
    if not check.passed:
        raise NatGradCheckError(
            f"natgrad-diag's step and GPflow's NaturalGradient differ on {type(model).__name__} ({type(xi).__name__}, gamma = {g:g}).",
            context=[("Check", check.name), ("Expected", "GPflow's new q_mu, q_sqrt"), ("Actual", _describe(check))],
            remedy="if the difference is just above the tolerance, pass a larger atol; otherwise report it with the model.",
        )
    return check
