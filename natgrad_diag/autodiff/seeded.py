"""``tape.gradient`` with its ``output_gradients`` checked first, and the functional ``vjp``.

TensorFlow 2.21 does not check that a seed has its target's shape: for ``y = x[:, None] * x[None, :]`` a seed [4]
fails deep inside with a reshape error, and for ``y = tf.sin(x)`` a seed [4, 1] is broadcast into a [4, 4]
"gradient". PyTorch refuses both (``Mismatch in shape: grad_output[0] has a shape of ...``); so do these functions.

References: ``tf.GradientTape.gradient`` (tensorflow/python/eager/backprop.py); ``torch.autograd.grad`` and its
``grad_outputs`` check (torch/autograd/__init__.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from natgrad_diag._validate import call_fn, converted, dtype_name, input_error, require_callable, require_finite
from natgrad_diag._validate import shape_str, validate_seeds
from natgrad_diag.exceptions import DTypeMismatchError, OutputGradientsError, UnconnectedGradientError, raised_as_is

__all__ = ["checked_gradient", "vjp"]


def _unconnected_mode(unconnected: Any) -> str:
    """``"none"``, ``"zero"`` or ``"raise"`` from a string or a ``tf.UnconnectedGradients``."""
    value = getattr(unconnected, "value", unconnected)
    if isinstance(value, str) and value.lower() in ("none", "zero", "raise"):
        return value.lower()
    raise input_error("unconnected must say what a source that does not influence the target gets.", "unconnected",
                      '"none", "zero" or "raise"', repr(unconnected), 'pass unconnected="none" (TensorFlow\'s default, None), '
                      '"zero" (zeros of the source\'s shape) or "raise" (an error naming the source).')


def _describe(x: Any) -> str:
    return f"shape {shape_str(x)}, {dtype_name(x)}" if hasattr(x, "shape") else type(x).__name__


def _flat_targets(target: Any, argument: str, target_name: str) -> list[Any]:
    import tensorflow as tf

    if not (flat := tf.nest.flatten(target)):
        raise input_error(f"{argument} is empty: there is nothing to differentiate.", argument,
                          "a tensor or a nest (list, tuple, dict) of tensors", repr(target),
                          f"pass the {target_name}(s) computed inside the tape's context.")
    for i, t in enumerate(flat):
        if not isinstance(t, (tf.Tensor, tf.Variable)):
            raise input_error(f"{argument} (flattened entry {i}) is not a tensor, so it was not recorded on a tape.",
                              argument if len(flat) == 1 else f"{argument} (flattened entry {i})",
                              "a tf.Tensor or tf.Variable computed inside the tape's context",
                              "None" if t is None else f"{type(t).__name__} {t!r}"[:60],
                              "return fn's output tensor(s), computed from the primals with TensorFlow ops (None: a missing "
                              "return?)." if argument == "fn's outputs" else f"pass the {target_name} tensor(s) computed from "
                              "the sources inside `with tf.GradientTape() as tape:`; a number, a numpy array or None has no gradient.")
        if not t.dtype.is_floating and not t.dtype.is_complex:
            raise input_error(f"{target_name}[{i}] is {t.dtype.name}: it has no derivative (TensorFlow would give zeros or None).",
                              argument, "floating-point targets", f"{target_name}[{i}]: {t.dtype.name}",
                              f"differentiate only float {target_name}s (drop or tf.cast integer results).", kind=DTypeMismatchError)
    return list(flat)


def _flat_sources(sources: Any) -> list[Any]:
    """The flattened sources, each a tf.Tensor or tf.Variable (else an InputError naming it)."""
    import tensorflow as tf

    flat = tf.nest.flatten(sources)
    for j, x in enumerate(flat):
        if not isinstance(x, (tf.Tensor, tf.Variable)):
            fix = f"pass {type(x).__name__}.unconstrained_variable" if hasattr(x, "unconstrained_variable") else "pass the tensors or variables"
            raise input_error(f"sources (flattened entry {j}) is not a tensor or a variable.", "sources" if len(flat) == 1 else f"sources[{j}]",
                              "tf.Tensor or tf.Variable (watched by the tape)", f"{type(x).__name__} {x!r}"[:60],
                              f"{fix} to differentiate with respect to, as in tape.gradient(target, sources).")  # fmt: skip
    return list(flat)


def _prepare_seeds(
    output_gradients: Any, targets: list[Any], *, argument: str, target_name: str, structure: Any
) -> list[Any] | None:
    """Flatten, validate, and convert the seeds; ``None`` entries become ones of the target's shape."""
    import tensorflow as tf

    if output_gradients is None:
        return None
    if isinstance(output_gradients, Mapping) and not isinstance(structure, Mapping):  # keys would pair by sorted order
        raise input_error(f"{argument} is a dict but the {target_name}s are not: its keys cannot name them.", argument,
                          f"a list with one seed per {target_name}, in the {target_name}s' order", "a dict",
                          f"pass the seeds as a list in the order of the {target_name}s.", kind=OutputGradientsError)
    if isinstance(output_gradients, Mapping) and set(map(str, output_gradients)) != set(map(str, structure)):
        raise input_error(f"{argument} and the {target_name}s are dicts with different keys.", argument,
                          f"keys {sorted(map(str, structure))}", f"keys {sorted(map(str, output_gradients))}",
                          f"give {argument} the same keys as the {target_name} dict.", kind=OutputGradientsError, label="Actual")
    flat = tf.nest.flatten(output_gradients)
    validate_seeds(flat, targets, argument=argument, target_name=target_name)
    eager, seeds = tf.executing_eagerly(), []
    for i, (seed, tgt) in enumerate(zip(flat, targets)):
        dtype = None if hasattr(seed, "dtype") else tgt.dtype  # a seed's dtype is checked; a number takes its target's
        t = converted(lambda: tf.ones_like(tgt) if seed is None else tf.convert_to_tensor(seed, dtype),
                      f"{argument}[{i}] could not be converted to a {dtype_name(tgt)} tensor.", f"{argument}[{i}]",
                      f"a tensor of shape {shape_str(tgt)} and dtype {dtype_name(tgt)}", type(seed).__name__,
                      f"pass tf.ones_like({target_name}[{i}]) or another tensor of its shape and dtype.",
                      kind=OutputGradientsError)
        if eager and t.dtype.is_floating:
            require_finite(t.numpy(), f"{argument}[{i}]")  # a NaN seed gives a NaN product
        seeds.append(t if eager else _assert_same_shape_at_run_time(t, tgt, f"{argument}[{i}]", f"{target_name}[{i}]"))
    return seeds


