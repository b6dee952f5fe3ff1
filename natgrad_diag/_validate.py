"""Input checks shared by the public functions: shapes, dtypes, numbers, finiteness, structure of q(u).

Each check raises a subclass of :class:`~natgrad_diag.exceptions.InputError` that names the argument,
what was expected, what was got and what to do. TensorFlow is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.exceptions import (
    DTypeMismatchError, InputError, NatGradDiagError, NonFiniteError, OutputGradientsError, ShapeMismatchError,
    SingularCovarianceError, UnsupportedModelError, error_line,
)


def shape_str(shape: Any) -> str:
    """``[5, 1]`` for a shape, a TensorShape or an array; ``[]`` for a scalar."""
    if hasattr(shape, "shape") and not isinstance(shape, tuple):
        shape = shape.shape
    dims = list(shape.as_list()) if hasattr(shape, "as_list") else list(shape)
    return "[" + ", ".join("None" if d is None else str(int(d)) for d in dims) + "]"


def dtype_name(x: Any) -> str:
    dtype = getattr(x, "dtype", None)
    return type(x).__name__ if dtype is None else getattr(dtype, "name", str(dtype))


@dataclass(frozen=True)
class ParamParts:
    """What natgrad-diag needs of a q_mu or q_sqrt: value, transform, and the shape of its unconstrained variable."""

    value: Any  # tf.Tensor, constrained
    transform: Any  # a tfp bijector, or None
    unconstrained_shape: tuple[int, ...]


def param_parts(x: Any, name: str) -> ParamParts:
    """Split a gpflow.Parameter, tf.Variable, tensor or array into what the natgrad flow uses."""
    import gpflow
    import tensorflow as tf

    if isinstance(x, gpflow.Parameter):
        return ParamParts(tf.convert_to_tensor(x), x.transform, tuple(x.unconstrained_variable.shape.as_list()))
    t = converted(lambda: tf.convert_to_tensor(x), f"{name} could not be converted to a tensor.", name,
                  "a gpflow.Parameter, tf.Variable, tensor or array", type(x).__name__,
                  f"pass {name} as a gpflow.Parameter (as in a GPflow model) or a float64 array.")
    return ParamParts(t, None, tuple(t.shape.as_list()))


def input_error(
    detail: str, argument: str, expected: str, got: object, remedy: str, *, kind: type[NatGradDiagError] = InputError,
    label: str | None = None,
) -> NatGradDiagError:
    """An :class:`InputError` (or ``kind``) with the usual context: the argument, what was expected and what was got
    (labelled ``label``; by default "Actual" for a ShapeMismatchError, whose got is a shape, else "Got")."""
    label = label or ("Actual" if issubclass(kind, ShapeMismatchError) else "Got")
    return kind(detail, context=[("Argument", argument), ("Expected", expected), (label, got)], remedy=remedy)


def converted(convert: Callable[[], Any], *error: Any, kind: type[NatGradDiagError] = InputError) -> Any:
    """``convert()``; when it raises a TypeError or ValueError, ``input_error(*error, kind=kind)`` raised from it."""
    try:
        return convert()
    except (TypeError, ValueError) as e:
        raise input_error(*error, kind=kind) from e


def require_int(
    value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None, expected: str = "", remedy: str = "", why: str = "",
) -> int:  # fmt: skip
    """``value`` as an ``int`` (a Python or numpy integer, not a bool), at least ``minimum`` and at most ``maximum``
    when given (``why`` says why there is a maximum).

    Raises:
        InputError: naming the argument, e.g. "num_directions must be a positive integer."

    Examples:
        >>> require_int(3, "seed")
        3
        >>> require_int(0, "num_directions", minimum=1)
        Traceback (most recent call last):
        ...
        natgrad_diag.exceptions.InputError: Invalid input. num_directions must be a positive integer.
          Argument: num_directions
            Expected: an int ≥ 1
            Got:      0
          To fix: pass e.g. num_directions=4.
    """
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if is_int and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return int(value)
    if is_int and maximum is not None and value > maximum:
        raise input_error(f"{name} must be at most {maximum}." + (f" {why}" if why else ""), name, expected or f"an int ≤ {maximum}",
                          repr(value), remedy or f"pass {name} ≤ {maximum}.")  # fmt: skip
    if minimum is None:
        detail, default_expected, example = f"{name} must be an integer.", "an int", 0
    else:
        what = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        detail, default_expected, example = f"{name} must be {what}.", f"an int ≥ {minimum}", max(minimum, 4)
    raise input_error(detail, name, expected or default_expected, repr(value), remedy or f"pass e.g. {name}={example}.")


def require_bool(value: Any, name: str) -> bool:
    """``value`` when it is True or False (numpy's included); else an :class:`InputError` naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise input_error(f"{name} must be True or False.", name, "a bool", repr(value), f"pass {name}=True or {name}=False.")
    return bool(value)


def require_positive_float(value: Any, name: str, *, remedy: str = "") -> float:
    """``float(value)``, finite and > 0; else an :class:`InputError` naming ``name``.

    Examples:
        >>> require_positive_float(1e-6, "eps")
        1e-06
    """
    def number() -> float:
        if isinstance(value, (str, bytes, bool, np.bool_)):  # float() reads "1" and True
            raise TypeError(type(value).__name__)
        return float(value)

    v = converted(number, f"{name} must be a number.", name, "a finite float > 0", repr(value), remedy or f"pass {name} as a float.")
    if not np.isfinite(v) or v <= 0:
        raise input_error(f"{name} must be finite and > 0.", name, "a finite float > 0", v, remedy or f"pass a finite {name} > 0.")
    return v


def require_float(x: Any, name: str) -> None:
    if dtype_name(x) not in ("float64", "float32", "float16"):
        raise input_error(f"{name} must be a floating-point tensor.", name, "float64 (or float32)", dtype_name(x),
                          f"convert {name} with tf.cast({name}, tf.float64) or gpflow.utilities.to_default_float.", kind=DTypeMismatchError)


def require_finite(x: Any, name: str, *, remedy: str = "") -> None:
    a = np.asarray(x)
    bad = ~np.isfinite(a)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise NonFiniteError(
            f"{name} contains {int(np.isnan(a).sum())} NaN and {int(np.isinf(a).sum())} Inf value(s).",
            context=[("Argument", name), ("Shape", shape_str(a.shape)), ("First at", list(first)), ("Value", a[first])],
            remedy=remedy or f"find where {name} became non-finite (often a failed Cholesky or a too-large gamma) and pass finite values.",
        )


def require_same_dtype(x: Any, ref: Any, name: str, ref_name: str) -> None:
    if dtype_name(x) != dtype_name(ref):
        raise input_error(f"{name} must have the dtype of {ref_name}.", name, f"{dtype_name(ref)} (the dtype of {ref_name})", dtype_name(x),
                          f"cast {name} to {dtype_name(ref)}; mixing precisions silently loses accuracy.", kind=DTypeMismatchError)


_FULL_COVARIANCE = "build the model with q_diag=False (the default) to use natural gradients."


def validate_q(q_mu: ParamParts, q_sqrt: ParamParts) -> None:
    """Check q_mu [M, L] and q_sqrt [L, M, M] agree; q_diag ([M, L]) is refused."""
    mu_shape = tuple(q_mu.value.shape.as_list())
    sq_shape = tuple(q_sqrt.value.shape.as_list())
    if len(mu_shape) != 2:
        raise input_error("q_mu must be a matrix [M, L].", "q_mu", "[M, L]", shape_str(mu_shape),
                          "pass q_mu with one column per latent GP, e.g. q_mu[:, None] for a single GP.",
                          kind=ShapeMismatchError)
    M, L = mu_shape
    if sq_shape == (M, L):
        raise input_error("q_sqrt is diagonal ([M, L], q_diag=True); GPflow's NaturalGradient supports only the full "
                          "covariance parametrisation [L, M, M].", "q_sqrt", f"[L, M, M] = {shape_str((L, M, M))}",
                          shape_str(sq_shape), _FULL_COVARIANCE, kind=UnsupportedModelError, label="Actual")
    if sq_shape != (L, M, M):
        raise input_error("q_mu and q_sqrt disagree on M (inducing points) or L (latent GPs).", "q_sqrt",
                          f"[L, M, M] = {shape_str((L, M, M))} (from q_mu {shape_str(mu_shape)})", shape_str(sq_shape),
                          "pass the q_mu and q_sqrt of the same variational distribution" + (" (one [M, M] factor per "
                          "latent GP: q_sqrt[None] for L = 1)." if len(sq_shape) == 2 else "."), kind=ShapeMismatchError)
    require_float(q_mu.value, "q_mu")
    require_same_dtype(q_sqrt.value, q_mu.value, "q_sqrt", "q_mu")
    require_finite(q_mu.value, "q_mu")
    require_finite(q_sqrt.value, "q_sqrt")
    diag = np.abs(np.diagonal(np.asarray(q_sqrt.value), axis1=-2, axis2=-1))  # [L, M]
    if (diag == 0).any():
        l_idx, m_idx = (int(i) for i in np.argwhere(diag == 0)[0])
        raise SingularCovarianceError(
            "q_sqrt has a zero on its diagonal, so S = q_sqrt q_sqrtᵀ is singular and has no natural "
            "parameters (S⁻¹ does not exist).",
            context=[("Argument", "q_sqrt"), ("Zero at", f"q_sqrt[{l_idx}, {m_idx}, {m_idx}]"), ("Diagonal", diag[l_idx])],
            remedy="use a q_sqrt with a non-zero diagonal (GPflow initialises it to the identity).",
        )


def validate_grad(grad: Any, part: ParamParts, name: str, param_name: str) -> Any:
    """The gradient of a parameter's unconstrained variable: same shape, same dtype, finite."""
    import tensorflow as tf

    g = converted(lambda: tf.convert_to_tensor(grad), f"{name} could not be converted to a tensor.", name,
                  "a float tensor", type(grad).__name__,
                  f"pass the gradient of the loss with respect to {param_name}.unconstrained_variable.")
    if g.dtype.is_floating and g.dtype != part.value.dtype:
        require_same_dtype(g, part.value, name, param_name)
    require_float(g, name)
    where = f"{param_name}.unconstrained_variable" if part.transform is not None else param_name
    if tuple(int(d) for d in g.shape) != tuple(part.unconstrained_shape):
        raise input_error(f"{name} must have the shape of {where}.", name, shape_str(part.unconstrained_shape),
                          shape_str(g.shape), f"pass tape.gradient(loss, {where}); GPflow's step expects gradients in "
                          "unconstrained space.", kind=ShapeMismatchError)
    require_finite(g, name)
    return g


def validate_seeds(
    seeds: Sequence[Any], targets: Sequence[Any], *, argument: str = "output_gradients", target_name: str = "target",
) -> None:  # fmt: skip
    """Each given seed (``None`` means ones) must have exactly its target's shape and dtype, as torch's ``Mismatch in
    shape: grad_output[0] has a shape of ...``: no broadcasting, no silent cast.

    ``argument`` and ``target_name`` name the flattened seeds and targets in the OutputGradientsError. A Python
    number is not dtype-checked; unknown static dims (inside ``tf.function``) are not compared.
    """

    def static_dims(x: Any) -> tuple[int | None, ...] | None:
        # the static shape (None for an unknown dim), or None for an unknown rank
        shape = getattr(x, "shape", None)
        if getattr(shape, "rank", 0) is None:
            return None
        return tuple(None if d is None else int(d) for d in (np.shape(x) if shape is None else shape))

    def agree(a: tuple[int | None, ...] | None, b: tuple[int | None, ...] | None) -> bool:
        # equal shapes, no broadcasting; an unknown dim or rank agrees with anything
        return a is None or b is None or len(a) == len(b) and all(None in (x, y) or x == y for x, y in zip(a, b))

    def describe(x: Any) -> str:
        return "None" if x is None else "unknown rank" if (dims := static_dims(x)) is None else shape_str(dims)

    if len(seeds) != len(targets):
        hint = ""
        if len(seeds) > len(targets) and any(s is not None and not hasattr(s, "shape") for s in seeds):
            hint = (f" A Python list of numbers is read as {len(seeds)} separate seeds (tf.nest.flatten): wrap it, "
                    f"e.g. tf.constant([...], dtype=tf.{dtype_name(targets[0]) if targets else 'float64'}).")
        raise input_error(
            f"{argument} has {len(seeds)} entr{'y' if len(seeds) == 1 else 'ies'} for {len(targets)} {target_name}(s).",
            argument, f"{len(targets)} seed(s), one per flattened {target_name}: " + ", ".join(map(describe, targets)),
            f"{len(seeds)} seed(s)" + (": " if seeds else "") + ", ".join(map(describe, seeds)),
            f"pass one seed per {target_name}, in the order tf.nest.flatten gives the {target_name}s "
            f"(None for a seed of ones).{hint}", kind=OutputGradientsError, label="Actual",
        )
    for i, (seed, target) in enumerate(zip(seeds, targets)):
        if seed is None:
            continue
        s_shape, t_shape = static_dims(seed), static_dims(target)
        if not agree(s_shape, t_shape):
            raise input_error(
                f"{argument}[{i}] has a shape of {shape_str(s_shape)} and {target_name}[{i}] has a shape of "
                f"{shape_str(t_shape)}.", f"{argument}[{i}]", f"{shape_str(t_shape)} ({target_name}[{i}]'s shape)",
                shape_str(s_shape), f"pass a seed of exactly the {target_name}'s shape, e.g. tf.ones_like("
                f"{target_name}[{i}]) or dL/d{target_name}[{i}]; TensorFlow would broadcast it or fail deep inside.",
                kind=OutputGradientsError, label="Actual",
            )
        want, got = dtype_name(target), dtype_name(seed)
        if hasattr(seed, "dtype") and got != want:
            raise input_error(
                f"{argument}[{i}] has dtype {got} and {target_name}[{i}] has dtype {want}.", f"{argument}[{i}]",
                f"{want} ({target_name}[{i}]'s dtype)", got, f"cast the seed to {want}, e.g. tf.cast(seed, tf.{want}); "
                "TensorFlow would fail deep inside, and no cast is done silently.",
                kind=OutputGradientsError, label="Actual",
            )


def seed_array(seed: Any, target: Any, name: str) -> Any:
    """A checked seed (see :func:`validate_seeds`) as a finite numpy array of ``target``'s dtype; ``None``: ones."""
    dtype = np.dtype(getattr(target.dtype, "as_numpy_dtype", target.dtype))
    if seed is None:
        return np.ones(tuple(target.shape), dtype)
    a = converted(lambda: np.asarray(getattr(seed, "numpy", lambda: seed)(), dtype=dtype),
                  f"{name} could not be converted to a {dtype.name} array.", name,
                  f"numbers of shape {shape_str(target)}", f"{type(seed).__name__} {seed!r}"[:80],
                  f"pass {name} as a {dtype.name} array.", kind=OutputGradientsError)
    require_finite(a, name)  # a NaN cotangent gives NaN products, which would read as a mismatch
    return a


# ---- the one layer for functions of tensors: fn, inputs, outputs, sizes ------------------------------------


def require_callable(fn: Any, name: str = "fn") -> None:
    """``fn`` must be callable; else an :class:`InputError` naming ``name``."""
    if not callable(fn):
        raise input_error(
            f"{name} must be callable.", name, "a function of the inputs returning a tensor or a nest of tensors",
            f"{type(fn).__name__} {fn!r}"[:80], f"pass the function itself, e.g. {name}=tf.sin (not its value).",
        )  # fmt: skip


def as_float_tensor(x: Any, name: str) -> Any:
    """``x`` as a floating-point tensor: numbers and lists become float64, tensors and arrays keep their dtype.

    Raises:
        InputError: ``x`` is ``None`` or cannot be converted (a string, an object).
        DTypeMismatchError: ``x`` has an integer, bool, complex or string dtype.

    Examples:
        >>> as_float_tensor(2.0, "x").dtype.name  # a Python number is float64, as GPflow's default float
        'float64'
        >>> as_float_tensor([1, 2], "x").dtype.name
        'float64'
    """
    import tensorflow as tf

    if x is None:
        raise input_error(f"{name} is None.", name, "a float tensor, array or number", "None", f"pass a value for {name}.")

    def convert() -> Any:
        if isinstance(x, (tf.Tensor, tf.Variable, np.ndarray, np.generic)):  # keeps its dtype
            return tf.convert_to_tensor(x)
        a = np.asarray(x)
        return tf.convert_to_tensor(a.astype("float64") if a.dtype.kind in "iuf" else a)  # GPflow's default float

    t = converted(convert, f"{name} could not be converted to a tensor.", name, "a float tensor, array or number",
                  type(x).__name__, f"pass {name} as a float64 array or tensor (nested lists must be rectangular).")
    if not t.dtype.is_floating or t.dtype.name not in ("float16", "float32", "float64", "bfloat16"):
        raise input_error(f"{name} is {t.dtype.name}: derivatives need a real floating-point input.", name,
                          "float64 (or float32)", t.dtype.name, f"cast it first, e.g. tf.cast({name}, tf.float64); "
                          "TensorFlow would return zeros or None for it.", kind=DTypeMismatchError)
    return t


def output_labels(outputs: Any) -> tuple[str, ...] | None:
    """Labels of a dict's flattened leaves (its keys, or paths in a nested one), in ``tf.nest.flatten``'s order;
    ``None`` for other structures.

    Examples:
        >>> output_labels({10: 1.0, 2: 2.0, 9: 3.0})
        ('2', '9', '10')
        >>> output_labels({"z": (1.0, 2.0), "w": [3.0]})
        ('w/0', 'z/0', 'z/1')
    """
    import tensorflow as tf

    if not isinstance(outputs, Mapping):
        return None

    def paths(x: Any, prefix: str) -> Any:
        # the same nest with each leaf replaced by its path; tf.nest.flatten then orders them as it orders x
        join = (prefix + "/") if prefix else ""
        if isinstance(x, Mapping):
            return {k: paths(v, f"{join}{k}") for k, v in x.items()}
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(paths(v, f"{join}{f}") for f, v in zip(x._fields, x)))
        return type(x)(paths(v, f"{join}{k}") for k, v in enumerate(x)) if isinstance(x, (list, tuple)) else prefix

    try:
        labels = tuple(tf.nest.flatten(paths(outputs, "")))
    except (TypeError, ValueError):
        return None
    return labels if len(labels) == len(tf.nest.flatten(outputs)) else None


