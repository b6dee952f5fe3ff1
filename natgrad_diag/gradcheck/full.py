"""Full mode: central differences for every coordinate against the explicit reverse-mode Jacobian."""

from __future__ import annotations

import dataclasses
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
    return jacobian(fn, inputs, mode="reverse", compiled=None if inputs[0].dtype == np.float64 else False,
                    nan_policy="propagate", **kwargs)  # a NaN entry fails its row, with the reason


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
                ana = _analytical_columns(block_of(i, j), coords[j], prob.x[j])
                row = _block_row(prob, i, j, coords[j], *numer[i], *ana)
                rows.append(row if row.passed else _at_smaller_steps(prob, i, j, coords[j], *numer[i], *ana, row))
    return rows


def _at_smaller_steps(
    prob: Problem, i: int, j: int, coords: Coords, num: Array, noise: Array, ana: Array, reach: Array, row: GradientCheckRow
) -> GradientCheckRow:
    """A failed block judged again with the differences taken at eps/10 and eps/100. A difference dominated by its
    O(eps²) truncation error moves when the step shrinks, one off by rounding alone does not (Nocedal & Wright, §8.1):
    where they do not move beyond their rounding bounds, the failure stands; where they agree with the analytical side
    at a smaller step, the block passes there; where that side is off by more than their last move, it fails; else it
    is inconclusive (fn is strongly curved on the scale of eps, e.g. at a near-singular matrix). A smaller step is
    taken only while its rounding bound stays within the block's tolerance at eps, so a pass there is at most twice
    as loose as the check asked (in float32 rounding grows too fast: 5% off passed at eps/100)."""
    noise = noise + 2 * prob.unit * reach
    limit = float(np.max(noise + prob.atol + prob.rtol * np.abs(ana)))
    for k in (1, 2):
        small = prob.at_step(prob.eps / 10**k)
        if not np.all(small.realized(j, np.ones_like(prob.x[j]))):
            break  # x ± eps/10ᵏ rounds to x
        num_k, raw_k = _numerical_columns(small, j, coords, lambda: None)[i]
        noise_k, moved = raw_k + 2 * small.unit * reach, np.abs(num_k - num)
        if k == 1 and np.all(moved <= noise + noise_k):
            return row
        if float(np.max(noise_k)) > limit:
            break  # rounding at this step allows more than the check did at eps
        if (at := _block_row(small, i, j, coords, num_k, raw_k, ana, reach)).passed:
            why = (f"at eps = {prob.eps:g} the central differences are off by their O(eps²) error (beyond rounding they "
                   f"move by up to {float(np.max(moved)):.3g} from eps = {small.eps * 10:g} to {small.eps:g}); there the block agrees.")
            return dataclasses.replace(at, note=f"{why} {at.note}".strip())
        if not compare(num_k, ana, rtol=prob.rtol, atol=prob.atol, rounding=noise_k + moved).passed:
            why = f"At eps = {small.eps:g} the differences still disagree, by more than they moved: not the step's O(eps²) error."
            return dataclasses.replace(row, note=f"{row.note} {why}".strip())
        num, noise = num_k, noise_k
    return dataclasses.replace(row, passed=True, inconclusive=True, hint="", note=(
        f"inconclusive: the central differences move beyond rounding when eps shrinks below {prob.eps:g} (their O(eps²) "
        f"error dominates: fn is strongly curved on the scale of eps here, e.g. near a singular matrix), and no smaller "
        f"step settles them within this check's tolerance; pass a smaller eps (e.g. eps={prob.eps / 1000:g}) in float64, "
        "or check at a better-conditioned point."))


def _numerical_columns(
    prob: Problem, j: int, coords: Coords, advance: Callable[..., None]
) -> list[tuple[Array, Array]]:
    """Per output, two [n_out_i, n_coords]: the central difference of the flattened output along each coordinate of
    x_j, over the step the coordinate really took (:meth:`Problem.realized`), and its rounding bound."""
    cols: list[list[tuple[Array, Array]]] = [[] for _ in prob.y]
    steps = prob.realized(j, np.ones_like(prob.x[j]))  # per entry: a coordinate moves its entries alone (a symmetric
    for coord in coords:  # one moves two equal entries, by equal steps)
        d = np.zeros(prob.x[j].shape, prob.dtype)
        for idx in coord:
            d[idx] = 1.0
        for i, (dy, noise) in enumerate(prob.central(j, d, f"{coord_label(prob.names[j], coord, prob.structures[j])} ± eps")):
            cols[i].append((dy / steps[coord[0]], noise / steps[coord[0]]))
        advance()
    return [tuple(np.stack([pair[k].ravel() for pair in col], axis=1) for k in (0, 1)) for col in cols]


def _analytical_columns(block: Array, coords: Coords, x: Array) -> tuple[Array, Array]:
    """[n_out, n_coords]: the analytical block contracted with each coordinate's perturbation; and [n_out, 1]:
    Σ_k |∂y/∂x_k|·|x_k| per output, the first-order effect of rounding x (and intermediates of its size) by ε·|x|
    in a backward-stable evaluation of fn (Higham 2002, §1.5), which no coordinate's difference escapes."""
    flat = block.reshape(-1, x.size)
    ana = np.stack([sum(flat[:, int(np.ravel_multi_index(idx, x.shape))] for idx in c) for c in coords], axis=1)
    with np.errstate(invalid="ignore"):  # a NaN entry (no derivative) fails its row in compare
        return ana, np.abs(flat) @ np.abs(x.ravel())[:, None]


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


def _block_row(
    prob: Problem, i: int, j: int, coords: Coords, num: Array, noise: Array, ana: Array, reach: Array
) -> GradientCheckRow:
    """The row of block (i, j) from its numerical and analytical columns [n_out, n_coords]; the rounding bound of the
    differences (``noise`` from |fn|, ``reach`` from |x|·|J|, :attr:`Problem.unit`) widens atol."""
    noise = noise + 2 * prob.unit * reach
    c = compare(num, ana, rtol=prob.rtol, atol=prob.atol, rounding=noise)
    unresolved = prob.unresolved(j, ana, noise) if c.passed else ""
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
        hint="" if c.passed else hint(st, prob.names[j], prob.x[j], float(ana.flat[c.worst]), connected=bool(np.any(ana))),
        note=unresolved,
        inconclusive=bool(unresolved),
    )  # fmt: skip
