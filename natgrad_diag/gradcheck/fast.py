"""Fast mode: random directions ⟨v, D_u y⟩ against ⟨Jᵀ·v, u⟩, with a full re-run of a failing block."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from natgrad_diag import _compile
from natgrad_diag._validate import flat_outputs
from natgrad_diag.autodiff.memory import check_memory, memory_limit
from natgrad_diag.gradcheck.full import full_rows
from natgrad_diag.gradcheck.problem import Problem, compare
from natgrad_diag.gradcheck.report import GradientCheckRow
from natgrad_diag.gradcheck.structures import coordinates, gpflow_map_name, hint, random_direction
from natgrad_diag.typing import Array

__all__ = ["MAX_DIRECTIONS", "WHY_MAX_DIRECTIONS", "directions_nbytes", "fast_rows"]

#: Fast mode re-runs full mode on a failing block when it has at most this many input coordinates.
_RERUN_MAX_COORDS = 4096

#: The most direction pairs per block, and why (the refusal's message).
MAX_DIRECTIONS = 1000
WHY_MAX_DIRECTIONS = (
    "A wrong block fails ⟨v, J·u⟩ = ⟨Jᵀ·v, u⟩ for almost every random pair, so more pairs guard only against errors "
    "near the tolerance, and each costs one VJP and two evaluations of fn per input."
)


def _parts(x: Array, structure: str) -> tuple[str, ...]:
    """The parts of an input that get k directions each: a lower-triangular one's strictly upper part gets its own."""
    return ("lower", "upper") if structure == "lower_triangular" and x.shape[-1] > 1 else ("lower",)


def directions_nbytes(prob: Problem, num_directions: int) -> int:
    """Bytes of fast mode's random directions, held at once: k per part of each input, and max(those) cotangents."""
    per_input = [num_directions * len(_parts(x, st)) for x, st in zip(prob.x, prob.structures)]
    entries = sum(n * x.size for n, x in zip(per_input, prob.x)) + max(per_input) * sum(y.size for y in prob.y)
    return int(entries) * prob.dtype.itemsize


def fast_rows(prob: Problem, num_directions: int, seed: int, cotangents: list[Array] | None) -> list[GradientCheckRow]:
    """One row per block from k random (u, v) pairs; a failing block is re-run in full mode to name the entry."""
    check_memory(directions_nbytes(prob, num_directions), memory_limit(), "", title="Fast mode's random directions",
                 argument="num_directions", remedy="pass fewer num_directions (4 is the default).")  # fmt: skip
    rng = np.random.default_rng(seed)
    us = [[random_direction(rng, x.shape, st, prob.dtype, part=p) for p in _parts(x, st) for _ in range(num_directions)]
          for x, st in zip(prob.x, prob.structures)]  # fmt: skip
    vs = [[random_direction(rng, y.shape, "general", prob.dtype) for y in prob.y] if cotangents is None
          else list(cotangents) for _ in range(max(map(len, us)))]  # fmt: skip
    atols = [prob.atol * max(float(np.linalg.norm(v)) if cotangents is not None else 1.0, 1.0) for v in vs[0]]
    try:
        m: _Measured | None = _measure(prob, us, vs, atols, compiled=True)
    except Exception:  # noqa: BLE001 - not traceable, or not finite at a point: the eager run names the cause
        m = None  # and runs outside this handler, so its error does not carry the compiled attempt as context
    if m is None:
        m = _measure(prob, us, vs, atols, compiled=False)
    blocks = np.ndindex(len(prob.y), len(prob.x))
    rows = [_fast_row(prob, i, j, m, len(us[j]), num_directions, atol=atols[i]) for i, j in blocks]
    return [row if row.passed else _rerun_full(prob, row) for row in rows]


@dataclass
class _Measured:
    """[n_out, n_in, n_dirs] arrays of ⟨v, D_u y⟩ (numerical) and its rounding bound (noise, :attr:`Problem.unit`
    times ⟨|v|, |f(x + εu)| + |f(x − εu)|⟩ + 2⟨|Jᵀ·v|, |x|⟩ over u's support), ⟨Jᵀ·v, u⟩ (analytical, u as
    :meth:`Problem.realized`), ⟨v, J·u⟩ (forward)."""

    numerical: Array
    noise: Array
    analytical: Array
    forward: Array
    forward_error: str = ""  # why forward mode is unavailable


