"""Gradient checks that know matrix structure: finite differences against reverse mode, per block.

For outputs y_i and inputs x_j of ``fn``, each block J_ij = ∂y_i/∂x_j is checked against central
differences, the only oracle independent of TensorFlow's registered gradients (forward mode,
``tf.autodiff.ForwardAccumulator``, is built by transposing a registered op gradient, so
⟨v, J·u⟩ = ⟨Jᵀ·v, u⟩ holds even when that gradient is wrong):

    numerical  D_d y_i = (y_i(x + ε d) − y_i(x − ε d)) / 2ε          (error O(ε²) + O(δ/ε))
    analytical ⟨J_ij, d⟩ from ``tape.jacobian`` (full mode) or ⟨J_ijᵀ·v, d⟩ from ``tape.gradient``

The perturbations d follow each input's *structure*:

``"general"``
    d = E_ab, one entry at a time; compared with g_ab.
``"symmetric"``
    d = E_ab + E_ba (a > b) or E_aa, compared with g_ab + g_ba (or g_aa). A function that reads one
    triangle of a symmetric matrix (``tf.linalg.cholesky``) has a symmetrised gradient from TensorFlow;
    a one-entry difference then gives 2·g_ab below the diagonal and 0 above it, a false mismatch.
``"lower_triangular"``
    d = E_ab for a ≥ b (the triangle a q_sqrt lives in); above the diagonal the analytical gradient must
    equal the finite difference, which is zero when ``fn`` reads only the lower triangle
    (``tf.linalg.triangular_solve``, ``tf.linalg.cholesky``): there the gradient must be zero.

``mode="full"`` compares every coordinate with the explicit Jacobian (:func:`natgrad_diag.autodiff.dense.jacobian`).
``mode="fast"`` compares, for k random unit pairs (u, v), the directional difference ⟨v, D_u y⟩ with
⟨Jᵀ·v, u⟩ from reverse mode, never forming J (the idea of ``torch.autograd.gradcheck(fast_mode=True)``);
after a failure on a small block it re-runs full mode on that block to name the worst entry.

References:
    torch.autograd.gradcheck (slow and fast mode); Salimbeni et al., "Natural Gradients in Practice",
    AISTATS 2018 (the maps of ``gpflow.optimizers.natgrad`` checked here).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag._validate import require_finite, require_float, require_same_dtype, shape_str, validate_seeds
from natgrad_diag.exceptions import InputError, JacobianMismatchError, NonFiniteError, ShapeMismatchError, error_line
from natgrad_diag.autodiff.dense import DEFAULT_MAX_BYTES, check_memory, jacobian, jacobian_nbytes
from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section, Table, format_number, to_jsonable

__all__ = [
    "GradientCheckReport",
    "GradientCheckRow",
    "STRUCTURES",
    "assert_gradients",
    "check_gradients",
    "default_settings",
    "infer_structure",
]

#: The input structures :func:`check_gradients` understands.
STRUCTURES = ("general", "symmetric", "lower_triangular")
MODES = ("full", "fast")

#: (eps, rtol, atol) by dtype. ε ≈ ∛(machine ε) balances the O(ε²) truncation and O(δ/ε) rounding errors
#: of central differences; the tolerances leave room for both on well-conditioned functions.
_DEFAULTS = {
    "float64": (1e-6, 1e-5, 1e-7),
    "float32": (1e-3, 2e-2, 2e-3),
    "float16": (1e-2, 1e-1, 5e-2),
}

#: Fast mode re-runs full mode on a failing block when it has at most this many input coordinates.
_RERUN_MAX_COORDS = 4096

# GPflow's conversion maps: (input names, output names, input structures).
_GPFLOW_MAPS = {
    "expectation_to_meanvarsqrt": (("eta1", "eta2"), ("mean", "varsqrt"), ("general", "symmetric")),
    "meanvarsqrt_to_expectation": (("mean", "varsqrt"), ("eta1", "eta2"), ("general", "lower_triangular")),
    "natural_to_meanvarsqrt": (("nat1", "nat2"), ("mean", "varsqrt"), ("general", "symmetric")),
    "meanvarsqrt_to_natural": (("mean", "varsqrt"), ("nat1", "nat2"), ("general", "lower_triangular")),
    "natural_to_expectation": (("nat1", "nat2"), ("eta1", "eta2"), ("general", "symmetric")),
    "expectation_to_natural": (("eta1", "eta2"), ("nat1", "nat2"), ("general", "symmetric")),
}

_TABLE_TITLE = "one row per ∂output/∂input; errors are the block's maxima"

_FORWARD_NOTE = (
    "The forward column (ForwardAccumulator, ⟨v, J·u⟩) is information only: for ops TensorFlow builds it by "
    "transposing the registered gradient, so it agrees with reverse mode even when that gradient is wrong; for a "
    "tf.custom_gradient function it differentiates the forward computation instead, so there it can disagree."
)


def default_settings(dtype: Any) -> tuple[float, float, float]:
    """(eps, rtol, atol) for central differences in ``dtype`` (float64, float32 or float16)."""
    name = getattr(dtype, "name", None) or np.dtype(dtype).name
    return _DEFAULTS[name]


def _gpflow_map_name(fn: Any) -> str | None:
    name = getattr(fn, "__name__", None)
    if name in _GPFLOW_MAPS and getattr(fn, "__module__", "") == "gpflow.optimizers.natgrad":
        return name
    return None


def infer_structure(fn: Callable[..., Any], num_inputs: int) -> tuple[str, ...]:
    """The input structures of ``fn``: known for GPflow's natgrad conversion maps, else all ``"general"``.

    For ``gpflow.optimizers.natgrad``'s maps the second input is symmetric when it is η₂ or θ₂ (read
    through a Cholesky factorisation) and lower-triangular when it is a square root L_S (varsqrt).
    """
    name = _gpflow_map_name(fn)
    if name is not None and num_inputs == 2:
        return _GPFLOW_MAPS[name][2]
    return ("general",) * num_inputs


@dataclass(frozen=True)
class GradientCheckRow:
    """The verdict for one block ∂output/∂input.

    Attributes:
        output, input: names of the output and the input; ``output_index``, ``input_index`` their positions.
        structure: the input's structure (``"general"``, ``"symmetric"``, ``"lower_triangular"``).
        method: how the block was compared, e.g. ``"central differences, 36 coordinates"``.
        compared: how many numbers were compared (coordinates × output elements, or directions).
        worst_entry: the entry (full mode, or fast mode after a full re-run) or direction with the largest
            error relative to its tolerance, e.g. ``"∂varsqrt[0,2,1]/∂eta2[0,2,1]+eta2[0,1,2]"``.
        numerical, analytical: the two values at ``worst_entry``.
        forward: fast mode: ⟨v, J·u⟩ from forward mode at the worst direction (information only).
        max_abs_error: max |numerical − analytical| over the block.
        max_rel_error: max |numerical − analytical| / |analytical| over entries with |analytical| > atol.
        worst_abs_error, worst_tolerance: error and bound atol + rtol·|analytical| at ``worst_entry``.
        passed: every compared value within atol + rtol·|analytical|.
        hint: why it may have failed and what to do (empty when passed).
        note: further information (e.g. the full re-run after a fast-mode failure).
    """

    output: str
    input: str
    output_index: int
    input_index: int
    structure: str
    method: str
    compared: int
    worst_entry: str
    numerical: float
    analytical: float
    forward: float | None
    max_abs_error: float
    max_rel_error: float
    worst_abs_error: float
    worst_tolerance: float
    passed: bool
    hint: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(dict(self.__dict__))


@dataclass(frozen=True)
class GradientCheckReport(Report):
    """Finite differences against reverse mode, one row per (output, input) block.

    Attributes:
        function: the checked function's name.
        mode: ``"full"`` or ``"fast"``.
        dtype: the inputs' dtype.
        eps, rtol, atol: the step and tolerances used; ``settings_source`` says which came from the dtype.
        structures: one structure per input.
        input_names, output_names, input_shapes, output_shapes: the blocks' names and shapes.
        num_directions: fast mode: random (u, v) pairs per block.
        seed: the random seed of fast mode.
        rows: one :class:`GradientCheckRow` per block, outputs outer, inputs inner.
        checks: one :class:`~natgrad_diag.report.records.Check` per row.
        cotangents_given: whether fixed cotangents v were passed (used by fast mode; full mode compares every
            entry of J, which covers every v).
    """

    function: str
    mode: str
    dtype: str
    eps: float
    rtol: float
    atol: float
    settings_source: str
    structures: tuple[str, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    num_directions: int
    seed: int
    rows: tuple[GradientCheckRow, ...]
    checks: tuple[Check, ...]
    cotangents_given: bool = False

    @property
    def title(self) -> str:  # type: ignore[override]
        return f"Gradient check of {self.function} ({self.mode} mode, {self.dtype})"

    @property
    def failed_rows(self) -> tuple[GradientCheckRow, ...]:
        """The rows that failed, worst (largest error/tolerance) first."""
        bad = [r for r in self.rows if not r.passed]
        return tuple(sorted(bad, key=lambda r: -_ratio(r.worst_abs_error, r.worst_tolerance)))

    def row(self, output: str | int, input: str | int) -> GradientCheckRow:  # noqa: A002
        """The row of block ∂output/∂input, by names or indices."""
        for r in self.rows:
            if output in (r.output, r.output_index) and input in (r.input, r.input_index):
                return r
        raise InputError(
            f"no block ∂{output}/∂{input} in this report.",
            context=[
                ("Argument", "output, input"),
                ("Expected", f"outputs {self.output_names}, inputs {self.input_names}"),
                ("Got", f"{output!r}, {input!r}"),
            ],
            remedy="use names from report.output_names and report.input_names (or their indices).",
        )

    def sections(self) -> tuple[Section, ...]:
        how = (
            "central differences for every input coordinate (within its structure) against the explicit Jacobian"
            if self.mode == "full"
            else f"{self.num_directions} random unit direction pair(s) (u, v) per block: ⟨v, (f(x+εu) − f(x−εu))/2ε⟩ "
            "against ⟨Jᵀ·v, u⟩ from reverse mode; no dense Jacobian"
        )
        settings = (
            f"Mode {self.mode}: {how}.\n"
            f"Step ε = {format_number(self.eps)}, rtol = {format_number(self.rtol)}, atol = {format_number(self.atol)} "
            f"({self.settings_source}); an entry passes when |numerical − analytical| ≤ atol + rtol·|analytical|.\n"
            "Inputs: "
            + ", ".join(f"{n} {shape_str(s)} {st}" for n, s, st in zip(self.input_names, self.input_shapes, self.structures))
            + ".\n"
            "Outputs: " + ", ".join(f"{n} {shape_str(s)}" for n, s in zip(self.output_names, self.output_shapes)) + "."
        )
        if self.mode == "fast":
            settings += f"\nSeed {self.seed}" + ("; v = the given cotangents. " if self.cotangents_given else ". ") + _FORWARD_NOTE
        elif self.cotangents_given:
            settings += "\nThe given cotangents are not needed in full mode: every entry of J is compared, which covers every v."
        columns = ["", "block", "worst entry", "numerical", "analytical"]
        if self.mode == "fast":
            columns.append("forward")
        columns += ["abs err", "rel err"]
        rows = []
        for r in self.rows:
            cells = [
                "PASS" if r.passed else "FAIL", f"∂{r.output}/∂{r.input}", _short_entry(r),
                format_number(r.numerical), format_number(r.analytical),
            ]  # fmt: skip
            if self.mode == "fast":
                cells.append(format_number(r.forward))
            cells += [format_number(r.max_abs_error), format_number(r.max_rel_error)]
            rows.append(tuple(cells))
        sections = [
            Section("Settings", settings),
            Section("Blocks", "", (Table(columns=tuple(columns), rows=tuple(rows), title=_TABLE_TITLE),)),
        ]
        notes = [f"∂{r.output}/∂{r.input}: {r.hint}" for r in self.rows if r.hint]
        notes += [f"∂{r.output}/∂{r.input}: {r.note}" for r in self.rows if r.note]
        if notes:
            sections.append(Section("What to do", "\n".join(notes)))
        return tuple(sections)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.update(
            function=self.function,
            mode=self.mode,
            dtype=self.dtype,
            eps=self.eps,
            rtol=self.rtol,
            atol=self.atol,
            settings_source=self.settings_source,
            structures=list(self.structures),
            input_names=list(self.input_names),
            output_names=list(self.output_names),
            input_shapes=[list(s) for s in self.input_shapes],
            output_shapes=[list(s) for s in self.output_shapes],
            num_directions=self.num_directions,
            seed=self.seed,
            cotangents_given=self.cotangents_given,
            rows=[r.to_dict() for r in self.rows],
        )
        return to_jsonable(d)

    def mismatch_message(self) -> JacobianMismatchError | None:
        """The error :func:`assert_gradients` raises for the worst failing block (``None`` when all pass)."""
        bad = self.failed_rows
        if not bad:
            return None
        r = bad[0]
        others = [f"∂{b.output}/∂{b.input}" for b in bad[1:]]
        context: list[tuple[str, object]] = [
            ("Output", f"{r.output_index} ({r.output})"),
            ("Input", f"{r.input_index} ({r.input}, structure {r.structure!r})"),
            ("Worst entry", r.worst_entry),
            ("Expected", f"numerical  {r.numerical!r}  (central differences, eps={self.eps:g})"),
            ("Actual", f"analytical {r.analytical!r}  (reverse mode)"),
            ("Error", f"{r.worst_abs_error:.6g} > atol + rtol·|analytical| = {r.worst_tolerance:.6g} "
                      f"(rtol={self.rtol:g}, atol={self.atol:g})"),
            ("Block", f"max abs error {r.max_abs_error:.6g}, max rel error {r.max_rel_error:.6g}; {r.method}"),
        ]
        if r.note:
            context.append(("Note", r.note))
        if others:
            context.append(("Also failed", ", ".join(others)))
        remedy = r.hint or (
            f"look for a wrong gradient on the path of ∂{r.output}/∂{r.input} (tf.custom_gradient, RegisterGradient); "
            "if it is right, the difference is inaccurate: re-check with another eps (smaller when fn curves "
            "strongly, larger against rounding) or in float64."
        )
        return JacobianMismatchError(
            f"Output {r.output_index} ({r.output}) with respect to input {r.input_index} ({r.input}): "
            "finite differences and the analytical derivative disagree.",
            context=context,
            remedy=remedy,
        )


def _short_entry(r: GradientCheckRow) -> str:
    """The worst entry without the names (the block column has them): ``[1,4,3]/[1,4,3]``, ``direction 2``."""
    text = r.worst_entry
    if text.startswith("⟨v,"):
        return text.split("⟩, ", 1)[-1].replace("direction ", "u #")
    for name in (r.output, r.input):
        text = text.replace(f"∂{name}[", "[").replace(f"+{name}[", "+[").replace(f"∂{name}", "·")
    return text.replace(" (above diagonal)", " (upper)")


def _ratio(err: float, tol: float) -> float:
    if tol > 0:
        return err / tol
    return math.inf if err > 0 else 0.0


# --------------------------------------------------------------------------------------------------
# Input handling


def _input_error(detail: str, argument: str, expected: str, got: object, remedy: str) -> InputError:
    return InputError(detail, context=[("Argument", argument), ("Expected", expected), ("Got", got)], remedy=remedy)


def _to_arrays(inputs: Any, input_names: Sequence[str] | None) -> tuple[list[np.ndarray], tuple[str, ...]]:
    import tensorflow as tf

    if isinstance(inputs, Mapping):
        names = tuple(str(k) for k in inputs.keys()) if input_names is None else tuple(input_names)
        values = list(inputs.values())
    elif isinstance(inputs, (list, tuple)):
        values = list(inputs)
        names = tuple(input_names) if input_names is not None else tuple(f"x{k}" for k in range(len(values)))
    else:
        values = [inputs]
        names = tuple(input_names) if input_names is not None else ("x0",)
    if not values:
        raise _input_error(
            "inputs is empty.", "inputs", "one or more float tensors", "0 inputs", "pass the point to check at, e.g. [eta1, eta2]."
        )
    if len(names) != len(values):
        raise _input_error(
            f"input_names must name each of the {len(values)} inputs.", "input_names", f"{len(values)} names",
            f"{len(names)}: {names}", f"pass {len(values)} names, or leave input_names=None.",
        )  # fmt: skip
    arrays = []
    for name, v in zip(names, values):
        try:
            t = tf.convert_to_tensor(v)
        except (TypeError, ValueError) as e:
            raise _input_error(
                f"input {name} could not be converted to a tensor.", name, "a float tensor, tf.Variable or array",
                type(v).__name__, f"pass {name} as a float64 array or tensor.",
            ) from e  # fmt: skip
        require_float(t, name)
        a = np.array(t.numpy(), copy=True)
        require_finite(a, name)
        arrays.append(a)
    for name, a in zip(names[1:], arrays[1:]):
        require_same_dtype(a, arrays[0], name, names[0])
    return arrays, names


def _resolve_structures(structure: Any, fn: Any, names: tuple[str, ...], arrays: list[np.ndarray]) -> tuple[str, ...]:
    n = len(arrays)
    if structure is None:
        result = infer_structure(fn, n)
    elif isinstance(structure, str):
        result = (structure,) * n
    elif isinstance(structure, Mapping):
        unknown = [k for k in structure if k not in names]
        if unknown:
            raise _input_error(
                f"structure names unknown input(s) {unknown}.", "structure", f"keys among the input names {names}",
                list(structure), "key the dict by input name, e.g. structure={'eta2': 'symmetric'}.",
            )  # fmt: skip
        base = infer_structure(fn, n)
        result = tuple(structure.get(name, base[k]) for k, name in enumerate(names))
    elif isinstance(structure, (list, tuple)):
        if len(structure) != n:
            raise _input_error(
                f"structure has {len(structure)} entries for {n} input(s).", "structure", f"{n} structures, one per input",
                list(structure), "pass one structure per input, a single string for all, or a dict by input name.",
            )  # fmt: skip
        result = tuple(structure)
    else:
        raise _input_error(
            "structure must be a string, a sequence or a dict.", "structure", f"one of {STRUCTURES}, a list or a dict",
            type(structure).__name__, "pass e.g. structure='symmetric' or structure={'eta2': 'symmetric'}.",
        )  # fmt: skip
    for name, a, st in zip(names, arrays, result):
        if st not in STRUCTURES:
            raise _input_error(
                f"unknown structure {st!r} for input {name}.", "structure", " or ".join(repr(s) for s in STRUCTURES),
                repr(st), "use 'symmetric' for η₂ or θ₂, 'lower_triangular' for a q_sqrt, else 'general'.",
            )  # fmt: skip
        if st != "general" and (a.ndim < 2 or a.shape[-1] != a.shape[-2]):
            raise ShapeMismatchError(
                f"structure {st!r} needs square matrices in the last two axes of {name}.",
                context=[("Argument", f"structure for {name}"), ("Expected", "[..., M, M]"), ("Actual", shape_str(a.shape))],
                remedy=f"use structure 'general' for {name}, or pass the matrix input it was meant for.",
            )
    return result


def _positive(value: Any, name: str, *, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise _input_error(f"{name} must be a number.", name, "a finite float", repr(value), f"pass {name} as a float.") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = "≥ 0" if allow_zero else "> 0"
        raise _input_error(f"{name} must be finite and {bound}.", name, f"a finite float {bound}", v, f"pass a finite {name} {bound}.")
    return v


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise _input_error(f"{name} must be a positive integer.", name, "an int ≥ 1", repr(value), f"pass e.g. {name}=4.")
    return int(value)


# --------------------------------------------------------------------------------------------------
# Evaluation


class _Problem:
    """fn at a point, flattened outputs as numpy arrays; evaluations never modify the inputs."""

    def __init__(self, fn: Callable[..., Any], arrays: list[np.ndarray], output_names: Sequence[str] | None) -> None:
        import tensorflow as tf

        self.fn = fn
        self.x = arrays
        self.dtype = arrays[0].dtype
        try:
            outputs = fn(*[tf.constant(a) for a in arrays])
        except Exception as e:  # noqa: BLE001 - any failure of the user's function is reported the same way
            raise InputError(
                "fn(*inputs) raised an error at the given point.",
                context=[("Argument", "fn"), ("Inputs", ", ".join(shape_str(a.shape) for a in arrays)), ("Error", error_line(e, with_type=True))],
                remedy="call fn(*inputs) yourself to see the error; check the inputs' shapes and that the point is valid "
                "(e.g. positive definite).",
            ) from e
        if isinstance(outputs, Mapping) and output_names is None:
            output_names = tuple(sorted(str(k) for k in outputs.keys()))
        ys = [np.asarray(tf.convert_to_tensor(y).numpy()) for y in tf.nest.flatten(outputs)]
        if output_names is None:
            output_names = tuple(f"y{k}" for k in range(len(ys)))
        output_names = tuple(output_names)
        if len(output_names) != len(ys):
            raise _input_error(
                f"output_names must name each of the {len(ys)} outputs.", "output_names", f"{len(ys)} names",
                f"{len(output_names)}: {output_names}", f"pass {len(ys)} names, or leave output_names=None.",
            )  # fmt: skip
        for name, y in zip(output_names, ys):
            if y.dtype.kind != "f":
                raise _input_error(
                    f"output {name} is not floating point.", "fn", "float outputs", f"{name}: {y.dtype}",
                    "return only differentiable float tensors from fn.",
                )  # fmt: skip
            if not np.all(np.isfinite(y)):
                raise NonFiniteError(
                    f"fn(*inputs) returned NaN or Inf in output {name}.",
                    context=[("Argument", "inputs"), ("Output", f"{name} {shape_str(y.shape)}")],
                    remedy="check the point: GPflow's maps need a positive-definite η₂ − η₁η₁ᵀ (or −θ₂).",
                )
        self.y = ys
        self.output_names = output_names

    def eval(self, j: int, direction: np.ndarray, scale: float, what: str) -> list[np.ndarray]:
        """fn at x with x_j + scale·direction; errors and non-finite outputs become InputError."""
        import tensorflow as tf

        xs = [tf.constant(a) for a in self.x]
        xs[j] = tf.constant(self.x[j] + np.asarray(scale, self.dtype) * direction)
        try:
            out = [np.asarray(tf.convert_to_tensor(y).numpy()) for y in tf.nest.flatten(self.fn(*xs))]
        except Exception as e:  # noqa: BLE001
            raise InputError(
                f"fn failed at a finite-difference point ({what}).",
                context=[("Argument", "eps"), ("Step", scale), ("Error", error_line(e, with_type=True))],
                remedy="pass a smaller eps, or a point further from the edge of fn's domain (e.g. better conditioned).",
            ) from e
        for name, y in zip(self.output_names, out):
            if not np.all(np.isfinite(y)):
                raise NonFiniteError(
                    f"fn returned NaN or Inf in output {name} at a finite-difference point ({what}).",
                    context=[("Argument", "eps"), ("Step", scale)],
                    remedy="pass a smaller eps, or a point further from the edge of fn's domain.",
                )
        return out

    def central(self, j: int, direction: np.ndarray, eps: float, what: str) -> list[np.ndarray]:
        plus = self.eval(j, direction, eps, what)
        minus = self.eval(j, direction, -eps, what)
        return [(p - m) / (2 * eps) for p, m in zip(plus, minus)]


def _coordinates(shape: tuple[int, ...], structure: str, name: str) -> list[tuple[tuple[int, ...], ...]]:
    """The perturbations of one input: tuples of multi-indices set to 1 (E_ab, or E_ab + E_ba)."""
    if structure == "symmetric":
        coords = []
        for idx in np.ndindex(*shape):
            a, b = idx[-2], idx[-1]
            if a > b:
                coords.append((idx, idx[:-2] + (b, a)))
            elif a == b:
                coords.append((idx,))
        return coords
    return [(idx,) for idx in np.ndindex(*shape)]


def _label(name: str, idx: tuple[int, ...]) -> str:
    return f"{name}[{','.join(map(str, idx))}]" if idx else name


def _coord_label(name: str, coord: tuple[tuple[int, ...], ...], structure: str) -> str:
    text = "+".join(_label(name, idx) for idx in coord)
    if structure == "lower_triangular" and coord[0][-1] > coord[0][-2]:
        text += " (above diagonal)"
    return text


def _random_direction(rng: np.random.Generator, shape: tuple[int, ...], structure: str, dtype: Any, part: str = "lower") -> np.ndarray:
    d = rng.standard_normal(shape)
    if structure == "symmetric":
        d = 0.5 * (d + np.swapaxes(d, -1, -2))
    elif structure == "lower_triangular":
        d = np.tril(d) if part == "lower" else np.triu(d, 1)
    norm = np.linalg.norm(d)
    if norm == 0:  # an empty or 1x1 strictly-upper part
        return d.astype(dtype)
    return (d / norm).astype(dtype)


def _hint(structure: str, name: str, value: np.ndarray) -> str:
    """Why a general check may fail on a structured value, and which structure to use."""
    if structure != "general" or value.ndim < 2 or value.shape[-1] != value.shape[-2] or value.shape[-1] < 2:
        return ""
    scale = float(np.max(np.abs(value), initial=0.0))
    if np.allclose(value, np.swapaxes(value, -1, -2), rtol=0.0, atol=1e-12 * max(scale, 1.0)):
        return (
            f"input {name} looks symmetric ({name} = {name}ᵀ). If fn reads one triangle of it (tf.linalg.cholesky "
            f"does), TensorFlow's gradient is symmetrised and one-entry differences cannot match it: check with "
            f"structure='symmetric' (or structure={{'{name}': 'symmetric'}})."
        )
    return ""


def _compare(num: np.ndarray, ana: np.ndarray, rtol: float, atol: float) -> tuple[int, float, float, float, float, bool]:
    """(worst flat index, worst abs err, worst tol, max abs err, max rel err, passed) elementwise."""
    err = np.abs(num - ana)
    tol = atol + rtol * np.abs(ana)
    if err.size == 0:
        return 0, 0.0, atol, 0.0, 0.0, True
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(tol > 0, err / np.where(tol > 0, tol, 1.0), np.where(err > 0, np.inf, 0.0))
    k = int(np.argmax(ratio))
    big = np.abs(ana) > atol
    max_rel = float(np.max(err[big] / np.abs(ana[big]), initial=0.0)) if big.any() else 0.0
    return k, float(err.flat[k]), float(tol.flat[k]), float(np.max(err)), max_rel, bool(np.all(err <= tol))


# --------------------------------------------------------------------------------------------------
# Full mode


def _full_block_columns(
    prob: _Problem, j: int, structure: str, eps: float, name: str, advance: Callable[..., None]
) -> tuple[list[tuple[tuple[int, ...], ...]], list[np.ndarray]]:
    """Numerical columns for input j: for each coordinate, the central difference of every output (flattened)."""
    coords = _coordinates(prob.x[j].shape, structure, name)
    cols: list[list[np.ndarray]] = [[] for _ in prob.y]
    for coord in coords:
        d = np.zeros(prob.x[j].shape, prob.dtype)
        for idx in coord:
            d[idx] = 1.0
        diffs = prob.central(j, d, eps, f"{_coord_label(name, coord, structure)} ± eps")
        for i, dy in enumerate(diffs):
            cols[i].append(dy.ravel())
        advance()
    # per output: [n_out_i, n_coords]
    numer = [np.stack(c, axis=1) if c else np.zeros((prob.y[i].size, 0), prob.dtype) for i, c in enumerate(cols)]
    return coords, numer


def _analytic_columns(block: np.ndarray, in_shape: tuple[int, ...], coords: list[tuple[tuple[int, ...], ...]]) -> np.ndarray:
    """[n_out, n_coords]: the analytical block contracted with each coordinate's perturbation."""
    n_out = int(np.prod(block.shape[: block.ndim - len(in_shape)]))
    flat = block.reshape(n_out, -1)
    cols = []
    for coord in coords:
        col = np.zeros(n_out, block.dtype)
        for idx in coord:
            col = col + flat[:, int(np.ravel_multi_index(idx, in_shape)) if in_shape else 0]
        cols.append(col)
    return np.stack(cols, axis=1) if cols else np.zeros((n_out, 0), block.dtype)


