"""The function at the checked point: inputs as arrays, evaluations, central differences, the comparison rule."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag._validate import (
    as_float_tensor, call_fn, flat_outputs, input_error, names_of, output_labels, require_finite, require_output_dtypes,
    require_same_dtype, seed_array, shape_str, split_inputs, validate_seeds,
)  # fmt: skip
from natgrad_diag.exceptions import InputError, NonFiniteError, error_line
from natgrad_diag.tolerance import Tolerance, rounding_bound
from natgrad_diag.tolerance import eps as eps_of
from natgrad_diag.typing import Array

__all__ = ["Comparison", "Problem", "compare", "cotangent_arrays", "to_arrays"]


def to_arrays(inputs: Any, input_names: Sequence[str] | None) -> tuple[list[Array], tuple[str, ...]]:
    """Copies of the inputs as finite, non-empty float arrays of one dtype, and their names."""
    values, names = split_inputs(inputs, input_names, remedy="pass the point to check at, e.g. [eta1, eta2].")
    arrays = []
    for k, (name, v) in enumerate(zip(names, values)):
        a = np.array(as_float_tensor(v, f"inputs[{k}] ({name})").numpy(), copy=True)  # numbers, lists: float64
        if a.size == 0:
            raise input_error(
                f"input {name} has no entries (shape {shape_str(a.shape)}): there is no derivative to check.",
                f"inputs[{k}] ({name})", "a tensor with at least one entry", shape_str(a.shape), "pass a non-empty point.",
            )  # fmt: skip
        require_finite(a, name)
        arrays.append(a)
    for name, a in zip(names[1:], arrays[1:]):
        require_same_dtype(a, arrays[0], name, names[0])
    return arrays, names


def cotangent_arrays(cotangents: Any, ys: Sequence[Any]) -> list[Array]:
    """Cotangents checked against the outputs ``ys``, as arrays of their shapes and dtypes (``None``: ones)."""
    seeds = list(cotangents) if isinstance(cotangents, (list, tuple)) else [cotangents]
    validate_seeds(seeds, ys, argument="cotangents", target_name="output")
    return [seed_array(s, y, f"cotangents[{k}]") for k, (s, y) in enumerate(zip(seeds, ys))]


class Problem:
    """fn at a point with the check's settings: inputs ``x`` and flattened outputs ``y`` as numpy arrays, their names,
    the inputs' structures, the step and tolerances ``tol`` and ``max_bytes``; evaluations never modify the inputs."""

    def __init__(
        self, fn: Callable[..., Any], arrays: list[Array], names: tuple[str, ...], output_names: Sequence[str] | None,
        structures: tuple[str, ...], tol: Tolerance, max_bytes: int,
    ) -> None:  # fmt: skip
        import tensorflow as tf

        self.fn, self.x, self.names, self.structures, self.max_bytes = fn, arrays, names, structures, max_bytes
        self.eps, self.rtol, self.atol = float(tol.eps or 0.0), tol.rtol, tol.atol
        self._noise: dict[int, list[Array]] = {}
        self.dtype = arrays[0].dtype
        outputs = call_fn(fn, [tf.constant(a) for a in arrays], at=" at the given point", remedy="call fn(*inputs) yourself to "
                          "see the error; check the inputs' shapes and that the point is valid (e.g. positive definite).")
        flat = flat_outputs(outputs)  # float tensors of the inputs' dtype (float16, float32 or float64)
        require_output_dtypes(flat, self.dtype.name)
        self.y = [np.asarray(y.numpy()) for y in flat]
        for j, name in enumerate(names):  # x ± eps must be two points: at |x| = 2·10¹⁰ float64's spacing is 4·10⁻⁶
            if not np.all(self.realized(j, np.ones_like(arrays[j]))):
                big = float(np.max(np.abs(arrays[j])))
                raise input_error(f"x ± eps rounds to x itself in {name}: the step is below half the spacing of "
                                  f"{self.dtype.name} at its largest entry {big:.3g}.", "eps",
                                  f"a step above {float(np.spacing(self.dtype.type(big))) / 2:.3g}", f"{self.eps:g}",
                                  f"pass a step relative to the input's size, e.g. eps={self.eps * big:.3g} "
                                  f"(eps·max|{name}|) if fn varies on that scale, or centre and rescale the input.")  # fmt: skip
        labels = output_labels(outputs) if output_names is None else output_names  # a dict's keys or paths, flattened
        self.output_names = names_of(labels, len(self.y), "outputs")
        for name, y in zip(self.output_names, self.y):
            if not np.all(np.isfinite(y)):
                raise NonFiniteError(
                    f"fn(*inputs) returned NaN or Inf in output {name}.",
                    context=[("Argument", "inputs"), ("Output", f"{name} {shape_str(y.shape)}")],
                    remedy="check the point: GPflow's maps need a positive-definite η₂ − η₁η₁ᵀ (or −θ₂).",
                )
        # finite differences need a function: a second call may differ by the rounding of one evaluation, no more
        moved = max(float(np.max(np.abs(y - np.asarray(z)), initial=0.0)) for y, z in zip(self.y, flat_outputs(fn(*[tf.constant(a) for a in arrays]))))
        if not moved <= rounding_bound(self.dtype, condition=1.0, scale=max(float(np.max(np.abs(y), initial=0.0)) for y in self.y)):
            raise input_error("fn(*inputs) gives different values at the same point (it draws random numbers?).", "fn",
                              "a function of the inputs (two calls within 100·ε·max|fn|)", f"two calls {moved:.3g} apart",
                              "fix its randomness (tf.random.stateless_* with a fixed seed), or check the deterministic part.")

    def central(self, j: int, direction: Array, what: str) -> list[tuple[Array, Array]]:
        """Per output, the central difference (fn(x_j + h·direction) − fn(x_j − h·direction)) / 2h and its rounding
        bound 100·ε·(|fn(x + h·d)| + |fn(x − h·d)|) / 2h elementwise (Nocedal & Wright, *Numerical Optimization*, 2nd
        ed., §8.1: each evaluation carries an error of order ε·|fn|, divided by the step); a failure or NaN/Inf:
        InputError. Its derivative is along :meth:`realized`'s direction, not ``direction``."""
        import tensorflow as tf

        values = []
        for scale in (self.eps, -self.eps):
            xs = [tf.constant(a) for a in self.x]
            xs[j] = tf.constant(self.x[j] + np.asarray(scale, self.dtype) * direction)
            try:
                out = [np.asarray(y.numpy()) for y in flat_outputs(self.fn(*xs))]
            except Exception as e:  # noqa: BLE001
                raise InputError(
                    f"fn failed at a finite-difference point ({what}).",
                    context=[("Argument", "eps"), ("Step", scale), ("Error", error_line(e, with_type=True))],
                    remedy="pass a smaller eps, or a point further from the edge of fn's domain "
                    "(e.g. better conditioned).",
                ) from e
            for name, y in zip(self.output_names, out):
                if not np.all(np.isfinite(y)):
                    raise NonFiniteError(
                        f"fn returned NaN or Inf in output {name} at a finite-difference point ({what}).",
                        context=[("Argument", "eps"), ("Step", scale)],
                        remedy="pass a smaller eps, or a point further from the edge of fn's domain.",
                    )
            values.append(out)
        floor = self.measured_noise(j)
        return [((p - m) / (2 * self.eps), self.unit * (np.abs(p) + np.abs(m)) + f) for p, m, f in zip(*values, floor)]

    def measured_noise(self, j: int) -> list[Array]:
        """Per output, 10 · N / 2h: the rounding bound a central difference gets from fn's measured noise N, the larger
        |fn(x') − fn(x)| of two points x' = x ∘ (1 + 4ε·s) (s random signs, x_j alone moved: a backward error). Unlike
        the bounds from |fn| and |J|·|x| this sees rounding amplified inside fn, e.g. by a solve with an ill-conditioned
        η₂; a difference carries twice one evaluation's noise, and 10 covers the noise's spread over the evaluations
        (J. Moré and S. Wild, *Estimating computational noise*, SIAM J. Sci. Comput. 33(3), 2011)."""
        import tensorflow as tf

        if j not in self._noise:
            rng, noise = np.random.default_rng(j), [np.zeros_like(y) for y in self.y]
            for _ in range(2):
                s = rng.choice(np.array([-4.0, 4.0]), self.x[j].shape)
                if self.structures[j] == "symmetric":  # the probe stays symmetric
                    s = 4 * np.sign(s + np.swapaxes(s, -1, -2))
                xs = [tf.constant(a) for a in self.x]
                xs[j] = tf.constant((self.x[j] * (1 + eps_of(self.dtype) * s)).astype(self.dtype))
                try:
                    noise = [np.fmax(n, np.abs(np.asarray(y) - y0)) for n, y, y0 in zip(noise, flat_outputs(self.fn(*xs)), self.y)]
                except Exception:  # noqa: BLE001, S110 - no noise measured there; the bounds from |fn| and |J|·|x| remain
                    pass
            self._noise[j] = [10.0 / (2 * self.eps) * np.nan_to_num(n, nan=0.0, posinf=0.0) for n in noise]
        return self._noise[j]

    def at_step(self, eps: float) -> Problem:
        """This problem with the finite-difference step ``eps`` (fn's noise measured again: its bound scales as 1/eps)."""
        other = copy.copy(self)
        other.eps, other._noise = eps, {}
        return other

    @property
    def unit(self) -> float:
        """100·ε / 2h: the rounding bound of a central difference per unit of |fn| (:meth:`central`) and, doubled, per
        unit of |x|·|∂fn/∂x| (the rounding of x and of intermediates of its size, e.g. x / lengthscale)."""
        return rounding_bound(self.dtype, condition=1.0, scale=1.0) / (2 * self.eps)

    def unresolved(self, j: int, ana: Array, noise: Array) -> str:
        """Why a block that passed could not have failed, else "": rounding alone (``noise``, per entry) allows an
        error as large as the block's largest |analytical| derivative, so a wrong one of that size would pass too
        (also below atol, when rounding swamps atol: the pass is not atol's)."""
        scale = float(np.max(np.abs(ana), initial=0.0))
        if not (scale > 0 and float(np.max(noise, initial=0.0)) >= max(scale, self.atol)):
            return ""
        step = self.eps * float(np.max(np.abs(self.x[j])))
        return (f"inconclusive: at eps = {self.eps:g} rounding allows errors up to {float(np.max(noise)):.3g}, as large "
                f"as the block's largest derivative {scale:.3g}. Where fn varies slowly on the scale of x (timestamps) "
                f"pass a larger step, e.g. eps={step:.3g} (eps·max|{self.names[j]}|); where fn is ill-conditioned here "
                "(a near-singular solve), check at a better-conditioned point.")  # fmt: skip

    def realized(self, j: int, direction: Array) -> Array:
        """The direction a central difference along ``direction`` really takes: ((x_j + h·d) − (x_j − h·d)) / 2h as
        rounded in the inputs' dtype. Where |x_j| is large next to h the two points round to the dtype's grid (at
        |x| = 10⁶ in float64 its spacing is 1.2·10⁻¹⁰, 10⁻⁴ of h = 10⁻⁶), and the analytical side is contracted with
        this direction so that the comparison does not count that rounding as an error."""
        step = np.asarray(self.eps, self.dtype) * direction
        return np.asarray((self.x[j] + step) - (self.x[j] - step), np.float64) / (2 * self.eps)


