"""The conjugate oracles (Gaussian likelihood): one γ = 1 step reaches the collapsed bound, a second stays there, and
the user's γ and ξ approach it over k steps.

One XiNat step with γ = 1 lands on SGPR's bound (SVGP) or GPR's marginal likelihood with noise σ² + jitter (VGP).
With a Gaussian likelihood, ∂L/∂η = θ − θ* (θ* the optimum's natural parameters), so XiNat's step θ ← θ − γ·∂L/∂η
gives θ_{k+1} − θ* = (1 − γ)·(θ_k − θ*): the distance to the optimum in natural parameters shrinks by exactly
|1 − γ| per step (Salimbeni, Eleftheriadis and Hensman 2018, §3), so for 0 < γ < 2 only. Other ξ (XiSqrtMeanVar) have
no closed-form rate; the convergence check asks that the distance shrinks at every step and reports the observed rate.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import numpy as np

from natgrad_diag.checks.bounds import Bound, Conditioning, bounded_check, factor_extremes, finite, kappa_eta, natgrad_bound
from natgrad_diag.checks.evaluator import Context, Evaluator, Run
from natgrad_diag.checks.report import Outcome
from natgrad_diag.exceptions import StepFailedError, error_line
from natgrad_diag.report.records import Check, format_number, status_of
from natgrad_diag.tolerance import rounding_bound
from natgrad_diag.typing import Array

__all__ = ["CONVERGENCE_STEPS", "conjugate_applicable", "keeps_gaussian_maths", "minibatch", "stage", "walk_failed"]


def _oracle_likelihood(noise: float) -> Any:
    """Gaussian(variance=noise) without GPflow's lower bound 1e-6, which a saturated softplus variance sits at."""
    import gpflow

    return gpflow.likelihoods.Gaussian(variance=noise, variance_lower_bound=0.0)


def keeps_gaussian_maths(likelihood: Any) -> bool:
    """Whether ``likelihood`` is GPflow's ``Gaussian`` with a variance parameter (not ``Gaussian(scale=...)``, whose
    noise may depend on X), or a subclass whose variational expectations on seeded inputs equal Gaussian's with the
    same variance to 100·ε relative: the conjugate optimum depends on the likelihood only through
    ∫ log p(y | f) q(f) df, so a subclass that keeps its values (a custom gradient, logging) keeps the checks."""
    import gpflow
    import tensorflow as tf

    variance = getattr(likelihood, "variance", None)
    if not isinstance(likelihood, gpflow.likelihoods.Gaussian) or variance is None:  # Gaussian(scale=...): no variance
        return False
    if type(likelihood) is gpflow.likelihoods.Gaussian:
        return True
    rng, dtype = np.random.default_rng(0), variance.dtype
    X = tf.zeros((5, 1), dtype)
    Fmu, Fvar, Y = (tf.constant(a, dtype) for a in (rng.standard_normal((5, 1)), rng.uniform(0.1, 1.0, (5, 1)), rng.standard_normal((5, 1))))
    try:
        got = likelihood.variational_expectations(X, Fmu, Fvar, Y).numpy()
        want = gpflow.likelihoods.Gaussian(variance=variance.numpy()).variational_expectations(X, Fmu, Fvar, Y).numpy()
    except Exception:  # noqa: BLE001 - a subclass with other shapes or inputs does not keep Gaussian's maths
        return False
    return bool(np.all(np.abs(got - want) <= 100 * np.finfo(want.dtype).eps * np.max(np.abs(want))))


