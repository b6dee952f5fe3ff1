"""The ``loss_gradient`` oracle: the gradients that feed the step, dL/dmean and dL/dvarsqrt, against central differences.

GPflow's step takes dL/dmean [M, L] and dL/dvarsqrt [L, M, M] from the user's model (likelihood, kernel, mean function,
any ``tf.custom_gradient`` in them). Along K random unit directions d = (d_m, d_S) (d_S lower-triangular, the
structure of q_sqrt) the directional derivative ⟨dL/dmean, d_m⟩ + ⟨dL/dvarsqrt, d_S⟩ must equal the central
difference (L(q + h·d) − L(q − h·d)) / 2h of the loss on the same data, evaluated by the evaluator on its scratch
copy, so the model is never touched. The evaluator computes those losses with the step (:func:`probes` names the points).
"""

from __future__ import annotations

import numpy as np

from natgrad_diag.checks.evaluator import Evaluator, Point, Run
from natgrad_diag.checks.health import NOISE_SAMPLES, noise
from natgrad_diag.checks.report import Outcome
from natgrad_diag.report.records import Check, format_number, status_of
from natgrad_diag.tolerance import default_tolerance, eps
from natgrad_diag.typing import Array

__all__ = ["probes", "random_directions", "stage"]


def random_directions(M: int, L: int, k: int, seed: int = 0) -> list[tuple[Array, Array]]:
    """``k`` seeded unit directions (d_m [M, L], d_S [L, M, M] lower-triangular), ‖d_m‖² + ‖d_S‖² = 1."""
    rng = np.random.default_rng(seed)
    raw = [(rng.standard_normal((M, L)), np.tril(rng.standard_normal((L, M, M)))) for _ in range(k)]
    return [(d_m / norm, d_S / norm) for d_m, d_S in raw for norm in [np.sqrt(np.sum(d_m**2) + np.sum(d_S**2))]]


def _step_length(q_sqrt: Array, dtype: str) -> float:
    """h = ε^(1/3)·min(1, min |diag q_sqrt|) (see :func:`stage`)."""
    min_diag = float(np.min(np.abs(np.diagonal(q_sqrt, axis1=-2, axis2=-1))))
    return float(eps(dtype) ** (1.0 / 3.0) * (min(1.0, min_diag) if min_diag > 0 else 1.0))


def probes(ev: Evaluator) -> list[Point]:
    """q + h·d and q − h·d for each of the ``ev.loss_directions`` seeded directions d, in the model's dtype."""
    ctx = ev.ctx
    q_mu, q_sqrt = (np.asarray(a, np.float64) for a in ev.q_arrays)
    h = _step_length(q_sqrt, np.dtype(ctx.np_dtype).name)
    return [
        ((q_mu + s * h * d_m).astype(ctx.np_dtype), (q_sqrt + s * h * d_S).astype(ctx.np_dtype))
        for d_m, d_S in random_directions(ctx.M, ctx.L, ev.loss_directions) for s in (1.0, -1.0)
    ]