def _assert_same_shape_at_run_time(seed: Any, target: Any, seed_label: str, target_label: str) -> Any:
    """Inside ``tf.function``, where a static dim is unknown: check the shapes when the graph runs."""
    import tensorflow as tf

    if seed.shape.is_fully_defined() and target.shape.is_fully_defined():
        return seed  # decided statically by validate_seeds
    s_shape, t_shape = tf.shape(seed), tf.shape(target)
    same_rank = tf.equal(tf.size(s_shape), tf.size(t_shape))
    same = tf.cond(same_rank, lambda: tf.reduce_all(tf.equal(s_shape, t_shape)), lambda: tf.constant(False))
    check = tf.debugging.Assert(same, [f"Mismatch in output_gradients. {seed_label} and {target_label} have different "
                                       "shapes at run time (no broadcasting). Shapes of the seed and the target:",
                                       s_shape, t_shape])
    with tf.control_dependencies([check]):
        return tf.identity(seed)


_WATCH_REMEDY = (
    "compute the target from the source inside the tape's context and make sure the tape watches it "
    "(tf.Variables are watched automatically, tensors need tape.watch(x)); if a zero gradient is right, "
    'pass unconnected="zero".'
)


def _gradients(
    tape: Any, targets: list[Any], flat_sources: list[Any], seeds: Any, mode: str, *, source_name: str = "sources",
    target_name: str = "target", remedy: str = _WATCH_REMEDY,
) -> list[Any]:  # fmt: skip
    """``tape.gradient`` with ``unconnected`` = ``mode``; for "raise", an :class:`UnconnectedGradientError` naming the
    first source whose gradient is None."""
    import tensorflow as tf

    tf_mode = tf.UnconnectedGradients.ZERO if mode == "zero" else tf.UnconnectedGradients.NONE
    grads = list(tape.gradient(targets, flat_sources, output_gradients=seeds, unconnected_gradients=tf_mode))
    for j, g in enumerate(grads if tf.executing_eagerly() else []):  # NaN where fn has no derivative (tf.norm at 0)
        if g is not None:
            require_finite(tf.convert_to_tensor(g).numpy(), f"{source_name}[{j}]'s gradient", remedy="evaluate at a point "
                           "where fn is differentiable (tf.norm and tf.sqrt have no derivative at 0: tf.sqrt(tf.reduce_sum("
                           "x**2) + tiny) has one), or one where fn's value is finite.")
    missing = [j for j, g in enumerate(grads) if g is None] if mode == "raise" else []
    if not missing:
        return grads
    j = missing[0]
    where = f"{target_name}[0]" if len(targets) == 1 else f"any of the {len(targets)} {target_name}s"
    target_text = "; ".join(f"{target_name}[{i}]: {_describe(t)}" for i, t in enumerate(targets))
    context: list[tuple[str, object]] = [("Source", f"{source_name}[{j}]: {_describe(flat_sources[j])}"),
                                         ("Target", target_text)]
    if len(missing) > 1:
        context.append(("Also unconnected", ", ".join(f"{source_name}[{k}]" for k in missing[1:])))
    raise UnconnectedGradientError(f"{source_name}[{j}] is not connected to {where}: TensorFlow's gradient is None.",
                                   context=context, remedy=remedy)


