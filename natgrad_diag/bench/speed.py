"""The benchmark's speed rows (issue 15): the closed-form apply and minimize, the O(M⁴) Jacobian, the fast modes."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from natgrad_diag.bench.cases import svgp
from natgrad_diag.bench.report import BenchRow
from natgrad_diag.bench.timing import compare, make_row, random_q
from natgrad_diag.exceptions import error_line
from natgrad_diag.report.records import Check, status_of
from natgrad_diag.typing import Array

__all__ = ["bench_apply", "bench_check_gradients_fast", "bench_fill", "bench_minimize", "not_applicable"]


def not_applicable(row: BenchRow) -> BenchRow:
    """The row with its target not judged: it is meant for the full sizes ("n/a at this size", not "NO")."""
    return dataclasses.replace(row, meets=None, applies=False)


def _parameters(M: int, seed: int) -> tuple[Any, Any, Array, Array]:
    import gpflow

    mu, sq = random_q(M, seed=seed)
    return gpflow.Parameter(mu), gpflow.Parameter(sq, transform=gpflow.utilities.triangular()), mu, sq


def bench_apply(sizes: Sequence[int], repeats: int, checks: list[Check], *, applies: bool) -> list[BenchRow]:
    """``natgrad_diag.NaturalGradient.apply_natgrad`` against GPflow's ``_natgrad_apply_gradients`` on a plain
    ``gpflow.optimizers.NaturalGradient``: the apply part alone, same gradients, both compiled, XiNat."""
    import gpflow
    import tensorflow as tf

    import natgrad_diag
    from natgrad_diag._gpflow import natgrad_apply_gradients

    group = "the natural-gradient apply step alone (same gradients, both compiled, XiNat)"
    rows, worst = [], 0.0
    for M in sizes:
        o_mu, o_sq, mu, sq = _parameters(M, seed=M)
        g_mu_p, g_sq_p, _, _ = _parameters(M, seed=M)
        rng = np.random.default_rng(M + 2)
        q_mu_grad = tf.constant(0.01 * rng.normal(size=mu.shape))
        q_sqrt_grad = tf.constant(0.01 * rng.normal(size=o_sq.unconstrained_variable.shape))
        xi = gpflow.optimizers.XiNat()
        opt = natgrad_diag.NaturalGradient(gamma=0.1)
        gp = gpflow.optimizers.NaturalGradient(gamma=0.1)
        ours = tf.function(lambda: opt.apply_natgrad(q_mu_grad, q_sqrt_grad, o_mu, o_sq, xi))
        base = tf.function(lambda: natgrad_apply_gradients(gp, q_mu_grad, q_sqrt_grad, g_mu_p, g_sq_p, xi))
        for p, v in ((o_mu, mu), (o_sq, sq), (g_mu_p, mu), (g_sq_p, sq)):
            p.assign(v)
        ours()
        base()
        scale = max(1.0, float(np.max(np.abs(sq))))
        worst = max(worst, float(np.max(np.abs(o_mu.numpy() - g_mu_p.numpy()))) / scale,
                    float(np.max(np.abs(o_sq.numpy() - g_sq_p.numpy()))) / scale)  # fmt: skip
        t_ours, t_base = compare(ours, base, repeats)
        row = make_row(
            group, "NaturalGradient apply (natgrad_diag)", M, t_ours, "_natgrad_apply_gradients", t_base, 0.6
        )
        rows.append(row if applies else not_applicable(row))
    checks.append(Check(
        name="apply_matches_gpflow",
        claim="the timed natgrad_diag.NaturalGradient.apply_natgrad gives GPflow's new q_mu and q_sqrt (compiled, every M)",
        status=status_of(worst <= 1e-9), max_abs_error=worst, tolerance=1e-9,
    ))  # fmt: skip
    return rows


def bench_minimize(M: int, N: int, repeats: int, checks: list[Check], *, applies: bool) -> list[BenchRow]:
    """One whole compiled ``minimize`` step of natgrad_diag.NaturalGradient against GPflow's, on an SVGP."""
    import gpflow
    import tensorflow as tf

    import natgrad_diag

    group = "one whole compiled NaturalGradient.minimize step (SVGP, XiNat)"
    models, steps = [], []
    for opt in (natgrad_diag.NaturalGradient(gamma=0.1), gpflow.optimizers.NaturalGradient(gamma=0.1)):
        model, data = svgp(M, N)
        loss = model.training_loss_closure(data, compile=False)
        models.append(model)
        steps.append(
            tf.function(lambda opt=opt, model=model, loss=loss: opt.minimize(loss, [(model.q_mu, model.q_sqrt)]))
        )
    steps[0]()
    steps[1]()
    a, b = models
    scale = max(1.0, float(np.max(np.abs(b.q_sqrt.numpy()))), float(np.max(np.abs(b.q_mu.numpy()))))
    err = max(
        float(np.max(np.abs(a.q_mu.numpy() - b.q_mu.numpy()))),
        float(np.max(np.abs(a.q_sqrt.numpy() - b.q_sqrt.numpy()))),
    )
    checks.append(Check(
        name="minimize_matches_gpflow",
        claim=f"one step of natgrad_diag.NaturalGradient gives GPflow's q_mu and q_sqrt on the same SVGP (M = {M}, N = {N})",
        status=status_of(err / scale <= 1e-9), max_abs_error=err / scale, tolerance=1e-9,
    ))  # fmt: skip
    t_ours, t_base = compare(steps[0], steps[1], repeats)
    row = make_row(
        group, "NaturalGradient (natgrad_diag)", M, t_ours, "NaturalGradient (gpflow)", t_base, 0.8, note=f"N = {N}"
    )
    return [row if applies else not_applicable(row)]


