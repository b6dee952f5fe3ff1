"""The benchmark's rows for the natural-gradient step (natgrad_trace, BLAS threads, the drop-in optimizer, fast check)
and for the training guard around it."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

import natgrad_diag
from natgrad_diag._gpflow import natgrad_apply_gradients
from natgrad_diag.bench.report import BenchRow
from natgrad_diag.bench.timing import Run, compare, random_q
from natgrad_diag.checks.api import check_natgrad
from natgrad_diag.report.records import Check, max_abs_diff, status_of
from natgrad_diag.step.lapack import natgrad_record_lapack
from natgrad_diag.step.trace import natgrad_trace

__all__ = ["bench_apply", "bench_check_natgrad", "bench_guard", "bench_minimize", "bench_threads", "bench_trace"]


def _problem(M: int) -> tuple[Any, ...]:
    """(q_mu, q_sqrt) as Parameters (``triangular()``), gradients w.r.t. their unconstrained variables, the agreement
    checks' scale max(1, max|q_sqrt|), and the baseline: GPflow's compiled ``_natgrad_apply_gradients`` (XiNat,
    γ = 0.1, not yet called) on a copy of (q_mu, q_sqrt), since it assigns, and the copy."""
    import gpflow
    import tensorflow as tf

    mu, sq = random_q(M, seed=M)
    (q_mu, q_sqrt), copy = ((gpflow.Parameter(mu), gpflow.Parameter(sq, transform=gpflow.utilities.triangular()))
                            for _ in range(2))  # fmt: skip
    rng = np.random.default_rng(M + 1)
    g_mu, g_sq = (tf.constant(0.01 * rng.normal(size=shape)) for shape in (mu.shape, q_sqrt.unconstrained_variable.shape))
    opt, xi = gpflow.optimizers.NaturalGradient(gamma=0.1), gpflow.optimizers.XiNat()
    base = tf.function(lambda: natgrad_apply_gradients(opt, g_mu, g_sq, *copy, xi))
    return q_mu, q_sqrt, g_mu, g_sq, max(1.0, float(np.max(np.abs(sq)))), base, copy


def bench_trace(run: Run) -> list[BenchRow]:
    """natgrad_trace (the LAPACK record) against GPflow's compiled ``_natgrad_apply_gradients`` on a copy, each M."""
    rows, worst = [], 0.0
    for M in run.sizes:
        q_mu, q_sqrt, g_mu, g_sq, scale, base, copy = _problem(M)
        trace = natgrad_trace(q_mu, q_sqrt, g_mu, g_sq, gamma=0.1, compiled=True)
        base()
        worst = max(worst, max_abs_diff((trace.new_q_mu, trace.new_q_sqrt), copy) / scale)
        t_ours, t_base = compare(lambda: natgrad_trace(q_mu, q_sqrt, g_mu, g_sq, gamma=0.1, compiled=True), base, run.repeats)
        rows.append(run.row("natgrad_trace (LAPACK record) vs GPflow's compiled step", "natgrad_trace", M, t_ours,
                            "_natgrad_apply_gradients", t_base, 0.7 if M >= 1000 else 1.3))  # fmt: skip
    run.agree("trace_matches_gpflow", "the timed natgrad_trace gives GPflow's new q_mu and q_sqrt (compiled, every M)", worst, 1e-8)
    return rows


