"""The conjugate oracles (Gaussian likelihood): one γ = 1 step reaches the collapsed bound, a second stays there.

One XiNat step with γ = 1 lands on SGPR's bound (SVGP) or GPR's marginal likelihood with noise σ² + jitter (VGP).

With a Gaussian likelihood the optimal q(u) is known in closed form and a natural-gradient step with γ = 1 lands on
it (Salimbeni, Eleftheriadis and Hensman 2018, §3); the ELBO there is Titsias's (2009) collapsed bound.
"""

from __future__ import annotations

from typing import Any

from natgrad_diag.exceptions import error_line
from natgrad_diag.natgrad.context import Context
from natgrad_diag.natgrad.report import Outcome
from natgrad_diag.natgrad.tensors import loss_and_grads
from natgrad_diag.report.records import Check, format_number

__all__ = ["check_conjugate", "conjugate_applicable"]


def conjugate_applicable(ctx: Context) -> str:
    """'' if the conjugate checks apply, else the reason they do not."""
    import gpflow

    m = ctx.model
    if type(m.likelihood) is not gpflow.likelihoods.Gaussian:
        return f"needs a Gaussian likelihood (this model has {type(m.likelihood).__name__})"
    if isinstance(m, gpflow.models.SVGP):
        if isinstance(m.kernel, gpflow.kernels.MultioutputKernel) or not isinstance(m.inducing_variable, gpflow.inducing_variables.InducingPoints):
            return "SGPR's bound needs a single kernel and InducingPoints"
        N = int(ctx.data[0].shape[0])
        if m.num_data is not None and int(m.num_data) != N:
            return f"needs the full batch (model.num_data = {int(m.num_data)} but {N} rows were passed)"
        return ""
    if isinstance(m, gpflow.models.VGP):
        return ""
    return f"closed form known only for SVGP and VGP (this is {type(m).__name__})"


def _elbo(model: Any, data: Any) -> float:
    return float((model.elbo() if data is None else model.elbo(data)).numpy())


def _nat_step_on(ctx: Context, copy_: Any) -> None:
    """One XiNat step with γ = 1 (natgrad_trace, the core), assigned to ``copy_``."""
    from gpflow.optimizers import XiNat

    from natgrad_diag.natgrad.trace import natgrad_trace

    _, g_mu, g_sq = loss_and_grads(copy_, ctx.data)
    t = natgrad_trace(copy_.q_mu, copy_.q_sqrt, g_mu, g_sq, gamma=1.0, xi_transform=XiNat())
    copy_.q_mu.assign(t.new_q_mu)
    copy_.q_sqrt.assign(t.new_q_sqrt)


def check_conjugate(ctx: Context) -> Outcome:
    """One γ = 1 XiNat step reaches the collapsed bound (SGPR / GPR); a second step stays there."""
    import gpflow
    import tensorflow as tf

    from natgrad_diag.exceptions import StepFailedError

    m = ctx.model
    copy_ = gpflow.utilities.deepcopy(m)
    rtol = ctx.tol.conjugate_rtol
    try:
        _nat_step_on(ctx, copy_)
        elbo1 = _elbo(copy_, ctx.data)
        _nat_step_on(ctx, copy_)
        elbo2 = _elbo(copy_, ctx.data)
    except (StepFailedError, tf.errors.InvalidArgumentError) as e:
        why = e.detail if isinstance(e, StepFailedError) else error_line(e)
        return Outcome(checks=(Check(name="conjugate_optimality", claim="one γ = 1 step reaches the collapsed bound", passed=False, detail=f"the step failed: {why}"),))
    noise = m.likelihood.variance.numpy()
    if isinstance(m, gpflow.models.SVGP):
        ref = gpflow.models.SGPR(
            ctx.data, kernel=m.kernel, inducing_variable=m.inducing_variable, mean_function=m.mean_function, noise_variance=noise,
        ).elbo().numpy()  # fmt: skip
        ref = float(ref)
        err = abs(elbo1 - ref)
        bound = rtol * abs(ref)
        checks = [Check(
            name="conjugate_optimality",
            claim="after one full-batch XiNat step with γ = 1, SVGP's ELBO equals SGPR's bound (Titsias 2009) for the same kernel, Z and noise",
            passed=bool(err <= bound), max_abs_error=err, tolerance=bound,
            detail=f"SVGP ELBO {elbo1!r}, SGPR bound {ref!r} (relative {format_number(err / max(abs(ref), 1e-300))})",
        )]  # fmt: skip
        numbers: tuple[tuple[str, float], ...] = (("SGPR bound", ref),)
    else:
        X, Y = m.data
        jitter = gpflow.config.default_jitter()
        lml = float(gpflow.models.GPR((X, Y), kernel=m.kernel, mean_function=m.mean_function, noise_variance=noise).log_marginal_likelihood().numpy())
        lml_j = float(gpflow.models.GPR((X, Y), kernel=m.kernel, mean_function=m.mean_function, noise_variance=noise + jitter).log_marginal_likelihood().numpy())
        err = abs(elbo1 - lml_j)
        bound = rtol * abs(lml_j)
        share = lml_j - lml
        numbers = (("GPR log marginal likelihood (noise σ²)", lml), ("GPR log marginal likelihood (noise σ² + jitter)", lml_j),
                   ("jitter's share: VGP ELBO − GPR(σ²)", elbo1 - lml), ("GPR(σ² + jitter) − GPR(σ²)", share))  # fmt: skip
        checks = [Check(
            name="conjugate_optimality",
            claim=(
                f"after one XiNat step with γ = 1, VGP's ELBO equals GPR's log marginal likelihood with noise σ² + jitter "
                f"(jitter = {jitter:g}, VGP adds it to K)"
            ),
            passed=bool(err <= bound), max_abs_error=err, tolerance=bound,
            detail=(
                f"VGP ELBO {elbo1!r}; GPR(σ² + jitter) {lml_j!r}; GPR(σ²) {lml!r}: the gap to GPR(σ²), "
                f"{format_number(elbo1 - lml)}, is the jitter's share ({format_number(share)})"
            ),
        )]  # fmt: skip
    d = abs(elbo2 - elbo1)
    checks.append(Check(
        name="conjugate_fixed_point",
        claim="a second XiNat step with γ = 1 does not change the ELBO (the optimum is a fixed point)",
        passed=bool(d <= rtol * abs(elbo1)), max_abs_error=d, tolerance=rtol * abs(elbo1),
        detail=f"ELBO after one step {elbo1!r}, after two {elbo2!r}",
    ))  # fmt: skip
    return Outcome(checks=tuple(checks), numbers=numbers)
