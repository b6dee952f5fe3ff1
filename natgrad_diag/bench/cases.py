"""The benchmark's rows: each times one of ours against its TensorFlow or GPflow baseline, and checks they agree."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from natgrad_diag.bench.report import BenchRow
from natgrad_diag.bench.timing import cli_command, compare, make_row, random_q, subprocess_env, time_subprocess
from natgrad_diag.exceptions import error_line
from natgrad_diag.report.records import Check, status_of

__all__ = ["bench_check_natgrad", "bench_cli", "bench_jacobian", "bench_memory", "bench_trace", "bench_vech"]


def bench_trace(sizes: Sequence[int], repeats: int, checks: list[Check]) -> list[BenchRow]:
    import gpflow
    import tensorflow as tf
    from gpflow.optimizers import NaturalGradient, XiNat

    from natgrad_diag._gpflow import natgrad_apply_gradients
    from natgrad_diag.step.trace import natgrad_trace

    rows = []
    worst = 0.0
    for M in sizes:
        mu, sq = random_q(M, seed=M)
        q_mu = gpflow.Parameter(mu)
        q_sqrt = gpflow.Parameter(sq, transform=gpflow.utilities.triangular())
        rng = np.random.default_rng(M + 1)
        g_mu = tf.constant(0.01 * rng.normal(size=mu.shape))
        g_sq = tf.constant(0.01 * rng.normal(size=q_sqrt.unconstrained_variable.shape))
        # GPflow's step on copies (it assigns), compiled
        c_mu = gpflow.Parameter(mu)
        c_sq = gpflow.Parameter(sq, transform=gpflow.utilities.triangular())
        opt = NaturalGradient(gamma=0.1)
        xi = XiNat()

        @tf.function
        def gp_step(a: Any, b: Any) -> None:
            natgrad_apply_gradients(opt, a, b, c_mu, c_sq, xi)

        def base() -> None:
            gp_step(g_mu, g_sq)

        def ours() -> Any:
            return natgrad_trace(q_mu, q_sqrt, g_mu, g_sq, gamma=0.1, compiled=True)

        t = ours()
        c_mu.assign(mu)
        c_sq.assign(sq)
        gp_step(g_mu, g_sq)
        err = max(float(np.max(np.abs(t.new_q_mu - c_mu.numpy()))), float(np.max(np.abs(t.new_q_sqrt - c_sq.numpy()))))
        worst = max(worst, err / max(1.0, float(np.max(np.abs(sq)))))
        t_ours, t_base = compare(ours, base, repeats)
        # the closed-form step's target (issue 15) is for M = 1000; smaller M keep the first benchmark's 1.3
        rows.append(make_row("natgrad_trace (LAPACK record) vs GPflow's compiled step", "natgrad_trace", M, t_ours,
                         "_natgrad_apply_gradients", t_base, 0.7 if M >= 1000 else 1.3))  # fmt: skip
    checks.append(Check(
        name="trace_matches_gpflow",
        claim="the timed natgrad_trace gives GPflow's new q_mu and q_sqrt (compiled, every M)",
        status=status_of(worst <= 1e-8), max_abs_error=worst, tolerance=1e-8,
    ))  # fmt: skip
    return rows


def natgrad_map_fixture(M: int) -> tuple[Any, Any]:
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_expectation

    mu, sq = random_q(M, seed=M)
    e1, e2 = meanvarsqrt_to_expectation(tf.constant(mu), tf.constant(sq))
    return e1, e2


def tape_jacobian(e1: Any, e2: Any) -> Any:
    import tensorflow as tf
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    with tf.GradientTape(persistent=True) as tape:
        tape.watch([e1, e2])
        ys = expectation_to_meanvarsqrt(e1, e2)
    zero = tf.UnconnectedGradients.ZERO
    return [[tape.jacobian(y, x, unconnected_gradients=zero) for x in (e1, e2)] for y in ys]


def bench_jacobian(M: int, repeats: int, checks: list[Check]) -> list[BenchRow]:
    import tensorflow as tf

    from natgrad_diag.step.jacobian import natgrad_map_jacobian

    e1, e2 = natgrad_map_fixture(M)
    compiled_tape = tf.function(tape_jacobian)

    def ours() -> Any:  # jacobian()'s own machinery (TensorFlow autodiff), not the closed form
        return natgrad_map_jacobian(e1, e2, method="autodiff")

    group = "jacobian() of the natgrad map vs tape.jacobian"
    t_ours, t_comp = compare(ours, lambda: compiled_tape(e1, e2), repeats)
    t_ours2, t_eager = compare(ours, lambda: tape_jacobian(e1, e2), max(1, min(repeats, 3)))
    J = ours()
    ref = compiled_tape(e1, e2)
    err = max(float(np.max(np.abs(J.block(i, j) - ref[i][j].numpy()))) for i in range(2) for j in range(2))
    checks.append(Check(
        name="jacobian_matches_tape",
        claim=f"the timed natgrad_map_jacobian (vech η₂, mapped back) equals tape.jacobian block by block at M = {M}",
        status=status_of(err <= 1e-9), max_abs_error=err, tolerance=1e-9,
    ))  # fmt: skip
    return [
        make_row(group, "natgrad_map_jacobian", M, t_ours, "tape.jacobian, compiled", t_comp, 1.2),
        make_row(group, "natgrad_map_jacobian", M, t_ours2, "tape.jacobian, eager", t_eager, 3.0, higher_is_better=True),
    ]


def bench_vech(M: int, repeats: int, checks: list[Check]) -> list[BenchRow]:
    from natgrad_diag.step.jacobian import natgrad_map_jacobian

    e1, e2 = natgrad_map_fixture(M)
    # the natgrad map's default method: closed-form JVP columns, so the cost follows the column count
    t_v, t_g = compare(lambda: natgrad_map_jacobian(e1, e2), lambda: natgrad_map_jacobian(e1, e2, symmetric=False), repeats)
    Jv = natgrad_map_jacobian(e1, e2)
    Jg = natgrad_map_jacobian(e1, e2, symmetric=False)
    assert Jv.compact is not None and Jg.compact is not None  # the closed form builds from the stored matrix
    err = max(float(np.max(np.abs(Jv.block(i, j) - Jg.block(i, j)))) for i in range(2) for j in range(2))
    checks.append(Check(
        name="vech_matches_general",
        claim=f"the vech Jacobian mapped back to general blocks equals the general one at M = {M}",
        status=status_of(err <= 1e-9), max_abs_error=err, tolerance=1e-9,
    ))  # fmt: skip
    group = "symmetric (vech) η₂ vs general η₂"
    return [
        make_row(group, "vech Jacobian: time", M, t_v, "general Jacobian", t_g, 0.6),
        make_row(group, "vech Jacobian: stored size", M, float(Jv.compact.nbytes), "general Jacobian",
             float(Jg.compact.nbytes), 0.6, unit="bytes"),  # fmt: skip
    ]


MEMORY_SCRIPT = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
from natgrad_diag.bench.cases import natgrad_map_fixture, tape_jacobian
from natgrad_diag.step.jacobian import natgrad_map_jacobian

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None

M, how = int(sys.argv[1]), sys.argv[2]
compiled_tape = tf.function(tape_jacobian)

def run(m):
    e1, e2 = natgrad_map_fixture(m)
    if how == "tape":
        return [[b.numpy() for b in row] for row in compiled_tape(e1, e2)]
    return natgrad_map_jacobian(e1, e2, symmetric=(how == "vech"), method="autodiff")  # jacobian()'s chunks

run(6)  # warm up TensorFlow and our code at a small size
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    reset = True
except OSError:
    reset = False
baseline = status("VmRSS") if reset else status("VmHWM")
J = run(M)
peak = status("VmHWM")
rows, cols = M + M * M, (M + M * (M + 1) // 2) if how == "vech" else M + M * M
print(json.dumps({"baseline": baseline, "peak": peak, "nbytes": rows * cols * 8, "reset": reset}))
"""


