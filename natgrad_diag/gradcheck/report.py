"""The gradient check's records: one row per block, the report, and the mismatch message."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from natgrad_diag._validate import input_error, shape_str
from natgrad_diag.exceptions import JacobianMismatchError
from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section, Table, format_number, to_jsonable

__all__ = ["GradientCheckReport", "GradientCheckRow"]

_FORWARD_NOTE = (
    "The forward column (ForwardAccumulator, ⟨v, J·u⟩) is information only: for ops TensorFlow builds it by "
    "transposing the registered gradient, so it agrees with reverse mode even when that gradient is wrong; for a "
    "tf.custom_gradient function it differentiates the forward computation instead, so there it can disagree."
)


@dataclass(frozen=True)
class GradientCheckRow:
    """The verdict for one block ∂output/∂input.

    Attributes:
        output, input: names of the output and the input; ``output_index``, ``input_index`` their positions.
        structure: the input's structure (``"general"``, ``"symmetric"``, ``"lower_triangular"``).
        method, compared: how the block was compared (``"central differences, 36 coordinates"``) and how many numbers.
        worst_entry: the entry (full mode, or fast mode after a full re-run) or direction with the largest error
            relative to its tolerance, e.g. ``"∂varsqrt[0,2,1]/∂eta2[0,2,1]+eta2[0,1,2]"``; ``numerical``,
            ``analytical``: the two values there; ``forward``: fast mode's ⟨v, J·u⟩ there (information only).
        max_abs_error, max_rel_error: max |numerical − analytical| over the block, and relative to |analytical| where
            that exceeds atol.
        worst_abs_error, worst_tolerance: error and bound atol + rtol·|analytical| at ``worst_entry``.
        passed: every compared value within atol + rtol·|analytical| + the rounding bound of its finite difference.
        inconclusive: passed, but that rounding bound reaches the block's largest |analytical| (the note says why).
        hint, note: why it may have failed and what to do (empty when passed); further information (e.g. the full
            re-run after a fast-mode failure).
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
    inconclusive: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(to_jsonable(dict(self.__dict__)))