def _reverse_jacobian(fn: Callable[..., Any], inputs: list[np.ndarray], **kwargs: Any) -> Any:
    """The explicit Jacobian from reverse mode, the derivative ``tape.gradient`` uses and this module checks.

    Forward mode is not the same thing: for a ``tf.custom_gradient`` function ``ForwardAccumulator``
    differentiates the forward computation and ignores the custom gradient.
    """
    if inputs[0].dtype != np.float64:
        return _RowJacobian(fn, inputs)
    if "mode" in inspect.signature(jacobian).parameters:
        kwargs["mode"] = "reverse"
    return jacobian(fn, inputs, **kwargs)


class _RowJacobian:
    """J row by row: ``tape.gradient`` with one-hot ``output_gradients`` (no pfor).

    Used below float64: in TensorFlow 2.21 ``tape.jacobian``'s vectorisation (pfor) of the float32
    Cholesky gradient crashes the process (a segmentation fault), so those rows are taken one at a time.
    """

    def __init__(self, fn: Callable[..., Any], inputs: list[np.ndarray]) -> None:
        import tensorflow as tf

        xs = [tf.constant(a) for a in inputs]
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch(xs)
            ys = [tf.convert_to_tensor(y) for y in tf.nest.flatten(fn(*xs))]
        self.blocks: list[list[np.ndarray]] = []
        for y in ys:
            rows: list[list[np.ndarray]] = [[] for _ in xs]
            for a in range(int(np.prod(y.shape))):
                seed = np.zeros(int(np.prod(y.shape)), y.dtype.as_numpy_dtype)
                seed[a] = 1.0
                grads = tape.gradient(
                    y, xs, output_gradients=tf.constant(seed.reshape(y.shape)), unconnected_gradients=tf.UnconnectedGradients.ZERO
                )
                for j, g in enumerate(grads):
                    rows[j].append(g.numpy())
            self.blocks.append([
                np.stack(r).reshape(tuple(y.shape) + tuple(x.shape)) if r else np.zeros(tuple(y.shape) + tuple(x.shape), y.dtype.as_numpy_dtype)
                for r, x in zip(rows, xs)
            ])  # fmt: skip
        del tape

    def block(self, i: int, j: int) -> np.ndarray:
        return self.blocks[i][j]