def per_output_parts(model: Any) -> list[tuple[Any, Any]] | None:
    """(kernel, inducing points) per output for an SVGP whose ELBO is a sum of independent per-output SGPR problems:
    one part for a single kernel with ``InducingPoints`` (SGPR takes Y's L columns alike), one per latent GP for
    SharedIndependent / SeparateIndependent kernels and inducing variables (q(u) is then block-diagonal); None for
    anything else (e.g. linear coregionalization)."""
    import gpflow

    k, iv, L = model.kernel, model.inducing_variable, int(model.q_mu.shape[1])
    kernels, ivs = gpflow.kernels, gpflow.inducing_variables
    if not isinstance(k, kernels.MultioutputKernel):
        return [(k, iv)] if isinstance(iv, ivs.InducingPoints) else None
    ks = (
        [k.kernel] * L if isinstance(k, kernels.SharedIndependent)
        else list(k.kernels) if isinstance(k, kernels.SeparateIndependent) else []
    )  # fmt: skip
    points = (
        [iv.inducing_variable] * L if isinstance(iv, ivs.SharedIndependentInducingVariables)
        else list(iv.inducing_variable_list) if isinstance(iv, ivs.SeparateIndependentInducingVariables) else [iv] * L
    )  # fmt: skip
    ok = len(ks) == L == len(points) and all(isinstance(p, ivs.InducingPoints) for p in points)
    return list(zip(ks, points)) if ok else None


def conjugate_applicable(ctx: Context) -> str:
    """'' if the conjugate checks apply, else the reason they do not."""
    import gpflow

    m = ctx.model
    if isinstance(m.likelihood, gpflow.likelihoods.Gaussian) and getattr(m.likelihood, "variance", None) is None:
        return (
            "SGPR's and GPR's closed forms need a constant noise variance; this Gaussian likelihood is built with "
            "scale= (its noise may depend on X), so the conjugate optimum has no closed form here"
        )
    if not keeps_gaussian_maths(m.likelihood):
        return f"needs a Gaussian likelihood (this model has {type(m.likelihood).__name__})"
    if isinstance(m, gpflow.models.SVGP):
        return "" if per_output_parts(m) is not None else (
            "SGPR's bound needs a single kernel with InducingPoints, or SharedIndependent / SeparateIndependent "
            "kernels and inducing variables with one latent GP per output"
        )  # fmt: skip
    if isinstance(m, gpflow.models.VGP):
        multi = "GPR's closed form is checked for a single-output kernel (VGP with a multi-output kernel)"
        return multi if isinstance(m.kernel, gpflow.kernels.MultioutputKernel) else ""
    return f"closed form known only for SVGP and VGP (this is {type(m).__name__})"


def _conjugate_bound(ctx: Context, cond: Conditioning, ref: float) -> Bound:
    """The bound on |ELBO − reference|: 100·ε·(κ(F) + κ(Kuu))·|reference| + conjugate_rtol·|reference|.

    One γ = 1 step θ_new = θ − ∂L/∂η amounts to a solve with F (∂L/∂θ = F·∂L/∂η): relative error ε·κ(F) (Higham
    2002, §7.1); the ELBO, SGPR's bound and GPR's marginal likelihood go through a Cholesky of Kuu (or K + σ²I):
    ε·κ(Kuu) (§10.1). First order in both: conservative, as the ELBO is stationary at the optimum.
    """
    return natgrad_bound(ctx.np_dtype, condition=cond.kappa_F + (cond.kappa_Kuu or 1.0), condition_name="κ(F) + κ(Kuu)",
                         scale=abs(ref), rtol=ctx.tol.conjugate_rtol, atol=0.0, factor=1.0)


def batch_constant(N: int, c: float, noise: float) -> float:
    """The constant between SVGP's batch-scaled ELBO and SGPR's bound with noise σ²/c on the batch, c = num_data/N.

    c·Σᵢ E_q log N(yᵢ | fᵢ, σ²) = Σᵢ E_q log N(yᵢ | fᵢ, σ²/c) + N·(½·log(2πσ²/c) − (c/2)·log(2πσ²)): the scaled data
    term is a Gaussian one with noise σ²/c up to this constant, so the batch's conjugate optimum is SGPR's with σ²/c.
    """
    return float(N * (0.5 * np.log(2 * np.pi * noise / c) - 0.5 * c * np.log(2 * np.pi * noise)))