@dataclass(frozen=True)
class GradientCheckReport(Report):
    """Finite differences against reverse mode, one row per (output, input) block.

    Attributes:
        function, mode, dtype: the checked function's name, ``"full"`` or ``"fast"``, the inputs' dtype.
        eps, rtol, atol: the step and tolerances used; ``settings_source`` says which came from the dtype.
        structures, input_names, output_names, input_shapes, output_shapes: one structure per input; the blocks'
            names and shapes.
        num_directions, seed, cotangents_given: fast mode's random (u, v) pairs per block, its seed, and whether fixed
            cotangents v were passed (full mode compares every entry of J, which covers every v).
        rows: one :class:`GradientCheckRow` per block, outputs outer, inputs inner; ``checks``: one
            :class:`~natgrad_diag.Check` per row.
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

    def row(self, output: str | int, input: str | int) -> GradientCheckRow:  # noqa: A002
        """The row of block ∂output/∂input, by names or indices."""
        for r in self.rows:
            if output in (r.output, r.output_index) and input in (r.input, r.input_index):
                return r
        raise input_error(f"no block ∂{output}/∂{input} in this report.", "output, input",
                          f"outputs {self.output_names}, inputs {self.input_names}", f"{output!r}, {input!r}",
                          "use names from report.output_names and report.input_names (or their indices).")

    def sections(self) -> tuple[Section, ...]:
        fast = self.mode == "fast"
        how = (f"{self.num_directions} random unit direction pair(s) (u, v) per block: ⟨v, (f(x+εu) − f(x−εu))/2ε⟩ "
               "against ⟨Jᵀ·v, u⟩ from reverse mode; no dense Jacobian" if fast else
               "central differences for every input coordinate (within its structure) against the explicit Jacobian")
        inputs = ", ".join(f"{n} {shape_str(s)} {st}"
                           for n, s, st in zip(self.input_names, self.input_shapes, self.structures))
        outputs = ", ".join(f"{n} {shape_str(s)}" for n, s in zip(self.output_names, self.output_shapes))
        settings = (
            f"Mode {self.mode}: {how}.\n"
            f"Step ε = {format_number(self.eps)}, rtol = {format_number(self.rtol)}, atol = {format_number(self.atol)} "
            f"({self.settings_source}); an entry passes when |numerical − analytical| ≤ atol + rtol·|analytical| + the "
            "rounding of its difference, 100·ε·(|f(x+εu)| + |f(x−εu)| + 2·|J|·|x|)/2ε + 10·(f's measured noise)/2ε.\n"
            f"Inputs: {inputs}.\nOutputs: {outputs}."
        )
        if fast:
            settings += f"\nSeed {self.seed}" + ("; v = the given cotangents. " if self.cotangents_given else ". ") + _FORWARD_NOTE
        elif self.cotangents_given:
            settings += "\nThe given cotangents are not needed in full mode: every entry of J is compared, which covers every v."
        columns = ("", "block", "worst entry", "numerical", "analytical", *(("forward",) if fast else ()),
                   "abs err", "rel err")  # fmt: skip
        rows = tuple((c.mark, f"∂{r.output}/∂{r.input}", _short_entry(r),
                      *map(format_number, (r.numerical, r.analytical, *((r.forward,) if fast else ()),
                                           r.max_abs_error, r.max_rel_error)))
                     for r, c in zip(self.rows, self.checks))  # fmt: skip
        notes = [f"∂{r.output}/∂{r.input}: {r.hint}" for r in self.rows if r.hint]
        notes += [f"∂{r.output}/∂{r.input}: {r.note}" for r in self.rows if r.note]
        return (
            Section("Settings", settings),
            Section("Blocks", "", (Table(columns=columns, rows=rows,
                                         title="one row per ∂output/∂input; errors are the block's maxima"),)),
            *((Section("What to do", "\n".join(notes)),) if notes else ()),
        )

    def to_dict(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "checks"}
        return dict(to_jsonable(super().to_dict() | fields | {"rows": [r.to_dict() for r in self.rows]}))

    def mismatch_message(self) -> JacobianMismatchError | None:
        """The error :func:`assert_gradients` raises for the worst failing block (``None`` when all pass)."""
        if not (bad := sorted([r for r in self.rows if not r.passed], key=_badness)):
            return None
        r = bad[0]
        context: list[tuple[str, object]] = [
            ("Output", f"{r.output_index} ({r.output})"),
            ("Input", f"{r.input_index} ({r.input}, structure {r.structure!r})"),
            ("Worst entry", r.worst_entry),
            ("Expected", f"numerical  {r.numerical!r}  (central differences, eps={self.eps:g})"),
            ("Actual", f"analytical {r.analytical!r}  (reverse mode)"),
            ("Error", f"{r.worst_abs_error:.6g} > atol + rtol·|analytical| + rounding = {r.worst_tolerance:.6g} "
                      f"(rtol={self.rtol:g}, atol={self.atol:g})"),
            ("Block", f"max abs error {r.max_abs_error:.6g}, max rel error {r.max_rel_error:.6g}; {r.method}"),
            *([("Note", r.note)] if r.note else []),
            *([("Also failed", ", ".join(f"∂{b.output}/∂{b.input}" for b in bad[1:]))] if len(bad) > 1 else []),
        ]
        return JacobianMismatchError(
            f"Output {r.output_index} ({r.output}) with respect to input {r.input_index} ({r.input}): "
            "finite differences and the analytical derivative disagree.",
            context=context,
            remedy=r.hint or (
                f"look for a wrong gradient on the path of ∂{r.output}/∂{r.input} (tf.custom_gradient, "
                "RegisterGradient); if it is right, the difference is inaccurate: re-check with another eps "
                "(smaller when fn curves strongly, larger against rounding) or in float64."
            ),
        )


def _short_entry(r: GradientCheckRow) -> str:
    """The worst entry without the names (the block column has them): ``[1,4,3]/[1,4,3]``, ``direction 2``."""
    text = r.worst_entry
    if text.startswith("⟨v,"):
        return text.split("⟩, ", 1)[-1].replace("direction ", "u #")
    for name in (r.output, r.input):
        text = text.replace(f"∂{name}[", "[").replace(f"+{name}[", "+[").replace(f"∂{name}", "·")
    return text.replace(" (above diagonal)", " (upper)")


def _badness(r: GradientCheckRow) -> float:
    """−error/tolerance at the worst entry: the worst row sorts first."""
    err, tol = r.worst_abs_error, r.worst_tolerance
    return -(err / tol if tol > 0 else math.inf if err > 0 else 0.0)
