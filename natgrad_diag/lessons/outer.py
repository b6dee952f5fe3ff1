"""PyTorch's ``grad_outputs`` example (``torch.outer``) reproduced in TensorFlow, checked, and explained.

With x [n] and y = x xᵀ [n, n] (``torch.outer(x, x)``, ``x[:, None] * x[None, :]``), the seed v = ``grad_outputs``
(PyTorch) = ``output_gradients`` (TensorFlow) is ∂L/∂y, of y's shape [n, n], and the result is ∂L/∂x:

    ∂L/∂x_i = Σ_jk v_jk · ∂y_jk/∂x_i,      ∂y_jk/∂x_i = δ_ij x_k + x_j δ_ik      (J is [n, n, n])

so a seed of ones gives ∂L/∂x_i = Σ_k x_k + Σ_j x_j = 2·sum(x): [20, 20, 20, 20] for x = [1, 2, 3, 4].
The chain x → y = x xᵀ → z = y² is two vector-Jacobian products, ∂L/∂y = (∂z/∂y)ᵀ·∂L/∂z = 2y ⊙ ∂L/∂z
and then ∂L/∂x = (∂y/∂x)ᵀ·∂L/∂y, and equals the one-step ∂L/∂x; with ∂L/∂z = 1 it is 4 x_i Σ_k x_k².

References:
    PyTorch, ``torch.autograd.grad`` (the ``grad_outputs`` argument), https://pytorch.org/docs/stable/autograd.html
    TensorFlow, ``tf.GradientTape.gradient`` (the ``output_gradients`` argument).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag._validate import converted, input_error, require_bool, shape_str
from natgrad_diag.autodiff.blocks import BlockJacobian
from natgrad_diag.autodiff.dense import jacobian
from natgrad_diag.autodiff.seeded import checked_gradient
from natgrad_diag.exceptions import MissingExtraError, NonFiniteError, OutputGradientsError, ShapeMismatchError, error_line
from natgrad_diag.progress import progress_bar
from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section, Table, close_check, format_number, matrix_table, status_of, to_jsonable
from natgrad_diag.tolerance import validate_tolerance
from natgrad_diag.torch_bridge import INSTALL_HINT, torch_outer
from natgrad_diag.typing import Array, FloatArray

__all__ = ["DEFAULT_X", "MAX_LENGTH", "OuterExample", "outer_example", "validate_x"]

#: The x of PyTorch's example.
DEFAULT_X = (1.0, 2.0, 3.0, 4.0)
#: The longest x accepted: the explicit Jacobian has n³ entries.
MAX_LENGTH = 64
#: The largest |x_i| accepted: z = (x xᵀ)² has entries x_i²x_j², finite in float64 while |x_i| ≤ 1e76.
MAX_ABS_X = 1e76


@dataclass(frozen=True)
class OuterExample(Report):
    """The ``torch.outer`` lesson, every number computed in TensorFlow (and PyTorch, when installed); shapes for n = len(x).

    Attributes:
        x, y: [n] the point and [n, n] y = x xᵀ.
        gradient_ones_seed: [n], ``checked_gradient(tape, y, x, tf.ones_like(y))``; ``default_seed_gradient``:
            ``tape.gradient(y, x)`` with no seed; ``closed_form``: 2·sum(x).
        jacobian: the :class:`~natgrad_diag.BlockJacobian` ∂y/∂x from :func:`~natgrad_diag.jacobian` (HTML reports
            draw it); ``jacobian_closed_form``: [n, n, n], δ_ij x_k + x_j δ_ik built by hand; ``contraction``: [n],
            Σ_jk 1 · J[j, k, i].
        dL_dy, chain_two_step, chain_one_step, chain_closed_form: the chain z = y²: dL/dy = 2y [n, n], then
            (∂y/∂x)ᵀ·dL_dy, against ``checked_gradient(tape, z, x, tf.ones_like(z))`` and 4 x_i Σ_k x_k² ([n] each).
        wrong_seed_error, tensorflow_wrong_seed: our message, and what plain ``tape.gradient`` did, for the seed
            ``tf.ones_like(x)``.
        broadcast_seed_error, tensorflow_broadcast_shape: our message for y = sin(x) with a seed [n, 1], and the shape
            of the "gradient" plain ``tape.gradient`` returned (``None`` if it raised).
        torch, torch_status: the PyTorch run (a :class:`~natgrad_diag.torch_bridge.TorchOuter`) or ``None``, and
            "torch <version>" or why it did not run.
        checks: the claims, each decided by its numbers; ``rtol``, ``atol``: the tolerances of every "equal".
    """

    x: Array
    y: Array
    gradient_ones_seed: Array
    default_seed_gradient: Array
    closed_form: Array
    jacobian: BlockJacobian
    jacobian_closed_form: Array
    contraction: Array
    dL_dy: Array
    chain_two_step: Array
    chain_one_step: Array
    chain_closed_form: Array
    wrong_seed_error: str
    tensorflow_wrong_seed: str
    broadcast_seed_error: str
    tensorflow_broadcast_shape: tuple[int, ...] | None
    torch: Any
    torch_status: str
    checks: tuple[Check, ...]
    rtol: float = 1e-12
    atol: float = 1e-12

    @property
    def title(self) -> str:  # type: ignore[override]
        return f"grad_outputs / output_gradients for y = outer(x, x), x = {_vec(self.x)} (float64)"

    @property
    def jacobian_array(self) -> Array:
        """[n, n, n], ``tape.jacobian(y, x)``: J[j, k, i] = ∂y_jk/∂x_i."""
        return self.jacobian.block(0, 0)

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    def sections(self) -> tuple[Section, ...]:
        return (
            self._seed_section(),
            Section("The seed of ones", "", (self._by_element(
                ("x_i", "dL/dx_i (seed of ones)", "2·sum(x)", "Σ_jk J[j,k,i]"),
                (self.x, self.gradient_ones_seed, self.closed_form, self.contraction), "gradient_ones_seed"),)),  # fmt: skip
            self._jacobian_section(), self._chain_section(),
            Section("The wrong seed", self._wrong_seed_text()), Section("PyTorch cross-check", self._torch_text()),
        )  # fmt: skip

    def _seed_section(self) -> Section:
        n, total = self.n, float(np.sum(self.x))
        return Section("What the seed is", (
            f"y = outer(x, x) has shape [{n}, {n}]; x has shape [{n}]. The seed v, grad_outputs in PyTorch and "
            f"output_gradients in TensorFlow, is dL/dy: it has y's shape [{n}, {n}], not x's. The result is dL/dx:\n"
            "    dL/dx_i = Σ_jk v_jk · ∂y_jk/∂x_i,     ∂y_jk/∂x_i = δ_ij x_k + x_j δ_ik\n"
            f"so a seed of ones gives dL/dx_i = Σ_k x_k + Σ_j x_j = 2·sum(x) = 2·{format_number(total)} = "
            f"{format_number(2 * total)} for every i. It is the gradient of sum(y), not the Jacobian."
        ))

    def _by_element(self, columns: tuple[str, ...], series: tuple[Array, ...], torch_series: str) -> Table:
        """One row per i: i, then each series at i, then PyTorch's ``torch_series`` at i when it ran."""
        if self.torch is not None:
            columns, series = (*columns, "torch"), (*series, getattr(self.torch, torch_series))
        return Table(columns=("i", *columns), rows=tuple((str(i), *(format_number(a[i]) for a in series)) for i in range(self.n)))

    def _jacobian_section(self) -> Section:
        c = {ch.name: ch for ch in self.checks}
        jac_text = (
            f"tape.jacobian(y, x) has shape {shape_str(self.jacobian_array.shape)} (y's shape, then x's) and equals "
            f"δ_ij x_k + x_j δ_ik built by hand (max difference {format_number(c['jacobian_closed_form'].max_abs_error)}). "
            "Contracting it with the seed, Σ_jk v_jk J[j, k, i], is exactly what output_gradients computes, without "
            f"ever forming J (max difference {format_number(c['contraction_equals_gradient'].max_abs_error)}). "
            "In the slice ∂y/∂x_0 below, row j = 0 and column k = 0 hold x, and the corner y_00 = x_0² has 2·x_0."
        )
        table = matrix_table("∂y_jk/∂x_0", self.jacobian_array[:, :, 0], "J[:, :, 0] = ∂y/∂x_0", row="j={}", col="k={}")
        return Section("The Jacobian", jac_text, (table,) if self.n <= 6 else ())

    def _chain_section(self) -> Section:
        two_vs_one = next(ch for ch in self.checks if ch.name == "chain_two_steps_equal_one")
        chain_text = (
            "For x → y = x xᵀ → z = y², reverse mode runs two vector-Jacobian products: first "
            "dL/dy = (∂z/∂y)ᵀ·dL/dz = 2y ⊙ dL/dz (a seed of ones on z), then dL/dx = (∂y/∂x)ᵀ·dL/dy, "
            "passing dL/dy as the seed of y. That is the same as differentiating z in one step (max difference "
            f"{format_number(two_vs_one.max_abs_error)}), and equals d/dx_i (Σ_k x_k²)² = 4 x_i Σ_k x_k²."
        )
        series = (self.chain_two_step, self.chain_one_step, self.chain_closed_form)
        return Section("A chain: z = y², in two steps and in one", chain_text,
                       (self._by_element(("two steps", "one step", "4·x_i·Σx²"), series, "chain_two_step"),))

    def _wrong_seed_text(self) -> str:
        n = self.n
        wrong = [
            f"The seed ones_like(x) has shape [{n}], but y has shape [{n}, {n}]. What each one does with it:",
            f"- natgrad_diag.checked_gradient: {first_line(self.wrong_seed_error)}",
            f"- TensorFlow's tape.gradient: {self.tensorflow_wrong_seed}",
        ]
        if self.torch is not None:
            wrong.append(f"- PyTorch's torch.autograd.grad: {first_line(self.torch.wrong_seed_error) or '(no error)'}")
        tf_b = ("TensorFlow raises an error" if self.tensorflow_broadcast_shape is None else
                f"TensorFlow returns a \"gradient\" of shape {shape_str(self.tensorflow_broadcast_shape)} for a [{n}] "
                "source, with no error")  # fmt: skip
        wrong += [
            "",
            f"Worse, for y = sin(x) a seed of shape [{n}, 1] is broadcast: {tf_b}. "
            f"checked_gradient refuses it: {first_line(self.broadcast_seed_error)}",
            "",
            "Call natgrad_diag.checked_gradient(tape, y, x, seed) where you would call tape.gradient(y, x, "
            "output_gradients=seed) to get these checks.",
        ]
        return "\n".join(wrong)

    def _torch_text(self) -> str:
        if self.torch is not None:
            return (
                f"{self.torch_status}: torch.autograd.grad on the same x in float64 gives the same seed-of-ones "
                "gradient, Jacobian and chain as TensorFlow (within atol + rtol·max|value|, "
                f"rtol = {format_number(self.rtol)}, atol = {format_number(self.atol)}), and rejects the wrong seed itself."
            )
        return f"The PyTorch cross-check did not run: {self.torch_status}."

    def to_dict(self) -> dict[str, Any]:
        t, skip = self.torch, ("jacobian", "jacobian_closed_form", "torch", "torch_status", "checks")
        d = super().to_dict() | {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        d.update(jacobian_shape=list(self.jacobian_array.shape), jacobian=self.jacobian_array)
        torch_keys = ("gradient_ones_seed", "chain_two_step", "chain_one_step", "wrong_seed_error")  # None without torch
        d["torch"] = {"available": t is not None, "status": self.torch_status} | {k: getattr(t, k, None) for k in torch_keys}
        return dict(to_jsonable(d))


def first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else ""


def _computed(xn: FloatArray) -> dict[str, Any]:
    """Every number of the lesson by :class:`OuterExample`'s fields: TensorFlow's, and the oracles (J, closed forms)."""
    import tensorflow as tf

    n = xn.shape[0]
    xt = tf.constant(xn)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xt)
        y = xt[:, None] * xt[None, :]
        z = y**2
        s = tf.sin(xt)
    dL_dy = checked_gradient(tape, z, y, tf.ones_like(z))
    wide = tf.ones([n, 1], tf.float64)  # broadcast against sin(x) [n] by plain tape.gradient

    def refusal(target: Any, seed: Any) -> str:  # checked_gradient's message for a wrong seed, "" if it took it
        try:
            checked_gradient(tape, target, xt, seed)
        except OutputGradientsError as e:
            return str(e)
        return ""

    f: dict[str, Any] = dict(
        x=xn, y=y.numpy(), gradient_ones_seed=checked_gradient(tape, y, xt, tf.ones_like(y)).numpy(),
        default_seed_gradient=tape.gradient(y, xt).numpy(), dL_dy=dL_dy.numpy(),
        chain_two_step=checked_gradient(tape, y, xt, dL_dy).numpy(),
        chain_one_step=checked_gradient(tape, z, xt, tf.ones_like(z)).numpy(), tensorflow_broadcast_shape=None,
        wrong_seed_error=refusal(y, tf.ones_like(xt)), broadcast_seed_error=refusal(s, wide),
    )  # fmt: skip
    try:
        raw = tape.gradient(y, xt, output_gradients=tf.ones_like(xt))
        f["tensorflow_wrong_seed"] = f"no error: returned a \"gradient\" of shape {shape_str(raw.shape)}"
    except (tf.errors.OpError, ValueError, TypeError) as e:
        f["tensorflow_wrong_seed"] = error_line(e, with_type=True)
    with contextlib.suppress(tf.errors.OpError, ValueError, TypeError):
        f["tensorflow_broadcast_shape"] = tuple(int(d) for d in tape.gradient(s, xt, output_gradients=wide).shape)
    J_block = jacobian(lambda a: a[:, None] * a[None, :], [xt], input_names=("x",), output_names=("y",))
    eye = np.eye(n)
    f.update(
        jacobian=J_block, contraction=np.tensordot(np.ones((n, n)), J_block.block(0, 0), axes=2),
        jacobian_closed_form=np.einsum("ij,k->jki", eye, xn) + np.einsum("j,ik->jki", xn, eye),  # δ_ij x_k + x_j δ_ik at [j, k, i]
        closed_form=np.full(n, 2.0 * xn.sum()), chain_closed_form=4.0 * xn * np.sum(xn**2),
    )  # fmt: skip
    return f