def flat_outputs(outputs: Any, name: str = "fn") -> list[Any]:
    """``fn``'s outputs flattened (``tf.nest.flatten``) into real floating tensors.

    Raises:
        InputError: ``fn`` returned ``None``, nothing, or a leaf that is not a tensor.
        DTypeMismatchError: an output is integer, bool, complex or a string (its derivative would be zeros).
    """
    import tensorflow as tf

    leaves = tf.nest.flatten(outputs)
    if outputs is None or not leaves or any(y is None for y in leaves):
        raise input_error(
            f"{name} returned {'None' if outputs is None else 'no tensor' if not leaves else 'None inside its outputs'}.",
            name, "a tensor or a nest (tuple, list, dict) of tensors", repr(outputs)[:80],
            f"make {name} return its result (a missing `return` gives None).",
        )  # fmt: skip
    ys = []
    for k, y in enumerate(leaves):
        t = converted(lambda: tf.convert_to_tensor(y), f"output {k} of {name} is not a tensor.", name,
                      "tensors as outputs", type(y).__name__, f"return only tensors from {name}.")
        if not t.dtype.is_floating:
            raise input_error(f"output {k} of {name} is {t.dtype.name}: it has no derivative (TensorFlow would give "
                              "zeros).", name, "real floating-point outputs", f"output {k}: {t.dtype.name}",
                              f"return only differentiable float tensors from {name} (drop or tf.cast integer "
                              "results).", kind=DTypeMismatchError)
        ys.append(t)
    return ys