def _reference(ctx: Context) -> tuple[float, str, str, tuple[tuple[str, float], ...]]:
    """(the collapsed bound, its name, the claim, further numbers): SGPR's bound (SVGP) or GPR's (VGP)."""
    import gpflow

    m = ctx.model
    noise = m.likelihood.variance.numpy()
    if isinstance(m, gpflow.models.SVGP):
        (X, Y), N = ctx.data, int(ctx.data[0].shape[0])
        c = 1.0 if m.num_data is None else float(m.num_data) / N
        parts = per_output_parts(m)
        assert parts is not None  # conjugate_applicable refused an SVGP without per-output parts
        # Σ over outputs l of SGPR's bound for (X, Y[:, l] − mean(X)[:, l]) with kernel_l, Z_l and noise σ²/c
        resid = Y - m.mean_function(X)  # what SGPR subtracts itself; one part takes every column, as SGPR does
        columns = [resid] if len(parts) == 1 else [resid[:, l : l + 1] for l in range(len(parts))]
        sgpr = sum(float(gpflow.models.SGPR((X, y), k, z, likelihood=_oracle_likelihood(noise / c)).elbo().numpy())
                   for y, (k, z) in zip(columns, parts))  # fmt: skip
        ref = sgpr + int(Y.shape[1]) * batch_constant(N, c, float(noise))
        if len(parts) > 1:
            name, claim = "sum of per-output SGPR bounds", (
                f"after one XiNat step with γ = 1, SVGP's {'batch-scaled ' if c != 1.0 else ''}ELBO equals the sum of the "
                f"{len(parts)} per-output SGPR bounds (Titsias 2009; {type(m.kernel).__name__}, independent outputs)"
            )
        elif c == 1.0:
            name, claim = "SGPR bound", "after one full-batch XiNat step with γ = 1, SVGP's ELBO equals SGPR's bound (Titsias 2009) for the same kernel, Z and noise"
        else:
            name, claim = "batch-scaled SGPR bound", (
                f"after one XiNat step with γ = 1 on this batch (model.num_data = {int(m.num_data)}, {N} rows), SVGP's batch-scaled "
                f"ELBO equals the batch's optimum: SGPR's bound with noise σ²·{N}/{int(m.num_data)} plus a constant"
            )
        return ref, name, claim, ((name, ref),)
    jitter = gpflow.config.default_jitter()
    lml, lml_j = (
        float(gpflow.models.GPR(m.data, kernel=m.kernel, mean_function=m.mean_function, likelihood=_oracle_likelihood(s2)).log_marginal_likelihood().numpy())
        for s2 in (noise, noise + jitter)
    )
    claim = (f"after one XiNat step with γ = 1, VGP's ELBO equals GPR's log marginal likelihood with noise σ² + jitter "
             f"(jitter = {jitter:g}, VGP adds it to K)")
    numbers = (("GPR log marginal likelihood (noise σ²)", lml), ("GPR log marginal likelihood (noise σ² + jitter)", lml_j),
               ("GPR(σ² + jitter) − GPR(σ²)", lml_j - lml))  # fmt: skip
    return lml_j, "GPR(σ² + jitter)", claim, numbers


def stage(run: Run) -> Outcome:
    """The conjugate checks (Gaussian likelihood), or why they do not apply or were skipped for their cost."""
    from gpflow.optimizers import XiNat

    ctx = run.ev.ctx
    if why := conjugate_applicable(ctx) or ctx.skipped("conjugate_optimality"):
        return Outcome(skipped=(("conjugate_optimality", why),))
    found = _check_conjugate(run.ev, run.cond)
    if not (isinstance(ctx.xi, XiNat) and ctx.gamma == 1.0):  # one XiNat γ = 1 step is the conjugate check itself
        found += _check_convergence(run.ev, run.cond)
    if batch := minibatch(ctx):  # the full data's optimum is out of reach; the batch's is checked
        why = f"against the full data's optimum: needs the full batch ({batch.split(':')[0]}); checked against the batch-scaled objective instead"
        return Outcome(skipped=(("conjugate_optimality", why),)) + found
    return found