class _Engine:
    """fn's pieces for one point (shapes, dtype), compiled (each traced once, called once per direction) or eager;
    only scalars come back: ``analytical`` two [n_dirs, n_out, n_in], ⟨Jᵀ·v, u⟩ and ⟨|Jᵀ·v|, |x|⟩ over u's support
    (one forward pass, one VJP per output and direction), ``central`` ⟨v, f(x + εu_j) − f(x − εu_j)⟩ and
    ⟨|v|, |f(x + εu_j)| + |f(x − εu_j)|⟩ per active input and whether all was finite, ``jvp`` ⟨v_i, J_i·t⟩ by
    forward mode (information only)."""

    def __init__(self, prob: Problem, compiled: bool) -> None:
        import tensorflow as tf

        self.fn, self.compiled = prob.fn, compiled  # not prob: a cached engine keeps no arrays alive
        self.xspecs = [tf.TensorSpec(x.shape, prob.dtype) for x in prob.x]
        self.yspecs = [tf.TensorSpec(y.shape, prob.dtype) for y in prob.y]
        self._built: dict[Any, Any] = {}

    def _outputs(self, xs: list[Any]) -> list[Any]:
        if self.compiled:
            _compile.note_trace("gradcheck_fast")
        return flat_outputs(self.fn(*xs))

    def _piece(self, key: Any, body: Any, *specs: Any) -> Any:
        if key not in self._built:
            self._built[key] = _compile.function(body).get_concrete_function(*specs) if self.compiled else body
        return self._built[key]

    def analytical(self, n_dirs: int) -> Any:
        import tensorflow as tf

        def body(xs: list[Any], vs: list[list[Any]], us: list[list[Any]]) -> Any:
            with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
                tape.watch(xs)
                ys = self._outputs(xs)

            def dot(y: Any, v: Any, uk: list[Any]) -> Any:  # [2, n_in] for one output and direction
                grads = tape.gradient(y, xs, output_gradients=v, unconnected_gradients=tf.UnconnectedGradients.ZERO)
                return tf.stack([[tf.reduce_sum(g * u) for g, u in zip(grads, uk)],
                                 [tf.reduce_sum(abs(g * x) * tf.cast(u != 0, x.dtype)) for g, u, x in zip(grads, uk, xs)]])

            return tf.stack([tf.stack([dot(y, v, uk) for y, v in zip(ys, vk)], axis=1) for vk, uk in zip(vs, us)], axis=1)

        return self._piece(("analytical", n_dirs), body, self.xspecs, [self.yspecs] * n_dirs, [self.xspecs] * n_dirs)

    def central(self, active: tuple[bool, ...]) -> Any:
        import tensorflow as tf

        def body(xs: list[Any], vs: list[Any], xp: list[Any], xm: list[Any]) -> Any:
            num, size, finite = [], [], [tf.constant(True)]
            for j, on in enumerate(active):
                if not on:
                    num.append(tf.zeros([len(vs)], xs[0].dtype))
                    size.append(num[-1])
                    continue
                plus, minus = (self._outputs([xd[j] if k == j else x for k, x in enumerate(xs)]) for xd in (xp, xm))
                num.append(tf.stack([tf.reduce_sum(v * (a - b)) for v, a, b in zip(vs, plus, minus)]))
                size.append(tf.stack([tf.reduce_sum(abs(v) * (abs(a) + abs(b))) for v, a, b in zip(vs, plus, minus)]))
                finite += [tf.reduce_all(tf.math.is_finite(t)) for t in plus + minus]
            return tf.stack(num, axis=1), tf.stack(size, axis=1), tf.reduce_all(tf.stack(finite))

        return self._piece(("central", active), body, self.xspecs, self.yspecs, self.xspecs, self.xspecs)

    def jvp(self) -> Any:
        import tensorflow as tf

        def body(xs: list[Any], tangents: list[Any], vs: list[Any]) -> Any:
            with tf.autodiff.ForwardAccumulator(primals=xs, tangents=tangents) as acc:
                ys = self._outputs(xs)
            jv = [acc.jvp(y, unconnected_gradients=tf.UnconnectedGradients.ZERO) for y in ys]
            return tf.stack([tf.reduce_sum(v * t) for v, t in zip(vs, jv)])

        return self._piece("jvp", body, self.xspecs, self.xspecs, self.yspecs)