@raised_as_is
def checked_gradient(
    tape: Any, target: Any, sources: Any, output_gradients: Any = None, *, unconnected: Any = "none",
) -> Any:
    """``tape.gradient`` that checks ``output_gradients`` before it calls: Jᵀ·v, never a broadcast.

    With targets y_i (the flattened ``target``), sources x_j and seeds v_i = ∂L/∂y_i, returns

        ∂L/∂x_j = Σ_i Σ_a v_i[a] · ∂y_i[a]/∂x_j          (Jᵀ·v; a seed of ones gives ∂(Σ y)/∂x_j)

    As torch does: one seed per flattened target, of exactly its shape (no broadcasting) and dtype (no cast; a Python
    number takes its target's dtype); ``None`` means ones. Nothing is computed before the checks pass, so a
    non-persistent tape stays usable. Inside ``tf.function``, dims unknown when tracing are checked when the graph
    runs (``tf.errors.InvalidArgumentError``, "Mismatch in output_gradients").

    Args:
        tape, target: the ``tf.GradientTape`` and the tensor or nest (list, tuple, dict) of tensors it recorded.
        sources: a tensor, a variable or a nest of them; the result has the same structure.
        output_gradients: ``None`` (ones for every target), or one seed per flattened target, nested or flat.
        unconnected: what a source that does not influence any target gets: ``"none"`` (``None``, as TensorFlow),
            ``"zero"`` (zeros of its shape) or ``"raise"`` (:class:`~natgrad_diag.exceptions.UnconnectedGradientError`
            naming the source and the target); ``tf.UnconnectedGradients`` values too.

    Returns:
        The gradients, structured like ``sources``: source j's entry has source j's shape.

    Raises:
        OutputGradientsError: a wrong number of seeds, or a seed of another shape or dtype (also a ``ValueError``).
        UnconnectedGradientError: ``unconnected="raise"`` and a source does not influence the target.
        InputError: ``tape`` is not a ``tf.GradientTape``, ``target`` is empty or not tensors, a source is not a tensor
            or variable, or a bad ``unconnected``.

    Example:
        >>> import tensorflow as tf
        >>> x = tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64)
        >>> with tf.GradientTape() as tape:
        ...     tape.watch(x)
        ...     y = x[:, None] * x[None, :]
        >>> checked_gradient(tape, y, x, tf.ones_like(y)).numpy()
        array([20., 20., 20., 20.])
    """
    import tensorflow as tf

    if not isinstance(tape, tf.GradientTape):
        raise input_error("tape must be the tf.GradientTape that recorded the target.", "tape",
                          "tf.GradientTape", type(tape).__name__,
                          "call checked_gradient(tape, target, sources, output_gradients) as you would tape.gradient(...).")
    mode = _unconnected_mode(unconnected)
    targets = _flat_targets(target, "target", "target")
    seeds = _prepare_seeds(output_gradients, targets, argument="output_gradients", target_name="target", structure=target)
    return tf.nest.pack_sequence_as(sources, _gradients(tape, targets, _flat_sources(sources), seeds, mode))


