"""Assertions for your own pytest suite: gradients, vector-Jacobian products, natural-gradient steps."""

# Each helper raises an ``AssertionError`` subclass with a message that names the block or input, the
# worst entry, expected against actual, the tolerances and what to do, so a failing test reads:
#
#     natgrad_diag.exceptions.JacobianMismatchError: Jacobian mismatch. Output 0 (square) with respect to
#     input 0 (x): finite differences and the analytical derivative disagree.
#       Output:      0 (square)
#       Input:       0 (x, structure 'general')
#       Worst entry: ∂square[2]/∂x[2]
#         Expected:    numerical  4.000000000115023  (central differences, eps=1e-06)
#         Actual:      analytical 6.0  (reverse mode)
#       ...
#
# Only numpy is imported here; TensorFlow, GPflow and the natural-gradient checks load on first use.
# In a test file:
#
#     from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt
#     from natgrad_diag.testing import assert_gradients
#
#     def test_my_map_gradients():
#         assert_gradients(expectation_to_meanvarsqrt, [eta1, eta2])   # eta2 is checked as symmetric

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from natgrad_diag.autodiff.memory import DEFAULT_MAX_BYTES
from natgrad_diag.gradcheck.api import assert_gradients
from natgrad_diag.typing import Array

__all__ = ["assert_gradients", "assert_natgrad_step_matches_gpflow", "assert_vjp_matches_jacobian"]