def bench_fill(sizes: Sequence[int], repeats: int, checks: list[Check], *, applies: bool) -> list[BenchRow]:
    """``natgrad_map_jacobian`` (closed form, vech) against ``np.ones`` of its stored array's shape and dtype."""
    from natgrad_diag.bench.cases import natgrad_map_fixture
    from natgrad_diag.step.jacobian import natgrad_map_jacobian

    group = "the O(M⁴) closed-form Jacobian vs writing its array"
    rows = []
    for n, M in enumerate(sizes):
        e1, e2 = (t.numpy() for t in natgrad_map_fixture(M))
        J = natgrad_map_jacobian(e1, e2)
        assert J.compact is not None  # natgrad_map_jacobian builds from the stored (compact) matrix
        shape, dtype = J.compact.shape, J.compact.dtype
        if n == 0:  # against TensorFlow's own Jacobian (the autodiff path), at the smallest size
            A = natgrad_map_jacobian(e1, e2, method="autodiff")
            assert A.compact is not None  # jacobian() builds from the stored (compact) matrix
            err = float(np.max(np.abs(J.compact - A.compact))) / max(1.0, float(np.max(np.abs(A.compact))))
            checks.append(Check(
                name="closed_form_jacobian_matches_autodiff",
                claim=f"the timed closed-form natgrad_map_jacobian equals TensorFlow's (method='autodiff') at M = {M}, "
                "and its array has the baseline's shape and dtype at every M",
                status=status_of(err <= 1e-10), max_abs_error=err, tolerance=1e-10,
            ))  # fmt: skip
        del J
        t_ours, t_base = compare(lambda: natgrad_map_jacobian(e1, e2), lambda: np.ones(shape, dtype), repeats)
        note = f"{np.prod(shape) * np.dtype(dtype).itemsize / 1024**2:.1f} MiB"
        row = make_row(group, "natgrad_map_jacobian", M, t_ours, "filling its array", t_base, 4.0, note=note)
        rows.append(row if applies else not_applicable(row))
    return rows


def _natural_point(M: int, seed: int) -> tuple[Array, Array]:
    """A natural-parameter point (θ₁ [M, 1], θ₂ [1, M, M]) = (S⁻¹m, −½S⁻¹) of a random q(u)."""
    mu, sq = random_q(M, seed=seed)
    prec = np.linalg.inv(sq[0] @ sq[0].T)
    prec = 0.5 * (prec + prec.T)
    return prec @ mu, (-0.5 * prec)[None]


def _timed_once(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def bench_check_gradients_fast(M: int, repeats: int, checks: list[Check], *, applies: bool) -> list[BenchRow]:
    """check_gradients(mode='fast') on natural_to_meanvarsqrt against one compiled f and VJP, tracing included
    on both sides: every timed call traces afresh (a new function object, a new tf.function)."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import natural_to_meanvarsqrt

    from natgrad_diag.gradcheck.api import check_gradients

    group = "fast-mode check_gradients vs one compiled f and VJP (natural_to_meanvarsqrt, tracing included)"
    nat1, nat2 = _natural_point(M, seed=M)
    rng = np.random.default_rng(M)
    v = [tf.constant(rng.normal(size=(M, 1))), tf.constant(rng.normal(size=(1, M, M)))]
    x = [tf.constant(nat1), tf.constant(nat2)]

    def ours() -> Any:  # a new function object: not in the compile cache, so it is traced in the call
        return check_gradients(lambda a, b: natural_to_meanvarsqrt(a, b), [nat1, nat2],
                               structure=("general", "symmetric"), mode="fast")  # fmt: skip

    def base() -> Any:
        @tf.function
        def f_vjp(a: Any, b: Any) -> Any:
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                ys = natural_to_meanvarsqrt(a, b)
            return tape.gradient(ys, [a, b], output_gradients=v)

        return [g.numpy() for g in f_vjp(*x)]

    times: list[tuple[float, float]] = []
    report = None
    try:
        for k in range(max(1, repeats)):
            t_o, report = _timed_once(ours)
            t_b, _ = _timed_once(base)
            times.append((t_o, t_b))
    except Exception as e:  # noqa: BLE001 - a bench row must not abort the run
        return [make_row(group, "check_gradients(mode='fast')", M, None, "one compiled f and VJP", None, 15.0,
                         note=f"failed: {error_line(e, with_type=True, limit=80)}")]  # fmt: skip
    checks.append(Check(
        name="fast_gradcheck_passes_on_gpflow",
        claim=f"the timed fast-mode check_gradients passes every block of GPflow's natural_to_meanvarsqrt at M = {M} "
        "(reverse mode agrees with central differences along each random direction)",
        status=status_of(report is not None and report.passed and len(report.rows) == 4),
    ))  # fmt: skip
    t_ours = float(np.median([t[0] for t in times]))
    t_base = float(np.median([t[1] for t in times]))
    row = make_row(
        group, "check_gradients(mode='fast')", M, t_ours, "one compiled f and VJP", t_base, 15.0, note="L = 1"
    )
    return [row if applies else not_applicable(row)]
