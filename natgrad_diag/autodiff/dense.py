"""The explicit Jacobian of a function of several tensors, by the first path that applies.

1. Compiled chunks: peak memory about 1.1-1.3× the Jacobian at M = 80, not the 3-4× of ``tape.jacobian``'s pfor.
2. Eager rows, one ``tape.gradient`` each: a first call with ≤ 64 rows, an untraceable ``fn`` with ≤ 256 rows, or a
   dtype other than float64.
3. Eager ``tape.jacobian``, one output at a time, for a larger untraceable float64 ``fn``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag._compile import recall, remember
from natgrad_diag._validate import as_float_tensor, call_fn, flat_outputs, input_error, names_of, output_labels
from natgrad_diag._validate import require_bool, require_callable, require_finite, require_int, require_max_bytes
from natgrad_diag._validate import require_output_dtypes, require_same_dtype, shape_str, split_inputs
from natgrad_diag.autodiff.blocks import BlockJacobian, label, vech_layout
from natgrad_diag.autodiff.chunks import run_chunks
from natgrad_diag.autodiff.memory import DEFAULT_MAX_BYTES, auto_chunk, check_memory
from natgrad_diag.exceptions import NO_DERIVATIVE, NonFiniteError, ShapeMismatchError
from natgrad_diag.typing import Array

__all__ = ["jacobian"]

#: Path 2's limits (module docstring): rows of a first call (tracing would cost more), rows of an untraceable fn.
_EAGER_MAX_ROWS = 64
_EAGER_LOOP_MAX_ROWS = 256


def jacobian(
    fn: Callable[..., Any], inputs: Sequence[Any] | Mapping[str, Any], *, input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
    symmetric: Sequence[bool] | bool | None = None, chunk_size: int | None = None, mode: str = "auto",
    compiled: bool | None = None, nan_policy: str = "raise",
) -> BlockJacobian:
    """The explicit Jacobian of ``fn(*inputs)``, built in chunks into one array; unconnected blocks are zeros.

    J[r, c] = ∂y_r/∂x_c for the flattened outputs y (rows) and inputs x (columns), in chunks of rows [e_r, …]ᵀ·J
    (reverse mode) or of columns J·[e_c, …] (forward mode), batched in a ``tf.function``; it equals
    ``tape.jacobian`` block by block. A ``symmetric`` input X [..., M, M] is differentiated along E_ab + E_ba (a > b)
    and E_aa only; its general blocks are ½(∂y/∂X_ab + ∂y/∂X_ba), ``tape.jacobian``'s through a Cholesky.

    Args:
        fn: a function of the inputs returning a tensor or a nest of tensors; its compiled chunks are cached by
            identity (pass the same function object to reuse them).
        inputs: the point, a sequence (or a dict: its keys name the inputs); Python numbers and lists become float64.
        input_names, output_names: names for the labels (default ``x0, ...``, ``y0, ...``; for dict outputs the keys,
            or paths such as ``"z/0"`` for nested ones, in ``tf.nest.flatten``'s order).
        max_bytes: refuse, before any Jacobian is allocated, when the stored Jacobian would be larger.
        symmetric: one flag per input (or one bool for all): store that input [..., M, M] by vech columns.
        chunk_size: rows (columns) per chunk; default :func:`~natgrad_diag.autodiff.memory.auto_chunk`'s budget.
        mode: ``"reverse"``, ``"forward"`` or ``"auto"`` (reverse, unless vech columns leave fewer columns than
            rows). Forward mode ignores a ``tf.custom_gradient``: use ``"reverse"`` there ("auto" checks it, below).
        compiled: ``True``: compiled chunks (as in ``tf.function``, Python state ``fn`` reads is frozen at the trace);
            ``False``: eagerly; ``None`` (default): eager for a first call with at most 64 rows, compiled otherwise
            and from the second call, a reused trace checked against one eager row vᵀ·J (it follows such state).
        nan_policy: ``"raise"`` (default): a NaN or Inf entry, where the derivative does not exist (tf.norm or
            tf.sqrt at 0), is a :class:`~natgrad_diag.exceptions.NonFiniteError` naming it; ``"propagate"`` returns
            it (as ``tape.jacobian`` does; the gradient check reports such an entry as a failure).

    Returns:
        A :class:`BlockJacobian` (``.compact`` is the stored matrix; ``.block(i, j)`` one block, see there).

    Raises:
        MemoryLimitError: the stored Jacobian would exceed ``max_bytes``.
        InputError: ``fn`` not callable, raising or returning None; ``None``, empty or non-finite inputs; bad
            ``symmetric``, ``mode``, ``chunk_size``, ``max_bytes``, ``nan_policy`` or names; integer, bool or complex
            inputs or outputs, or outputs in another dtype than the inputs; NonFiniteError, a NaN or Inf entry.

    Examples:
        >>> import tensorflow as tf
        >>> J = jacobian(lambda x: x[:, None] * x[None, :], [tf.constant([1., 2., 3., 4.], tf.float64)])
        >>> J.block(0, 0).shape
        (4, 4, 4)
    """
    require_callable(fn)
    if mode not in ("auto", "forward", "reverse"):
        raise input_error("mode must be 'auto', 'forward' or 'reverse'.", "mode", "'auto', 'forward' or 'reverse'",
                          repr(mode), "leave mode='auto' (forward when there are fewer columns than rows).")
    if nan_policy not in ("raise", "propagate"):
        raise input_error("nan_policy must be 'raise' or 'propagate'.", "nan_policy", "'raise' or 'propagate'",
                          repr(nan_policy), "leave nan_policy='raise', or pass 'propagate' to keep NaN entries.")
    if chunk_size is not None:
        require_int(chunk_size, "chunk_size", minimum=1, expected="an int ≥ 1 or None",
                    remedy="leave chunk_size=None for an automatic size.")
    max_bytes = require_max_bytes(max_bytes)
    compiled = None if compiled is None else require_bool(compiled, "compiled")  # "no" is truthy: it meant True
    xs, in_names = _as_tensors(inputs, input_names)
    in_shapes = tuple(tuple(x.shape.as_list()) for x in xs)
    sym = _validate_symmetric(symmetric, in_shapes, in_names)
    key = ("jacobian_outputs", id(fn), tuple((s, x.dtype.name) for s, x in zip(in_shapes, xs)), sym)
    probe = _probe(fn, xs, key, compiled)
    out_names = names_of(probe.dict_keys if output_names is None else output_names, len(probe.out_shapes), "outputs")
    size = _size(probe, xs, in_shapes, sym, max_bytes)
    compact = _compiled_path(fn, xs, probe, key, sym, size, chunk_size=chunk_size, mode=mode, compiled=compiled)
    if compact is None:
        compact = _eager_path(fn, xs, probe, sym, size)
    J = BlockJacobian.from_compact(compact, out_names, in_names, probe.out_shapes, in_shapes, sym)
    if nan_policy == "raise" and not np.all(np.isfinite(compact)):
        i, j = next((i, j) for i, j in np.ndindex(len(out_names), len(in_names)) if not np.all(np.isfinite(J.block(i, j))))
        at = tuple(int(k) for k in np.argwhere(~np.isfinite(J.block(i, j)))[0])
        n = len(probe.out_shapes[i])
        raise NonFiniteError(
            f"The Jacobian has {J.block(i, j)[at]} at ∂{label(out_names[i], at[:n])}/∂{label(in_names[j], at[n:])}: "
            f"{NO_DERIVATIVE}.",
            context=[("Argument", "inputs"), ("Non-finite entries", int(np.sum(~np.isfinite(compact))))],
            remedy="evaluate at another point, give fn a finite gradient there (tf.math.divide_no_nan, "
            "tf.custom_gradient), or pass nan_policy='propagate' to get the entries as TensorFlow gives them.",
        )
    return J


def _size(probe: _Probe, xs: Sequence[Any], in_shapes: tuple[tuple[int, ...], ...], sym: tuple[bool, ...], max_bytes: int) -> tuple[int, int]:
    """The stored matrix's (rows, columns); refuses, before anything is allocated, one over ``max_bytes``."""
    stored_shapes = [(vech_layout(s)[2],) if f else s for s, f in zip(in_shapes, sym)]
    rows, cols = (sum(int(np.prod(s)) for s in shapes) for shapes in (probe.out_shapes, stored_shapes))
    check_memory(rows * cols * xs[0].dtype.size, max_bytes, f"{len(probe.out_shapes)} output(s) and {len(xs)} input(s)")
    return rows, cols


@dataclass
class _Probe:
    """What one forward pass of ``fn`` (or the record of an earlier call) says about its outputs."""

    out_shapes: tuple[tuple[int, ...], ...]
    dict_keys: tuple[str, ...] | None
    tape: Any = None  # the forward pass's persistent tape; None: recorded by an earlier call, no forward pass
    ys: list[Any] | None = None  # its flattened outputs
    seen: bool = False  # an earlier call with the same key: its compiled chunks may be reused


def _as_tensors(inputs: Any, input_names: Sequence[str] | None) -> tuple[list[Any], tuple[str, ...]]:
    """The inputs as finite float tensors of one dtype (a dict's keys name them), and their names."""
    values, names = split_inputs(inputs, input_names)
    xs = [as_float_tensor(x, f"inputs[{k}] ({n})") for k, (x, n) in enumerate(zip(values, names))]
    for k, (x, n) in enumerate(zip(xs, names)):
        require_finite(x.numpy(), f"inputs[{k}] ({n})")  # a NaN point gives a NaN Jacobian
    for k, x in enumerate(xs[1:], 1):
        require_same_dtype(x, xs[0], f"inputs[{k}] ({names[k]})", f"inputs[0] ({names[0]})")
    return xs, names


def forward_pass(fn: Callable[..., Any], xs: Sequence[Any]) -> tuple[Any, Any, list[Any]]:
    """fn(*xs) on a persistent tape watching xs: (tape, outputs as returned, flattened outputs)."""
    import tensorflow as tf

    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch(xs)
        outputs = call_fn(fn, xs)
    ys = flat_outputs(outputs)
    require_output_dtypes(ys, xs[0].dtype)
    return tape, outputs, ys


def _probe(fn: Callable[..., Any], xs: Sequence[Any], key: Any, compiled: bool | None) -> _Probe:
    """The outputs' shapes and dict keys: from an earlier call with ``key``, else one forward pass
    on a tape (kept for the small-Jacobian path's VJPs)."""
    meta: Any = recall(key) if compiled is not False else None
    seen = meta is not None and meta[0] is fn  # remembered as (fn, out_shapes, dict_keys)
    if seen and compiled:  # compiled=True trusts the trace, as tf.function does: no forward pass
        return _Probe(meta[1], meta[2], seen=True)
    tape, outputs, ys = forward_pass(fn, xs)
    out_shapes = tuple(tuple(y.shape.as_list()) for y in ys)
    return _Probe(out_shapes, output_labels(outputs), tape=tape, ys=ys, seen=seen)  # labels: tf.nest's order


def _compiled_path(
    fn: Callable[..., Any], xs: Sequence[Any], probe: _Probe, key: Any, sym: tuple[bool, ...], size: tuple[int, int],
    *, chunk_size: int | None, mode: str, compiled: bool | None,
) -> Array | None:  # fmt: skip
    """Path 1: the compiled chunks, or ``None`` for ``compiled=False``, a first small call (it records the outputs'
    shapes under ``key``, so that the next call compiles and skips the eager forward pass) or an ``fn`` that does
    not trace."""
    import tensorflow as tf

    rows, cols = size
    if compiled is False or not (rows and cols):
        return None
    if probe.tape is not None:
        remember(key, (fn, probe.out_shapes, probe.dict_keys), keep=(fn,))
    if not (compiled or probe.seen or rows > _EAGER_MAX_ROWS or chunk_size is not None):
        return None
    # auto: reverse mode (tape.gradient's own semantics, and cheaper per pass: TensorFlow forms many JVPs
    # as the derivative of a VJP), except when vech columns make forward mode the one with fewer passes
    forward = mode == "forward" or (mode == "auto" and any(sym) and cols < rows)

    def run(forward: bool, fresh: bool) -> Array:
        n_chunked, n_other = (cols, rows) if forward else (rows, cols)
        itemsize = xs[0].dtype.size
        chunk = min(int(chunk_size or auto_chunk(n_chunked, n_other, itemsize, rows * cols * itemsize)), n_chunked)
        return run_chunks(fn, xs, probe.out_shapes, sym, forward, chunk, rows, cols, fresh=fresh)

    try:
        out = run(forward, fresh=False)
        # a reused trace keeps the Python state fn read when traced, and forward mode ignores a tf.custom_gradient:
        # compare one random row vᵀ·J with the eager tape's; beyond rounding, trace again (reverse, unless asked)
        if probe.tape is not None and _stale(out, probe, xs, sym):
            out = run(forward and mode == "forward", fresh=True)
        return out
    except (tf.errors.OpError, TypeError, ValueError, NotImplementedError, AttributeError, LookupError):
        return None  # not traceable: the eager tape


def _stale(out: Array, probe: _Probe, xs: Sequence[Any], sym: tuple[bool, ...]) -> bool:
    """Whether compiled ``out`` differs from the eager tape's vᵀ·J (a fixed random v) beyond 10³·ε·(|v|ᵀ·|J| + |vᵀ·J|)."""
    import tensorflow as tf

    v = np.random.default_rng(0).standard_normal(out.shape[0]).astype(out.dtype)
    assert probe.tape is not None and probe.ys is not None
    seeds = np.split(v, np.cumsum([int(np.prod(s)) for s in probe.out_shapes])[:-1])
    gs = probe.tape.gradient(probe.ys, list(xs), [np.reshape(s, y.shape) for s, y in zip(seeds, probe.ys)],
                             unconnected_gradients="zero")
    eager = _fold([tf.convert_to_tensor(g).numpy().ravel() for g in gs], xs, sym)  # tf.gather: IndexedSlices
    k = max(1, (1 << 20) // max(out.shape[1], 1))  # |v|ᵀ·|J| in row blocks: no second Jacobian-sized array
    size = sum(np.abs(v[i : i + k]) @ np.abs(out[i : i + k]) for i in range(0, len(v), k))
    with np.errstate(invalid="ignore"):  # a NaN entry (no derivative) is in both: nan_policy decides about it
        return bool(np.any(np.abs(eager - v @ out) > 1e3 * np.finfo(out.dtype).eps * (size + np.abs(eager))))


def _fold(parts: Sequence[Array], xs: Sequence[Any], sym: tuple[bool, ...]) -> Array:
    """One stored row from flattened per-input gradients: a symmetric input's vech column k sums G_ab and G_ba."""
    layouts = [vech_layout(tuple(x.shape.as_list())) if f else None for x, f in zip(xs, sym)]
    return np.concatenate([p if v is None else np.bincount(v[0], p, v[2]) for p, v in zip(parts, layouts)])


def _eager_path(fn: Callable[..., Any], xs: Sequence[Any], probe: _Probe, sym: tuple[bool, ...], size: tuple[int, int]) -> Array:
    """Paths 2 and 3, eagerly: the stored matrix row by row, vech columns folded (D_ab = G_ab + G_ba, D_aa = G_aa)."""
    import tensorflow as tf

    tape, ys = probe.tape, probe.ys
    if tape is None:
        tape, _, ys = forward_pass(fn, xs)
    assert ys is not None  # the probe's or the forward pass's outputs
    zero = tf.UnconnectedGradients.ZERO
    # outside float64 never tape.jacobian: its pfor segfaults on a float32 Cholesky gradient
    by_rows = size[0] <= _EAGER_LOOP_MAX_ROWS or xs[0].dtype != tf.float64
    out = np.empty(size, dtype=xs[0].dtype.as_numpy_dtype)
    zeros = [tf.zeros_like(y) for y in ys]
    r = 0
    for i, y in enumerate(ys):
        n = y.shape.num_elements()
        if not by_rows:  # path 3: the rows of output i at once, [n, input size] per input
            blocks = [tape.jacobian(y, x, unconnected_gradients=zero).numpy().reshape(n, -1) for x in xs]
        for a in range(n):
            if by_rows:  # path 2: row r = tape.gradient with a one-hot seed at output element r
                seeds = zeros[:i] + [tf.reshape(tf.one_hot(a, tf.size(y), dtype=y.dtype), tf.shape(y))] + zeros[i + 1 :]
                parts = [tf.convert_to_tensor(g).numpy().ravel() for g in tape.gradient(ys, xs, seeds, unconnected_gradients=zero)]
            else:
                parts = [b[a] for b in blocks]
            out[r] = _fold(parts, xs, sym)
            r += 1
    return out


def _validate_symmetric(symmetric: Any, in_shapes: tuple[tuple[int, ...], ...], in_names: tuple[str, ...]) -> tuple[bool, ...]:
    if symmetric is None or isinstance(symmetric, bool):
        symmetric = [bool(symmetric)] * len(in_shapes)
    if len(flags := tuple(bool(s) for s in symmetric)) != len(in_shapes):
        raise input_error("symmetric needs one flag per input.", "symmetric",
                          f"{len(in_shapes)} flags (one per input: {', '.join(in_names)})", f"{len(flags)} flags",
                          "pass e.g. symmetric=(False, True) to store the second input by its lower triangle.")
    for flag, s, n in zip(flags, in_shapes, in_names):
        if flag and (len(s) < 2 or s[-1] != s[-2]):
            raise input_error(f"input {n!r} is marked symmetric but is not a (batch of) square matrices.", "symmetric",
                              f"{n} of shape [..., M, M]", shape_str(s), f"mark only square-matrix inputs as symmetric "
                              f"(symmetric=False for {n}).", kind=ShapeMismatchError)
    return flags
