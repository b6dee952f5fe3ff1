"""Compiled chunks of a dense Jacobian: one-hot rows (reverse) or basis columns (forward), batched."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from natgrad_diag._compile import compiled, function, note_trace
from natgrad_diag._validate import flat_outputs
from natgrad_diag.autodiff.blocks import vech_layout
from natgrad_diag.typing import Array

__all__ = ["TRACE_KIND", "run_chunks"]

#: The compiled path's name in :mod:`natgrad_diag._compile` (its cache keys and trace counter).
TRACE_KIND = "jacobian_chunk"


def run_chunks(
    fn: Callable[..., Any], xs: Sequence[Any], out_shapes: tuple[tuple[int, ...], ...], sym: tuple[bool, ...],
    forward: bool, chunk: int, n_rows: int, n_cols: int, fresh: bool = False,
) -> Array:  # fmt: skip
    """The stored [n_rows, n_cols] Jacobian of ``fn`` at ``xs``, filled chunk by chunk: ``chunk`` columns (forward,
    J·E) or rows (reverse, Eᵀ·J) at a time.

    The chunk function is compiled once per (``fn``, input shapes and dtypes, ``sym``, ``forward``, ``chunk``) in
    :mod:`natgrad_diag._compile`'s cache, which keeps ``fn`` alive; ``fresh`` traces it again. Column chunks go into a column-major array, row
    chunks into a row-major one, so each is one contiguous write.
    """
    import tensorflow as tf

    def build() -> Any:  # (*inputs, start) → [chunk, other]; indices past the end give zeros: every call has one shape
        body = _chunk_body(fn, xs, out_shapes, sym, forward, chunk)
        signature = tuple(tf.TensorSpec(x.shape, x.dtype) for x in xs) + (tf.TensorSpec([], tf.int32),)
        return function(body, input_signature=signature).get_concrete_function()

    key = (TRACE_KIND, id(fn), tuple((tuple(x.shape.as_list()), x.dtype.name) for x in xs), sym, forward, chunk)
    chunk_fn = compiled(key, build, keep=(fn,), fresh=fresh)
    out = np.empty((n_rows, n_cols), dtype=xs[0].dtype.as_numpy_dtype, order="F" if forward else "C")
    chunked = out.T if forward else out  # a chunk fills rows of this view (in forward mode, columns of out)
    for start in range(0, len(chunked), chunk):
        # straight into out; the chunk's tensor, held by no name, goes before the next one is computed
        chunked[start : start + chunk] = np.asarray(chunk_fn(*xs, tf.constant(start, tf.int32)))[: len(chunked) - start]
    return out


def _batched(one: Callable[[Any], Any], elems: Any, width: int, dtype: Any) -> Any:
    """``one`` over the leading axis of ``elems``: pfor (vectorized_map) in float64, else a tf.map_fn loop.

    TensorFlow 2.21's pfor crashes the process (SIGSEGV) on a float32 Cholesky gradient.
    """
    import tensorflow as tf

    if dtype == tf.float64:
        return tf.vectorized_map(one, elems)
    return tf.map_fn(one, elems, fn_output_signature=tf.TensorSpec([width], dtype))


def _basis(chunk: int, dtype: Any, start: Any, sizes: Sequence[int], shapes: Sequence[Any], layouts: Any = None) -> Any:
    """``chunk`` one-hot rows from ``start`` as [chunk, *shape] parts (vech parts gathered: E_ab + E_ba)."""
    import tensorflow as tf

    E = tf.one_hot(start + tf.range(chunk), depth=int(sum(sizes)), dtype=dtype)
    return tuple(tf.reshape(p if v is None else tf.gather(p, v[0], axis=1), (chunk,) + s)
                 for p, s, v in zip(tf.split(E, list(sizes), axis=1), shapes, layouts or [None] * len(shapes)))


def _chunk_body(
    fn: Callable[..., Any], xs: Sequence[Any], out_shapes: tuple[tuple[int, ...], ...], sym: tuple[bool, ...],
    forward: bool, chunk: int,
) -> Callable[..., Any]:  # fmt: skip
    """(*inputs, start) → forward: J·E for ``chunk`` stored basis tangents E (E_ab + E_ba for vech columns), by
    ForwardAccumulator; reverse: Eᵀ·J for ``chunk`` one-hot cotangent rows, by tape.gradient, vech columns folded
    (g_ab + g_ba)."""
    import tensorflow as tf

    zero, dtype = tf.UnconnectedGradients.ZERO, xs[0].dtype
    in_shapes = [tuple(x.shape.as_list()) for x in xs]
    in_sizes, out_sizes = [int(np.prod(s)) for s in in_shapes], [int(np.prod(s)) for s in out_shapes]
    layouts = [vech_layout(s) if f else None for s, f in zip(in_shapes, sym)]
    stored_sizes = [n if v is None else v[2] for n, v in zip(in_sizes, layouts)]

    def forward_chunk(inputs: list[Any], start: Any) -> Any:
        def one(ts: Any) -> Any:
            with tf.autodiff.ForwardAccumulator(inputs, list(ts)) as acc:
                ys = flat_outputs(fn(*inputs))
            return tf.concat([tf.reshape(acc.jvp(y, unconnected_gradients=zero), [-1]) for y in ys], axis=-1)

        return _batched(one, _basis(chunk, dtype, start, stored_sizes, in_shapes, layouts), sum(out_sizes), dtype)

    def reverse_chunk(inputs: list[Any], start: Any) -> Any:
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch(inputs)
            ys = flat_outputs(fn(*inputs))

        def one(vs: Any) -> Any:
            gs = tape.gradient(ys, inputs, output_gradients=list(vs), unconnected_gradients=zero)
            return tf.concat([tf.reshape(g, [-1]) for g in gs], axis=-1)

        cots = _basis(chunk, dtype, start, out_sizes, out_shapes)
        rows = _batched(one, cots, sum(in_sizes), dtype)  # [chunk, Σ input sizes]
        if all(v is None for v in layouts):
            return rows
        # stored column k of a vech input = Σ of the general entries (a, b), (b, a) mapping to k
        return tf.concat([p if v is None else tf.transpose(tf.math.unsorted_segment_sum(tf.transpose(p), v[0], v[2]))
                          for p, v in zip(tf.split(rows, in_sizes, axis=1), layouts)], axis=-1)

    def body(*args: Any) -> Any:
        note_trace(TRACE_KIND)
        return (forward_chunk if forward else reverse_chunk)(list(args[:-1]), args[-1])

    return body