def _to_primal(x: Any, k: int) -> Any:
    import tensorflow as tf

    if x is None:
        raise input_error(f"primals[{k}] is None.", f"primals[{k}]", "a floating-point tensor, array or number", "None",
                          "pass the point to differentiate at.")
    t = converted(lambda: tf.convert_to_tensor(x if hasattr(x, "dtype") else np.asarray(x, dtype=np.float64)),
                  f"primals[{k}] could not be converted to a tensor.", f"primals[{k}]",
                  "a floating-point tensor, array or number", type(x).__name__, "pass float64 arrays or tensors.")
    if t.dtype.is_floating and tf.executing_eagerly():
        require_finite(t.numpy(), f"primals[{k}]")  # a NaN point gives a NaN product
    if not t.dtype.is_floating and not t.dtype.is_complex:
        raise input_error(f"primals[{k}] is {t.dtype.name}: a vector-Jacobian product needs a floating-point input.", f"primals[{k}]",
                          "float64 (or float32)", t.dtype.name,
                          f"cast it first, e.g. tf.cast(primals[{k}], tf.float64).", kind=DTypeMismatchError)
    return tf.identity(t)  # its own tensor: one tensor passed as two primals is two inputs, each with its gradient


@raised_as_is
def vjp(fn: Callable[..., Any], primals: Any, cotangents: Any, *, unconnected: Any = "zero") -> tuple[Any, Any]:
    """The outputs of ``fn(*primals)`` and Jᵀ·v, the functional form of :func:`checked_gradient` (same seed checks).

    Args:
        fn: a function of the primals returning a tensor or a nest of tensors.
        primals: one tensor/array (``fn(x)``) or a list/tuple of them (``fn(*primals)``); arrays and numbers
            without a dtype become float64, integer inputs are refused.
        cotangents: one seed per flattened output, of its exact shape and dtype, as in :func:`checked_gradient`.
        unconnected: for an input ``fn`` does not use: ``"zero"`` (default), ``"none"`` or ``"raise"``.

    Returns:
        ``(outputs, grads)``: ``outputs`` as ``fn`` returned them, ``grads`` one tensor per primal of its shape
        (a single tensor for a single primal).

    Raises:
        OutputGradientsError: as :func:`checked_gradient`; InputError: a primal is not a floating-point tensor.

    Example:
        >>> import tensorflow as tf
        >>> y, g = vjp(lambda x: x[:, None] * x[None, :], tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64),
        ...            tf.ones([4, 4], tf.float64))
        >>> g.numpy()
        array([20., 20., 20., 20.])
    """
    import tensorflow as tf

    require_callable(fn)
    single = not isinstance(primals, (list, tuple))
    xs = [_to_primal(x, k) for k, x in enumerate([primals] if single else primals)]
    mode = _unconnected_mode(unconnected)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(xs)
        outputs = call_fn(fn, xs)
    targets = _flat_targets(outputs, "fn's outputs", "output")
    if cotangents is None:
        raise input_error("cotangents is None.", "cotangents",
                          "one seed per output: " + ", ".join(shape_str(t) for t in targets), "None",
                          "pass the cotangents ∂L/∂output explicitly (tf.ones_like(output) for the gradient of "
                          "the sum).", kind=OutputGradientsError, label="Actual")
    seeds = _prepare_seeds(cotangents, targets, argument="cotangents", target_name="output", structure=outputs)
    grads = _gradients(tape, targets, xs, seeds, mode, source_name="primals", target_name="output",
                       remedy='make fn use every primal, or pass unconnected="zero" if a zero gradient is right.')
    grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]  # tf.gather: dense
    return outputs, (grads[0] if single else tuple(grads))