def _checks(f: dict[str, Any], t: Any, *, rtol: float, atol: float) -> tuple[Check, ...]:
    """The claims on the numbers ``f`` of :func:`_computed`, and on PyTorch's run ``t`` unless it is ``None``."""
    close = functools.partial(close_check, rtol=rtol, atol=atol)
    n, J = f["x"].shape[0], f["jacobian"].block(0, 0)
    g_ones, two, one, wrong, b_shape = (f[k] for k in (
        "gradient_ones_seed", "chain_two_step", "chain_one_step", "wrong_seed_error", "tensorflow_broadcast_shape"))  # fmt: skip
    checks = [
        close("ones_seed_is_2_sum_x", "output_gradients = ones_like(y) gives dL/dx = 2·sum(x) = "
              f"{format_number(f['closed_form'][0])}", g_ones, f["closed_form"]),
        close("default_seed_is_ones", "tape.gradient(y, x) with no seed equals the seed of ones (TensorFlow's default)",
              f["default_seed_gradient"], g_ones),
        close("jacobian_closed_form", f"tape.jacobian(y, x) [{n}, {n}, {n}] equals δ_ij x_k + x_j δ_ik built by hand",
              J, f["jacobian_closed_form"]),
        close("contraction_equals_gradient", "Σ_jk 1·J[j, k, i], the explicit Jacobian contracted with the seed, "
              "equals the output_gradients result", f["contraction"], g_ones),
        close("chain_two_steps_equal_one", "z = y²: dL/dy = 2y, then (∂y/∂x)ᵀ·dL/dy, equals differentiating z in one "
              "step", two, one),
        close("chain_closed_form", "z = y² in one step equals 4·x_i·Σ_k x_k²", one, f["chain_closed_form"]),
        Check(
            name="wrong_seed_caught",
            claim=f"the seed ones_like(x) (shape [{n}]) for y (shape [{n}, {n}]) is refused, naming both shapes",
            status=status_of(f"shape of [{n}] and target[0] has a shape of [{n}, {n}]" in wrong),
            detail=f"plain tape.gradient: {f['tensorflow_wrong_seed']}" if wrong else f"no error for shapes [{n}] and [{n}, {n}]",
        ),
        Check(
            name="broadcast_seed_caught",
            claim=f"for y = sin(x) the seed of shape [{n}, 1] is refused instead of being broadcast",
            status=status_of(f["broadcast_seed_error"]),
            detail=f"plain tape.gradient returned shape {shape_str(b_shape)} for a [{n}] source" if b_shape is not None
            else "plain tape.gradient raised",
        ),
    ]  # fmt: skip
    if t is not None:
        checks += [
            close("torch_ones_seed_agrees", "torch.autograd.grad(y, x, grad_outputs=ones_like(y)) equals TensorFlow's",
                  t.gradient_ones_seed, g_ones),
            close("torch_jacobian_agrees", "torch.autograd.functional.jacobian equals tape.jacobian", t.jacobian, J),
            close("torch_chain_agrees", "torch's two-step and one-step chain z = y² equal TensorFlow's",
                  (t.chain_two_step, t.chain_one_step, t.dL_dy), (two, one, f["dL_dy"])),
            Check(
                name="torch_rejects_wrong_seed",
                claim="PyTorch refuses grad_outputs=ones_like(x) too, with its own shape message",
                status=status_of("Mismatch in shape" in t.wrong_seed_error),
                detail=f"torch: {first_line(t.wrong_seed_error) or '(no error)'}",
            ),
        ]  # fmt: skip
    return tuple(checks)