def bench_threads(run: Run) -> list[BenchRow]:
    """The LAPACK record (natgrad_trace's path) in one BLAS thread, as it runs, against the BLAS default; M = 1000."""
    from threadpoolctl import threadpool_info

    M = run.size(1000, 30)
    mu, sq = random_q(M, seed=M)
    rng = np.random.default_rng(M + 1)
    d_mu, G = 0.01 * rng.normal(size=mu.shape), np.tril(0.01 * rng.normal(size=sq.shape))
    record = functools.partial(natgrad_record_lapack, mu, sq, d_mu, G, 0.1, "nat")
    one, default = record(one_thread=True), record(one_thread=False)
    threads = max((i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"), default=1)
    scale = max(1.0, max(float(np.max(np.abs(v))) for v in one.values()))
    run.agree("blas_threads_agree", f"the LAPACK record at M = {M} in one BLAS thread equals the record at the BLAS "
              f"default ({threads} threads), every key", max_abs_diff(list(one.values()), list(default.values())) / scale, 1e-10)  # fmt: skip
    t_one, t_default = compare(lambda: record(one_thread=True), lambda: record(one_thread=False), run.repeats)
    return [run.row("the LAPACK record's BLAS threads (natgrad_trace's path, XiNat)", "LAPACK record, 1 BLAS thread", M,
                    t_one, "BLAS default threads", t_default, None, note=f"default here = {threads} threads")]  # fmt: skip


def bench_apply(run: Run) -> list[BenchRow]:
    """``natgrad_diag.NaturalGradient.apply_natgrad`` against GPflow's ``_natgrad_apply_gradients`` on a plain
    ``gpflow.optimizers.NaturalGradient``: the apply part alone, same gradients, both compiled, XiNat; M = 200, 1000."""
    import gpflow
    import tensorflow as tf

    rows, worst = [], 0.0
    for M in run.size((200, 1000), (10, 30)):
        o_mu, o_sq, g_mu, g_sq, scale, base, copy = _problem(M)
        xi, opt = gpflow.optimizers.XiNat(), natgrad_diag.NaturalGradient(gamma=0.1)
        ours = tf.function(lambda: opt.apply_natgrad(g_mu, g_sq, o_mu, o_sq, xi))  # called in this pass only
        ours(), base()
        worst = max(worst, max_abs_diff((o_mu, o_sq), copy) / scale)
        t_ours, t_base = compare(ours, base, run.repeats)
        rows.append(run.row("the natural-gradient apply step alone (same gradients, both compiled, XiNat)",
                            "NaturalGradient apply (natgrad_diag)", M, t_ours, "_natgrad_apply_gradients", t_base, 0.6))  # fmt: skip
    run.agree("apply_matches_gpflow", "the timed natgrad_diag.NaturalGradient.apply_natgrad gives GPflow's new q_mu and "
              "q_sqrt (compiled, every M)", worst, 1e-9)  # fmt: skip
    return rows


def svgp(M: int, N: int, seed: int = 0) -> tuple[Any, Any]:
    """An SVGP with M inducing points on N points in 3-d, only q(u) trainable, and its data."""
    import gpflow
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(N, 3))
    Y = np.sin(X[:, :1]) + np.cos(X[:, 1:2]) + 0.1 * rng.normal(size=(N, 1))
    Z = X[rng.choice(N, size=M, replace=False)].copy() if M <= N else rng.uniform(0, 10, size=(M, 3))
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(lengthscales=1.0), gpflow.likelihoods.Gaussian(variance=0.1),
                               inducing_variable=Z, num_data=N)  # fmt: skip
    for part in (model.kernel, model.likelihood, model.inducing_variable):
        gpflow.set_trainable(part, False)
    return model, (tf.constant(X), tf.constant(Y))


def bench_minimize(run: Run) -> list[BenchRow]:
    """One whole compiled ``minimize`` step of natgrad_diag.NaturalGradient against GPflow's on an SVGP, M = 1000."""
    import gpflow
    import tensorflow as tf

    M, N = run.size((1000, 2000), (50, 200))
    (a, data), (b, _) = svgp(M, N), svgp(M, N)
    steps = [tf.function(lambda opt=opt, m=m: opt.minimize(m.training_loss_closure(data, compile=False), [(m.q_mu, m.q_sqrt)]))
             for opt, m in ((natgrad_diag.NaturalGradient(gamma=0.1), a), (gpflow.optimizers.NaturalGradient(gamma=0.1), b))]  # fmt: skip
    steps[0](), steps[1]()
    scale = max(1.0, float(np.max(np.abs(b.q_sqrt.numpy()))), float(np.max(np.abs(b.q_mu.numpy()))))
    run.agree("minimize_matches_gpflow", f"one step of natgrad_diag.NaturalGradient gives GPflow's q_mu and q_sqrt on "
              f"the same SVGP (M = {M}, N = {N})", max_abs_diff((a.q_mu, a.q_sqrt), (b.q_mu, b.q_sqrt)) / scale, 1e-9)  # fmt: skip
    t_ours, t_base = compare(steps[0], steps[1], run.few)
    return [run.row("one whole compiled NaturalGradient.minimize step (SVGP, XiNat)", "NaturalGradient (natgrad_diag)",
                    M, t_ours, "NaturalGradient (gpflow)", t_base, 0.8, note=f"N = {N}")]  # fmt: skip


