"""Assertions for your own pytest suite: gradients, vector-Jacobian products, natural-gradient steps.

Each raises an ``AssertionError`` subclass whose message names the block or input, the worst entry, expected
against actual, the tolerances and what to do. Only numpy is imported here; TensorFlow, GPflow and the
natural-gradient checks load on first use::

    from natgrad_diag.testing import assert_gradients

    def test_my_map_gradients():
        assert_gradients(expectation_to_meanvarsqrt, [eta1, eta2])   # eta2 is checked as symmetric
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from natgrad_diag._validate import require_callable, require_max_bytes
from natgrad_diag.autodiff.blocks import element_labels
from natgrad_diag.autodiff.dense import forward_pass
from natgrad_diag.autodiff.memory import DEFAULT_MAX_BYTES
from natgrad_diag.exceptions import JacobianMismatchError
from natgrad_diag.gradcheck.api import assert_gradients
from natgrad_diag.gradcheck.full import reverse_jacobian
from natgrad_diag.gradcheck.problem import compare, cotangent_arrays, to_arrays
from natgrad_diag.tolerance import resolve
from natgrad_diag.typing import Array

if TYPE_CHECKING:  # imported on first use (it needs GPflow) by __getattr__
    from natgrad_diag.checks.api import assert_natgrad_step_matches_gpflow

__all__ = ["assert_gradients", "assert_natgrad_step_matches_gpflow", "assert_vjp_matches_jacobian"]


def assert_vjp_matches_jacobian(
    fn: Callable[..., Any], inputs: Sequence[Any] | Mapping[str, Any] | Any, cotangents: Sequence[Any] | Any, *,
    rtol: float | None = None, atol: float | None = None, input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[Array, ...]:
    """Assert that ``tape.gradient(fn(*inputs), inputs, output_gradients=cotangents)`` is Jᵀ·v.

    With J_ij = ∂y_i/∂x_j from reverse mode (one-hot seeds) and v_i the cotangent of output i, the expected
    result for input j is the explicit contraction

        (Jᵀ·v)_j[b] = Σ_i Σ_a v_i[a] · J_ij[a, b]          (numpy ``tensordot``)

    not (Jᵀ·1) ⊙ v. Catches gradients that are not linear in the upstream gradient (a ``tf.custom_gradient``
    that forgets to multiply by ``dy``) and seeds in the wrong order; :func:`assert_gradients` checks J itself.

    Args:
        fn, inputs, input_names, output_names: as :func:`assert_gradients` takes them (the names are for the message).
        cotangents: one seed per flattened output (exact shape and dtype; ``None`` means ones).
        rtol, atol: an entry passes when |vjp − Jᵀ·v| ≤ atol + rtol·|Jᵀ·v|; default the policy's "exact" kind
            ((1e-10, 1e-12) in float64, (1e-4, 1e-5) in float32).
        max_bytes: refuse, before allocating, a dense Jacobian larger than this (default 2 GiB).

    Returns:
        The VJP, one array per input (shape of that input).

    Raises:
        JacobianMismatchError: for some input the VJP differs from Jᵀ·v (names the input and worst entry).
        OutputGradientsError: a cotangent has the wrong count, shape or dtype; NonFiniteError: it has NaN or Inf.
        MemoryLimitError: the dense Jacobian would exceed ``max_bytes``.
    """
    __tracebackhide__ = True
    import tensorflow as tf

    require_callable(fn)
    max_bytes = require_max_bytes(max_bytes)
    points, names = to_arrays(inputs, input_names)
    # two exact routes, only rounding between them (the "exact" kind); a bad rtol/atol: an InputError before any work
    tol = resolve(points[0].dtype, "exact", rtol=rtol, atol=atol)
    xs = [tf.constant(x) for x in points]
    tape, _, ys = forward_pass(fn, xs)
    vs = cotangent_arrays(cotangents, ys)
    # jacobian refuses, before allocating, a Jacobian over max_bytes: so before the VJP too
    want = reverse_jacobian(fn, points, input_names=names, output_names=output_names, max_bytes=max_bytes).vjp(vs)
    got = tape.gradient(ys, xs, output_gradients=[tf.constant(v) for v in vs], unconnected_gradients=tf.UnconnectedGradients.ZERO)
    got = [tf.convert_to_tensor(g).numpy() for g in got]  # tf.gather's gradient is an IndexedSlices
    for j, (g, w) in enumerate(zip(got, want)):
        _raise_on_mismatch(j, names[j], g, w, rtol=tol.rtol, atol=tol.atol)
    return tuple(got)


def _raise_on_mismatch(j: int, name: str, got: Array, want: Array, *, rtol: float, atol: float) -> None:
    """Raise JacobianMismatchError naming the worst entry when some |got − want| > atol + rtol·|want|."""
    c = compare(got, want, rtol=rtol, atol=atol)
    if c.passed:
        return
    k, shape = c.worst, tuple(got.shape)
    raise JacobianMismatchError(
        f"tape.gradient with output_gradients is not Jᵀ·v for input {j} ({name}).",
        context=[
            ("Input", f"{j} ({name}, shape {list(shape)})"),
            ("Worst entry", element_labels(name, shape)[k]),
            ("Expected", f"{float(want.flat[k])!r}  (Jᵀ·v: tape.jacobian contracted with the cotangents)"),
            ("Actual", f"{float(got.flat[k])!r}  (tape.gradient(..., output_gradients=cotangents))"),
            ("Error", f"{c.worst_abs_error:.6g} > atol + rtol·|Jᵀ·v| = {c.worst_tolerance:.6g} "
                      f"(rtol={rtol:g}, atol={atol:g})"),
        ],
        remedy="a gradient on this path is not linear in the upstream gradient (in tf.custom_gradient, multiply "
        "by dy), or the cotangents are not in tf.nest.flatten order of the outputs.",
    )


def __getattr__(name: str) -> Any:
    if name == "assert_natgrad_step_matches_gpflow":
        from natgrad_diag.checks.api import assert_natgrad_step_matches_gpflow

        return assert_natgrad_step_matches_gpflow
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
