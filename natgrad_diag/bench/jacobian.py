"""The benchmark's rows for the natgrad map's Jacobian (against tape.jacobian, vech, memory, fill) and fast gradcheck."""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
from typing import Any

import numpy as np

from natgrad_diag.bench.report import BenchRow
from natgrad_diag.bench.timing import Run, compare, make_row, random_q, subprocess_env
from natgrad_diag.exceptions import error_line
from natgrad_diag.gradcheck.api import check_gradients
from natgrad_diag.report.records import Check, max_abs_diff, status_of
from natgrad_diag.step.jacobian import natgrad_map_jacobian

__all__ = ["bench_check_gradients_fast", "bench_fill", "bench_jacobian", "bench_memory", "bench_vech"]


def natgrad_map_fixture(M: int) -> tuple[Any, Any]:
    """(η₁, η₂) of a random q(u) with L = 1, as tensors."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_expectation

    mu, sq = random_q(M, seed=M)
    return meanvarsqrt_to_expectation(tf.constant(mu), tf.constant(sq))


def tape_jacobian(e1: Any, e2: Any) -> Any:
    """TensorFlow's own Jacobian of the natgrad map, block by block (the baseline)."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    with tf.GradientTape(persistent=True) as tape:
        tape.watch([e1, e2])
        ys = expectation_to_meanvarsqrt(e1, e2)
    return [[tape.jacobian(y, x, unconnected_gradients=tf.UnconnectedGradients.ZERO) for x in (e1, e2)] for y in ys]


def bench_jacobian(run: Run) -> list[BenchRow]:
    """``natgrad_map_jacobian(method="autodiff")`` (``jacobian()``'s own machinery) against ``tape.jacobian``, M = 40."""
    import tensorflow as tf

    M = run.size(40, 10)
    e1, e2 = natgrad_map_fixture(M)
    compiled_tape = tf.function(tape_jacobian)
    ours = functools.partial(natgrad_map_jacobian, e1, e2, method="autodiff")
    t_ours, t_comp = compare(ours, lambda: compiled_tape(e1, e2), run.repeats)
    t_ours2, t_eager = compare(ours, lambda: tape_jacobian(e1, e2), run.few)
    J, ref = ours(), compiled_tape(e1, e2)
    err = max_abs_diff([J.block(i, j) for i in range(2) for j in range(2)], [b for row in ref for b in row])
    run.agree("jacobian_matches_tape", f"the timed natgrad_map_jacobian (vech η₂, mapped back) equals tape.jacobian "
              f"block by block at M = {M}", err, 1e-9)  # fmt: skip
    group = "jacobian() of the natgrad map vs tape.jacobian"
    return [
        run.row(group, "natgrad_map_jacobian", M, t_ours, "tape.jacobian, compiled", t_comp, 1.2),
        run.row(group, "natgrad_map_jacobian", M, t_ours2, "tape.jacobian, eager", t_eager, 3.0, higher_is_better=True),
    ]


def bench_vech(run: Run) -> list[BenchRow]:
    """The closed-form Jacobian, vech η₂ against general, M = 60: time, and stored size (exact: judged at every M)."""
    M = run.size(60, 20)
    e1, e2 = natgrad_map_fixture(M)
    t_v, t_g = compare(lambda: natgrad_map_jacobian(e1, e2), lambda: natgrad_map_jacobian(e1, e2, symmetric=False), run.repeats)
    Jv, Jg = natgrad_map_jacobian(e1, e2), natgrad_map_jacobian(e1, e2, symmetric=False)
    err = max_abs_diff(Jv.matrix, Jg.matrix)
    run.agree("vech_matches_general", f"the vech Jacobian mapped back to general blocks equals the general one at M = {M}", err, 1e-9)
    group = "symmetric (vech) η₂ vs general η₂"
    return [
        run.row(group, "vech Jacobian: time", M, t_v, "general Jacobian", t_g, 0.6),
        make_row(group, "vech Jacobian: stored size", M, float(Jv.compact.nbytes), "general Jacobian",
                 float(Jg.compact.nbytes), 0.6, unit="bytes"),  # fmt: skip
    ]