def assert_vjp_matches_jacobian(
    fn: Callable[..., Any],
    inputs: Sequence[Any] | Mapping[str, Any] | Any,
    cotangents: Sequence[Any] | Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[Array, ...]:
    """Assert that ``tape.gradient(fn(*inputs), inputs, output_gradients=cotangents)`` is Jᵀ·v.

    With J_ij = ∂y_i/∂x_j from reverse mode (:func:`natgrad_diag.gradcheck.full.reverse_jacobian`, one-hot seeds) and v_i the
    cotangent of output i, the expected result for input j is the explicit contraction

        (Jᵀ·v)_j[b] = Σ_i Σ_a v_i[a] · J_ij[a, b]          (numpy ``tensordot``)

    which is what ``output_gradients`` computes, and not (Jᵀ·1) ⊙ v. Catches gradients that are not
    linear in the upstream gradient (a ``tf.custom_gradient`` that forgets to multiply by ``dy``) and
    seeds in the wrong order. To check the Jacobian itself against finite differences use
    :func:`assert_gradients`.

    Args:
        fn: a function of the inputs returning a tensor or a nest of tensors.
        inputs: the point: a sequence of float tensors/arrays (or a dict: its keys name the inputs).
        cotangents: one seed per flattened output (exact shape and dtype; ``None`` means ones).
        rtol, atol: tolerances; default :func:`natgrad_diag.tolerance.default_tolerance`'s "exact" kind
            ((1e-10, 1e-12) in float64, (1e-4, 1e-5) in float32). An entry
            passes when |vjp − Jᵀ·v| ≤ atol + rtol·|Jᵀ·v|.
        input_names, output_names: names for the message (default ``x0, ...`` / ``y0, ...`` or dict keys).
        max_bytes: refuse, before allocating, a dense Jacobian larger than this (default 2 GiB).

    Returns:
        The VJP, one array per input (shape of that input).

    Raises:
        JacobianMismatchError: for some input the VJP differs from Jᵀ·v (names the input and worst entry).
        OutputGradientsError: a cotangent has the wrong count, shape or dtype.
        MemoryLimitError: the dense Jacobian would exceed ``max_bytes``.
    """
    __tracebackhide__ = True
    from natgrad_diag._validate import require_callable, require_max_bytes, tolerances

    require_callable(fn)
    max_bytes = require_max_bytes(max_bytes)
    xs, names = _point(inputs, input_names)
    tolerances(xs[0].dtype, "exact", rtol=rtol, atol=atol)  # bad rtol/atol: an InputError before any work
    got, want, dtype = _vjp_and_contraction(fn, xs, names, cotangents, output_names=output_names, max_bytes=max_bytes)
    # two exact routes to the same numbers: only rounding separates them (tolerance.py's "exact" kind)
    tol = tolerances(dtype, "exact", rtol=rtol, atol=atol)
    for j, (g, w) in enumerate(zip(got, want)):
        _raise_on_mismatch(j, names[j], g, w, rtol=tol.rtol, atol=tol.atol)
    return got


def _point(inputs: Any, input_names: Sequence[str] | None) -> tuple[list[Any], tuple[str, ...]]:
    """Constant copies of the inputs (float, finite) and their names."""
    import tensorflow as tf

    from natgrad_diag._validate import as_float_tensor, input_error, require_finite

    if inputs is None:
        raise input_error("inputs is None.", "inputs", "a tensor, array, number or a list of them", "None", "pass the point, e.g. [x].")
    if isinstance(inputs, Mapping):
        names = tuple(str(k) for k in inputs) if input_names is None else tuple(input_names)
        values = list(inputs.values())
    else:
        values = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        names = tuple(input_names) if input_names is not None else tuple(f"x{k}" for k in range(len(values)))
    # numbers and lists become float64, as everywhere in the package
    xs = [tf.constant(np.array(as_float_tensor(v, f"inputs[{k}] ({n})").numpy(), copy=True)) for k, (n, v) in enumerate(zip(names, values))]
    for n, x in zip(names, xs):
        require_finite(x.numpy(), n)
    return xs, names


def _vjp_and_contraction(
    fn: Callable[..., Any], xs: list[Any], names: tuple[str, ...], cotangents: Any, *,
    output_names: Sequence[str] | None, max_bytes: int,
) -> tuple[tuple[Array, ...], tuple[Array, ...], np.dtype]:  # fmt: skip
    """(tape.gradient with the cotangents, Jᵀ·v from the explicit reverse-mode Jacobian contracted by numpy,
    the first output's dtype)."""
    import tensorflow as tf

    from natgrad_diag._validate import flat_outputs, require_output_dtypes, validate_seeds
    from natgrad_diag.autodiff.memory import check_memory, jacobian_nbytes
    from natgrad_diag.gradcheck.full import reverse_jacobian

    seeds = list(cotangents) if isinstance(cotangents, (list, tuple)) else [cotangents]
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(xs)
        ys = flat_outputs(fn(*xs))
    require_output_dtypes(ys, xs[0].dtype)
    validate_seeds(seeds, ys, argument="cotangents", target_name="output")
    out_shapes = [tuple(y.shape) for y in ys]
    in_shapes = [tuple(x.shape) for x in xs]
    check_memory(jacobian_nbytes(out_shapes, in_shapes, ys[0].dtype.size), max_bytes, "assert_vjp_matches_jacobian")
    vs = [
        np.ones(y.shape, y.dtype.as_numpy_dtype) if s is None else np.asarray(s, dtype=y.dtype.as_numpy_dtype)
        for s, y in zip(seeds, ys)
    ]
    got = tape.gradient(ys, xs, output_gradients=[tf.constant(v) for v in vs], unconnected_gradients=tf.UnconnectedGradients.ZERO)
    J = reverse_jacobian(fn, [x.numpy() for x in xs], input_names=names, output_names=output_names, max_bytes=max_bytes)
    want = tuple(
        np.asarray(sum(np.tensordot(v, J.block(i, j), axes=v.ndim) for i, v in enumerate(vs))) for j in range(len(xs))
    )
    return tuple(g.numpy() for g in got), want, np.dtype(vs[0].dtype)


def _raise_on_mismatch(j: int, name: str, got: Array, want: Array, *, rtol: float, atol: float) -> None:
    """Raise JacobianMismatchError naming the worst entry when some |got − want| > atol + rtol·|want|."""
    from natgrad_diag.autodiff.blocks import element_labels
    from natgrad_diag.exceptions import JacobianMismatchError

    err = np.abs(got - want)
    tol = atol + rtol * np.abs(want)
    if np.all(err <= tol):
        return
    k = int(np.argmax(err - tol))
    shape = tuple(got.shape)
    raise JacobianMismatchError(
        f"tape.gradient with output_gradients is not Jᵀ·v for input {j} ({name}).",
        context=[
            ("Input", f"{j} ({name}, shape {list(shape)})"),
            ("Worst entry", element_labels(name, shape)[k]),
            ("Expected", f"{float(want.flat[k])!r}  (Jᵀ·v: tape.jacobian contracted with the cotangents)"),
            ("Actual", f"{float(got.flat[k])!r}  (tape.gradient(..., output_gradients=cotangents))"),
            ("Error", f"{float(err.flat[k]):.6g} > atol + rtol·|Jᵀ·v| = {float(tol.flat[k]):.6g} "
                      f"(rtol={rtol:g}, atol={atol:g})"),
        ],
        remedy="a gradient on this path is not linear in the upstream gradient (in tf.custom_gradient, multiply "
        "by dy), or the cotangents are not in tf.nest.flatten order of the outputs.",
    )


def assert_natgrad_step_matches_gpflow(*args: Any, **kwargs: Any) -> Any:
    """Assert that a natural-gradient step matches GPflow's ``NaturalGradient`` (see ``natgrad_check``).

    Call it as ``assert_natgrad_step_matches_gpflow(model, data=None, *, gamma=1.0, xi_transform=None,
    atol=None, rtol=None)``: natgrad-diag's step on the model's own parameters is compared with the step
    ``gpflow.optimizers.NaturalGradient`` applies to a deep copy; the model is not changed.

    A thin wrapper: the check lives in :mod:`natgrad_diag.checks.api` under the same name, and is
    imported when called (it needs GPflow); arguments and return value are passed through unchanged.

    Raises:
        NatGradCheckError: the step differs from GPflow's (an ``AssertionError``).
    """
    __tracebackhide__ = True
    import importlib

    # sys.modules' entry, not the package attribute (``from natgrad_diag.checks import api``), so that the
    # module that is registered is the one called, whatever was imported before
    natgrad_check = importlib.import_module("natgrad_diag.checks.api")
    return natgrad_check.assert_natgrad_step_matches_gpflow(*args, **kwargs)