@dataclass(frozen=True)
class Comparison:
    """numerical against analytical, elementwise: an entry passes when |num − ana| ≤ atol + rtol·|ana| + rounding (rtol
    scales each entry's own |analytical|: stricter than :mod:`natgrad_diag.tolerance`'s block rule).

    ``worst`` is the flat index of the largest error relative to its tolerance; the other fields are
    :class:`~natgrad_diag.gradcheck.report.GradientCheckRow`'s of these names.
    """

    worst: int
    worst_abs_error: float
    worst_tolerance: float
    max_abs_error: float
    max_rel_error: float
    passed: bool


def compare(num: Array, ana: Array, *, rtol: float, atol: float, rounding: float | Array = 0.0) -> Comparison:
    """The elementwise :class:`Comparison` of ``num`` with ``ana`` (same shape): an entry's tolerance is
    atol + rtol·|ana| + its ``rounding`` (a bound on the rounding error of ``num``, a number or per entry).

    Examples:
        >>> c = compare(np.array([1.0, 2.5]), np.array([1.0, 2.0]), rtol=0.1, atol=0.0)
        >>> c.worst, c.worst_abs_error, c.worst_tolerance, c.passed
        (1, 0.5, 0.2, False)
    """
    finite = np.isfinite(ana) & np.isfinite(num)  # a NaN from reverse mode is an infinite error, not a NaN one
    err = np.where(finite, np.abs(num - ana), np.inf)
    tol = np.where(finite, atol + rtol * np.abs(ana) + rounding, atol)
    if err.size == 0:
        return Comparison(0, 0.0, atol, 0.0, 0.0, True)
    with np.errstate(divide="ignore", invalid="ignore"):
        k = int(np.argmax(np.where(tol > 0, err / np.where(tol > 0, tol, 1.0), np.where(err > 0, np.inf, 0.0))))
    big = np.abs(ana) > atol
    max_rel = float(np.max(err[big] / np.abs(ana[big]), initial=0.0))
    return Comparison(k, float(err.flat[k]), float(tol.flat[k]), float(np.max(err)), max_rel, bool(np.all(err <= tol)))