def stage(run: Run) -> Outcome:
    """|analytic − central difference| ≤ 100·ε·|L|/h + rtol_fd·s + atol_fd along each of ``ev.loss_directions``
    random directions (three in full mode; one in fast mode, which the monitor runs during training: a wrong
    gradient e is missed only when the direction is nearly orthogonal to it, |⟨e, d⟩| under the tolerance).

    h = ε^(1/3)·min(1, min diag q_sqrt): the loss's −log det S = −2 Σ log diag(q_sqrt) has k-th derivatives of
    order diag^(−k), so the step scales with the smallest diagonal entry (q_sqrt = 1e-4·I would otherwise make the
    truncation error O(h²/diag³) dominate). The central difference's truncation error is O(h²), its rounding error
    about ε·|L|/h (Nocedal and Wright, *Numerical Optimization*, 2nd ed., §8.1): the bound takes 100 times the
    rounding part, and the package's finite-difference tolerance (``default_tolerance(dtype, "finite_difference")``,
    rtol ≈ 10²·ε^(2/3), the truncation error with a margin) relative to the directional derivative's scale
    s = max(|analytic|, |fd|, ‖∇L‖/√n), n the number of parameters: ‖∇L‖/√n is the typical size of a unit random
    directional derivative, so a direction nearly orthogonal to ∇L is not held to a tolerance near zero, and the
    tolerance does not grow with √n as one relative to ‖∇L‖ would. The analytic side's rounding, about √n·ε·‖∇L‖,
    is far below rtol·‖∇L‖/√n for n < 10¹⁰.
    """
    ev, step, ctx = run.ev, run.step, run.ev.ctx
    dtype = np.dtype(ctx.np_dtype).name
    g_m, g_S = np.asarray(step.dL_dmean, np.float64), np.tril(np.asarray(step.dL_dvarsqrt, np.float64))
    h = _step_length(np.asarray(ev.q_arrays[1], np.float64), dtype)
    n = ctx.M * ctx.L + ctx.L * ctx.M * (ctx.M + 1) // 2
    typical = float(np.sqrt(np.sum(g_m**2) + np.sum(g_S**2))) / np.sqrt(n)
    rounding, tol = 100.0 * eps(dtype) * abs(step.loss) / h, default_tolerance(dtype, "finite_difference")
    worst = (-1.0, 0, 0.0, 0.0, 0.0)  # (error / bound, direction, analytic, fd, bound)
    found = run.probes or tuple((p, ev.loss_at(*p)) for p in probes(ev))  # a run that did not ask computes them here
    for i, (((up_m, up_S), up), ((down_m, down_S), down)) in enumerate(zip(found[::2], found[1::2])):
        fd = (up - down) / (2.0 * h) if up is not None and down is not None else float("nan")
        # along the displacement the two losses saw, (q + h·d) − (q − h·d) = 2h·d up to the dtype's rounding
        analytic = float(np.sum(g_m * (up_m - down_m.astype(np.float64))) + np.sum(g_S * (up_S - down_S.astype(np.float64)))) / (2.0 * h)
        bound = rounding + tol.rtol * max(abs(analytic), abs(fd), typical) + tol.atol  # truncation: relative to s
        ratio = abs(fd - analytic) / bound
        ratio = ratio if np.isfinite(ratio) else np.inf  # NaN on either side fails (a NaN ratio never beats worst)
        if ratio > worst[0]:
            worst = (ratio, i, analytic, fd, bound)
    _, i, analytic, fd, bound = worst
    err = abs(fd - analytic) if np.isfinite(fd - analytic) else float("inf")
    if err > bound and noise(ev, step):  # a difference of two noisy losses over 2h: σ̂/h ≈ 10⁵·σ̂ in float64
        return Outcome(skipped=(("loss_gradient", (
            f"the loss is stochastic (standard deviation {format_number(ev.noise)} over {NOISE_SAMPLES} evaluations at "
            "the current q(u): a Monte Carlo likelihood such as GPflow's Softmax draws new samples at each evaluation), "
            "so central differences cannot check its gradient; check a likelihood's own gradients with check_gradients "
            "on fixed samples")),))
    claim = (f"the gradients that feed the step, dL/dmean and dL/dvarsqrt, equal central differences of the loss along "
             f"{ev.loss_directions} random direction{'s' if ev.loss_directions != 1 else ''} (lower-triangular for q_sqrt)")
    detail = (
        f"worst direction {i} (seeded): analytic {analytic!r}, central difference {fd!r} (relative "
        f"{format_number(err / max(abs(fd), 1e-300))}); h = {format_number(h)}; bound = 100·ε·|L|/h "
        f"{format_number(rounding)} + rtol·max(|analytic|, |fd|, ‖∇L‖/√n = {format_number(typical)}) + atol"
    )
    return Outcome(checks=(Check("loss_gradient", claim, status_of(err <= bound), err, bound, detail),))