def _full_rows(
    prob: _Problem, names: tuple[str, ...], structures: tuple[str, ...], eps: float, rtol: float, atol: float,
    max_bytes: int, only: tuple[int, int] | None = None,
) -> list[GradientCheckRow]:  # fmt: skip
    from natgrad_diag.progress import progress_bar

    in_shapes = [a.shape for a in prob.x]
    out_shapes = [y.shape for y in prob.y]
    inputs_used = range(len(prob.x)) if only is None else [only[1]]
    outputs_used = range(len(prob.y)) if only is None else [only[0]]
    # the analytical dense Jacobian and the numerical one, before anything is allocated
    need = 2 * jacobian_nbytes([out_shapes[i] for i in outputs_used], [in_shapes[j] for j in inputs_used], prob.dtype.itemsize)
    check_memory(need, max_bytes, "the full-mode check (analytical and numerical Jacobians)")

    if only is None:
        J = _reverse_jacobian(prob.fn, list(prob.x), input_names=names, output_names=prob.output_names, max_bytes=max_bytes)
        block_of = J.block
    else:
        i0, j0 = only

        def restricted(xj: Any) -> Any:
            import tensorflow as tf

            xs = [tf.constant(a) for a in prob.x]
            xs[j0] = xj
            return tf.nest.flatten(prob.fn(*xs))[i0]

        Jb = _reverse_jacobian(restricted, [prob.x[j0]], max_bytes=max_bytes)

        def block_of(i: int, j: int) -> np.ndarray:
            return Jb.block(0, 0)

    total = sum(len(_coordinates(in_shapes[j], structures[j], names[j])) for j in inputs_used)
    rows = []
    with progress_bar(total=total, description=f"gradient check (full, {total} coordinates)") as advance:
        for j in inputs_used:
            coords, numer = _full_block_columns(prob, j, structures[j], eps, names[j], advance)
            for i in outputs_used:
                ana = _analytic_columns(block_of(i, j), in_shapes[j], coords)
                num = numer[i]
                k, werr, wtol, maxabs, maxrel, passed = _compare(num, ana, rtol, atol)
                r, c = np.unravel_index(k, num.shape) if num.size else (0, 0)
                out_idx = tuple(int(v) for v in np.unravel_index(r, out_shapes[i])) if num.size else ()
                out_label = _label(prob.output_names[i], out_idx)
                in_label = _coord_label(names[j], coords[c], structures[j]) if coords else names[j]
                method = f"central differences, {len(coords)} coordinate(s)"
                if structures[j] == "symmetric":
                    method += " (E_ab + E_ba)"
                rows.append(GradientCheckRow(
                    output=prob.output_names[i], input=names[j], output_index=i, input_index=j,
                    structure=structures[j], method=method, compared=int(num.size),
                    worst_entry=f"∂{out_label}/∂{in_label}",
                    numerical=float(num.flat[k]) if num.size else 0.0,
                    analytical=float(ana.flat[k]) if ana.size else 0.0,
                    forward=None, max_abs_error=maxabs, max_rel_error=maxrel,
                    worst_abs_error=werr, worst_tolerance=wtol, passed=passed,
                    hint="" if passed else _hint(structures[j], names[j], prob.x[j]),
                ))  # fmt: skip
    return rows