def bench_memory(M: int, hows: Sequence[str]) -> list[BenchRow]:
    group = "peak memory of the dense Jacobian above the process baseline, in Jacobian sizes"
    rows = []
    results = {}
    for how in hows:
        try:
            out = subprocess.run(
                [sys.executable, "-c", MEMORY_SCRIPT, str(M), how],
                capture_output=True, text=True, timeout=900, env=subprocess_env(), check=True,
            )  # fmt: skip
            results[how] = json.loads(out.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, OSError, ValueError, IndexError) as e:
            results[how] = {"error": error_line(e, limit=120)}
    names = {"general": "jacobian(), general η₂", "vech": "jacobian(), vech η₂", "tape": "tape.jacobian, compiled"}
    for how in hows:
        r = results[how]
        if "error" in r or r.get("peak") is None:
            rows.append(make_row(group, names[how], M, None, "Jacobian size", None, 1.5, note=r.get("error", "no /proc")))
            continue
        above = float(r["peak"] - r["baseline"])
        note = "" if r["reset"] else "VmHWM could not be reset"
        row = make_row(group, names[how], M, above, "Jacobian size", float(r["nbytes"]), 1.5, unit="bytes", note=note)
        if how == "tape":  # the baseline itself: shown for reference, the target is for ours
            row = dataclasses.replace(row, target="reference", meets=None)
        rows.append(row)
    return rows


