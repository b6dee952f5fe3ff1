"""Fast mode: random directions ⟨v, D_u y⟩ against ⟨Jᵀ·v, u⟩, with a full re-run of a failing block."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.gradcheck.full import full_rows
from natgrad_diag.gradcheck.problem import Problem, compare
from natgrad_diag.gradcheck.report import GradientCheckRow
from natgrad_diag.gradcheck.structures import coordinates, hint, random_direction

__all__ = ["fast_rows"]

#: Fast mode re-runs full mode on a failing block when it has at most this many input coordinates.
_RERUN_MAX_COORDS = 4096


def fast_rows(
    prob: Problem, names: tuple[str, ...], structures: tuple[str, ...], eps: float, rtol: float, atol: float,
    num_directions: int, seed: int, cotangents: list[np.ndarray] | None, max_bytes: int,
) -> list[GradientCheckRow]:  # fmt: skip
    """One row per block from k random (u, v) pairs; a failing block is re-run in full mode to name the entry."""
    rng = np.random.default_rng(seed)
    us = _input_directions(prob, structures, num_directions, rng)
    n_dirs = max(len(d) for d in us)
    if cotangents is not None:
        vs = [list(cotangents) for _ in range(n_dirs)]
    else:
        vs = [[random_direction(rng, y.shape, "general", prob.dtype) for y in prob.y] for _ in range(n_dirs)]
    m = _measure(prob, names, us, vs, eps)

    rows = []
    for i in range(len(prob.y)):
        vnorm = float(np.linalg.norm(vs[0][i])) if cotangents is not None else 1.0
        for j in range(len(prob.x)):
            row = _fast_row(prob, names, structures, i, j, m, len(us[j]), num_directions, rtol=rtol, atol=atol * max(vnorm, 1.0))
            if not row.passed:
                row = _rerun_full(prob, names, structures, eps, rtol, atol, max_bytes, row)
            rows.append(row)
    return rows


def _input_directions(prob: Problem, structures: tuple[str, ...], k: int, rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Per input j a list of unit directions u (lower_triangular: k lower-triangle plus k strictly-upper ones)."""
    us = []
    for x, st in zip(prob.x, structures):
        dirs = [random_direction(rng, x.shape, st, prob.dtype) for _ in range(k)]
        if st == "lower_triangular" and x.shape[-1] > 1:
            dirs += [random_direction(rng, x.shape, st, prob.dtype, part="upper") for _ in range(k)]
        us.append(dirs)
    return us


@dataclass(frozen=True)
class _Measured:
    """[n_out, n_in, n_dirs] arrays of ⟨v, D_u y⟩ (numerical), ⟨Jᵀ·v, u⟩ (analytical), ⟨v, J·u⟩ (forward)."""

    numerical: np.ndarray
    analytical: np.ndarray
    forward: np.ndarray
    forward_error: str  # why forward mode is unavailable ("" when it ran)


def _measure(prob: Problem, names: tuple[str, ...], us: list[list[np.ndarray]], vs: list[list[np.ndarray]], eps: float) -> _Measured:
    """For every direction k: reverse mode ⟨Jᵀ·v, u⟩, central differences ⟨v, D_u y⟩, forward mode ⟨v, J·u⟩."""
    import tensorflow as tf

    from natgrad_diag.progress import progress_bar

    n_in, n_out, n_dirs = len(prob.x), len(prob.y), len(vs)
    numerical, analytical, forward = (np.full((n_out, n_in, n_dirs), np.nan) for _ in range(3))
    forward_error = ""
    xs = [tf.constant(a) for a in prob.x]
    zero = tf.UnconnectedGradients.ZERO
    total = sum(len(d) for d in us)
    with progress_bar(total=total, description=f"gradient check (fast, {n_dirs} direction(s))") as advance:
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch(xs)
            ys = [tf.convert_to_tensor(y) for y in tf.nest.flatten(prob.fn(*xs))]
        for k in range(n_dirs):
            for i in range(n_out):
                grads = tape.gradient(ys[i], xs, output_gradients=tf.constant(vs[k][i]), unconnected_gradients=zero)
                for j in range(n_in):
                    if k < len(us[j]):
                        analytical[i, j, k] = float(np.vdot(grads[j].numpy(), us[j][k]))
            for j in range(n_in):
                if k >= len(us[j]):
                    continue
                diffs = prob.central(j, us[j][k], eps, f"{names[j]} ± eps·u (direction {k})")
                for i in range(n_out):
                    numerical[i, j, k] = float(np.vdot(vs[k][i], diffs[i]))
                if not forward_error:
                    forward_error = _forward_products(prob, xs, j, us[j][k], vs[k], forward[:, j, k])
                advance()
        del tape
    return _Measured(numerical, analytical, forward, forward_error)