def minibatch(ctx: Context) -> str:
    """'' for full-batch data, else the sentence saying the conjugate optimum is the batch's."""
    num_data = getattr(ctx.model, "num_data", None)
    if ctx.data is None or num_data is None or int(num_data) == int(ctx.data[0].shape[0]):
        return ""
    return f"model.num_data = {int(num_data)} but {int(ctx.data[0].shape[0])} rows were passed: the loss, its gradients and the conjugate optimum are the batch's."


def walk_failed(check: Check) -> bool:
    """Whether ``check`` is a conjugate_convergence failure because a step of its walk failed (its detail's words)."""
    return check.name == "conjugate_convergence" and check.status == "fail" and bool(
        re.match(r"(step \d+ of its \d+-step walk|the step to the optimum) failed: ", check.detail))


def _failed(name: str, claim: str, what: str, e: Exception) -> Outcome:
    why = e.detail if isinstance(e, StepFailedError) else error_line(e)
    return Outcome(checks=(Check(name, claim, "fail", detail=f"{what}: {why}"),))


def _check_conjugate(ev: Evaluator, cond: Conditioning) -> Outcome:
    """One γ = 1 XiNat step reaches the collapsed bound (SGPR / GPR); a second step stays there (both within
    :func:`_conjugate_bound`)."""
    import tensorflow as tf
    from gpflow.optimizers import XiNat

    ctx = ev.ctx
    try:
        elbo1, elbo2 = (float((m.elbo() if ctx.data is None else m.elbo(ctx.data)).numpy()) for m in itertools.islice(ev.walk(2, 1.0, XiNat()), 1, None))
    except (StepFailedError, tf.errors.InvalidArgumentError) as e:
        return _failed("conjugate_optimality", "one γ = 1 step reaches the collapsed bound", "the step failed", e)
    ref, ref_name, claim, numbers = _reference(ctx)
    detail = f"ELBO {elbo1!r}, {ref_name} {ref!r} (relative {format_number(abs(elbo1 - ref) / max(abs(ref), 1e-300))})"
    if ref_name.startswith("GPR"):
        lml = numbers[0][1]
        detail += f"; the gap to GPR(σ²), {format_number(elbo1 - lml)}, is the jitter's share ({format_number(numbers[2][1])})"
        numbers += (("jitter's share: VGP ELBO − GPR(σ²)", elbo1 - lml),)
    checks = (
        bounded_check("conjugate_optimality", claim, abs(elbo1 - ref), _conjugate_bound(ctx, cond, ref), detail),
        bounded_check(
            "conjugate_fixed_point", "a second XiNat step with γ = 1 does not change the ELBO (the optimum is a fixed point)",
            abs(elbo2 - elbo1), _conjugate_bound(ctx, cond, elbo1), f"ELBO after one step {elbo1!r}, after two {elbo2!r}",
        ),
    )  # fmt: skip
    return Outcome(checks=checks, numbers=numbers)


#: Steps taken by default (each is one eager step on the scratch copy: seconds for M up to a few hundred).
CONVERGENCE_STEPS = 5