def _engine(prob: Problem, compiled: bool) -> _Engine:
    """The engine of ``prob.fn`` at this shape; a compiled one is cached across checks for GPflow's (pure) maps
    only, since a user's function may read Python state that a cached trace would freeze."""
    name = gpflow_map_name(prob.fn)
    if name is None or not compiled:
        return _Engine(prob, compiled)
    key = ("gradcheck_fast", name, tuple(x.shape for x in prob.x), str(prob.dtype))
    return cast(_Engine, _compile.compiled(key, lambda: _Engine(prob, compiled)))


def _measure(
    prob: Problem, us: list[list[Array]], vs: list[list[Array]], atols: list[float], *, compiled: bool
) -> _Measured:
    """:class:`_Engine`'s quantities, then forward mode at each block's worst direction. Compiled: ArithmeticError
    when fn is not finite at a point; eager, the differences are :meth:`Problem.central`'s, which name such a point."""
    import tensorflow as tf

    from natgrad_diag.progress import progress_bar

    n_in, n_out, n_dirs = len(prob.x), len(prob.y), len(vs)
    numerical = np.zeros((n_out, n_in, n_dirs))  # direction k of input j is read only for k < len(us[j])
    noise = np.zeros_like(numerical)
    xs = [tf.constant(a) for a in prob.x]
    eps, step = prob.eps, np.asarray(prob.eps, prob.dtype)
    engine = _engine(prob, compiled)
    u_all = [[us[j][k] if k < len(us[j]) else np.zeros_like(prob.x[j]) for j in range(n_in)] for k in range(n_dirs)]
    v_all = [[tf.constant(v) for v in vk] for vk in vs]
    taken = [[tf.constant(prob.realized(j, u), prob.dtype) for j, u in enumerate(uk)] for uk in u_all]
    ana, reach = np.asarray(engine.analytical(n_dirs)(xs, v_all, taken), np.float64)  # [n_dirs, n_out, n_in] each
    with progress_bar(total=n_dirs, description=f"gradient check (fast, {n_dirs} direction(s))") as advance:
        for k in range(n_dirs):
            active = [j for j in range(n_in) if k < len(us[j])]
            if compiled:
                xp, xm = ([tf.constant(prob.x[j] + sign * step * u_all[k][j]) for j in range(n_in)] for sign in (1, -1))
                num, size, finite = engine.central(tuple(j in active for j in range(n_in)))(xs, v_all[k], xp, xm)
                if not bool(finite):
                    raise ArithmeticError("fn is not finite at a finite-difference point")
                numerical[:, :, k] = num.numpy() / (2 * eps)
                noise[:, :, k] = size.numpy() * prob.unit
                for j in active:
                    noise[:, j, k] += [np.vdot(np.abs(v), f) for v, f in zip(vs[k], prob.measured_noise(j))]
            else:
                for j in active:
                    diffs = prob.central(j, us[j][k], f"{prob.names[j]} ± eps·u (direction {k})")
                    numerical[:, j, k] = [np.vdot(v, d) for v, (d, _) in zip(vs[k], diffs)]
                    noise[:, j, k] = [np.vdot(np.abs(v), r) for v, (_, r) in zip(vs[k], diffs)]
            advance()
    noise += 2 * prob.unit * np.moveaxis(reach, 0, -1)
    m = _Measured(numerical, noise, np.moveaxis(ana, 0, -1), np.full(numerical.shape, np.nan))
    m.forward_error = _forward_at_worst(prob, engine, xs, us, taken, vs, m, atols)
    return m


def _forward_at_worst(
    prob: Problem, engine: _Engine, xs: list[Any], us: list[list[Array]], taken: list[list[Any]],
    vs: list[list[Array]], m: _Measured, atols: list[float],
) -> str:  # fmt: skip
    """Fill ``m.forward`` at each block's worst direction (the one its row reports, by the row's own
    tolerances; ``taken[k][j]`` as :meth:`Problem.realized`); the reason when forward mode fails, else ""."""
    import tensorflow as tf

    todo: dict[tuple[int, int], list[int]] = {}
    for i, j in np.ndindex(len(prob.y), len(prob.x)):
        n = len(us[j])
        num, ana, noise = m.numerical[i, j, :n], m.analytical[i, j, :n], m.noise[i, j, :n]
        k = compare(num, ana, rtol=prob.rtol, atol=atols[i], rounding=noise).worst
        todo.setdefault((j, k), []).append(i)
    try:
        for (j, k), outs in todo.items():
            t = [taken[k][j] if jj == j else tf.zeros_like(x) for jj, x in enumerate(xs)]
            m.forward[outs, j, k] = engine.jvp()(xs, t, [tf.constant(v) for v in vs[k]]).numpy()[outs]
    except Exception as e:  # noqa: BLE001 - forward mode is information only
        return f"forward mode unavailable ({type(e).__name__})."
    return ""