def _vec(a: Array) -> str:
    return "[" + ", ".join(format_number(v) for v in np.ravel(a)) + "]"


def validate_x(x: Any) -> Array:
    """x as a new float64 array [n] (the default when None); InputError unless 1 ≤ n ≤ 64 finite, |x_i| ≤ 1e76."""
    a: Array = converted(lambda: np.array(DEFAULT_X if x is None else x, np.float64),  # a copy: x is never touched
                         "x must be a list of numbers.", "x", "a 1-D sequence of floats, e.g. [1, 2, 3, 4]", repr(x)[:80],
                         "pass x as numbers, e.g. outer_example([1, 2, 3, 4]) or natgrad-diag outer --x 1,2,3,4.")
    if a.ndim != 1:
        raise input_error("x must be a vector.", "x", "[n]", shape_str(a.shape),
                          "pass a flat list of numbers, e.g. [1, 2, 3, 4].", kind=ShapeMismatchError)
    if not 1 <= a.shape[0] <= MAX_LENGTH:
        raise input_error(f"x must have between 1 and {MAX_LENGTH} entries (the explicit Jacobian has n³ entries).", "x",
                          f"[n] with 1 ≤ n ≤ {MAX_LENGTH}", shape_str(a.shape),
                          "pass a short x, e.g. [1, 2, 3, 4]; the lesson does not depend on n.", kind=ShapeMismatchError)
    if not np.all(np.isfinite(a)):
        raise input_error(f"x contains {int(np.isnan(a).sum())} NaN and {int(np.isinf(a).sum())} Inf value(s).", "x",
                          "finite numbers", _vec(a),
                          "pass finite numbers, e.g. outer_example([1, 2, 3, 4]) or natgrad-diag outer --x 1,2,3,4.", kind=NonFiniteError)
    if np.max(np.abs(a)) > MAX_ABS_X:
        raise input_error("x is too large: the chain z = (x xᵀ)² would overflow float64.", "x",
                          f"|x_i| ≤ {MAX_ABS_X:g} (so that x_i⁴ stays finite)", _vec(a),
                          "rescale x; the lesson does not depend on its size, e.g. outer_example([1, 2, 3, 4]).")
    return a