def _naturals(model: Any) -> tuple[Array, float]:
    """θ = (S⁻¹m, −½S⁻¹) of ``model``'s q(u), flattened, and its κ_η (:attr:`Conditioning.kappa_eta`)."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

    t = meanvarsqrt_to_natural(tf.convert_to_tensor(model.q_mu), tf.convert_to_tensor(model.q_sqrt))
    q_mu, q_sqrt = np.asarray(model.q_mu.numpy(), np.float64), np.asarray(model.q_sqrt.numpy(), np.float64)
    k_eta = kappa_eta(q_mu, *factor_extremes(q_sqrt)) if finite(q_mu, q_sqrt) else np.inf
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in t]), float(k_eta)


def _check_convergence(ev: Evaluator, cond: Conditioning, *, steps: int = CONVERGENCE_STEPS) -> Outcome:
    """``steps`` steps with the user's γ and ξ on the scratch copy, their distance to θ* (one XiNat γ = 1 step).

    Each distance is known to δ = 100·ε·(κ(F) + κ_η)·max_k ‖θ_k‖, κ_η the worst :attr:`Conditioning.kappa_eta` of θ* and
    the θ_k (as ``reproduction``). XiNat with 0 < γ < 2 away from θ* (d_0 > δ): every ratio d_{k+1}/d_k equals |1 − γ|
    within δ/min_k d_{k+1} + rtol. Otherwise every step shrinks the distance or ends within δ of θ* (a q(u) already at
    θ* is converged); XiNat with |1 − γ| ≥ 1 never contracts and fails. The observed rate (d_k/d_0)^(1/k) is reported.
    """
    import tensorflow as tf
    from gpflow.optimizers import XiNat

    ctx = ev.ctx
    walked: list[tuple[Any, float]] = []
    try:
        ((star, k_star),) = (_naturals(m) for m in itertools.islice(ev.walk(1, 1.0, XiNat()), 1, None))
        walked.extend(_naturals(m) for m in ev.walk(steps, ctx.gamma, ctx.xi))  # the start, then each step's q(u)
    except (StepFailedError, tf.errors.InvalidArgumentError) as e:
        at = f"step {len(walked)} of its {steps}-step walk" if walked else "the step to the optimum"  # not the one step
        return _failed("conjugate_convergence", "k steps approach the conjugate optimum", at + " failed", e)  # others take
    thetas, k_etas = zip(*walked)
    d = [float(np.linalg.norm(t - star)) for t in thetas]
    scale_theta = max(float(np.linalg.norm(t)) for t in [*thetas, star])
    k_eta = max(k_star, *k_etas)
    floor = rounding_bound(ctx.np_dtype, condition=cond.kappa_F + k_eta, scale=scale_theta)  # δ
    ratios = [d[k + 1] / max(d[k], 1e-300) for k in range(steps)]
    observed = (d[-1] / max(d[0], 1e-300)) ** (1.0 / steps)
    nums = f"distances {', '.join(format_number(x) for x in d)}; ratios {', '.join(format_number(r) for r in ratios)}; observed rate {format_number(observed)} per step"
    numbers = (("observed contraction rate per step", observed),)
    xinat, want = isinstance(ctx.xi, XiNat), abs(1.0 - ctx.gamma)
    if xinat and want < 1.0 and d[0] > floor:
        err = max(abs(r - want) for r in ratios)
        rel = scale_theta / max(min(d[1:]), 1e-300)
        bound = natgrad_bound(ctx.np_dtype, condition=(cond.kappa_F + k_eta) * rel, condition_name="(κ(F) + κ_η)·‖θ‖/d",
                              scale=1.0, rtol=ctx.tol.conjugate_rtol, atol=0.0)
        claim = (f"{steps} XiNat steps with γ = {ctx.gamma:g} contract the distance to the conjugate optimum in "
                 f"natural parameters by |1 − γ| = {want:g} per step")
        return Outcome(checks=(bounded_check("conjugate_convergence", claim, err, bound, nums),), numbers=numbers)
    worst = max((r for r, after in zip(ratios, d[1:]) if after > floor), default=0.0)  # within δ of θ*: converged
    diverges = xinat and want >= 1.0
    why = f" (XiNat: by |1 − γ| = {want:g} ≥ 1)" if diverges else ""
    claim = (f"{steps} {type(ctx.xi).__name__} steps with γ = {ctx.gamma:g} approach the conjugate optimum: the "
             f"distance in natural parameters shrinks at every step{why}")
    nums += f"; distances ≤ δ = {format_number(floor)} (100·ε·(κ(F) + κ_η)·‖θ‖, κ_η = {format_number(k_eta)}) are θ*"
    check = Check("conjugate_convergence", claim, status_of(worst < 1.0 and not diverges), worst, 1.0, nums)
    return Outcome(checks=(check,), numbers=numbers)