# --------------------------------------------------------------------------------------------------
# Fast mode


def _fast_rows(
    prob: _Problem, names: tuple[str, ...], structures: tuple[str, ...], eps: float, rtol: float, atol: float,
    num_directions: int, seed: int, cotangents: list[np.ndarray] | None, max_bytes: int,
) -> list[GradientCheckRow]:  # fmt: skip
    import tensorflow as tf

    from natgrad_diag.progress import progress_bar

    rng = np.random.default_rng(seed)
    n_in, n_out = len(prob.x), len(prob.y)
    # directions: per input j a list of u's (lower_triangular: k lower-triangle plus k strictly-upper ones)
    us: list[list[np.ndarray]] = []
    for j in range(n_in):
        shape, st = prob.x[j].shape, structures[j]
        dirs = [_random_direction(rng, shape, st, prob.dtype) for _ in range(num_directions)]
        if st == "lower_triangular" and shape[-1] > 1:
            dirs += [_random_direction(rng, shape, st, prob.dtype, part="upper") for _ in range(num_directions)]
        us.append(dirs)
    n_dirs = max(len(d) for d in us)
    vs = []
    for _ in range(n_dirs):
        if cotangents is not None:
            vs.append(list(cotangents))
        else:
            vs.append([_random_direction(rng, y.shape, "general", prob.dtype) for y in prob.y])

    numerical = np.full((n_out, n_in, n_dirs), np.nan)
    analytical = np.full((n_out, n_in, n_dirs), np.nan)
    forward = np.full((n_out, n_in, n_dirs), np.nan)
    forward_error = ""
    xs = [tf.constant(a) for a in prob.x]
    total = sum(len(d) for d in us)
    with progress_bar(total=total, description=f"gradient check (fast, {n_dirs} direction(s))") as advance:
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch(xs)
            ys = [tf.convert_to_tensor(y) for y in tf.nest.flatten(prob.fn(*xs))]
        for k in range(n_dirs):
            for i in range(n_out):
                grads = tape.gradient(
                    ys[i], xs, output_gradients=tf.constant(vs[k][i]), unconnected_gradients=tf.UnconnectedGradients.ZERO
                )
                for j in range(n_in):
                    if k < len(us[j]):
                        analytical[i, j, k] = float(np.vdot(grads[j].numpy(), us[j][k]))
            for j in range(n_in):
                if k >= len(us[j]):
                    continue
                diffs = prob.central(j, us[j][k], eps, f"{names[j]} ± eps·u (direction {k})")
                for i in range(n_out):
                    numerical[i, j, k] = float(np.vdot(vs[k][i], diffs[i]))
                if not forward_error:
                    try:
                        with tf.autodiff.ForwardAccumulator(primals=xs[j], tangents=tf.constant(us[j][k])) as acc:
                            yf = [tf.convert_to_tensor(y) for y in tf.nest.flatten(prob.fn(*xs))]
                        for i in range(n_out):
                            jv = acc.jvp(yf[i], unconnected_gradients=tf.UnconnectedGradients.ZERO)
                            forward[i, j, k] = float(np.vdot(vs[k][i], jv.numpy()))
                    except Exception as e:  # noqa: BLE001 - forward mode is information only
                        forward_error = f"forward mode unavailable ({type(e).__name__})."
                advance()
        del tape

    rows = []
    for i in range(n_out):
        vnorm = float(np.linalg.norm(vs[0][i])) if cotangents is not None else 1.0
        for j in range(n_in):
            m = len(us[j])
            num, ana = numerical[i, j, :m], analytical[i, j, :m]
            atol_ij = atol * max(vnorm, 1.0)
            k, werr, wtol, maxabs, maxrel, passed = _compare(num, ana, rtol, atol_ij)
            part = ""
            if structures[j] == "lower_triangular" and k >= num_directions:
                part = ", strictly upper"
            method = f"fast: {m} random direction(s)"
            if structures[j] == "lower_triangular" and m > num_directions:
                method += f" ({num_directions} lower-triangular, {m - num_directions} strictly upper)"
            elif structures[j] == "symmetric":
                method += " (symmetric u)"
            row = GradientCheckRow(
                output=prob.output_names[i], input=names[j], output_index=i, input_index=j,
                structure=structures[j], method=method, compared=m,
                worst_entry=f"⟨v, ∂{prob.output_names[i]}/∂{names[j]}·u⟩, direction {k}{part}",
                numerical=float(num[k]), analytical=float(ana[k]),
                forward=None if np.isnan(forward[i, j, k]) else float(forward[i, j, k]),
                max_abs_error=maxabs, max_rel_error=maxrel, worst_abs_error=werr, worst_tolerance=wtol,
                passed=passed, hint="" if passed else _hint(structures[j], names[j], prob.x[j]),
                note=forward_error,
            )  # fmt: skip
            if not passed:
                row = _rerun_full(prob, names, structures, eps, rtol, atol, max_bytes, row)
            rows.append(row)
    return rows


