"""Full mode: central differences for every coordinate against the explicit reverse-mode Jacobian."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from natgrad_diag.autodiff.blocks import BlockJacobian
from natgrad_diag.autodiff.dense import jacobian
from natgrad_diag.autodiff.memory import check_memory, jacobian_nbytes
from natgrad_diag.gradcheck.problem import Problem, compare
from natgrad_diag.gradcheck.report import GradientCheckRow
from natgrad_diag.gradcheck.structures import coord_label, coordinates, hint, label
from natgrad_diag.typing import Array

__all__ = ["full_rows", "reverse_jacobian"]

def _full_block_columns(
    prob: Problem, j: int, structure: str, eps: float, name: str, advance: Callable[..., None]
) -> tuple[list[tuple[tuple[int, ...], ...]], list[Array]]:
    """Numerical columns for input j: for each coordinate, the central difference of every output (flattened)."""
    coords = coordinates(prob.x[j].shape, structure, name)
    cols: list[list[Array]] = [[] for _ in prob.y]
    for coord in coords:
        d = np.zeros(prob.x[j].shape, prob.dtype)
        for idx in coord:
            d[idx] = 1.0
        diffs = prob.central(j, d, eps, f"{coord_label(name, coord, structure)} ± eps")
        for i, dy in enumerate(diffs):
            cols[i].append(dy.ravel())
        advance()
    # per output: [n_out_i, n_coords]
    numer = [np.stack(c, axis=1) if c else np.zeros((prob.y[i].size, 0), prob.dtype) for i, c in enumerate(cols)]
    return coords, numer


def _analytic_columns(block: Array, in_shape: tuple[int, ...], coords: list[tuple[tuple[int, ...], ...]]) -> Array:
    """[n_out, n_coords]: the analytical block contracted with each coordinate's perturbation."""
    n_out = int(np.prod(block.shape[: block.ndim - len(in_shape)]))
    flat = block.reshape(n_out, -1)
    cols = []
    for coord in coords:
        col = np.zeros(n_out, block.dtype)
        for idx in coord:
            col = col + flat[:, int(np.ravel_multi_index(idx, in_shape)) if in_shape else 0]
        cols.append(col)
    return np.stack(cols, axis=1) if cols else np.zeros((n_out, 0), block.dtype)


def reverse_jacobian(fn: Callable[..., Any], inputs: list[Array], **kwargs: Any) -> BlockJacobian:
    """The explicit Jacobian from reverse mode (a :class:`~natgrad_diag.autodiff.blocks.BlockJacobian`).

    It is the derivative ``tape.gradient`` uses and the gradient check checks.

    Forward mode is not the same thing: for a ``tf.custom_gradient`` function ``ForwardAccumulator``
    differentiates the forward computation and ignores the custom gradient.
    """
    # below float64 eagerly, one tape.gradient per row: TensorFlow 2.21's pfor (tape.jacobian,
    # vectorized_map) crashes the process on a float32 Cholesky gradient
    compiled = None if inputs[0].dtype == np.float64 else False
    return jacobian(fn, inputs, mode="reverse", compiled=compiled, **kwargs)


def full_rows(
    prob: Problem, names: tuple[str, ...], structures: tuple[str, ...], eps: float, rtol: float, atol: float,
    max_bytes: int, only: tuple[int, int] | None = None,
) -> list[GradientCheckRow]:  # fmt: skip
    """One row per block (or only the block ``only`` = (i, j)): every coordinate of each input, compared.

    Refuses, before allocating, when the analytical and numerical dense Jacobians exceed ``max_bytes``.
    """
    from natgrad_diag.progress import progress_bar

    in_shapes = [a.shape for a in prob.x]
    out_shapes = [y.shape for y in prob.y]
    inputs_used = range(len(prob.x)) if only is None else [only[1]]
    outputs_used = range(len(prob.y)) if only is None else [only[0]]
    # the analytical dense Jacobian and the numerical one, before anything is allocated
    need = 2 * jacobian_nbytes([out_shapes[i] for i in outputs_used], [in_shapes[j] for j in inputs_used], prob.dtype.itemsize)
    check_memory(need, max_bytes, "the full-mode check (analytical and numerical Jacobians)")
    block_of = _analytical_blocks(prob, names, max_bytes, only)

    total = sum(len(coordinates(in_shapes[j], structures[j], names[j])) for j in inputs_used)
    rows = []
    with progress_bar(total=total, description=f"gradient check (full, {total} coordinates)") as advance:
        for j in inputs_used:
            coords, numer = _full_block_columns(prob, j, structures[j], eps, names[j], advance)
            for i in outputs_used:
                ana = _analytic_columns(block_of(i, j), in_shapes[j], coords)
                rows.append(_block_row(prob, names, structures, i, j, coords, numer[i], ana, rtol=rtol, atol=atol))
    return rows


def _analytical_blocks(prob: Problem, names: tuple[str, ...], max_bytes: int, only: tuple[int, int] | None) -> Callable[[int, int], Array]:
    """``block_of(i, j)``: ∂y_i/∂x_j from reverse mode, for every block or only the block ``only``."""
    if only is None:
        J = reverse_jacobian(prob.fn, list(prob.x), input_names=names, output_names=prob.output_names, max_bytes=max_bytes)
        return J.block
    i0, j0 = only

    def restricted(xj: Any) -> Any:
        import tensorflow as tf

        xs = [tf.constant(a) for a in prob.x]
        xs[j0] = xj
        return tf.nest.flatten(prob.fn(*xs))[i0]

    Jb = reverse_jacobian(restricted, [prob.x[j0]], max_bytes=max_bytes)
    return lambda i, j: Jb.block(0, 0)


def _block_row(
    prob: Problem, names: tuple[str, ...], structures: tuple[str, ...], i: int, j: int,
    coords: list[tuple[tuple[int, ...], ...]], num: Array, ana: Array, *, rtol: float, atol: float,
) -> GradientCheckRow:  # fmt: skip
    """The row of block (i, j) from its numerical and analytical columns [n_out, n_coords]."""
    c = compare(num, ana, rtol=rtol, atol=atol)
    r, col = np.unravel_index(c.worst, num.shape) if num.size else (0, 0)
    out_idx = tuple(int(v) for v in np.unravel_index(r, prob.y[i].shape)) if num.size else ()
    out_label = label(prob.output_names[i], out_idx)
    in_label = coord_label(names[j], coords[col], structures[j]) if coords else names[j]
    method = f"central differences, {len(coords)} coordinate(s)"
    if structures[j] == "symmetric":
        method += " (E_ab + E_ba)"
    return GradientCheckRow(
        output=prob.output_names[i], input=names[j], output_index=i, input_index=j,
        structure=structures[j], method=method, compared=int(num.size), worst_entry=f"∂{out_label}/∂{in_label}",
        numerical=float(num.flat[c.worst]) if num.size else 0.0,
        analytical=float(ana.flat[c.worst]) if ana.size else 0.0,
        forward=None, max_abs_error=c.max_abs_error, max_rel_error=c.max_rel_error,
        worst_abs_error=c.worst_abs_error, worst_tolerance=c.worst_tolerance, passed=c.passed,
        hint="" if c.passed else hint(structures[j], names[j], prob.x[j]),
    )  # fmt: skip