def require_output_dtypes(ys: Sequence[Any], dtype: Any, name: str = "fn") -> None:
    """Every output must have the inputs' dtype: a cast inside ``fn`` changes the precision of the derivative."""
    want = getattr(dtype, "name", str(dtype))
    for k, y in enumerate(ys):
        if dtype_name(y) != want:
            raise input_error(f"output {k} of {name} is {dtype_name(y)} but the inputs are {want}.", name,
                              f"{want} outputs (the inputs' dtype)", f"output {k}: {dtype_name(y)}",
                              f"compute in one precision: cast the inputs (or drop the cast inside {name}) so outputs "
                              "and inputs share a dtype.", kind=DTypeMismatchError)


def require_max_bytes(value: Any, name: str = "max_bytes") -> int:
    """A memory limit: an int ≥ 1 (bytes)."""
    return require_int(value, name, minimum=1, expected="bytes ≥ 1, e.g. 2 * 1024**3", remedy=f"pass {name} ≥ 1, or leave the default.")


def names_of(given: Sequence[str] | None, count: int, kind: str) -> tuple[str, ...]:
    """``given`` as ``count`` names of ``kind`` ("inputs" or "outputs"; default ``x0, x1, ...`` or ``y0, y1, ...``)."""
    if given is None:
        return tuple(f"{'x' if kind == 'inputs' else 'y'}{k}" for k in range(count))
    given, argument = tuple(given), f"{kind[:-1]}_names"
    if len(given) != count:
        raise input_error(f"{argument} must name each of the {count} {kind}.", argument, f"{count} names",
                          f"{len(given)}: {given}", f"pass {count} names, or leave {argument}=None.")
    return given


