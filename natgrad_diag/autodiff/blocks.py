"""The BlockJacobian record: a dense Jacobian in (output, input) blocks, its labels and vech layout."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from natgrad_diag import _compile
from natgrad_diag._validate import input_error, require_finite, shape_str
from natgrad_diag.exceptions import ShapeMismatchError
from natgrad_diag.typing import Array

__all__ = ["BlockJacobian", "element_labels", "label", "vech_layout"]


def label(name: str, idx: Sequence[int]) -> str:
    """``"x[0,1]"`` for the element at ``idx`` of ``x``; ``"x"`` for a scalar (``idx`` empty)."""
    return f"{name}[{','.join(map(str, idx))}]" if len(idx) else name


def element_labels(name: str, shape: Sequence[int]) -> list[str]:
    """``["x[0,0]", "x[0,1]", ...]`` in row-major order; ``["x"]`` for a scalar.

    Examples:
        >>> element_labels("x", (2, 2))
        ['x[0,0]', 'x[0,1]', 'x[1,0]', 'x[1,1]']
        >>> element_labels("loss", ())
        ['loss']
    """
    return [label(name, idx) for idx in np.ndindex(*shape)]


def vech_layout(shape: tuple[int, ...]) -> tuple[Array, Array, int]:
    """Map a symmetric input of ``shape`` [..., M, M] to its vech (lower-triangle) columns.

    Stored column (a, b), a ≥ b, is the derivative along E_ab + E_ba (E_aa on the diagonal); the general blocks are
    ∂y/∂X[a, b] = ∂y/∂X[b, a] = ½ J·(E_ab + E_ba) for a ≠ b, J·E_aa on the diagonal: TensorFlow's (symmetrised)
    Cholesky gradient.

    Returns:
        ``(index, scale, size)``: ``index`` [prod(shape)] gives each general element (..., a, b), row-major, its vech
        column (``np.tril_indices`` order, batch-major); ``scale`` is 1 on the diagonal and ½ off it; ``size`` =
        prod(shape[:-2]) · M(M+1)/2. Element e's general column is ``scale[e] · compact[:, index[e]]``.
    """
    shape = tuple(int(d) for d in shape)

    def build() -> tuple[Array, Array, int]:
        M, batch = shape[-1], int(np.prod(shape[:-2], dtype=np.int64))
        K = M * (M + 1) // 2
        a, b = np.meshgrid(np.arange(M), np.arange(M), indexing="ij")
        hi, lo = np.maximum(a, b), np.minimum(a, b)
        k = (hi * (hi + 1) // 2 + lo).ravel()  # position of (hi, lo) in np.tril_indices(M) order
        index = (np.arange(batch)[:, None] * K + k[None, :]).ravel().astype(np.int64)
        scale = np.tile(np.where(a == b, 1.0, 0.5).ravel(), batch)
        index.setflags(write=False)
        scale.setflags(write=False)
        return index, scale, batch * K

    return cast(tuple[Array, Array, int], _compile.compiled(("vech_layout", shape), build))


def _vech_labels(name: str, shape: tuple[int, ...]) -> list[str]:
    rows, cols = np.tril_indices(shape[-1])
    tril = [(*bidx, a, b) for bidx in np.ndindex(*shape[:-2]) for a, b in zip(rows, cols)]
    return [label(name, i) + ("" if i[-1] == i[-2] else "+" + label("", (*i[:-2], i[-1], i[-2]))) for i in tril]


def _position(k: Any, names: tuple[str, ...], argument: str, side: str) -> int:
    """Block row or column ``k``: a position 0 ≤ k < len(names) or a name that occurs once in ``names``."""
    if isinstance(k, str) and names.count(k) == 1:
        return names.index(k)
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool) and 0 <= k < len(names):
        return int(k)
    raise input_error(f"{argument}={k!r} is not the position or the unique name of an {side}.", argument,
                      f"a position 0 to {len(names) - 1} or a name: " + ", ".join(map(repr, names)), repr(k),
                      f"pass a position in .{side}_names (negative positions are not accepted) or one of its names.")


class _LazyRow(Sequence[Any]):
    """Row i of ``blocks``: block j drawn from the stored matrix on first use (a view for a general input, expanded
    and cached for a vech input)."""

    def __init__(self, n: int, make: Any) -> None:
        self._n, self._make = n, make
        self._blocks: dict[int, Array] = {}

    def __getitem__(self, j: Any) -> Any:
        if isinstance(j, slice):
            return tuple(self[k] for k in range(self._n)[j])
        j = range(self._n)[j]  # negative indices; IndexError past the end
        if j not in self._blocks:
            self._blocks[j] = self._make(j)
        return self._blocks[j]

    def __repr__(self) -> str:
        return f"<{self._n} blocks>"

    def __len__(self) -> int:
        return self._n


@dataclass(frozen=True)
class BlockJacobian:
    """The Jacobian of ``outputs`` with respect to ``inputs``, as a grid of blocks over one stored matrix.

    For outputs y_i (flattened as ``tf.nest.flatten`` does) and inputs x_j, block (i, j) is
    ∂y_i/∂x_j with shape ``y_i.shape + x_j.shape``. The dense matrix stacks the flattened blocks:
    rows are output elements, columns are input elements. Then

        vjp(v)  = Jᵀ·v,   (Jᵀ·v)_j = Σ_i Σ_a v_i[a] ∂y_i[a]/∂x_j          (what output_gradients computes)
        jvp(u)  = J·u,    (J·u)_i  = Σ_j Σ_b ∂y_i/∂x_j[b] u_j[b]
        summed_gradient() = Jᵀ·1                                          (what a seed of ones computes)

    Attributes:
        blocks: ``blocks[i][j]`` = ∂output_i/∂input_j, shape ``output_shapes[i] + input_shapes[j]``.
        output_names, input_names: names used in the labels, e.g. ``("mean", "varsqrt")``.
        output_shapes, input_shapes: the shapes of the outputs and inputs.
        compact: the stored dense matrix [Σ output sizes, Σ stored input columns], read-only (built from
            ``blocks`` when not given; ``blocks`` are views of it when built by :meth:`from_compact`).
        symmetric: one flag per input; ``True``: that input [..., M, M] is stored by its vech columns
            (:func:`vech_layout`).

    Examples:
        >>> import numpy as np
        >>> J = BlockJacobian.from_compact(np.array([[2.0, 0.0], [1.0, 3.0]]), ["y"], ["x"], [(2,)], [(2,)])
        >>> J.vjp([np.array([1.0, 1.0])])  # Jᵀ·1 = column sums
        (array([3., 3.]),)
        >>> J.row_labels, J.col_labels
        (('y[0]', 'y[1]'), ('x[0]', 'x[1]'))
    """

    blocks: Sequence[Sequence[Array]]
    output_names: tuple[str, ...]
    input_names: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    input_shapes: tuple[tuple[int, ...], ...]
    compact: Array = field(default=None, repr=False, compare=False)  # type: ignore[arg-type]
    symmetric: tuple[bool, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.symmetric is None:
            object.__setattr__(self, "symmetric", (False,) * len(self.input_shapes))
        if self.compact is None:  # given as general blocks: stack them
            rows = [np.concatenate([np.reshape(b, (int(np.prod(o)), -1)) for b in row], axis=1) for row, o in zip(self.blocks, self.output_shapes)]
            object.__setattr__(self, "compact", np.concatenate(rows, axis=0))
            self.compact.setflags(write=False)

    @classmethod
    def from_compact(
        cls, compact: Array, output_names: Sequence[str], input_names: Sequence[str],
        output_shapes: Sequence[Sequence[int]], input_shapes: Sequence[Sequence[int]],
        symmetric: Sequence[bool] | None = None,
    ) -> BlockJacobian:  # fmt: skip
        """A BlockJacobian over one dense matrix [Σ output sizes, Σ stored input columns]."""
        in_shapes = tuple(tuple(int(d) for d in s) for s in input_shapes)
        compact = np.asarray(compact).view()  # read-only through this view: the caller's array stays writeable
        compact.setflags(write=False)
        jac = cls(
            blocks=(), output_names=tuple(output_names), input_names=tuple(input_names),
            output_shapes=tuple(tuple(int(d) for d in s) for s in output_shapes), input_shapes=in_shapes,
            compact=compact, symmetric=tuple(bool(s) for s in symmetric) if symmetric is not None else None,
        )
        want = (int(jac._row_offsets[-1]), int(jac._stored_offsets[-1]))
        if compact.shape != want:  # else .block() would hand out a truncated piece
            raise input_error("compact does not have the shape the output and input shapes give.", "compact",
                              f"[{want[0]}, {want[1]}] (Σ output sizes, Σ stored input columns)", shape_str(compact.shape),
                              "pass the matrix with output_shapes and input_shapes that describe it.", kind=ShapeMismatchError)
        rows = [_LazyRow(len(in_shapes), lambda j, i=i: jac._dense_block(i, j)) for i in range(len(output_shapes))]
        object.__setattr__(jac, "blocks", tuple(rows))
        return jac

    def _is_sym(self, j: int) -> bool:
        return bool(self.symmetric and self.symmetric[j])

    @functools.cached_property
    def _row_offsets(self) -> Array:
        return np.concatenate([[0], np.cumsum([int(np.prod(s)) for s in self.output_shapes])]).astype(np.int64)

    @functools.cached_property
    def _stored_offsets(self) -> Array:
        """Offsets of the inputs in the stored (compact) column layout."""
        sizes = [vech_layout(s)[2] if self._is_sym(j) else int(np.prod(s)) for j, s in enumerate(self.input_shapes)]
        return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def _expand(self, j: int, part: Array) -> Array:
        """Input j's stored columns of ``part`` → its general columns (a vech input's: scaled, gathered)."""
        if not self._is_sym(j):
            return part
        index, scale, _ = vech_layout(self.input_shapes[j])
        return part[:, index] * scale

    def _general(self, rows: Array) -> Array:
        """Stored columns of ``rows`` [n, stored] → general columns [n, Σ input sizes] (a view without vech inputs)."""
        if not any(self.symmetric or ()):
            return rows
        off = self._stored_offsets
        return np.concatenate([self._expand(j, rows[:, off[j] : off[j + 1]]) for j in range(len(off) - 1)], axis=1)

    def _dense_block(self, i: int, j: int) -> Array:
        rows, cols = self._row_offsets, self._stored_offsets
        part = self._expand(j, self.compact[rows[i] : rows[i + 1], cols[j] : cols[j + 1]])
        part.setflags(write=False)
        return part.reshape(self.output_shapes[i] + self.input_shapes[j])

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.compact.dtype

    @property
    def shape(self) -> tuple[int, int]:
        """(Σ output sizes, Σ input sizes): the shape of :attr:`matrix` (computed without building it)."""
        return int(self._row_offsets[-1]), sum(int(np.prod(s)) for s in self.input_shapes)

    def block(self, i: int | str, j: int | str) -> Array:
        """∂output_i/∂input_j, shape ``output_shapes[i] + input_shapes[j]``; ``i`` and ``j`` are positions from 0 or
        names (``J.block("mean", "eta1")``), else an :class:`~natgrad_diag.exceptions.InputError` naming them."""
        return self.blocks[_position(i, self.output_names, "i", "output")][_position(j, self.input_names, "j", "input")]

    @functools.cached_property
    def matrix(self) -> Array:
        """[Σ output sizes, Σ input sizes], rows = flattened outputs, columns = flattened inputs.

        For a Jacobian stored with vech columns this expands them (a copy of the general size);
        :attr:`compact` is the stored matrix.
        """
        out = self._general(self.compact)
        out.setflags(write=False)
        return out

    @functools.cached_property
    def row_labels(self) -> tuple[str, ...]:
        """``("mean[0,0]", ..., "varsqrt[0,4,4]")``."""
        return tuple(lab for n, s in zip(self.output_names, self.output_shapes) for lab in element_labels(n, s))

    @functools.cached_property
    def col_labels(self) -> tuple[str, ...]:
        """``("eta1[0,0]", ..., "eta2[0,4,4]")``: the general columns of :attr:`matrix`."""
        return tuple(lab for n, s in zip(self.input_names, self.input_shapes) for lab in element_labels(n, s))

    @functools.cached_property
    def compact_col_labels(self) -> tuple[str, ...]:
        """Labels of the stored columns: ``"eta2[0,3,1]+[0,1,3]"`` is the tangent E₃₁ + E₁₃ of a vech input."""
        return tuple(lab for j, (n, s) in enumerate(zip(self.input_names, self.input_shapes))
                     for lab in (_vech_labels(n, s) if self._is_sym(j) else element_labels(n, s)))

    def _check(self, vectors: Any, shapes: tuple[tuple[int, ...], ...], argument: str, side: str) -> list[Array]:
        if not isinstance(vectors, (list, tuple)):  # one array
            vectors = [vectors]
        if len(vectors) != len(shapes):
            raise input_error(f"{argument} needs one array per {side}.", argument,
                              f"{len(shapes)} array(s): " + ", ".join(map(shape_str, shapes)), f"{len(vectors)} array(s)",
                              f"pass a list with one array per {side}, in order.", kind=ShapeMismatchError)
        out = []
        for k, (v, s) in enumerate(zip(vectors, shapes)):
            if (a := np.asarray(v, dtype=self.dtype)).shape != tuple(s):
                raise input_error(f"{argument}[{k}] has a shape of {shape_str(a.shape)} and {side} {k} has a shape of "
                                  f"{shape_str(s)}.", f"{argument}[{k}]", shape_str(s), shape_str(a.shape),
                                  f"pass an array of exactly the shape of {side} {k} (no broadcasting).",
                                  kind=ShapeMismatchError)
            require_finite(a, f"{argument}[{k}]")  # a NaN or Inf gives NaN products; nd.vjp refuses it too
            out.append(a)
        return out

    def vjp(self, cotangents: Any) -> tuple[Array, ...]:
        """Jᵀ·v by explicit contraction; one cotangent per output, one result per input."""
        vs = self._check(cotangents, self.output_shapes, "cotangents", "output")
        flat = self._general((np.concatenate([a.ravel() for a in vs]) @ self.compact)[None, :])[0]
        offsets = np.cumsum([0] + [int(np.prod(s)) for s in self.input_shapes])
        return tuple(flat[offsets[j] : offsets[j + 1]].reshape(s) for j, s in enumerate(self.input_shapes))

    def jvp(self, tangents: Any) -> tuple[Array, ...]:
        """J·u by explicit contraction; one tangent per input, one result per output."""
        us = self._check(tangents, self.input_shapes, "tangents", "input")
        # a vech coefficient is the scaled sum of the general entries (a, b) and (b, a) that share its column
        layouts = [vech_layout(s) if self._is_sym(j) else None for j, s in enumerate(self.input_shapes)]
        parts = [u.ravel() if lay is None else np.bincount(lay[0], u.ravel() * lay[1], lay[2]).astype(self.dtype)
                 for u, lay in zip(us, layouts)]
        flat = self.compact @ np.concatenate(parts) if parts else np.zeros(self.shape[0], self.dtype)
        return tuple(flat[self._row_offsets[i] : self._row_offsets[i + 1]].reshape(s) for i, s in enumerate(self.output_shapes))

    def summed_gradient(self) -> tuple[Array, ...]:
        """Jᵀ·1: the gradient of the sum of every output element (TensorFlow's default seed)."""
        return self.vjp([np.ones(s, dtype=self.dtype) for s in self.output_shapes])

    def is_diagonal(self, *, atol: float = 0.0) -> bool:
        """True when J is square and every off-diagonal entry is within ``atol`` of zero."""
        if self.shape[0] != self.shape[1]:
            return False
        m = self.matrix
        return bool(np.max(np.abs(m - np.diag(np.diag(m))), initial=0.0) <= atol)

    def row(self, label: str) -> Array:
        """One row of the dense matrix, by its label (``"varsqrt[0,4,0]"``)."""
        try:
            r = self.row_labels.index(label)
        except ValueError:
            raise input_error(f"no output element is labelled {label!r}.", "label",
                              f"one of {self.row_labels[0]!r} ... {self.row_labels[-1]!r}", label,
                              "use a label from .row_labels.") from None
        return cast(Array, self._general(self.compact[r : r + 1])[0])

    def __str__(self) -> str:
        lines = [f"BlockJacobian {self.shape[0]} × {self.shape[1]} ({self.dtype})"]
        if any(self.symmetric or ()):
            lines[0] += f", stored as {self.compact.shape[0]} × {self.compact.shape[1]} (vech columns for symmetric inputs)"
        for on, os_, row in zip(self.output_names, self.output_shapes, self.blocks):
            for inn, is_, b in zip(self.input_names, self.input_shapes, row):
                lines.append(f"  ∂{on}{shape_str(os_)}/∂{inn}{shape_str(is_)}: max |entry| {np.max(np.abs(b), initial=0.0):.4g}")
        return "\n".join(lines)