def _rerun_full(
    prob: _Problem, names: tuple[str, ...], structures: tuple[str, ...], eps: float, rtol: float, atol: float,
    max_bytes: int, row: GradientCheckRow,
) -> GradientCheckRow:  # fmt: skip
    """After a fast-mode failure, full mode on that block alone names the worst entry (if small enough)."""
    i, j = row.output_index, row.input_index
    n_coords = len(_coordinates(prob.x[j].shape, structures[j], names[j]))
    need = 2 * prob.y[i].size * prob.x[j].size * prob.dtype.itemsize
    if n_coords > _RERUN_MAX_COORDS or need > max_bytes:
        return dataclasses.replace(row, note=_join(row.note, (
            f"block too large to re-run in full mode ({n_coords} coordinates); run check_gradients on a smaller "
            "instance with mode='full' to name the entry."
        )))  # fmt: skip
    full = _full_rows(prob, names, structures, eps, rtol, atol, max_bytes, only=(i, j))[0]
    failed_dir = f"fast mode failed ({row.worst_entry}: error {row.worst_abs_error:.3g} > {row.worst_tolerance:.3g})"
    if full.passed:  # every coordinate agrees: the stronger check wins, the direction was finite-difference error
        return dataclasses.replace(
            row,
            passed=True, hint="",
            method=row.method + f"; full mode on this block passed ({full.method})",
            note=_join(row.note, f"{failed_dir}, but full mode on this block passes, so the block passes: along that "
                       "direction the finite difference was dominated by its O(ε²) error (try a smaller eps)."),
        )  # fmt: skip
    return dataclasses.replace(
        row,
        worst_entry=full.worst_entry, numerical=full.numerical, analytical=full.analytical, forward=None,
        compared=full.compared, max_abs_error=full.max_abs_error, max_rel_error=full.max_rel_error,
        worst_abs_error=full.worst_abs_error, worst_tolerance=full.worst_tolerance,
        method=row.method + f"; then full mode on this block ({full.method})",
        note=_join(row.note, f"{failed_dir}; full mode on this block confirms it and names the entry."),
    )  # fmt: skip


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