def peak_memory(M: int, how: str) -> None:
    """Print, as JSON, the peak memory of building the Jacobian (``how``: general, vech or tape) above the process
    baseline: ``VmHWM`` from /proc/self/status, reset after a warm-up. Run in a fresh process by :func:`bench_memory`."""
    import tensorflow as tf

    def status(key: str) -> int | None:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":")), None)

    def build(m: int) -> Any:
        e1, e2 = natgrad_map_fixture(m)
        if how == "tape":
            return [[b.numpy() for b in row] for row in compiled_tape(e1, e2)]
        return natgrad_map_jacobian(e1, e2, symmetric=(how == "vech"), method="autodiff")  # jacobian()'s chunks

    compiled_tape = tf.function(tape_jacobian)
    build(6)  # warm up TensorFlow and our code at a small size
    reset = False
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        reset = True
    baseline = status("VmRSS") if reset else status("VmHWM")
    build(M)  # VmHWM keeps its peak
    cols = (M + M * (M + 1) // 2) if how == "vech" else M + M * M
    print(json.dumps({"baseline": baseline, "peak": status("VmHWM"), "nbytes": (M + M * M) * cols * 8, "reset": reset}))


def bench_memory(run: Run) -> list[BenchRow]:
    """Peak memory of building the dense Jacobian (M = 80) in a fresh subprocess, in Jacobian sizes above the baseline."""
    M, hows = run.size((80, ("general", "vech", "tape")), (30, ("general",)))
    group = "peak memory of the dense Jacobian above the process baseline, in Jacobian sizes"
    names = {"general": "jacobian(), general η₂", "vech": "jacobian(), vech η₂", "tape": "tape.jacobian, compiled"}
    rows = []
    for how in hows:
        code = f"from natgrad_diag.bench.jacobian import peak_memory; peak_memory({M}, {how!r})"
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                                 env=subprocess_env(), check=True)  # fmt: skip
            r = json.loads(out.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, OSError, ValueError, IndexError) as e:
            r = {"error": error_line(e, limit=120)}
        ok = "error" not in r and r.get("peak") is not None
        note = r.get("error", "no /proc") if not ok else "" if r["reset"] else "VmHWM could not be reset"
        rows.append(run.row(group, names[how], M, float(r["peak"] - r["baseline"]) if ok else None, "Jacobian size",
                            float(r["nbytes"]) if ok else None, None if how == "tape" else 1.5, unit="bytes", note=note))  # fmt: skip
    return rows


def bench_fill(run: Run) -> list[BenchRow]:
    """``natgrad_map_jacobian`` (closed form, vech) against ``np.ones`` of its stored array's shape and dtype, M = 60, 100."""
    rows = []
    for n, M in enumerate(run.size((60, 100), (10, 20))):
        e1, e2 = (t.numpy() for t in natgrad_map_fixture(M))
        J = natgrad_map_jacobian(e1, e2)
        shape, dtype = J.compact.shape, J.compact.dtype
        if n == 0:  # against TensorFlow's own Jacobian (the autodiff path), at the smallest size
            A = natgrad_map_jacobian(e1, e2, method="autodiff")
            err = max_abs_diff(J.compact, A.compact) / max(1.0, float(np.max(np.abs(A.compact))))
            run.agree("closed_form_jacobian_matches_autodiff", f"the timed closed-form natgrad_map_jacobian equals "
                      f"TensorFlow's (method='autodiff') at M = {M}, and its array has the baseline's shape and dtype at "
                      "every M", err, 1e-10)  # fmt: skip
        del J
        t_ours, t_base = compare(lambda: natgrad_map_jacobian(e1, e2), lambda: np.ones(shape, dtype), run.few)
        rows.append(run.row("the O(M⁴) closed-form Jacobian vs writing its array", "natgrad_map_jacobian", M, t_ours,
                            "filling its array", t_base, 4.0, note=f"{np.prod(shape) * np.dtype(dtype).itemsize / 1024**2:.1f} MiB"))  # fmt: skip
    return rows


def bench_check_gradients_fast(run: Run) -> list[BenchRow]:
    """check_gradients(mode='fast') on natural_to_meanvarsqrt (M = 1000) against one compiled f and VJP, tracing
    included on both sides: every timed call traces afresh (a new function object, a new tf.function)."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import natural_to_meanvarsqrt

    M = run.size(1000, 50)
    mu, sq = random_q(M, seed=M)
    prec = np.linalg.inv(sq[0] @ sq[0].T)
    nat1, nat2 = prec @ mu, (-0.25 * (prec + prec.T))[None]  # θ = (S⁻¹m, −½S⁻¹), θ₂ exactly symmetric
    rng = np.random.default_rng(M)
    v = [tf.constant(rng.normal(size=(M, 1))), tf.constant(rng.normal(size=(1, M, M)))]
    reports = []

    def ours() -> None:  # a new function object: not in the compile cache, so it is traced in the call
        reports.append(check_gradients(lambda a, b: natural_to_meanvarsqrt(a, b), [nat1, nat2],
                                       structure=("general", "symmetric"), mode="fast"))  # fmt: skip

    def base() -> Any:
        @tf.function
        def f_vjp(a: Any, b: Any) -> Any:
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                ys = natural_to_meanvarsqrt(a, b)
            return tape.gradient(ys, [a, b], output_gradients=v)

        return [g.numpy() for g in f_vjp(tf.constant(nat1), tf.constant(nat2))]

    t_ours, t_base = compare(ours, base, run.size(1, run.repeats), warm_up=False)
    run.checks.append(Check("fast_gradcheck_passes_on_gpflow", f"the timed fast-mode check_gradients passes every block of "
                        f"GPflow's natural_to_meanvarsqrt at M = {M} (reverse mode agrees with central differences along "
                        "each random direction)", status_of(reports and all(r.passed and len(r.rows) == 4 for r in reports))))  # fmt: skip
    group = "fast-mode check_gradients vs one compiled f and VJP (natural_to_meanvarsqrt, tracing included)"
    return [run.row(group, "check_gradients(mode='fast')", M, t_ours, "one compiled f and VJP", t_base, 15.0, note="L = 1")]