def split_inputs(inputs: Any, input_names: Sequence[str] | None, *, remedy: str = "pass the point, e.g. [x].") -> tuple[list[Any], tuple[str, ...]]:
    """The values of ``inputs`` (a sequence, a dict whose keys name them, or one value) and their names
    (``input_names``, the dict's keys, or ``x0, x1, ...``).

    Raises:
        InputError: ``inputs`` is None or empty (``remedy`` says what to pass), or the names do not match.
    """
    if inputs is None:
        raise input_error("inputs is None.", "inputs", "a tensor, array, number or a list of them", "None", remedy)
    values = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if not values:
        raise input_error("inputs is empty.", "inputs", "one or more float tensors", "0 inputs", remedy)
    if input_names is None and isinstance(inputs, Mapping):
        input_names = [str(k) for k in inputs]
    return values, names_of(input_names, len(values), "inputs")


def call_fn(fn: Any, xs: Sequence[Any], name: str = "fn", *, at: str = "", remedy: str = "") -> Any:
    """``fn(*xs)``; an error inside it: an :class:`InputError` naming ``fn``, its inputs' shapes, ``at`` and ``remedy``."""
    try:
        return fn(*xs)
    except NatGradDiagError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the user's function is reported the same way
        inputs = [("Inputs", ", ".join(f"{shape_str(x)} {dtype_name(x)}" for x in xs))] if xs else []
        raise InputError(f"{name}({'*inputs' if xs else ''}) raised an error{at}.", context=[("Argument", name), *inputs, ("Error", error_line(e, with_type=True))],
                         remedy=remedy or f"call {name} on these inputs yourself to see the error; check how many inputs it takes and their shapes.") from e