def _forward_products(prob: Problem, xs: list[Any], j: int, u: np.ndarray, v: list[np.ndarray], out: np.ndarray) -> str:
    """out[i] = ⟨v_i, J_ij·u⟩ by ForwardAccumulator (information only); the reason when it fails, else ""."""
    import tensorflow as tf

    try:
        with tf.autodiff.ForwardAccumulator(primals=xs[j], tangents=tf.constant(u)) as acc:
            yf = [tf.convert_to_tensor(y) for y in tf.nest.flatten(prob.fn(*xs))]
        for i in range(len(prob.y)):
            jv = acc.jvp(yf[i], unconnected_gradients=tf.UnconnectedGradients.ZERO)
            out[i] = float(np.vdot(v[i], jv.numpy()))
    except Exception as e:  # noqa: BLE001 - forward mode is information only
        return f"forward mode unavailable ({type(e).__name__})."
    return ""


def _fast_row(
    prob: Problem, names: tuple[str, ...], structures: tuple[str, ...], i: int, j: int, m: _Measured,
    n_dirs: int, num_directions: int, *, rtol: float, atol: float,
) -> GradientCheckRow:  # fmt: skip
    """The row of block (i, j) from its ``n_dirs`` directions."""
    num, ana = m.numerical[i, j, :n_dirs], m.analytical[i, j, :n_dirs]
    c = compare(num, ana, rtol=rtol, atol=atol)
    k = c.worst
    part = ", strictly upper" if structures[j] == "lower_triangular" and k >= num_directions else ""
    method = f"fast: {n_dirs} random direction(s)"
    if structures[j] == "lower_triangular" and n_dirs > num_directions:
        method += f" ({num_directions} lower-triangular, {n_dirs - num_directions} strictly upper)"
    elif structures[j] == "symmetric":
        method += " (symmetric u)"
    fwd = m.forward[i, j, k]
    return GradientCheckRow(
        output=prob.output_names[i], input=names[j], output_index=i, input_index=j,
        structure=structures[j], method=method, compared=n_dirs,
        worst_entry=f"⟨v, ∂{prob.output_names[i]}/∂{names[j]}·u⟩, direction {k}{part}",
        numerical=float(num[k]), analytical=float(ana[k]), forward=None if np.isnan(fwd) else float(fwd),
        max_abs_error=c.max_abs_error, max_rel_error=c.max_rel_error, worst_abs_error=c.worst_abs_error,
        worst_tolerance=c.worst_tolerance, passed=c.passed,
        hint="" if c.passed else hint(structures[j], names[j], prob.x[j]), note=m.forward_error,
    )  # fmt: skip


def _rerun_full(
    prob: Problem, names: tuple[str, ...], structures: tuple[str, ...], eps: float, rtol: float, atol: float,
    max_bytes: int, row: GradientCheckRow,
) -> GradientCheckRow:  # fmt: skip
    """After a fast-mode failure, full mode on that block alone names the worst entry (if small enough)."""
    i, j = row.output_index, row.input_index
    n_coords = len(coordinates(prob.x[j].shape, structures[j], names[j]))
    need = 2 * prob.y[i].size * prob.x[j].size * prob.dtype.itemsize
    if n_coords > _RERUN_MAX_COORDS or need > max_bytes:
        return dataclasses.replace(row, note=_join(row.note, (
            f"block too large to re-run in full mode ({n_coords} coordinates); run check_gradients on a smaller "
            "instance with mode='full' to name the entry."
        )))  # fmt: skip
    full = full_rows(prob, names, structures, eps, rtol, atol, max_bytes, only=(i, j))[0]
    failed_dir = f"fast mode failed ({row.worst_entry}: error {row.worst_abs_error:.3g} > {row.worst_tolerance:.3g})"
    if full.passed:  # every coordinate agrees: the stronger check wins, the direction was finite-difference error
        return dataclasses.replace(
            row,
            passed=True, hint="",
            method=row.method + f"; full mode on this block passed ({full.method})",
            note=_join(row.note, f"{failed_dir}, but full mode on this block passes, so the block passes: along that "
                       "direction the finite difference was dominated by its O(ε²) error (try a smaller eps)."),
        )  # fmt: skip
    return dataclasses.replace(
        row,
        worst_entry=full.worst_entry, numerical=full.numerical, analytical=full.analytical, forward=None,
        compared=full.compared, max_abs_error=full.max_abs_error, max_rel_error=full.max_rel_error,
        worst_abs_error=full.worst_abs_error, worst_tolerance=full.worst_tolerance,
        method=row.method + f"; then full mode on this block ({full.method})",
        note=_join(row.note, f"{failed_dir}; full mode on this block confirms it and names the entry."),
    )  # fmt: skip


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)
