"""The explicit Jacobian of a function of several tensors, in blocks, with labels and contractions.

For outputs y_i (flattened as ``tf.nest.flatten`` does) and inputs x_j, block (i, j) is
∂y_i/∂x_j with shape ``y_i.shape + x_j.shape``. The dense matrix stacks the flattened blocks:
rows are output elements, columns are input elements. Then

    vjp(v)  = Jᵀ·v,   (Jᵀ·v)_j = Σ_i Σ_a v_i[a] ∂y_i[a]/∂x_j          (what output_gradients computes)
    jvp(u)  = J·u,    (J·u)_i  = Σ_j Σ_b ∂y_i/∂x_j[b] u_j[b]
    summed_gradient() = Jᵀ·1                                          (what a seed of ones computes)

How it is computed (fast and memory-bounded):

* The matrix is built in row chunks (reverse mode, Eᵀ·J: ``tape.gradient`` with one-hot seeds, the
  default) or column chunks (forward mode, J·E for basis tangents E: used when vech columns make it
  the one with fewer passes), batched with ``tf.vectorized_map`` inside a ``tf.function`` that is
  traced once per (function, input shapes and dtypes, options) and cached. Each chunk is written into
  one preallocated array, so the peak memory is the Jacobian plus one chunk's intermediates (about
  1.1-1.3× in all, measured at M = 80), not the 3-4× of ``tape.jacobian``'s all-at-once pfor.
* A first call with a small Jacobian (≤ 64 rows) runs eagerly, one ``tape.gradient`` per row: tracing
  would cost more than it saves. Outside float64, chunks loop with ``tf.map_fn`` instead of pfor
  (TensorFlow 2.21's pfor segfaults on a float32 Cholesky gradient).
* A symmetric input X [..., M, M] (``symmetric=``) is parameterised by its lower triangle (vech):
  column (a, b), a ≥ b, is the derivative along the symmetric tangent E_ab + E_ba (E_aa on the
  diagonal), so the stored matrix has M(M+1)/2 instead of M² columns for it. The general-shaped
  blocks are recovered on demand as the symmetrised general Jacobian,
  ∂y/∂X[a, b] = ∂y/∂X[b, a] = ½ J·(E_ab + E_ba) for a ≠ b and J·E_aa on the diagonal, which is
  exactly what TensorFlow's (symmetrised) Cholesky gradient gives. The natural-gradient map uses
  this for η₂ by default (Salimbeni et al., AISTATS 2018: η₂ = S + m mᵀ is symmetric).
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from natgrad_diag._validate import shape_str
from natgrad_diag.exceptions import InputError, MemoryLimitError, ShapeMismatchError

__all__ = [
    "BlockJacobian",
    "DEFAULT_MAX_BYTES",
    "check_memory",
    "element_labels",
    "jacobian",
    "jacobian_nbytes",
    "natgrad_map_jacobian",
    "trace_count",
    "vech_layout",
]

#: Default limit for a dense Jacobian: 2 GiB.
DEFAULT_MAX_BYTES = 2 * 1024**3

#: Memory for one chunk's result when ``chunk_size`` is not given: 1/32 of the Jacobian, within these
#: bounds. While a chunk is computed, pfor holds several intermediates of about the chunk's size (up to
#: ~8 in forward mode through a Cholesky), so the peak stays near the Jacobian plus a quarter of it.
_CHUNK_FRACTION = 32
_CHUNK_BYTES_MIN = 4 * 1024**2
_CHUNK_BYTES_MAX = 16 * 1024**2
#: ... but at least this many columns (rows) per chunk: fewer make the per-call overhead dominate.
_CHUNK_MIN = 128


def element_labels(name: str, shape: Sequence[int]) -> list[str]:
    """``["x[0,0]", "x[0,1]", ...]`` in row-major order; ``["x"]`` for a scalar."""
    if len(shape) == 0:
        return [name]
    return [f"{name}[{','.join(map(str, idx))}]" for idx in np.ndindex(*shape)]


def jacobian_nbytes(output_shapes: Sequence[Sequence[int]], input_shapes: Sequence[Sequence[int]], itemsize: int) -> int:
    """Bytes of the dense Jacobian: (Σ output sizes) · (Σ input sizes) · itemsize."""
    rows = sum(int(np.prod(s)) for s in output_shapes)
    cols = sum(int(np.prod(s)) for s in input_shapes)
    return rows * cols * itemsize


def _gib(n: int) -> str:
    return f"{n / 1024**3:.3g} GiB" if n >= 1024**3 else f"{n / 1024**2:.3g} MiB"


def check_memory(nbytes: int, max_bytes: int, what: str) -> None:
    """Refuse, before allocating, a dense Jacobian larger than ``max_bytes``."""
    if nbytes > max_bytes:
        raise MemoryLimitError(
            f"the dense Jacobian for {what} would need {_gib(nbytes)}, over the limit of {_gib(max_bytes)}.",
            context=[("Estimated size", f"{nbytes} bytes ({_gib(nbytes)})"), ("Limit (max_bytes)", f"{max_bytes} bytes")],
            remedy="use mode='fast' (matrix-free, no dense Jacobian), or raise max_bytes if you have the memory.",
        )


# --------------------------------------------------------------------------------------------------
# vech layout of a symmetric input


@functools.lru_cache(maxsize=64)
def vech_layout(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    """Map a symmetric input of ``shape`` [..., M, M] to its vech (lower-triangle) columns.

    Returns:
        ``(index, scale, size)``: ``index`` [prod(shape)] gives, for each general element
        (..., a, b) in row-major order, its vech column k(max(a, b), min(a, b)) (lower triangle in
        ``np.tril_indices`` order, batch-major); ``scale`` [prod(shape)] is 1 on the diagonal and ½
        off it; ``size`` = prod(shape[:-2]) · M(M+1)/2. Then the general-shaped Jacobian column of
        element e is ``scale[e] · compact[:, index[e]]`` and a symmetric tangent for vech column k
        is ``onehot(k)[index]`` (E_ab + E_ba).
    """
    M = shape[-1]
    batch = int(np.prod(shape[:-2], dtype=np.int64))
    K = M * (M + 1) // 2
    a, b = np.meshgrid(np.arange(M), np.arange(M), indexing="ij")
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    k = (hi * (hi + 1) // 2 + lo).ravel()  # position of (hi, lo) in np.tril_indices(M) order
    index = (np.arange(batch)[:, None] * K + k[None, :]).ravel().astype(np.int64)
    scale = np.tile(np.where(a == b, 1.0, 0.5).ravel(), batch)
    for arr in (index, scale):
        arr.setflags(write=False)
    return index, scale, batch * K


def _vech_labels(name: str, shape: tuple[int, ...]) -> list[str]:
    M = shape[-1]
    rows, cols = np.tril_indices(M)
    out = []
    for bidx in np.ndindex(*shape[:-2]):
        pre = ",".join(map(str, bidx + ()))
        for a, b in zip(rows, cols):
            idx = f"{pre},{a},{b}" if pre else f"{a},{b}"
            out.append(f"{name}[{idx}]" if a == b else f"{name}[{idx}]+[{(pre + ',') if pre else ''}{b},{a}]")
    return out


class _BlockGrid(Sequence):
    """``blocks[i][j]`` drawn from a dense store: views for general inputs, expanded (and cached) for
    vech inputs. Behaves like a tuple of tuples of arrays."""

    def __init__(self, jac: BlockJacobian) -> None:
        self._jac = jac
        self._rows = tuple(_BlockRow(jac, i) for i in range(len(jac.output_shapes)))

    def __getitem__(self, i: Any) -> Any:
        return self._rows[i]

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"<blocks {len(self._jac.output_shapes)} × {len(self._jac.input_shapes)}>"


class _BlockRow(Sequence):
    def __init__(self, jac: BlockJacobian, i: int) -> None:
        self._jac, self._i = jac, i
        self._cache: dict[int, np.ndarray] = {}

    def __getitem__(self, j: Any) -> Any:
        if isinstance(j, slice):
            return tuple(self[k] for k in range(len(self))[j])
        n = len(self)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(j)
        if j not in self._cache:
            self._cache[j] = self._jac._dense_block(self._i, j)
        return self._cache[j]

    def __len__(self) -> int:
        return len(self._jac.input_shapes)


@dataclass(frozen=True)
class BlockJacobian:
    """The Jacobian of ``outputs`` with respect to ``inputs``, as a grid of blocks.

    Attributes:
        blocks: ``blocks[i][j]`` = ∂output_i/∂input_j, shape ``output_shapes[i] + input_shapes[j]``.
        output_names, input_names: names used in the labels, e.g. ``("mean", "varsqrt")``.
        output_shapes, input_shapes: the shapes of the outputs and inputs.
        compact: the stored dense matrix [Σ output sizes, Σ stored input columns] when built by
            :func:`jacobian` (read-only; ``blocks`` are views of it), else ``None``.
        symmetric: one flag per input; ``True`` means that input [..., M, M] is stored by its vech
            columns (symmetric tangents E_ab + E_ba), and its general-shaped blocks are the
            symmetrised general Jacobian.
    """

    blocks: Sequence[Sequence[np.ndarray]]
    output_names: tuple[str, ...]
    input_names: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    input_shapes: tuple[tuple[int, ...], ...]
    compact: np.ndarray | None = field(default=None, repr=False, compare=False)
    symmetric: tuple[bool, ...] | None = field(default=None, compare=False)

    @classmethod
    def from_compact(
        cls,
        compact: np.ndarray,
        output_names: Sequence[str],
        input_names: Sequence[str],
        output_shapes: Sequence[Sequence[int]],
        input_shapes: Sequence[Sequence[int]],
        symmetric: Sequence[bool] | None = None,
    ) -> BlockJacobian:
        """A BlockJacobian over one dense matrix [Σ output sizes, Σ stored input columns]."""
        in_shapes = tuple(tuple(int(d) for d in s) for s in input_shapes)
        sym = tuple(bool(s) for s in symmetric) if symmetric is not None else (False,) * len(in_shapes)
        compact.setflags(write=False)
        jac = cls(
            blocks=(),
            output_names=tuple(output_names),
            input_names=tuple(input_names),
            output_shapes=tuple(tuple(int(d) for d in s) for s in output_shapes),
            input_shapes=in_shapes,
            compact=compact,
            symmetric=sym,
        )
        object.__setattr__(jac, "blocks", _BlockGrid(jac))
        return jac

    # ---- layout of the stored matrix -------------------------------------------------------------

    def _is_sym(self, j: int) -> bool:
        return bool(self.symmetric and self.symmetric[j])

    @functools.cached_property
    def _row_offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([int(np.prod(s)) for s in self.output_shapes])]).astype(np.int64)

    @functools.cached_property
    def _col_offsets(self) -> np.ndarray:
        """Offsets of the inputs in the general column layout (Σ input sizes)."""
        return np.concatenate([[0], np.cumsum([int(np.prod(s)) for s in self.input_shapes])]).astype(np.int64)

    @functools.cached_property
    def _stored_offsets(self) -> np.ndarray:
        """Offsets of the inputs in the stored (compact) column layout."""
        sizes = [vech_layout(s)[2] if self._is_sym(j) else int(np.prod(s)) for j, s in enumerate(self.input_shapes)]
        return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def _expand_columns(self, part: np.ndarray, j: int) -> np.ndarray:
        """Stored columns of input j (any rows) → general columns (a copy for a vech input)."""
        if not self._is_sym(j):
            return part
        index, scale, _ = vech_layout(self.input_shapes[j])
        return part[:, index] * scale

    def _dense_block(self, i: int, j: int) -> np.ndarray:
        r0, r1 = self._row_offsets[i], self._row_offsets[i + 1]
        c0, c1 = self._stored_offsets[j], self._stored_offsets[j + 1]
        part = self._expand_columns(self.compact[r0:r1, c0:c1], j)
        if self._is_sym(j):
            part.setflags(write=False)
        return part.reshape(self.output_shapes[i] + self.input_shapes[j])

    # ---- public API ------------------------------------------------------------------------------

    @property
    def dtype(self) -> np.dtype:
        if self.compact is not None:
            return self.compact.dtype
        return self.blocks[0][0].dtype

    @property
    def shape(self) -> tuple[int, int]:
        """(Σ output sizes, Σ input sizes): the shape of :attr:`matrix` (computed without building it)."""
        return int(self._row_offsets[-1]), int(self._col_offsets[-1])

    def block(self, i: int, j: int) -> np.ndarray:
        """∂output_i/∂input_j, shape ``output_shapes[i] + input_shapes[j]``."""
        return self.blocks[i][j]

    @functools.cached_property
    def matrix(self) -> np.ndarray:
        """[Σ output sizes, Σ input sizes], rows = flattened outputs, columns = flattened inputs.

        For a Jacobian stored with vech columns this expands them (a copy of the general size);
        :attr:`compact` is the stored matrix.
        """
        if self.compact is not None:
            if not any(self.symmetric or ()):
                return self.compact
            parts = [
                self._expand_columns(self.compact[:, self._stored_offsets[j] : self._stored_offsets[j + 1]], j)
                for j in range(len(self.input_shapes))
            ]
            out = np.concatenate(parts, axis=1)
            out.setflags(write=False)
            return out
        rows = []
        for i, oshape in enumerate(self.output_shapes):
            n_out = int(np.prod(oshape))
            rows.append(np.concatenate([self.blocks[i][j].reshape(n_out, -1) for j in range(len(self.input_shapes))], axis=1))
        return np.concatenate(rows, axis=0)

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
        out: list[str] = []
        for j, (n, s) in enumerate(zip(self.input_names, self.input_shapes)):
            out.extend(_vech_labels(n, s) if self._is_sym(j) else element_labels(n, s))
        return tuple(out)

    def _check(self, vectors: Any, shapes: tuple[tuple[int, ...], ...], argument: str, side: str) -> list[np.ndarray]:
        if isinstance(vectors, np.ndarray) or not isinstance(vectors, (list, tuple)):
            vectors = [vectors]
        if len(vectors) != len(shapes):
            raise ShapeMismatchError(
                f"{argument} needs one array per {side}.",
                context=[("Argument", argument), ("Expected", f"{len(shapes)} array(s): " + ", ".join(map(shape_str, shapes))), ("Actual", f"{len(vectors)} array(s)")],
                remedy=f"pass a list with one array per {side}, in order.",
            )
        out = []
        for k, (v, s) in enumerate(zip(vectors, shapes)):
            a = np.asarray(v, dtype=self.dtype)
            if a.shape != tuple(s):
                raise ShapeMismatchError(
                    f"{argument}[{k}] has a shape of {shape_str(a.shape)} and {side} {k} has a shape of {shape_str(s)}.",
                    context=[("Argument", f"{argument}[{k}]"), ("Expected", shape_str(s)), ("Actual", shape_str(a.shape))],
                    remedy=f"pass an array of exactly the shape of {side} {k} (no broadcasting).",
                )
            out.append(a)
        return out

    def vjp(self, cotangents: Any) -> tuple[np.ndarray, ...]:
        """Jᵀ·v by explicit contraction; one cotangent per output, one result per input."""
        vs = self._check(cotangents, self.output_shapes, "cotangents", "output")
        if self.compact is not None:
            v = np.concatenate([a.ravel() for a in vs])
            stored = v @ self.compact
            result = []
            for j, ishape in enumerate(self.input_shapes):
                part = stored[self._stored_offsets[j] : self._stored_offsets[j + 1]]
                result.append(self._expand_columns(part[None, :], j)[0].reshape(ishape))
            return tuple(result)
        result = []
        for j, ishape in enumerate(self.input_shapes):
            acc = np.zeros(ishape, dtype=self.dtype)
            for i, v in enumerate(vs):
                acc = acc + np.tensordot(v, self.blocks[i][j], axes=v.ndim)
            result.append(acc)
        return tuple(result)

    def jvp(self, tangents: Any) -> tuple[np.ndarray, ...]:
        """J·u by explicit contraction; one tangent per input, one result per output."""
        us = self._check(tangents, self.input_shapes, "tangents", "input")
        if self.compact is not None:
            parts = []
            for j, u in enumerate(us):
                if self._is_sym(j):
                    # Σ_ab ½(D_ab)(u_ab) over both (a, b) and (b, a): the vech coefficient is the
                    # scaled sum of the general entries that share a column.
                    index, scale, size = vech_layout(self.input_shapes[j])
                    parts.append(np.bincount(index, weights=u.ravel() * scale, minlength=size).astype(self.dtype))
                else:
                    parts.append(u.ravel())
            flat = self.compact @ np.concatenate(parts) if parts else np.zeros(self.shape[0], self.dtype)
            return tuple(
                flat[self._row_offsets[i] : self._row_offsets[i + 1]].reshape(s) for i, s in enumerate(self.output_shapes)
            )
        result = []
        for i, oshape in enumerate(self.output_shapes):
            acc = np.zeros(oshape, dtype=self.dtype)
            for j, u in enumerate(us):
                b = self.blocks[i][j]
                acc = acc + np.tensordot(b, u, axes=(list(range(len(oshape), b.ndim)), list(range(u.ndim))))
            result.append(acc)
        return tuple(result)

    def summed_gradient(self) -> tuple[np.ndarray, ...]:
        """Jᵀ·1: the gradient of the sum of every output element (TensorFlow's default seed)."""
        return self.vjp([np.ones(s, dtype=self.dtype) for s in self.output_shapes])

    def is_diagonal(self, *, atol: float = 0.0) -> bool:
        """True when J is square and every off-diagonal entry is within ``atol`` of zero."""
        if self.shape[0] != self.shape[1]:
            return False
        m = self.matrix
        off = m - np.diag(np.diag(m))
        return bool(np.max(np.abs(off), initial=0.0) <= atol)

    def row(self, label: str) -> np.ndarray:
        """One row of the dense matrix, by its label (``"varsqrt[0,4,0]"``)."""
        try:
            r = self.row_labels.index(label)
        except ValueError:
            raise InputError(
                f"no output element is labelled {label!r}.",
                context=[("Argument", "label"), ("Expected", f"one of {self.row_labels[0]!r} ... {self.row_labels[-1]!r}"), ("Got", label)],
                remedy="use a label from .row_labels.",
            ) from None
        if self.compact is not None:
            return np.concatenate([
                self._expand_columns(self.compact[r : r + 1, self._stored_offsets[j] : self._stored_offsets[j + 1]], j)[0]
                for j in range(len(self.input_shapes))
            ])  # fmt: skip
        return self.matrix[r]

    def __str__(self) -> str:
        rows, cols = self.shape
        lines = [f"BlockJacobian {rows} × {cols} ({self.dtype})"]
        if self.compact is not None and any(self.symmetric or ()):
            lines[0] += f", stored as {self.compact.shape[0]} × {self.compact.shape[1]} (vech columns for symmetric inputs)"
        for i, (on, os_) in enumerate(zip(self.output_names, self.output_shapes)):
            for j, (inn, is_) in enumerate(zip(self.input_names, self.input_shapes)):
                b = self.blocks[i][j]
                lines.append(f"  ∂{on}{shape_str(os_)}/∂{inn}{shape_str(is_)}: max |entry| {np.max(np.abs(b), initial=0.0):.4g}")
        return "\n".join(lines)


def _names(given: Sequence[str] | None, count: int, prefix: str, argument: str) -> tuple[str, ...]:
    if given is None:
        return tuple(f"{prefix}{k}" for k in range(count))
    given = tuple(given)
    if len(given) != count:
        raise InputError(
            f"{argument} must name each of the {count} {prefix == 'x' and 'inputs' or 'outputs'}.",
            context=[("Argument", argument), ("Expected", f"{count} names"), ("Got", f"{len(given)}: {given}")],
            remedy=f"pass {count} names, or leave {argument}=None.",
        )
    return given


# --------------------------------------------------------------------------------------------------
# Compiled chunk functions, traced once per (fn, input specs, options) and cached.

_TRACE_COUNTS: collections.Counter[str] = collections.Counter()
_CACHE: collections.OrderedDict[Any, _Compiled] = collections.OrderedDict()
_CACHE_SIZE = 32
_LOCK = threading.Lock()


def trace_count() -> int:
    """How many times a compiled Jacobian chunk function has been traced in this process (for tests:
    repeated calls with the same function, shapes and options must not add to it)."""
    return _TRACE_COUNTS["jacobian_chunk"]


@dataclass
class _Compiled:
    fn: Any  # kept alive so that id(fn) in the key cannot be reused
    chunk_fn: Any  # tf.function(*inputs, start) -> [chunk, other dimension]
    forward: bool
    chunk: int


def _input_signature(xs: Sequence[Any]) -> tuple[Any, ...]:
    import tensorflow as tf

    return tuple(tf.TensorSpec(x.shape, x.dtype) for x in xs)


def _build_chunk_fn(
    fn: Callable[..., Any],
    xs: Sequence[Any],
    out_shapes: tuple[tuple[int, ...], ...],
    sym: tuple[bool, ...],
    forward: bool,
    chunk: int,
) -> Any:
    """A tf.function computing ``chunk`` columns (forward) or rows (reverse) of the stored matrix.

    Forward: for stored columns k = start … start+chunk-1 the tangents are basis vectors (for a vech
    input the symmetric E_ab + E_ba), pushed through ``ForwardAccumulator`` and batched with
    ``tf.vectorized_map``; returns [chunk, Σ output sizes] (row c is column start+c of J).
    Reverse: the cotangents are one-hot rows, pulled back with ``tape.gradient`` and batched the
    same way; vech inputs are folded (g_ab + g_ba); returns [chunk, Σ stored input columns].
    Indices past the end give zero tangents (zero rows), so every call has the same shape.
    """
    import tensorflow as tf

    dtype = xs[0].dtype
    in_shapes = [tuple(x.shape.as_list()) for x in xs]
    in_sizes = [int(np.prod(s)) for s in in_shapes]
    stored_sizes = [vech_layout(s)[2] if sy else n for s, sy, n in zip(in_shapes, sym, in_sizes)]
    out_sizes = [int(np.prod(s)) for s in out_shapes]
    n_stored, n_out = int(sum(stored_sizes)), int(sum(out_sizes))
    zero = tf.UnconnectedGradients.ZERO
    layouts = [vech_layout(s) if sy else None for s, sy in zip(in_shapes, sym)]

    def batched(one: Callable[[Any], Any], elems: Any, width: int) -> Any:
        # pfor (vectorized_map) in float64; a tf.map_fn loop otherwise, because TensorFlow 2.21's pfor
        # crashes the process (SIGSEGV) on a float32 Cholesky gradient
        if dtype == tf.float64:
            return tf.vectorized_map(one, elems)
        return tf.map_fn(one, elems, fn_output_signature=tf.TensorSpec([width], dtype))

    def flat_outputs(ys: Any) -> list[Any]:
        return [tf.convert_to_tensor(y) for y in tf.nest.flatten(ys)]

    def forward_chunk(*args: Any) -> Any:
        _TRACE_COUNTS["jacobian_chunk"] += 1
        inputs, start = list(args[:-1]), args[-1]
        E = tf.one_hot(start + tf.range(chunk), depth=n_stored, dtype=dtype)  # [chunk, n_stored]
        parts = tf.split(E, stored_sizes, axis=1) if len(stored_sizes) > 1 else [E]
        tangents = []
        for p, s, lay in zip(parts, in_shapes, layouts):
            if lay is not None:
                p = tf.gather(p, lay[0], axis=1)  # E_ab + E_ba
            tangents.append(tf.reshape(p, (chunk,) + s))

        def one(ts: Any) -> Any:
            with tf.autodiff.ForwardAccumulator(inputs, list(ts)) as acc:
                ys = flat_outputs(fn(*inputs))
            cols = [tf.reshape(acc.jvp(y, unconnected_gradients=zero), [-1]) for y in ys]
            return tf.concat(cols, axis=0) if len(cols) > 1 else cols[0]

        return batched(one, tuple(tangents), n_out)

    def reverse_chunk(*args: Any) -> Any:
        _TRACE_COUNTS["jacobian_chunk"] += 1
        inputs, start = list(args[:-1]), args[-1]
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch(inputs)
            ys = flat_outputs(fn(*inputs))
        V = tf.one_hot(start + tf.range(chunk), depth=n_out, dtype=dtype)  # [chunk, n_out]
        parts = tf.split(V, out_sizes, axis=1) if len(out_sizes) > 1 else [V]
        cots = tuple(tf.reshape(p, (chunk,) + s) for p, s in zip(parts, out_shapes))

        def one(vs: Any) -> Any:
            gs = tape.gradient(ys, inputs, output_gradients=list(vs), unconnected_gradients=zero)
            return tf.concat([tf.reshape(g, [-1]) for g in gs], axis=0) if len(gs) > 1 else tf.reshape(gs[0], [-1])

        rows = batched(one, cots, int(sum(in_sizes)))  # [chunk, Σ input sizes]
        if not any(sym):
            return rows
        pieces = tf.split(rows, in_sizes, axis=1) if len(in_sizes) > 1 else [rows]
        folded = []
        for p, lay in zip(pieces, layouts):
            if lay is not None:  # stored column k = Σ of the general entries (a, b), (b, a) mapping to k
                p = tf.transpose(tf.math.unsorted_segment_sum(tf.transpose(p), lay[0], lay[2]))
            folded.append(p)
        return tf.concat(folded, axis=1) if len(folded) > 1 else folded[0]

    signature = _input_signature(xs) + (tf.TensorSpec([], tf.int32),)
    body = forward_chunk if forward else reverse_chunk
    return tf.function(body, input_signature=signature, autograph=False)


def _auto_chunk(n_chunked: int, n_other: int, itemsize: int, total_bytes: int) -> int:
    budget = min(max(total_bytes // _CHUNK_FRACTION, _CHUNK_BYTES_MIN), _CHUNK_BYTES_MAX)
    chunk = max(1, min(n_chunked, max(_CHUNK_MIN, budget // max(1, n_other * itemsize))))
    n_chunks = -(-n_chunked // chunk)
    return -(-n_chunked // n_chunks)  # equal chunks: the last one wastes as little as possible


def _validate_symmetric(symmetric: Any, in_shapes: tuple[tuple[int, ...], ...], in_names: tuple[str, ...]) -> tuple[bool, ...]:
    if symmetric is None:
        return (False,) * len(in_shapes)
    if isinstance(symmetric, bool):
        symmetric = [symmetric] * len(in_shapes)
    flags = tuple(bool(s) for s in symmetric)
    if len(flags) != len(in_shapes):
        raise InputError(
            "symmetric needs one flag per input.",
            context=[("Argument", "symmetric"), ("Expected", f"{len(in_shapes)} flags (one per input: {', '.join(in_names)})"), ("Got", f"{len(flags)} flags")],
            remedy="pass e.g. symmetric=(False, True) to store the second input by its lower triangle.",
        )
    for flag, s, n in zip(flags, in_shapes, in_names):
        if flag and (len(s) < 2 or s[-1] != s[-2]):
            raise ShapeMismatchError(
                f"input {n!r} is marked symmetric but is not a (batch of) square matrices.",
                context=[("Argument", "symmetric"), ("Expected", f"{n} of shape [..., M, M]"), ("Actual", shape_str(s))],
                remedy=f"mark only square-matrix inputs as symmetric (symmetric=False for {n}).",
            )
    return flags


def jacobian(
    fn: Callable[..., Any],
    inputs: Sequence[Any] | Mapping[str, Any],
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    symmetric: Sequence[bool] | bool | None = None,
    chunk_size: int | None = None,
    mode: str = "auto",
    compiled: bool | None = None,
) -> BlockJacobian:
    """The explicit Jacobian of ``fn(*inputs)``, built in chunks into one array; unconnected blocks are zeros.

    J[r, c] = ∂y_r/∂x_c for the flattened outputs y (rows) and inputs x (columns). It is computed in
    chunks of columns, J·[e_c, …] (forward mode, ``ForwardAccumulator``), or of rows, [e_r, …]ᵀ·J
    (reverse mode, ``tape.gradient`` with one-hot ``output_gradients``), each chunk batched with
    ``tf.vectorized_map`` inside a ``tf.function`` that is traced once per (fn, input shapes and
    dtypes, options) and cached, and written into one preallocated array. The result equals
    ``tape.jacobian`` block by block.

    A ``symmetric`` input X [..., M, M] is differentiated along the symmetric tangents E_ab + E_ba
    (a > b) and E_aa only: M(M+1)/2 columns instead of M². Its general blocks are the symmetrised
    general Jacobian ½(∂y/∂X_ab + ∂y/∂X_ba); for a function that reads X only through its symmetric
    part (such as a Cholesky factorisation, whose TensorFlow gradient is symmetrised) that is
    exactly ``tape.jacobian``'s block.

    Args:
        fn: a function of the inputs returning a tensor or a nest of tensors (tuple, list, dict).
            It must be traceable by ``tf.function`` for the compiled path (otherwise the eager
            ``tape.jacobian`` path is used). The compiled function is cached by ``fn``'s identity:
            pass the same function object to reuse it.
        inputs: the points to differentiate at, a sequence (or a dict: its keys name the inputs).
        input_names, output_names: names for the labels (default ``x0, x1, ...`` and ``y0, y1, ...``,
            or the keys of dicts).
        max_bytes: refuse, before any Jacobian is allocated, when the stored Jacobian would be larger.
        symmetric: one flag per input (or one bool for all): store that input [..., M, M] by vech columns.
        chunk_size: columns (or rows) per chunk; default: about 1/32 of the Jacobian per chunk,
            between 4 MiB and 16 MiB, and at least 128 columns (rows).
        mode: ``"forward"`` (column chunks, ``ForwardAccumulator``), ``"reverse"`` (row chunks,
            ``tape.gradient``) or ``"auto"``: reverse, unless a ``symmetric`` input leaves fewer
            stored columns than rows. Forward mode differentiates the forward computation of a
            ``tf.custom_gradient`` instead of using its gradient: use ``"reverse"`` for such functions.
        compiled: ``True``: the cached compiled chunks; ``False``: eagerly, no tracing (one
            ``tape.gradient`` per row for up to 256 rows, else ``tape.jacobian``); ``None``
            (default): eager for a first call with at most 64 rows (tracing would cost more than
            it saves), compiled otherwise and from the second call with the same ``fn`` and shapes.

    Returns:
        A :class:`BlockJacobian` (``.compact`` is the stored matrix; ``.block(i, j)`` has shape
        ``output_shapes[i] + input_shapes[j]`` in every case).

    Raises:
        MemoryLimitError: the stored Jacobian would exceed ``max_bytes``.
        InputError, ShapeMismatchError: bad ``symmetric``, ``mode`` or ``chunk_size``, or names.

    Example:
        >>> import tensorflow as tf
        >>> J = jacobian(lambda x: x[:, None] * x[None, :], [tf.constant([1., 2., 3., 4.], tf.float64)])
        >>> J.block(0, 0).shape
        (4, 4, 4)
    """
    import tensorflow as tf

    if mode not in ("auto", "forward", "reverse"):
        raise InputError(
            "mode must be 'auto', 'forward' or 'reverse'.",
            context=[("Argument", "mode"), ("Expected", "'auto', 'forward' or 'reverse'"), ("Got", repr(mode))],
            remedy="leave mode='auto' (forward when there are fewer columns than rows).",
        )
    if chunk_size is not None and (not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or chunk_size < 1):
        raise InputError(
            "chunk_size must be a positive integer.",
            context=[("Argument", "chunk_size"), ("Expected", "an int ≥ 1 or None"), ("Got", repr(chunk_size))],
            remedy="leave chunk_size=None for an automatic size.",
        )
    if isinstance(inputs, Mapping):
        input_names = tuple(inputs.keys()) if input_names is None else input_names
        inputs = list(inputs.values())
    elif not isinstance(inputs, (list, tuple)):
        inputs = [inputs]
    xs = [tf.convert_to_tensor(x) for x in inputs]
    in_names = _names(input_names, len(xs), "x", "input_names")
    in_shapes = tuple(tuple(x.shape.as_list()) for x in xs)
    sym = _validate_symmetric(symmetric, in_shapes, in_names)

    meta_key = (id(fn), tuple((tuple(x.shape.as_list()), x.dtype.name) for x in xs), sym)
    meta = _SEEN.get(meta_key) if compiled is not False else None
    if meta is not None and meta[0] is fn:
        # seen before: the outputs' shapes are known, no eager forward pass is needed
        _, out_shapes, dict_keys, out_dtypes = meta
        tape, ys = None, None
    else:
        # one forward pass, on a tape: the output shapes and names, and the small-Jacobian path's VJPs
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch(xs)
            outputs = fn(*xs)
        dict_keys = tuple(sorted(outputs.keys())) if isinstance(outputs, Mapping) else None
        ys = [tf.convert_to_tensor(y) for y in tf.nest.flatten(outputs)]
        out_shapes = tuple(tuple(y.shape.as_list()) for y in ys)
        out_dtypes = tuple(y.dtype for y in ys)
        meta = None
    if dict_keys is not None and output_names is None:
        output_names = dict_keys
    out_names = _names(output_names, len(out_shapes), "y", "output_names")
    itemsize = out_dtypes[0].size if out_dtypes else xs[0].dtype.size
    stored_shapes = [(vech_layout(s)[2],) if f else s for s, f in zip(in_shapes, sym)]
    nbytes = jacobian_nbytes(out_shapes, stored_shapes, itemsize)
    check_memory(nbytes, max_bytes, f"{len(out_shapes)} output(s) and {len(xs)} input(s)")

    n_rows = sum(int(np.prod(s)) for s in out_shapes)
    n_cols = sum(int(np.prod(s)) for s in stored_shapes)
    dtypes = {x.dtype for x in xs} | set(out_dtypes)
    traceable = len(dtypes) == 1 and next(iter(dtypes)).is_floating and n_rows > 0 and n_cols > 0
    compact = None
    if traceable and compiled is not False:
        seen = meta is not None
        if not seen:
            _remember(meta_key, (fn, out_shapes, dict_keys, out_dtypes))
        if compiled or seen or n_rows > _EAGER_MAX_ROWS or chunk_size is not None:
            # auto: reverse mode (tape.gradient's own semantics, and cheaper per pass: TensorFlow forms
            # many JVPs as the derivative of a VJP), except when vech columns make forward mode the
            # one with fewer passes
            forward = mode == "forward" or (mode == "auto" and any(sym) and n_cols < n_rows)
            n_chunked, n_other = (n_cols, n_rows) if forward else (n_rows, n_cols)
            chunk = int(chunk_size) if chunk_size is not None else _auto_chunk(n_chunked, n_other, itemsize, nbytes)
            chunk = min(chunk, n_chunked)
            try:
                compact = _run_chunks(fn, xs, out_shapes, sym, forward, chunk, n_rows, n_cols)
            except (tf.errors.OpError, TypeError, ValueError, NotImplementedError, AttributeError, LookupError):
                compact = None  # not traceable: the eager tape below
    if compact is None and tape is None:
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch(xs)
            outputs = fn(*xs)
        ys = [tf.convert_to_tensor(y) for y in tf.nest.flatten(outputs)]
    if compact is None and (n_rows <= _EAGER_LOOP_MAX_ROWS or xs[0].dtype != tf.float64):
        # (outside float64 never tape.jacobian: its pfor segfaults on a float32 Cholesky gradient)
        compact = _eager_rows(tape, ys, xs, sym, n_rows, n_cols)
    if compact is not None:
        del tape
        return BlockJacobian.from_compact(compact, out_names, in_names, out_shapes, in_shapes, sym)
    blocks = tuple(
        tuple(tape.jacobian(y, x, unconnected_gradients=tf.UnconnectedGradients.ZERO).numpy() for x in xs) for y in ys
    )
    del tape
    if not any(sym):
        return BlockJacobian(blocks, out_names, in_names, out_shapes, in_shapes)
    compact = _fold_general(blocks, out_shapes, in_shapes, sym, itemsize)
    return BlockJacobian.from_compact(compact, out_names, in_names, out_shapes, in_shapes, sym)


#: A first call with at most this many output elements runs eagerly, one VJP per row (no tracing:
#: for a one-off small Jacobian tracing costs more than it saves); a second call with the same
#: function and shapes compiles.
_EAGER_MAX_ROWS = 64
#: The eager fallback (for a function tf.function cannot trace) loops over rows up to this many,
#: and uses eager ``tape.jacobian`` beyond.
_EAGER_LOOP_MAX_ROWS = 256
_SEEN: collections.OrderedDict[Any, Any] = collections.OrderedDict()


def _remember(key: Any, meta: Any) -> None:
    """Record (fn, output shapes, dict keys, dtypes) for ``key``: the next call compiles and skips the
    eager forward pass. ``fn`` is kept, so that its id cannot be reused while the entry lives."""
    with _LOCK:
        _SEEN[key] = meta
        _SEEN.move_to_end(key)
        while len(_SEEN) > _CACHE_SIZE:
            _SEEN.popitem(last=False)


def _eager_rows(tape: Any, ys: Sequence[Any], xs: Sequence[Any], sym: tuple[bool, ...], n_rows: int, n_cols: int) -> np.ndarray:
    """Row r of J = tape.gradient with a one-hot seed at output element r, eagerly (vech inputs folded)."""
    import tensorflow as tf

    dtype = xs[0].dtype
    out = np.empty((n_rows, n_cols), dtype=dtype.as_numpy_dtype)
    shapes = [tuple(y.shape.as_list()) for y in ys]
    sizes = [int(np.prod(s)) for s in shapes]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    zeros = [tf.zeros(s, dtype) for s in shapes]
    layouts = [vech_layout(tuple(x.shape.as_list())) if f else None for x, f in zip(xs, sym)]
    for i, (s, n) in enumerate(zip(shapes, sizes)):
        for a in range(n):
            seed = np.zeros(n, dtype=dtype.as_numpy_dtype)
            seed[a] = 1.0
            cots = list(zeros)
            cots[i] = tf.constant(seed.reshape(s))
            gs = tape.gradient(ys, xs, output_gradients=cots, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            parts = []
            for g, lay in zip(gs, layouts):
                flat = g.numpy().ravel()
                parts.append(flat if lay is None else np.bincount(lay[0], weights=flat, minlength=lay[2]))
            out[offsets[i] + a] = np.concatenate(parts)
    return out


def _run_chunks(
    fn: Callable[..., Any],
    xs: Sequence[Any],
    out_shapes: tuple[tuple[int, ...], ...],
    sym: tuple[bool, ...],
    forward: bool,
    chunk: int,
    n_rows: int,
    n_cols: int,
) -> np.ndarray:
    """Fill one preallocated [n_rows, n_cols] array chunk by chunk with the cached compiled function."""
    import tensorflow as tf

    key = (id(fn), tuple((tuple(x.shape.as_list()), x.dtype.name) for x in xs), sym, forward, chunk)
    with _LOCK:
        entry = _CACHE.get(key)
        if entry is not None and entry.fn is fn:
            _CACHE.move_to_end(key)
        else:
            entry = _Compiled(fn=fn, chunk_fn=_build_chunk_fn(fn, xs, out_shapes, sym, forward, chunk), forward=forward, chunk=chunk)
            _CACHE[key] = entry
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    # column chunks go into a column-major array, row chunks into a row-major one: each chunk is then
    # one contiguous write (blocks stay views either way: splitting an axis never needs a copy)
    out = np.empty((n_rows, n_cols), dtype=xs[0].dtype.as_numpy_dtype, order="F" if forward else "C")
    n_chunked = n_cols if forward else n_rows
    for start in range(0, n_chunked, chunk):
        stop = min(start + chunk, n_chunked)
        res = entry.chunk_fn(*xs, tf.constant(start, tf.int32))  # [chunk, other]
        view = np.asarray(res)  # no copy: read once, straight into ``out``
        if forward:
            out[:, start:stop] = view[: stop - start].T
        else:
            out[start:stop, :] = view[: stop - start]
        del view, res
    return out


def _fold_general(blocks: Any, out_shapes: Any, in_shapes: Any, sym: tuple[bool, ...], itemsize: int) -> np.ndarray:
    """General blocks → stored matrix with vech columns (D_ab = G_ab + G_ba, D_aa = G_aa)."""
    rows = []
    for i, os_ in enumerate(out_shapes):
        n = int(np.prod(os_))
        parts = []
        for j, (s, f) in enumerate(zip(in_shapes, sym)):
            g = np.asarray(blocks[i][j]).reshape(n, -1)
            if f:
                index, _, size = vech_layout(s)
                folded = np.zeros((n, size), dtype=g.dtype)
                np.add.at(folded.T, index, g.T)
                g = folded
            parts.append(g)
        rows.append(np.concatenate(parts, axis=1))
    return np.ascontiguousarray(np.concatenate(rows, axis=0))


def _natgrad_map(eta1: Any, eta2: Any) -> Any:
    """GPflow's ``expectation_to_meanvarsqrt`` (one function object, so the compiled Jacobian is cached)."""
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    return expectation_to_meanvarsqrt(eta1, eta2)


def _natgrad_map_closed_form(eta1: Any, eta2: Any, *, symmetric: bool, max_bytes: int, chunk_size: int | None) -> BlockJacobian:
    """J of ``expectation_to_meanvarsqrt`` in closed form, one JVP per stored column, in chunks.

    mean = η₁, so ∂mean/∂η₁ = I and ∂mean/∂η₂ = 0. For latent GP l, varsqrt_l = chol(S_l) with
    S_l = η₂,l − η₁,l η₁,lᵀ, and the derivative of a Cholesky factor C along a symmetric dS is
    (Murray 2016, "Differentiation of the Cholesky decomposition", eq. 9)

        dC = C·Φ(C⁻¹ dS C⁻ᵀ),    Φ(X) = the lower triangle of X with its diagonal halved.

    Every tangent here is dS = s(p qᵀ + q pᵀ) with p, q columns of C⁻¹ (or w = C⁻¹η₁,l), so
    C⁻¹ dS C⁻ᵀ = s(C⁻¹p (C⁻¹q)ᵀ + ...) is a rank-2 outer product and a column costs one M×M matmul:

        η₁[m, l]:            dS = −(E_m η₁,lᵀ + η₁,l E_mᵀ)       (p = e_m, q = η₁,l, s = −1)
        η₂ vech (a, b), a>b: dS = E_ab + E_ba                  (s = 1);   diagonal (a, a): dS = E_aa
        η₂ general (a, b):   dS = ½(E_ab + E_ba)               (TensorFlow's symmetrised gradient)

    The columns are written into one preallocated array; ``.block(i, j)`` equals ``tape.jacobian``'s.
    """
    from natgrad_diag.exceptions import SingularCovarianceError

    e1 = np.asarray(eta1)
    e2 = np.asarray(eta2)
    if e1.dtype not in (np.float32, np.float64):
        e1, e2 = e1.astype(np.float64), e2.astype(np.float64)
    dtype = e1.dtype
    M, L = e1.shape
    K2 = M * (M + 1) // 2 if symmetric else M * M
    n_rows, n_cols = M * L + L * M * M, M * L + L * K2
    check_memory(n_rows * n_cols * dtype.itemsize, max_bytes, f"the natgrad map at M = {M}, L = {L}")
    out = np.zeros((n_rows, n_cols), dtype=dtype)
    out[np.arange(M * L), np.arange(M * L)] = 1.0  # ∂mean/∂η₁ = I
    # the stored η₂ columns of one latent GP: (p index, q index, scale) into the columns of C⁻¹
    if symmetric:
        a_idx, b_idx = np.tril_indices(M)
        scale2 = np.ones(len(a_idx), dtype=dtype)
    else:
        a_idx, b_idx = (g.ravel() for g in np.meshgrid(np.arange(M), np.arange(M), indexing="ij"))
        scale2 = np.full(len(a_idx), 0.5, dtype=dtype)  # ½(E_ab + E_ba); on the diagonal E_aa
    if symmetric:
        scale2[a_idx == b_idx] = 0.5  # E_aa = ½(c cᵀ + c cᵀ) in the rank-2 form
    phi = np.tril(np.ones((M, M), dtype=dtype)) - 0.5 * np.eye(M, dtype=dtype)
    per = max(1, (32 * 1024**2) // (3 * M * M * dtype.itemsize)) if chunk_size is None else int(chunk_size)
    for l in range(L):
        S = e2[l] - np.outer(e1[:, l], e1[:, l])
        try:
            C = np.linalg.cholesky(S)
        except np.linalg.LinAlgError:
            raise SingularCovarianceError(
                f"eta2 − eta1·eta1ᵀ is not positive definite for latent GP {l}, so varsqrt = chol(·) has no derivative.",
                context=[("Argument", "eta2"), ("Latent GP", l), ("min eigenvalue", float(np.linalg.eigvalsh(S).min()))],
                remedy="pass expectation parameters of a valid q(u): eta2 = S + eta1·eta1ᵀ with S positive definite.",
            ) from None
        Cinv = np.tril(np.linalg.solve(C, np.eye(M, dtype=dtype)))
        w = Cinv @ e1[:, l]
        # tangents of latent l: η₁ columns (m*L + l) then η₂ columns (M*L + l*K2 + k)
        P = np.concatenate([Cinv.T, Cinv.T[a_idx]])  # rows are C⁻¹ columns
        Q = np.concatenate([np.tile(w, (M, 1)), Cinv.T[b_idx]])
        sc = np.concatenate([-np.ones(M, dtype=dtype), scale2])
        cols = np.concatenate([np.arange(M) * L + l, M * L + l * K2 + np.arange(K2)])
        r0 = M * L + l * M * M
        for k0 in range(0, len(cols), per):
            p, q, s_ = P[k0 : k0 + per], Q[k0 : k0 + per], sc[k0 : k0 + per]
            X = p[:, :, None] * q[:, None, :]
            X = s_[:, None, None] * (X + np.swapaxes(X, 1, 2))
            dC = np.matmul(C, X * phi)  # [k, M, M]
            out[r0 : r0 + M * M, cols[k0 : k0 + per]] = dC.reshape(len(s_), M * M).T
    return BlockJacobian.from_compact(
        out, ("mean", "varsqrt"), ("eta1", "eta2"), [(M, L), (L, M, M)], [(M, L), (L, M, M)], (False, bool(symmetric))
    )


def natgrad_map_jacobian(
    eta1: Any,
    eta2: Any,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    symmetric: bool = True,
    chunk_size: int | None = None,
    method: str = "closed_form",
) -> BlockJacobian:
    """J = ∂(mean, varsqrt)/∂(eta1, eta2) of GPflow's ``expectation_to_meanvarsqrt`` at (η₁, η₂).

    mean = η₁ and varsqrt = chol(η₂ − η₁η₁ᵀ). eta1 is [M, L], eta2 is [L, M, M]; the blocks are
    labelled mean, varsqrt / eta1, eta2. With ``symmetric=True`` (default) η₂ is differentiated along
    symmetric tangents only (M + M(M+1)/2 columns per latent GP instead of M + M²: about half the time
    and memory); ``.block(i, 1)`` still has the general shape [..., L, M, M] and equals
    ``tape.jacobian``'s block, because TensorFlow's Cholesky gradient is symmetrised.

    ``method="closed_form"`` (default) computes each column as a closed-form JVP of the Cholesky factor
    (see ``_natgrad_map_closed_form``), so its cost is proportional to the number of columns;
    ``method="autodiff"`` builds the same matrix with TensorFlow through :func:`jacobian`.
    """
    if method == "closed_form":
        return _natgrad_map_closed_form(eta1, eta2, symmetric=bool(symmetric), max_bytes=max_bytes, chunk_size=chunk_size)
    if method != "autodiff":
        raise InputError(
            "unknown method.",
            context=[("Argument", "method"), ("Expected", "'closed_form' or 'autodiff'"), ("Got", repr(method))],
            remedy="pass method='closed_form' (default) or method='autodiff' (TensorFlow's tape).",
        )
    return jacobian(
        _natgrad_map,
        [eta1, eta2],
        input_names=("eta1", "eta2"),
        output_names=("mean", "varsqrt"),
        max_bytes=max_bytes,
        symmetric=(False, bool(symmetric)),
        chunk_size=chunk_size,
    )