def validate_model(model: Any) -> None:
    """An SVGP- or VGP-like GPflow model: q_mu [M, L] and q_sqrt [L, M, M] Parameters (not q_diag), float64 or float32."""
    import gpflow

    q_mu, q_sqrt = getattr(model, "q_mu", None), getattr(model, "q_sqrt", None)
    if not isinstance(model, gpflow.models.GPModel) or not isinstance(q_mu, gpflow.Parameter) or not isinstance(q_sqrt, gpflow.Parameter):
        raise input_error(
            "natural gradients need a GPflow model with a variational q(u) = N(q_mu, q_sqrt q_sqrtᵀ).", "model",
            "gpflow.models.SVGP or gpflow.models.VGP (q_mu and q_sqrt Parameters)", type(model).__name__,
            "pass an SVGP or VGP model; GPR and SGPR have no variational parameters to take natural steps on.",
            kind=UnsupportedModelError,
        )
    if getattr(model, "q_diag", False) or len(q_sqrt.shape) == 2:
        raise input_error("q_sqrt is diagonal (q_diag=True); GPflow's NaturalGradient supports only the full "
                          "covariance parametrisation q_sqrt [L, M, M].", "model.q_sqrt", "[L, M, M] (q_diag=False)",
                          f"{list(q_sqrt.shape)} (q_diag=True)", _FULL_COVARIANCE, kind=UnsupportedModelError,
                          label="Actual")
    if len(q_mu.shape) != 2 or len(q_sqrt.shape) != 3 or tuple(q_sqrt.shape) != (q_mu.shape[1], q_mu.shape[0], q_mu.shape[0]):
        raise input_error("q_mu and q_sqrt do not have GPflow's shapes q_mu [M, L], q_sqrt [L, M, M].",
                          "model.q_mu / model.q_sqrt",
                          "[M, L] and [L, M, M]", f"{list(q_mu.shape)} and {list(q_sqrt.shape)}",
                          "natural gradients need one full-covariance q(u) per latent GP, as SVGP and VGP build them.",
                          kind=UnsupportedModelError, label="Actual")
    if dtype_name(q_mu) not in ("float64", "float32"):
        raise input_error("the model's variational parameters must be float64 or float32.", "model.q_mu",
                          "float64 (or float32)", str(q_mu.dtype),
                          "build the model under gpflow.config.set_default_float(np.float64).")