def svgp(M: int, N: int, seed: int = 0) -> tuple[Any, Any]:
    import gpflow
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(N, 3))
    Y = np.sin(X[:, :1]) + np.cos(X[:, 1:2]) + 0.1 * rng.normal(size=(N, 1))
    Z = X[rng.choice(N, size=M, replace=False)].copy() if M <= N else rng.uniform(0, 10, size=(M, 3))
    model = gpflow.models.SVGP(
        gpflow.kernels.SquaredExponential(lengthscales=1.0), gpflow.likelihoods.Gaussian(variance=0.1),
        inducing_variable=Z, num_data=N,
    )  # fmt: skip
    gpflow.set_trainable(model.kernel, False)
    gpflow.set_trainable(model.likelihood, False)
    gpflow.set_trainable(model.inducing_variable, False)
    return model, (tf.constant(X), tf.constant(Y))


def bench_check_natgrad(M: int, N: int, repeats: int, checks: list[Check] | None = None) -> list[BenchRow]:
    import inspect

    import tensorflow as tf
    from gpflow.optimizers import NaturalGradient

    group = "fast-mode check_natgrad vs one compiled GPflow NaturalGradient step (SVGP)"
    try:
        from natgrad_diag.checks.api import check_natgrad

        has_fast = "mode" in inspect.signature(check_natgrad).parameters
    except ImportError:
        has_fast = False
    if not has_fast:
        return [make_row(group, "check_natgrad(mode='fast')", M, None, "NaturalGradient step", None, 3.0, note="not available")]
    model, data = svgp(M, N)
    base_model, _ = svgp(M, N)
    opt = NaturalGradient(gamma=0.1)
    loss = base_model.training_loss_closure(data, compile=False)

    @tf.function
    def step() -> None:
        opt.minimize(loss, [(base_model.q_mu, base_model.q_sqrt)])

    reports = []

    def ours() -> Any:
        reports.append(check_natgrad(model, data, gamma=0.1, mode="fast", progress=False))

    try:
        t_ours, t_base = compare(ours, step, repeats)
    except Exception as e:  # noqa: BLE001 - a bench row must not abort the run
        return [make_row(group, "check_natgrad(mode='fast')", M, None, "NaturalGradient step", None, 1.6,
                     note=f"failed: {error_line(e, with_type=True, limit=80)}")]  # fmt: skip
    if checks is not None:
        checks.append(Check(
            name="fast_check_natgrad_passes",
            claim=f"the timed check_natgrad(mode='fast') finds the healthy SVGP (M = {M}, N = {N}) healthy, every call",
            status=status_of(status_of(reports) and all(bool(r.passed) for r in reports)),
        ))  # fmt: skip
    return [make_row(group, "check_natgrad(mode='fast')", M, t_ours, "NaturalGradient step", t_base, 1.6, note=f"N = {N}")]


def bench_cli(repeats: int, quick: bool, checks: list[Check]) -> list[BenchRow]:
    group = "the command line"
    code = "import sys; from natgrad_diag.cli.app import build_parser; build_parser(); print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=subprocess_env())
    imported = out.stdout.strip() != "False"
    checks.append(Check(
        name="help_imports_no_tensorflow",
        claim="importing natgrad_diag.cli.app and building the parser does not import TensorFlow",
        status=status_of(not imported), detail=out.stderr.strip()[-200:] if out.returncode else "",
    ))  # fmt: skip
    t_help = time_subprocess(cli_command() + ["--help"], max(3, min(repeats, 5)))
    t_py = time_subprocess([sys.executable, "-c", "pass"], max(3, min(repeats, 5)))
    # the target is absolute (≤ 0.3 s): judge the time itself; the ratio to a bare interpreter is context
    rows = [BenchRow(group, "natgrad-diag --help", None, t_help, "python -c pass", t_py,
                     None if t_help is None or not t_py else t_help / t_py, "≤ 0.3 s",
                     None if t_help is None else t_help <= 0.3)]  # fmt: skip
    if quick:
        rows.append(BenchRow(group, "natgrad-diag (explain)", None, None, "python -c 'import gpflow'", None, None,
                             "≤ import + 2 s", None, note="skipped in --quick"))  # fmt: skip
        return rows
    n = max(1, min(repeats, 3))
    t_explain = time_subprocess(cli_command() + ["--plain"], n)
    t_gpflow = time_subprocess([sys.executable, "-c", "import gpflow"], n)
    meets = None if t_explain is None or t_gpflow is None else t_explain <= t_gpflow + 2.0
    rows.append(BenchRow(group, "natgrad-diag (explain)", None, t_explain, "python -c 'import gpflow'", t_gpflow,
                         t_explain / t_gpflow if t_explain is not None and t_gpflow is not None else None,
                         "≤ import + 2 s", meets,
                         note=f"{t_explain - t_gpflow:+.2f} s" if t_explain is not None and t_gpflow is not None else ""))  # fmt: skip
    return rows
