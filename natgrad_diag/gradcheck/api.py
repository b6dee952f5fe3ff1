"""check_gradients and assert_gradients: one dispatcher over full and fast mode."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from natgrad_diag._validate import input_error, require_callable, require_int, require_max_bytes
from natgrad_diag.autodiff.memory import DEFAULT_MAX_BYTES
from natgrad_diag.exceptions import NatGradDiagError, error_line
from natgrad_diag.gradcheck.fast import MAX_DIRECTIONS, WHY_MAX_DIRECTIONS, fast_rows
from natgrad_diag.gradcheck.full import full_rows
from natgrad_diag.gradcheck.problem import Problem, cotangent_arrays, to_arrays
from natgrad_diag.gradcheck.report import GradientCheckReport, GradientCheckRow
from natgrad_diag.gradcheck.structures import GPFLOW_MAPS, gpflow_map_name, resolve_structures
from natgrad_diag.report.records import Check, format_number, status_of
from natgrad_diag.tolerance import Tolerance, resolve

__all__ = ["MAX_DIRECTIONS", "GradientCheckReport", "assert_gradients", "check_gradients"]


def check_gradients(
    fn: Callable[..., Any], inputs: Sequence[Any] | Mapping[str, Any] | Any, *,
    structure: str | Sequence[str] | Mapping[str, str] | None = None, mode: str = "full",
    cotangents: Sequence[Any] | None = None, eps: float | None = None, rtol: float | None = None,
    atol: float | None = None, seed: int = 0, num_directions: int = 4, input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
) -> GradientCheckReport:
    """Check TensorFlow's gradients of ``fn`` against central differences, block by block; never raises on a mismatch.

    For each output y_i and input x_j, with perturbations d that respect x_j's structure, numerical
    (y_i(x + ε d) − y_i(x − ε d)) / 2ε against analytical J_ij·d (full mode: every coordinate) or
    ⟨v, numerical⟩ against ⟨J_ijᵀ·v, d⟩ (fast mode: k random unit pairs (d, v)); an entry passes when
    |numerical − analytical| ≤ atol + rtol·|analytical| + r (elementwise), where r = 100·ε·(|y_i(x + ε d)| +
    |y_i(x − ε d)| + 2·|J_ij|·|x_j|) / 2ε bounds the rounding of fn's values (Nocedal and Wright, *Numerical
    Optimization*, 2nd ed., §8.1) and of x itself (|J|·|x| = Σ_k |∂y/∂x_k|·|x_k|, the first-order effect of a
    backward error ε·|x|; fast mode: ⟨|J_ijᵀ·v|, |x_j|⟩), plus 10/2ε times fn's measured noise (rounding amplified
    inside fn, :meth:`Problem.measured_noise`); d is the step x really took in its dtype.
    A block whose r reaches its largest |analytical| could not fail: it is "warn" (inconclusive), not "pass". A failed
    block is judged again at eps/10 and eps/100, where a difference off by its O(eps²) error moves (full mode).

    Args:
        fn: a function of the inputs returning a tensor or a nest of tensors (tuple, list, dict).
        inputs: the point, float tensors/arrays (a dict: its keys name them); ``fn`` sees copies; Python numbers
            and lists become float64.
        structure: per input ``"general"``, ``"symmetric"`` or ``"lower_triangular"``: one string, a sequence or a
            dict by input name. ``None`` infers it: GPflow's natgrad maps have a symmetric η₂ or θ₂ and a
            lower-triangular varsqrt; anything else is general.
        mode: ``"full"`` (every coordinate against the explicit Jacobian) or ``"fast"`` (matrix-free).
        cotangents: fast mode's fixed cotangents v (one per flattened output, exact shape and dtype, ``None`` for
            ones) instead of random ones; validated but not needed in full mode.
        eps, rtol, atol: the step and tolerances; default the dtype's (float64 1e-6, 1e-5, 1e-7; ε ≈ ∛(machine ε)).
        seed, num_directions: fast mode's random seed and direction pairs per block (k, 1 to :data:`MAX_DIRECTIONS`).
        input_names, output_names: names for the report (default dict keys, GPflow's names, ``x0``/``y0``...).
        max_bytes: full mode refuses, before allocating, analytical plus numerical Jacobians over this.

    Returns:
        A frozen :class:`GradientCheckReport` with one :class:`GradientCheckRow` per (output, input) block.

    Raises:
        InputError (and subclasses): bad arguments; fn fails or returns NaN/Inf at a point it is evaluated at, or
            gives two values at the given point (a random function, whose differences are noise).
        MemoryLimitError: full mode would exceed ``max_bytes`` (use ``mode="fast"``), or fast mode's directions half of
            this machine's memory.

    Examples:
        >>> import numpy as np
        >>> import tensorflow as tf
        >>> report = check_gradients(tf.sin, [np.array([0.1, 0.2, 0.3])])
        >>> report.passed, report.row(0, 0).method
        (True, 'central differences, 3 coordinate(s)')
        >>> from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt
        >>> eta1 = np.array([[0.5], [-1.0]])
        >>> check_gradients(expectation_to_meanvarsqrt, [eta1, (np.eye(2) + eta1 @ eta1.T)[None]]).structures
        ('general', 'symmetric')
    """
    require_callable(fn)
    if mode not in ("full", "fast"):
        raise input_error(f"unknown mode {mode!r}.", "mode", "'full' or 'fast'", repr(mode),
                          "use mode='full' for small problems, mode='fast' for large ones.")
    seed = require_int(seed, "seed", minimum=0)  # numpy's default_rng refuses a negative seed
    num_directions = require_int(num_directions, "num_directions", minimum=1, maximum=MAX_DIRECTIONS, why=WHY_MAX_DIRECTIONS,
                                 remedy="pass num_directions=4 (the default), or mode='full' to check every coordinate.")  # fmt: skip
    max_bytes = require_max_bytes(max_bytes)
    gp_map = gpflow_map_name(fn)  # GPflow's names for its natgrad maps' inputs and outputs, unless names are given
    if gp_map is not None and input_names is None and isinstance(inputs, (list, tuple)) and len(inputs) == 2:
        input_names = GPFLOW_MAPS[gp_map][0]
    if gp_map is not None and output_names is None:
        output_names = GPFLOW_MAPS[gp_map][1]
    arrays, names = to_arrays(inputs, input_names)
    structures = resolve_structures(structure, fn, names, arrays)
    tol, source = _settings(arrays[0].dtype, eps=eps, rtol=rtol, atol=atol)
    prob = Problem(fn, arrays, names, output_names, structures, tol, max_bytes)
    cots = None if cotangents is None else cotangent_arrays(cotangents, prob.y)
    for i, v in enumerate(cots or []):  # ⟨v, J·u⟩ = 0 = ⟨Jᵀ·v, u⟩ whatever J is: that block would pass unchecked
        if mode == "fast" and not np.any(v):
            raise input_error(f"cotangents[{i}] is zero: fast mode would check nothing of output {prob.output_names[i]}.",
                              f"cotangents[{i}]", "a cotangent with a nonzero entry", "all zeros",
                              "leave cotangents=None (random ones), or drop the output the loss does not use.")
    # torch's _slow_gradcheck / _fast_gradcheck, against central differences (independent of TensorFlow's gradients)
    import tensorflow as tf

    try:
        rows = fast_rows(prob, num_directions, seed, cots) if mode == "fast" else full_rows(prob)
    except NatGradDiagError:
        raise
    except (ValueError, tf.errors.InvalidArgumentError) as e:  # fn's own values were fine: TensorFlow's gradient failed
        raise input_error(f"TensorFlow's gradient of fn failed: {error_line(e, with_type=True)}", "fn",
                          "a gradient per input, of that input's shape and dtype", "an error in reverse mode",
                          "check fn's tf.custom_gradient (or RegisterGradient): one gradient per input, of its shape.") from e
    rows = sorted(rows, key=lambda r: (r.output_index, r.input_index))
    return GradientCheckReport(
        function=getattr(fn, "__name__", None) or type(fn).__name__, mode=mode, dtype=arrays[0].dtype.name,
        eps=prob.eps, rtol=prob.rtol, atol=prob.atol, settings_source=source,
        structures=structures, input_names=names, output_names=prob.output_names,
        input_shapes=tuple(a.shape for a in arrays), output_shapes=tuple(y.shape for y in prob.y),
        num_directions=num_directions, seed=seed, rows=tuple(rows), checks=tuple(_check(r) for r in rows),
        cotangents_given=cots is not None,
    )  # fmt: skip


def _settings(dtype: np.dtype[Any], *, eps: Any, rtol: Any, atol: Any) -> tuple[Tolerance, str]:
    """The step and tolerances used, and which of them came from the dtype's defaults (ε ≈ ∛(machine ε))."""
    given = [k for k, v in (("eps", eps), ("rtol", rtol), ("atol", atol)) if v is not None]
    source = ("all given" if len(given) == 3 else f"{', '.join(given)} given; the rest {dtype.name} defaults" if given
              else f"defaults for {dtype.name}")  # fmt: skip
    tol = resolve(dtype, "finite_difference", rtol=rtol, atol=atol)  # validated: finite numbers ≥ 0
    if eps is None:
        return tol, source
    number = isinstance(eps, (int, float, np.floating, np.integer)) and not isinstance(eps, (bool, np.bool_))
    if not number or not 0 < eps < np.inf:
        raise input_error("eps, the finite-difference step, must be a finite number > 0.", "eps",
                          f"a finite step > 0, e.g. {tol.eps:g} ({dtype.name}'s default, about ∛ε)", repr(eps),
                          f"pass eps > 0, e.g. eps={tol.eps:g}, or leave it out for {dtype.name}'s default.")
    return dataclasses.replace(tol, eps=float(eps)), source


def _check(r: GradientCheckRow) -> Check:
    largest = (f" (error and tolerance at the entry closest to failing; the block's largest absolute error, "
               f"{format_number(r.max_abs_error)}, is at an entry with a larger tolerance)"
               if r.worst_abs_error != r.max_abs_error else "")  # fmt: skip
    return Check(
        name=f"d{r.output}/d{r.input}", status="warn" if r.passed and r.inconclusive else status_of(r.passed),
        claim=f"finite differences agree with reverse mode ({r.structure} {r.input}; {r.method})",
        max_abs_error=r.worst_abs_error, tolerance=r.worst_tolerance,
        detail=(f"worst at {r.worst_entry}: numerical {format_number(r.numerical, 8)}, "
                f"analytical {format_number(r.analytical, 8)}.{largest}" + (f" {r.hint}" if r.hint else "")),
    )  # fmt: skip


def assert_gradients(
    fn: Callable[..., Any], inputs: Sequence[Any] | Mapping[str, Any] | Any, *,
    structure: str | Sequence[str] | Mapping[str, str] | None = None, mode: str = "full",
    cotangents: Sequence[Any] | None = None, eps: float | None = None, rtol: float | None = None,
    atol: float | None = None, seed: int = 0, num_directions: int = 4, input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
) -> GradientCheckReport:
    """:func:`check_gradients` (same arguments) that raises :class:`~natgrad_diag.JacobianMismatchError` (an
    ``AssertionError``) on a mismatch, naming the output, the input, the worst entry, numerical against analytical,
    the tolerances and a remedy; returns the report when every block passes."""
    __tracebackhide__ = True  # pytest shows the user's call as the failing line
    report = check_gradients(fn, inputs, structure=structure, mode=mode, cotangents=cotangents, eps=eps, rtol=rtol,
                             atol=atol, seed=seed, num_directions=num_directions, input_names=input_names,
                             output_names=output_names, max_bytes=max_bytes)  # fmt: skip
    if (error := report.mismatch_message()) is not None:
        raise error
    return report
