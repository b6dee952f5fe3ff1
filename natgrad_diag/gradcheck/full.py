"""Full mode: central differences for every coordinate against the explicit reverse-mode Jacobian."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from natgrad_diag.autodiff.blocks import BlockJacobian, label
from natgrad_diag.autodiff.dense import jacobian
from natgrad_diag.autodiff.memory import check_memory, jacobian_nbytes
from natgrad_diag.gradcheck.problem import Problem, compare
from natgrad_diag.gradcheck.report import GradientCheckRow
from natgrad_diag.gradcheck.structures import coord_label, coordinates, hint
from natgrad_diag.typing import Array

__all__ = ["full_rows", "reverse_jacobian"]

Coords = list[tuple[tuple[int, ...], ...]]


def reverse_jacobian(fn: Callable[..., Any], inputs: list[Array], **kwargs: Any) -> BlockJacobian:
    """The explicit Jacobian from reverse mode: the derivative ``tape.gradient`` uses and the gradient check checks.

    Forward mode is not the same thing: for a ``tf.custom_gradient`` function ``ForwardAccumulator``
    differentiates the forward computation and ignores the custom gradient.
    """
    # below float64 eagerly, one tape.gradient per row: pfor crashes on a float32 Cholesky gradient (chunks._batched)
    return jacobian(fn, inputs, mode="reverse", compiled=None if inputs[0].dtype == np.float64 else False, **kwargs)


def full_rows(prob: Problem, only: tuple[int, int] | None = None) -> list[GradientCheckRow]:
    """One row per block (or only the block ``only`` = (i, j)), every coordinate compared; refuses, before
    allocating, dense analytical and numerical Jacobians over ``prob.max_bytes``."""
    from natgrad_diag.progress import progress_bar

    inputs_used = range(len(prob.x)) if only is None else [only[1]]
    outputs_used = range(len(prob.y)) if only is None else [only[0]]
    out_shapes, in_shapes = [prob.y[i].shape for i in outputs_used], [prob.x[j].shape for j in inputs_used]
    check_memory(2 * jacobian_nbytes(out_shapes, in_shapes, prob.dtype.itemsize), prob.max_bytes,
                 "the full-mode check (analytical and numerical Jacobians)")
    block_of = _analytical_blocks(prob, only)
    coords = {j: coordinates(prob.x[j].shape, prob.structures[j]) for j in inputs_used}
    total = sum(map(len, coords.values()))
    rows = []
    with progress_bar(total=total, description=f"gradient check (full, {total} coordinates)") as advance:
        for j in inputs_used:
            numer = _numerical_columns(prob, j, coords[j], advance)
            for i in outputs_used:
                ana = _analytical_columns(block_of(i, j), prob.x[j].shape, coords[j])
                rows.append(_block_row(prob, i, j, coords[j], numer[i], ana))
    return rows


def _numerical_columns(prob: Problem, j: int, coords: Coords, advance: Callable[..., None]) -> list[Array]:
    """Per output, [n_out_i, n_coords]: the central difference of the flattened output along each coordinate of x_j."""
    cols: list[list[Array]] = [[] for _ in prob.y]
    for coord in coords:
        d = np.zeros(prob.x[j].shape, prob.dtype)
        for idx in coord:
            d[idx] = 1.0
        for i, dy in enumerate(prob.central(j, d, f"{coord_label(prob.names[j], coord, prob.structures[j])} ± eps")):
            cols[i].append(dy.ravel())
        advance()
    return [np.stack(c, axis=1) for c in cols]  # an input has at least one coordinate


def _analytical_columns(block: Array, in_shape: tuple[int, ...], coords: Coords) -> Array:
    """[n_out, n_coords]: the analytical block contracted with each coordinate's perturbation."""
    flat = block.reshape(-1, int(np.prod(in_shape)))
    return np.stack([sum(flat[:, int(np.ravel_multi_index(idx, in_shape))] for idx in c) for c in coords], axis=1)


def _analytical_blocks(prob: Problem, only: tuple[int, int] | None) -> Callable[[int, int], Array]:
    """``block_of(i, j)``: ∂y_i/∂x_j from reverse mode, for every block or only the block ``only``."""
    if only is None:
        return reverse_jacobian(prob.fn, list(prob.x), max_bytes=prob.max_bytes).block
    i0, j0 = only

    def restricted(xj: Any) -> Any:
        import tensorflow as tf

        xs = [tf.constant(a) for a in prob.x]
        xs[j0] = xj
        return tf.nest.flatten(prob.fn(*xs))[i0]

    block = reverse_jacobian(restricted, [prob.x[j0]], max_bytes=prob.max_bytes).block(0, 0)
    return lambda i, j: block


def _block_row(prob: Problem, i: int, j: int, coords: Coords, num: Array, ana: Array) -> GradientCheckRow:
    """The row of block (i, j) from its numerical and analytical columns [n_out, n_coords]."""
    c = compare(num, ana, rtol=prob.rtol, atol=prob.atol)
    r, col = np.unravel_index(c.worst, num.shape) if num.size else (0, 0)
    out_idx = tuple(int(v) for v in np.unravel_index(r, prob.y[i].shape)) if num.size else ()
    st = prob.structures[j]
    in_label = coord_label(prob.names[j], coords[col], st)
    return GradientCheckRow(
        output=prob.output_names[i], input=prob.names[j], output_index=i, input_index=j, structure=st,
        method=f"central differences, {len(coords)} coordinate(s)" + (" (E_ab + E_ba)" if st == "symmetric" else ""),
        compared=int(num.size), worst_entry=f"∂{label(prob.output_names[i], out_idx)}/∂{in_label}",
        numerical=float(num.flat[c.worst]) if num.size else 0.0,
        analytical=float(ana.flat[c.worst]) if ana.size else 0.0,
        forward=None, max_abs_error=c.max_abs_error, max_rel_error=c.max_rel_error,
        worst_abs_error=c.worst_abs_error, worst_tolerance=c.worst_tolerance, passed=c.passed,
        hint="" if c.passed else hint(st, prob.names[j], prob.x[j]),
    )  # fmt: skip