def _fast_row(
    prob: Problem, i: int, j: int, m: _Measured, n_dirs: int, num_directions: int, *, atol: float
) -> GradientCheckRow:
    num, ana, st = m.numerical[i, j, :n_dirs], m.analytical[i, j, :n_dirs], prob.structures[j]
    c = compare(num, ana, rtol=prob.rtol, atol=atol, rounding=m.noise[i, j, :n_dirs])
    unresolved = prob.unresolved(j, ana, m.noise[i, j, :n_dirs]) if c.passed else ""
    k = c.worst
    part = ", strictly upper" if st == "lower_triangular" and k >= num_directions else ""
    method = f"fast: {n_dirs} random direction(s)"
    if st == "lower_triangular" and n_dirs > num_directions:
        method += f" ({num_directions} lower-triangular, {n_dirs - num_directions} strictly upper)"
    elif st == "symmetric":
        method += " (symmetric u)"
    fwd = m.forward[i, j, k]
    return GradientCheckRow(
        output=prob.output_names[i], input=prob.names[j], output_index=i, input_index=j, structure=st, method=method,
        compared=n_dirs, worst_entry=f"⟨v, ∂{prob.output_names[i]}/∂{prob.names[j]}·u⟩, direction {k}{part}",
        numerical=float(num[k]), analytical=float(ana[k]), forward=None if np.isnan(fwd) else float(fwd),
        max_abs_error=c.max_abs_error, max_rel_error=c.max_rel_error, worst_abs_error=c.worst_abs_error,
        worst_tolerance=c.worst_tolerance, passed=c.passed,
        hint="" if c.passed else hint(st, prob.names[j], prob.x[j], float(ana[k]), connected=bool(np.any(ana))),
        note=_join(m.forward_error, unresolved),
        inconclusive=bool(unresolved),
    )  # fmt: skip


def _rerun_full(prob: Problem, row: GradientCheckRow) -> GradientCheckRow:
    """After a fast-mode failure, full mode on that block alone names the worst entry (if small enough)."""
    i, j = row.output_index, row.input_index
    n_coords = len(coordinates(prob.x[j].shape, prob.structures[j]))
    if n_coords > _RERUN_MAX_COORDS or 2 * prob.y[i].size * prob.x[j].size * prob.dtype.itemsize > prob.max_bytes:
        too_large = (f"block too large to re-run in full mode ({n_coords} coordinates); run check_gradients on a "
                     "smaller instance with mode='full' to name the entry.")
        return dataclasses.replace(row, note=_join(row.note, too_large))
    full = full_rows(prob, only=(i, j))[0]
    failed_dir = f"fast mode failed ({row.worst_entry}: error {row.worst_abs_error:.3g} > {row.worst_tolerance:.3g})"
    if full.passed and full.inconclusive:  # full mode could not tell: neither can this block
        return dataclasses.replace(full, method=row.method + f"; then full mode on this block ({full.method})",
                                   note=_join(row.note, f"{failed_dir}; full mode on this block: {full.note}"))
    if full.passed:  # every coordinate agrees: the stronger check wins, the direction was finite-difference error
        return dataclasses.replace(
            row, passed=True, hint="", method=row.method + f"; full mode on this block passed ({full.method})",
            note=_join(row.note, f"{failed_dir}, but full mode on this block passes, so the block passes: along that "
                       "direction the finite difference was dominated by its O(ε²) error (try a smaller eps)."),
        )  # fmt: skip
    return dataclasses.replace(
        full, method=row.method + f"; then full mode on this block ({full.method})",
        note=_join(row.note, f"{failed_dir}; full mode on this block confirms it and names the entry."),
    )  # fmt: skip


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)