# --------------------------------------------------------------------------------------------------
# Public API


def check_gradients(
    fn: Callable[..., Any],
    inputs: Sequence[Any] | Mapping[str, Any] | Any,
    *,
    structure: str | Sequence[str] | Mapping[str, str] | None = None,
    mode: str = "full",
    cotangents: Sequence[Any] | None = None,
    eps: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    num_directions: int = 4,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> GradientCheckReport:
    """Check TensorFlow's gradients of ``fn`` against central differences, block by block; never raises on a mismatch.

    For each output y_i and input x_j, with perturbations d that respect x_j's structure:

        numerical  = (y_i(x + ε d) − y_i(x − ε d)) / 2ε
        analytical = J_ij · d                       (full: every coordinate, from ``tape.jacobian``)
        ⟨v, numerical⟩ vs ⟨J_ijᵀ·v, d⟩              (fast: k random unit (d, v), from ``tape.gradient``)

    and an entry passes when |numerical − analytical| ≤ atol + rtol·|analytical|.

    Args:
        fn: a function of the inputs returning a tensor or a nest of tensors (tuple, list, dict).
        inputs: the point, a sequence of float tensors/arrays (or a dict: its keys name the inputs).
            Nothing is modified: ``fn`` is evaluated on copies.
        structure: per input ``"general"``, ``"symmetric"`` (perturb E_ab + E_ba, compare g_ab + g_ba)
            or ``"lower_triangular"`` (perturb E_ab, a ≥ b; above the diagonal the gradient must equal the
            finite difference, zero when fn reads only the lower triangle). One string for all inputs, a
            sequence, or a dict by input name. ``None`` infers it: for GPflow's natgrad maps η₂ and θ₂
            (eta2, nat2 [L, M, M]) are symmetric and varsqrt (L_S [L, M, M]) is lower-triangular; else general.
        mode: ``"full"`` (every coordinate against the explicit Jacobian) or ``"fast"`` (matrix-free).
        cotangents: fast mode: fixed cotangents v, one per flattened output (exact shape and dtype; ``None``
            for ones), used instead of random ones (e.g. the ``output_gradients`` you pass to TensorFlow).
            Validated in full mode too, where they are not needed: every entry of J is compared.
        eps: the finite-difference step ε; default from the dtype (float64 1e-6, float32 1e-3).
        rtol, atol: tolerances; default from the dtype (float64 1e-5, 1e-7; float32 2e-2, 2e-3).
        seed: the seed of fast mode's random directions.
        num_directions: fast mode: random direction pairs per block (k).
        input_names, output_names: names for the report (default the dict keys, GPflow's names for its
            maps, or ``x0, x1, ...`` / ``y0, y1, ...``).
        max_bytes: full mode refuses, before allocating, when the analytical plus numerical dense
            Jacobians would need more (default 2 GiB).

    Returns:
        A frozen :class:`GradientCheckReport` with one :class:`GradientCheckRow` per (output, input) block.

    Raises:
        InputError (and its subclasses): bad arguments, or fn fails or returns NaN/Inf at the point or at a
            finite-difference point (the message names the argument and says what to do).
        MemoryLimitError: full mode would exceed ``max_bytes`` (use ``mode="fast"``).

    Example:
        >>> from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt
        >>> report = check_gradients(expectation_to_meanvarsqrt, [eta1, eta2])  # eta2 inferred symmetric
        >>> report.passed
        True
    """
    if not callable(fn):
        raise _input_error(
            "fn must be callable.", "fn", "a function of the inputs", type(fn).__name__,
            "pass the function to check, e.g. expectation_to_meanvarsqrt.",
        )  # fmt: skip
    if mode not in MODES:
        raise _input_error(
            f"unknown mode {mode!r}.", "mode", "'full' or 'fast'", repr(mode),
            "use mode='full' for small problems, mode='fast' for large ones.",
        )  # fmt: skip
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise _input_error("seed must be an integer.", "seed", "an int", repr(seed), "pass e.g. seed=0.")
    seed = int(seed)
    num_directions = _positive_int(num_directions, "num_directions")
    max_bytes = _positive_int(max_bytes, "max_bytes")

    gp_map = _gpflow_map_name(fn)
    if isinstance(inputs, Mapping):
        n_given = len(inputs)
    else:
        n_given = len(inputs) if isinstance(inputs, (list, tuple)) else 1
    if input_names is None and not isinstance(inputs, Mapping) and gp_map and n_given == 2:
        input_names = _GPFLOW_MAPS[gp_map][0]
    if output_names is None and gp_map:
        output_names = _GPFLOW_MAPS[gp_map][1]
    arrays, names = _to_arrays(inputs, input_names)
    structures = _resolve_structures(structure, fn, names, arrays)

    dtype = arrays[0].dtype
    d_eps, d_rtol, d_atol = default_settings(dtype)
    given = [k for k, v in (("eps", eps), ("rtol", rtol), ("atol", atol)) if v is not None]
    eps_ = d_eps if eps is None else _positive(eps, "eps")
    rtol_ = d_rtol if rtol is None else _positive(rtol, "rtol", allow_zero=True)
    atol_ = d_atol if atol is None else _positive(atol, "atol", allow_zero=True)
    if not given:
        source = f"defaults for {dtype.name}"
    elif len(given) == 3:
        source = "all given"
    else:
        source = f"{', '.join(given)} given; the rest {dtype.name} defaults"

    prob = _Problem(fn, arrays, output_names)
    cots = None
    if cotangents is not None:
        if isinstance(cotangents, np.ndarray) or not isinstance(cotangents, (list, tuple)):
            cotangents = [cotangents]
        seeds = list(cotangents)
        validate_seeds(seeds, prob.y, argument="cotangents", target_name="output")
        cots = []
        for k, (s, y) in enumerate(zip(seeds, prob.y)):
            a = np.ones_like(y) if s is None else np.asarray(s, dtype=y.dtype)
            require_finite(a, f"cotangents[{k}]")
            cots.append(a)
    if mode == "full":
        rows = _full_rows(prob, names, structures, eps_, rtol_, atol_, max_bytes)
    else:
        rows = _fast_rows(prob, names, structures, eps_, rtol_, atol_, num_directions, seed, cots, max_bytes)

    rows = sorted(rows, key=lambda r: (r.output_index, r.input_index))
    checks = tuple(
        Check(
            name=f"d{r.output}/d{r.input}",
            claim=f"finite differences agree with reverse mode ({r.structure} {r.input}; {r.method})",
            passed=r.passed,
            max_abs_error=r.worst_abs_error,
            tolerance=r.worst_tolerance,
            detail=(
                f"worst at {r.worst_entry}: numerical {format_number(r.numerical, 8)}, "
                f"analytical {format_number(r.analytical, 8)}." + (f" {r.hint}" if r.hint else "")
            ),
        )
        for r in rows
    )
    fname = getattr(fn, "__name__", None) or type(fn).__name__
    return GradientCheckReport(
        function=fname, mode=mode, dtype=dtype.name, eps=eps_, rtol=rtol_, atol=atol_, settings_source=source,
        structures=structures, input_names=names, output_names=prob.output_names,
        input_shapes=tuple(tuple(int(d) for d in a.shape) for a in arrays),
        output_shapes=tuple(tuple(int(d) for d in y.shape) for y in prob.y),
        num_directions=num_directions, seed=seed, rows=tuple(rows), checks=checks, cotangents_given=cots is not None,
    )  # fmt: skip


def assert_gradients(
    fn: Callable[..., Any],
    inputs: Sequence[Any] | Mapping[str, Any] | Any,
    *,
    structure: str | Sequence[str] | Mapping[str, str] | None = None,
    mode: str = "full",
    cotangents: Sequence[Any] | None = None,
    eps: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    num_directions: int = 4,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> GradientCheckReport:
    """Like :func:`check_gradients`, but raise :class:`~natgrad_diag.JacobianMismatchError` on a mismatch.

    The message names the output and the input, the worst entry, the numerical value against the
    analytical one, the tolerances, and one line of remedy (e.g. to use ``structure="symmetric"``).

    Args:
        fn, inputs, structure, mode, cotangents, eps, rtol, atol, seed, num_directions, input_names,
            output_names, max_bytes: as for :func:`check_gradients`.

    Returns:
        The :class:`GradientCheckReport`, when every block passes.

    Raises:
        JacobianMismatchError: a block fails (also an ``AssertionError``, so pytest shows it as a failure).
        InputError, MemoryLimitError: as for :func:`check_gradients`.
    """
    report = check_gradients(
        fn, inputs, structure=structure, mode=mode, cotangents=cotangents, eps=eps, rtol=rtol, atol=atol,
        seed=seed, num_directions=num_directions, input_names=input_names, output_names=output_names,
        max_bytes=max_bytes,
    )  # fmt: skip
    error = report.mismatch_message()
    if error is not None:
        raise error
    return report


# --------------------------------------------------------------------------------------------------
# Command line


def gpflow_map_point(name: str, num_inducing: int, num_latent: int, *, seed: int = 0, dtype: str = "float64") -> list[np.ndarray]:
    """A well-conditioned random point for one of GPflow's natgrad maps, built with numpy.

    q_mu = m [M, L] ~ N(0, 1); q_sqrt = L_S [L, M, M] lower-triangular with 0.3/√M·N(0, 1) below a unit
    diagonal (so L_S stays well conditioned at any M); S = L_S L_Sᵀ. Returns (m, L_S),
    (η₁, η₂) = (m, S + m mᵀ) or (θ₁, θ₂) = (S⁻¹m, −½S⁻¹), whichever ``name`` takes.

    Raises:
        InputError: an unknown map name, or M, L < 1.
    """
    if name not in _GPFLOW_MAPS:
        raise _input_error(
            f"unknown GPflow map {name!r}.", "map", " or ".join(sorted(_GPFLOW_MAPS)), repr(name),
            "pass the name of a function in gpflow.optimizers.natgrad, e.g. expectation_to_meanvarsqrt.",
        )  # fmt: skip
    M = _positive_int(num_inducing, "num_inducing")
    L = _positive_int(num_latent, "num_latent")
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((M, L))
    A = np.tril(0.3 / math.sqrt(M) * rng.standard_normal((L, M, M)), -1) + np.eye(M)  # ‖A − I‖₂ ≲ 0.6
    S = A @ np.swapaxes(A, -1, -2)
    first = _GPFLOW_MAPS[name][0][0]
    if first == "mean":
        point = [m, A]
    elif first == "eta1":
        eta2 = S + np.einsum("ml,nl->lmn", m, m)
        point = [m, 0.5 * (eta2 + np.swapaxes(eta2, -1, -2))]
    else:
        S_inv = np.linalg.inv(S)
        nat2 = -0.5 * S_inv
        point = [np.einsum("lmn,nl->ml", S_inv, m), 0.5 * (nat2 + np.swapaxes(nat2, -1, -2))]
    return [p.astype(dtype) for p in point]


def gradcheck_cli(
    *,
    map: str = "expectation_to_meanvarsqrt",  # noqa: A002 - the CLI flag's name
    num_inducing: int = 8,
    num_latent: int = 2,
    mode: str = "full",
    structure: str = "auto",
    dtype: str = "float64",
    seed: int = 0,
    eps: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> GradientCheckReport:
    """``natgrad-diag gradcheck``: check one of GPflow's natgrad maps at a random point of size (M, L).

    ``structure`` applies to the map's matrix input (eta2, nat2 or varsqrt [L, M, M]); ``"auto"`` infers
    it (eta2/nat2 symmetric, varsqrt lower-triangular), ``"general"`` shows the false mismatch that
    one-entry checkers report on symmetric inputs. The first input ([M, L]) is always general.
    """
    from gpflow.optimizers import natgrad

    point = gpflow_map_point(map, num_inducing, num_latent, seed=seed, dtype=dtype)
    matrix_input = _GPFLOW_MAPS[map][0][1]
    return check_gradients(
        getattr(natgrad, map), point, structure=None if structure == "auto" else {matrix_input: structure},
        mode=mode, eps=eps, rtol=rtol, atol=atol, seed=seed,
    )  # fmt: skip