def bench_check_natgrad(run: Run) -> list[BenchRow]:
    """check_natgrad(mode="fast") against one compiled GPflow ``NaturalGradient`` step on the same SVGP (M = 1000): the
    one-step check (``gamma_steps=1, gamma_search=False``, what a training monitor runs between searches) and the
    default one (γ judged over 5 steps, the γ search)."""
    import tensorflow as tf
    from gpflow.optimizers import NaturalGradient

    M, N = run.size((1000, 2000), (50, 200))
    (model, data), (base_model, _) = svgp(M, N), svgp(M, N)
    opt, loss = NaturalGradient(gamma=0.1), base_model.training_loss_closure(data, compile=False)
    step = tf.function(lambda: opt.minimize(loss, [(base_model.q_mu, base_model.q_sqrt)]))
    rows = []
    cases: tuple[tuple[str, dict[str, Any], float], ...] = (("gamma_steps=1", dict(gamma_steps=1, gamma_search=False), 2.3), ("defaults", {}, 20.0))
    for name, kwargs, target in cases:
        reports: list[Any] = []
        t_ours, t_base = compare(lambda: reports.append(check_natgrad(model, data, gamma=0.1, mode="fast", progress=False, **kwargs)), step, run.few)
        run.checks.append(Check(f"fast_check_natgrad_passes_{name.split('=')[0]}", f"the timed check_natgrad(mode='fast', {name}) finds the "
                                f"healthy SVGP (M = {M}, N = {N}) healthy, every call", status_of(reports and all(r.passed for r in reports))))  # fmt: skip
        rows.append(run.row(f"fast-mode check_natgrad ({name}) vs one compiled GPflow NaturalGradient step (SVGP)", f"check_natgrad(mode='fast', {name})",
                            M, t_ours, "NaturalGradient step", t_base, target, note=f"N = {N}"))  # fmt: skip
    return rows


#: Training steps per timed call (one step takes milliseconds: a block of them times well).
_BLOCK = 25


def _training(M: int, N: int) -> tuple[Any, Any, Any, Any]:
    """An SVGP trained as GPflow's recipe does (natural gradients on q(u), Adam on the rest, one ``tf.function``)."""
    import gpflow
    import tensorflow as tf
    from gpflow.keras import tf_keras

    model, data = svgp(M, N)
    for part, trainable in ((model.kernel, True), (model.likelihood, True), (model.q_mu, False), (model.q_sqrt, False)):
        gpflow.set_trainable(part, trainable)
    natgrad = gpflow.optimizers.NaturalGradient(tf.Variable(0.5, dtype=tf.float64))
    adam = tf_keras.optimizers.Adam(0.01)
    loss = model.training_loss_closure(data, compile=False)

    @tf.function
    def step() -> None:
        natgrad.minimize(loss, [(model.q_mu, model.q_sqrt)])
        adam.minimize(loss, model.trainable_variables)

    return model, data, natgrad, step


def bench_guard(run: Run) -> list[BenchRow]:
    """A guarded compiled NaturalGradient + Adam step (``NatGradMonitor(..., on_failure="rollback")``, defaults
    otherwise) against the same step unguarded, on an SVGP with M = 50, N = 1000; blocks of :data:`_BLOCK` steps."""
    from natgrad_diag.training.monitor import NatGradMonitor

    M, N = run.size((50, 1000), (10, 100))
    (plain, _, _, plain_step), (model, data, natgrad, step) = _training(M, N), _training(M, N)
    monitor = NatGradMonitor(model, data, gamma=0.5, on_failure="rollback")
    count = [0]

    def guarded() -> None:
        for _ in range(_BLOCK):
            with monitor.guard(count[0], natgrad):
                step()
            count[0] += 1

    t_ours, t_base = compare(guarded, lambda: [plain_step() for _ in range(_BLOCK)], max(run.repeats, 11))
    records = monitor.guard_records
    healthy = len(records) == count[0] and all(r.passed for r in records)
    run.checks.append(Check("guard_records_every_step", f"the guard recorded each of the {len(records)} timed steps "
                            "healthy and rolled none back", status_of(healthy)))  # fmt: skip
    scale = max(1.0, float(np.max(np.abs(plain.q_sqrt.numpy()))), float(np.max(np.abs(plain.q_mu.numpy()))))
    run.agree("guarded_training_is_plain_training", f"after the same {count[0]} steps the guarded SVGP's q(u) equals "
              "the unguarded one's (the guard changes nothing on a healthy step)",
              max_abs_diff((model.q_mu, model.q_sqrt), (plain.q_mu, plain.q_sqrt)) / scale, 1e-10)  # fmt: skip
    return [run.row("the training guard with its defaults (SVGP, natural gradients on q(u) + Adam, one tf.function)",
                    "guarded step", M, t_ours / _BLOCK, "compiled NaturalGradient + Adam step", t_base / _BLOCK, 1.5,
                    note=f"N = {N}")]  # fmt: skip