def outer_example(x: Sequence[float] | Array | None = None, *, rtol: float = 1e-12, atol: float = 1e-12,
                  use_torch: bool | None = None) -> OuterExample:  # fmt: skip
    """PyTorch's ``torch.outer`` ``grad_outputs`` example in TensorFlow, every claim checked; never raises on a failed check.

    For y = x xᵀ it computes with :func:`~natgrad_diag.checked_gradient`, and checks against the module's closed
    forms, the seed of ones (2·sum(x), the contraction Σ_jk J[j, k, :]) and the chain z = y² (4 x Σ_k x_k²); it
    refuses the seed ones_like(x) [n] for y [n, n] and the seed [n, 1] for sin(x) [n] (TensorFlow fails deep inside
    on the first and broadcasts the second); with PyTorch installed it runs the same by ``torch.autograd.grad``.

    Args:
        x: [n] the point, 1 ≤ n ≤ 64 (default [1, 2, 3, 4], PyTorch's example); copied, never changed.
        rtol, atol: "equal" means max |a − b| ≤ atol + rtol · max |reference|.
        use_torch: ``None``: cross-check with PyTorch if it is installed; ``True``: require it; ``False``: skip it.

    Raises:
        InputError: x is not a finite vector of 1 to 64 numbers, or a tolerance is negative.
        MissingExtraError: ``use_torch=True`` and PyTorch is not installed.

    Example:
        >>> report = outer_example()
        >>> report.gradient_ones_seed
        array([20., 20., 20., 20.])
    """
    xn = validate_x(x)
    rtol, atol = validate_tolerance("rtol", rtol), validate_tolerance("atol", atol)
    use_torch = None if use_torch is None else require_bool(use_torch, "use_torch")  # "no" is truthy: it required torch
    with progress_bar(total=3, description="outer example") as advance:
        advance()
        f = _computed(xn)
        advance()
        t, status = None, "skipped (use_torch=False)"
        if use_torch is not False:
            try:
                t = torch_outer(xn)
                status = f"torch {t.torch_version}"
            except MissingExtraError:
                if use_torch:
                    raise
                status = f"torch is not installed (to run it, install {INSTALL_HINT})"
        advance()
    return OuterExample(**f, torch=t, torch_status=status, checks=_checks(f, t, rtol=rtol, atol=atol), rtol=rtol, atol=atol)