def validate_data(model: Any, data: Any, dtype: Any, name: str = "data") -> Any:
    """``(X [N, D], Y [N, P])`` as tensors of ``dtype`` that fit ``model``, or None for a model that holds its data.

    D comes from the inducing points Z [M, D] (or the model's own data), P is the number of latent GPs L (L + 1 for a
    SwitchedLikelihood, whose last column picks the likelihood); for a likelihood that takes the L latent GPs together
    (GPflow's ``latent_dim``), its ``observation_dim`` (any when None; one class label for a multi-class one). X
    and Y must be real numbers (integers are cast, but for GPflow's Softmax, which takes integer class labels),
    finite, with N ≥ 1.

    Raises:
        InputError, ShapeMismatchError, DTypeMismatchError, NonFiniteError: naming ``data``'s X or Y.
    """
    import gpflow
    import tensorflow as tf

    if isinstance(model, gpflow.models.InternalDataTrainingLossMixin):
        if data is not None:
            raise input_error(f"{type(model).__name__} holds its own data; {name} must be None.", name,
                              "None (the data are in model.data)", type(data).__name__, "call check_natgrad(model) without data.")  # fmt: skip
        return None
    if data is None:
        raise input_error(f"{type(model).__name__}'s training loss needs data.", name, "a tuple (X [N, D], Y [N, P])", "None",
                          "pass the full batch, check_natgrad(model, (X, Y)), as you pass it to model.training_loss.")  # fmt: skip
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        got = type(data).__name__ + (f" of length {len(data)}" if hasattr(data, "__len__") else "")
        raise input_error(f"{name} must be a pair (X, Y).", name, "a tuple (X [N, D], Y [N, P])", got, f"pass {name}=(X, Y).")
    X, Y = (np.asarray(getattr(v, "numpy", lambda v=v: v)()) for v in data)
    for k, (part, a, dims) in enumerate((("X", X, "[N, D]"), ("Y", Y, "[N, P]"))):
        arg = f"{name}[{k}] ({part})"
        if a.dtype.kind not in "fiu":
            raise input_error(f"{name}'s {part} must be real numbers.", arg, "float64 (or float32, or integers)",
                              str(a.dtype), f"pass {part} as a real float array (a complex {part} would lose its "
                              "imaginary part).", kind=DTypeMismatchError)
        if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
            raise input_error(f"{name}'s {part} must be a non-empty matrix {dims}.", arg,
                              f"{dims} with N ≥ 1 and at least one column", shape_str(a.shape),
                              f"reshape {part} to {dims}, e.g. {part}[:, None] for one column; the check needs at "
                              "least one data point.", kind=ShapeMismatchError)
    if X.shape[0] != Y.shape[0]:
        raise input_error(f"{name}'s X and Y must have the same number of rows N.", name,
                          "X [N, D] and Y [N, P] with one N", f"X {shape_str(X.shape)}, Y {shape_str(Y.shape)}",
                          "pass X and Y of the same data points.", kind=ShapeMismatchError)
    Z = getattr(getattr(model, "inducing_variable", None), "Z", None)
    D = int(Z.shape[-1]) if Z is not None and len(Z.shape) == 2 else None
    if D is not None and X.shape[1] != D:
        raise input_error(f"{name}'s X has {X.shape[1]} input dimension(s) but the model has {D}.", f"{name}[0] (X)",
                          f"[N, {D}] (D from the model's inducing points)", shape_str(X.shape),
                          "pass the X the model was built for (its inducing points Z [M, D] fix D).",
                          kind=ShapeMismatchError)
    L, likelihood = getattr(model, "num_latent_gps", None), getattr(model, "likelihood", None)
    switched = isinstance(likelihood, gpflow.likelihoods.SwitchedLikelihood)  # Y's last column picks the likelihood
    multi = isinstance(likelihood, (gpflow.likelihoods.MultiClass, gpflow.likelihoods.Softmax))
    W = getattr(getattr(model, "kernel", None), "W", None)  # LinearCoregionalization: f [N, P] = g [N, L]·Wᵀ
    if getattr(likelihood, "latent_dim", None) is None:  # a scalar likelihood: one Y column per output
        P = None if L is None else (int(L) if W is None else int(W.shape[0])) + switched
        has, fix = f"the model has {(P or 0) - switched} output(s)", "one Y column per output" + (
            " and the likelihood index last" if switched else "")
    else:  # it takes the L latent GPs together: Y has its observation_dim columns (None: any), a class label has one
        P = 1 if multi else getattr(likelihood, "observation_dim", None)
        has, fix = f"{type(likelihood).__name__} takes {P}", "the class labels as one column" if multi else f"Y [N, {P}]"
    if P is not None and Y.shape[1] != P:
        raise input_error(f"{name}'s Y has {Y.shape[1]} column(s) but {has}.", f"{name}[1] (Y)", f"[N, {P}]" + (
            " (the last column picks the likelihood)" if switched else ""), shape_str(Y.shape), f"pass {fix} (GPflow "
            "would broadcast the others silently or fail inside its loss).", kind=ShapeMismatchError)
    for k, a in enumerate((X, Y)):
        require_finite(a, f"{name}[{k}] ({'XY'[k]})")
    labels = isinstance(likelihood, gpflow.likelihoods.Softmax)  # tf.nn.sparse_softmax_cross_entropy_with_logits
    if labels and Y.dtype.kind == "f":
        raise input_error(f"GPflow's Softmax likelihood takes integer class labels; {name}'s Y is {Y.dtype}.", f"{name}[1] (Y)",
                          "int64 (or int32) class labels [N, 1]", str(Y.dtype), "pass Y.astype(np.int64), as GPflow's own "
                          "training loss needs.", kind=DTypeMismatchError)  # fmt: skip
    return tf.constant(X.astype(dtype)), tf.constant(Y if labels else Y.astype(dtype))
