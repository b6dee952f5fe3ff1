"""Why ``dL_deta1 != dtheta_deta1 * q_mu_grad``: the lesson, every claim computed and checked, and the question's setup.

With J = ∂(mean, varsqrt)/∂(η₁, η₂) and v = (∂L/∂mean, ∂L/∂varsqrt):

    tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=v)  = Jᵀ·v      (a vector-Jacobian product)
    tape.gradient(meanvarsqrt, [eta1, eta2])                      = Jᵀ·1      (every target seeded with ones)

and (Jᵀ·1) ⊙ v = Jᵀ·v only when J is diagonal (one target, an elementwise function). Here
mean = η₁ but varsqrt = chol(η₂ − η₁η₁ᵀ) also depends on η₁, so

    ∂L/∂η₁ = ∂L/∂mean + (∂varsqrt/∂η₁)ᵀ · ∂L/∂varsqrt           (mean path + varsqrt path).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from natgrad_diag._validate import input_error
from natgrad_diag.autodiff.blocks import BlockJacobian
from natgrad_diag.autodiff.dense import jacobian
from natgrad_diag.autodiff.seeded import vjp
from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section, Table, close_check, format_number, matrix_table, max_abs_diff, to_jsonable, status_of
from natgrad_diag.step.jacobian import natgrad_map_jacobian
from natgrad_diag.step.trace import NatGradTrace, natgrad_trace
from natgrad_diag.tolerance import resolve
from natgrad_diag.typing import Array

__all__ = ["Explanation", "SeedScenario", "explain_output_gradients", "seed_scenario"]

#: q_mu of the user's report, [M, L] = [5, 1].
SEED_Q_MU = ((0.93350756,), (0.15833747,), (0.23830378,), (0.28742445,), (0.14999759,))


@dataclass(frozen=True)
class SeedScenario:
    """Fresh GPflow Parameters and the gradients the user fed to the step, in ``natgrad_trace``'s order.

    Attributes:
        q_mu: ``gpflow.Parameter`` [M, L], identity transform.
        q_sqrt: ``gpflow.Parameter`` [L, M, M] with ``gpflow.utilities.triangular()``; its
            unconstrained variable is [L, M(M+1)/2].
        q_mu_grad: [M, L], plays dL/dq_mu (unconstrained): ``0.33 · q_mu.unconstrained_variable``.
        q_sqrt_grad: [L, M(M+1)/2], plays dL/dq_sqrt (unconstrained): ``q_sqrt.unconstrained_variable``.
    """

    q_mu: Any
    q_sqrt: Any
    q_mu_grad: Any
    q_sqrt_grad: Any

    def __iter__(self) -> Iterator[Any]:  # so that ``natgrad_trace(*seed_scenario())`` works
        return iter((self.q_mu, self.q_sqrt, self.q_mu_grad, self.q_sqrt_grad))


def seed_scenario() -> SeedScenario:
    """Build the user's setup exactly (float64, M = 5, L = 1), with new Parameters on every call.

    Example:
        >>> from natgrad_diag import natgrad_trace, seed_scenario
        >>> trace = natgrad_trace(*seed_scenario())
    """
    import gpflow
    import tensorflow as tf

    q_mu = gpflow.Parameter(list(map(list, SEED_Q_MU)), dtype=tf.float64)
    q_sqrt = gpflow.Parameter(tf.eye(5, batch_shape=[1], dtype=tf.float64), transform=gpflow.utilities.triangular())
    return SeedScenario(q_mu=q_mu, q_sqrt=q_sqrt, q_mu_grad=tf.convert_to_tensor(q_mu.unconstrained_variable) * 0.33,
                        q_sqrt_grad=tf.convert_to_tensor(q_sqrt.unconstrained_variable))


@dataclass(frozen=True)
class CounterExample:
    """y = sin(x), one target, elementwise: J = diag(cos x), so (Jᵀ·1) ⊙ v = Jᵀ·v."""

    x: Array
    v: Array
    naive: Array
    vjp: Array
    jacobian_is_diagonal: bool


@dataclass(frozen=True)
class Explanation(Report):
    """The lesson for one natural-gradient step; ``checks`` are its numbered claims (a)-(e).

    Attributes:
        trace: the :class:`NatGradTrace` explained.
        jacobian: J = ∂(mean, varsqrt)/∂(eta1, eta2) from ``tape.jacobian``.
        naive_product: [M, L], ``dtheta_deta1 * dL_dmean``.
        mean_path: [M, L], (∂mean/∂η₁)ᵀ·∂L/∂mean.
        varsqrt_path: [M, L], (∂varsqrt/∂η₁)ᵀ·∂L/∂varsqrt.
        counter_example: the diagonal case where the naive product is right.
        row_label: the output element whose row (e) reads with a one-hot seed.
        onehot_row: that row from ``output_gradients`` = one-hot (eta1 part then eta2 part, flattened).
        checks: (a) vjp, (b) default seed, (c) naive product and split, (d) counter-example, (e) row of J.
    """

    trace: NatGradTrace
    jacobian: BlockJacobian
    naive_product: Array
    mean_path: Array
    varsqrt_path: Array
    counter_example: CounterExample
    row_label: str
    onehot_row: Array
    checks: tuple[Check, ...]
    rtol: float = 1e-10
    atol: float = 1e-12

    @property
    def title(self) -> str:  # type: ignore[override]
        t = self.trace
        return (f"Why dL/deta1 ≠ dtheta_deta1 * dL/dmean  (M = {t.num_inducing}, L = {t.num_latent}, {t.eta1.dtype}, "
                f"{t.xi_transform})")

    def sections(self) -> tuple[Section, ...]:
        t, J = self.trace, self.jacobian
        M, L = t.num_inducing, t.num_latent
        c = {ch.name: ch for ch in self.checks}
        naive_err = max_abs_diff(self.naive_product, t.dL_deta1)
        intro = (
            "GPflow's step computes\n"
            "    dL_deta1, dL_deta2 = tape.gradient(meanvarsqrt, [eta1, eta2],\n"
            "                                       output_gradients=[dL_dmean, dL_dvarsqrt])\n"
            "That is the vector-Jacobian product Jᵀ·v, with J = ∂(mean, varsqrt)/∂(eta1, eta2) and\n"
            "v = (dL/dmean, dL/dvarsqrt). Without output_gradients TensorFlow seeds every element of both\n"
            f"targets (mean {list(t.eta1.shape)} and varsqrt {list(t.eta2.shape)}) with 1, so dtheta_deta = Jᵀ·1:\n"
            "the gradient of the sum of all output elements, summed over both targets. It is not the\n"
            "Jacobian, and multiplying it elementwise by dL/dmean is not the chain rule."
        )
        series = (t.dL_deta1, t.dtheta_deta1, self.naive_product, self.mean_path, self.varsqrt_path)
        table = Table(
            columns=("", "Jᵀ·v", "Jᵀ·1", "(Jᵀ·1)⊙v", "mean path", "varsqrt path"),
            rows=tuple((f"eta1[{m},{l}]", *(format_number(a[m, l]) for a in series)) for m, l in np.ndindex(M, L)),
            title="eta1: Jᵀ·v = dL/deta1 (output_gradients), Jᵀ·1 = dtheta/deta1 (default seed), (Jᵀ·1)⊙v the "
            "naive product, and Jᵀ·v split into its mean and varsqrt paths",
        )
        why = (
            (f"The naive product differs from Jᵀ·v by up to {format_number(naive_err)}. "
             if naive_err > (c["c_naive_product_differs"].tolerance or 0.0)
             else f"Here the naive product happens to equal Jᵀ·v (to {format_number(naive_err)}). ")
            + "∂mean/∂eta1 is the identity (the mean path equals dL/dmean "
            f"{_within(max_abs_diff(self.mean_path, t.dL_dmean))}), but varsqrt depends on eta1 through "
            f"chol(eta2 − eta1·eta1ᵀ): the block ∂varsqrt/∂eta1 has max |entry| "
            f"{format_number(float(np.max(np.abs(J.block(1, 0)), initial=0.0)))}. So\n"
            "    dL/deta1 = dL/dmean + (∂varsqrt/∂eta1)ᵀ·dL/dvarsqrt\n"
            f"(the mean path plus the varsqrt path), which holds here {_within(c['c_split'].max_abs_error)}. The default "
            "seed mixes the same two paths with ones instead of v: dtheta/deta1 = 1 + Σ ∂varsqrt/∂eta1 (which holds "
            f"{_within(c['b_default_seed_split'].max_abs_error)}), so no elementwise factor can turn it into Jᵀ·v."
        )
        ce = self.counter_example
        ce_text = (
            f"One target, elementwise: y = sin(x) with x = [{', '.join(format_number(v) for v in ce.x)}]. J = diag(cos x) "
            f"is {'diagonal' if ce.jacobian_is_diagonal else 'NOT diagonal'}, so (Jᵀ·1) ⊙ v = cos(x) ⊙ v equals Jᵀ·v "
            f"(max difference {format_number(max_abs_diff(ce.naive, ce.vjp))}). The naive product is right exactly when "
            "J is diagonal."
        )
        row_text = (
            f"output_gradients = one-hot at {self.row_label} returns the row {self.row_label} of J: it equals that row "
            f"of tape.jacobian's J {_within(c['e_onehot_row'].max_abs_error)}. The whole J from tape.jacobian "
            f"is {J.shape[0]} × {J.shape[1]}: rows {', '.join(f'{n}{list(s)}' for n, s in zip(J.output_names, J.output_shapes))}, "
            f"columns {', '.join(f'{n}{list(s)}' for n, s in zip(J.input_names, J.input_shapes))}."
        )
        catch_it = (
            "One line would have caught the mistake where it was made: run the code under\n"
            "    with natgrad_diag.strict_gradients(): ...\n"
            "(or the tests with pytest --strict-gradients), and tape.gradient(meanvarsqrt, [eta1, eta2]) without "
            "output_gradients raises, as PyTorch would."
        )
        sections = [
            Section("What TensorFlow computes", intro), Section("The numbers", "", (table,)),
            Section("Where the difference comes from", why), Section("When the naive product is right", ce_text),
            Section("Reading J itself", row_text), Section("What would have caught it", catch_it),
        ]
        if M <= 6:
            eta2 = (("dL/deta2", t.dL_deta2), ("dtheta/deta2", t.dtheta_deta2))
            tables = tuple(matrix_table(name, a[0], f"{name}[0] ({list(a.shape)})") for name, a in eta2)
            sections.insert(2, Section("eta2 (first latent GP)", "", tables))
        return tuple(sections)

    def to_dict(self) -> dict[str, Any]:
        t = self.trace
        d = super().to_dict()
        d.update(M=t.num_inducing, L=t.num_latent, dtype=str(t.eta1.dtype), xi_transform=t.xi_transform, gamma=t.gamma)
        d.update({k: getattr(t, k) for k in ("dL_dmean", "dL_dvarsqrt", "dL_deta1", "dL_deta2", "dtheta_deta1", "dtheta_deta2")})
        d.update(naive_product=self.naive_product, mean_path=self.mean_path, varsqrt_path=self.varsqrt_path,
                 jacobian_shape=list(self.jacobian.matrix.shape), onehot_row_label=self.row_label)
        return dict(to_jsonable(d))


def _within(difference: float | None) -> str:
    """How closely two routes agree, in words: "exactly" or "to within 3.1e-16"."""
    return "(not compared)" if difference is None else "exactly" if difference == 0 else f"to within {format_number(difference)}"


def _counter_example(x: Array, v: Array, close: Callable[..., Check]) -> tuple[CounterExample, Check]:
    import tensorflow as tf

    xt = tf.constant(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xt)
        y = tf.sin(xt)
    naive = tape.gradient(y, xt).numpy() * v
    vjp = tape.gradient(y, xt, output_gradients=tf.constant(v)).numpy()
    diag = jacobian(tf.sin, [xt], input_names=("x",), output_names=("y",)).is_diagonal()
    equal = close("d_diagonal_counter_example",
                  "for y = sin(x) (one target, diagonal J) the naive product (Jᵀ·1)⊙v equals Jᵀ·v", naive, vjp)
    check = replace(equal, status=status_of(equal.passed and diag),
                    detail="" if diag else "the Jacobian of sin was not diagonal")  # fmt: skip
    return CounterExample(x=x, v=v, naive=naive, vjp=vjp, jacobian_is_diagonal=diag), check


def _trace_of(source: Any, gamma: float, xi_transform: Any) -> NatGradTrace:
    """``source``, or the trace of its (q_mu, q_sqrt, q_mu_grad, q_sqrt_grad); an InputError for anything else."""
    if isinstance(source, NatGradTrace):
        return source
    try:
        parts = list(source) if not isinstance(source, (str, bytes)) else None
    except TypeError:
        parts = None
    if parts is None or len(parts) != 4:
        raise input_error(
            "source must be a NatGradTrace, a SeedScenario or (q_mu, q_sqrt, q_mu_grad, q_sqrt_grad).",
            "source", "a NatGradTrace, a SeedScenario, a 4-tuple of tensors, or None (the built-in scenario)",
            f"{type(source).__name__} {source!r}"[:80] if parts is None else f"{type(source).__name__} of {len(parts)} item(s)",
            "pass natgrad_trace(...)'s result or seed_scenario(), or call explain_output_gradients() for the built-in example.",
        )  # fmt: skip
    # one-off: the eager step is cheaper than tracing a compiled one (same numbers)
    return natgrad_trace(*parts, gamma=gamma, xi_transform=xi_transform, compiled=False)


def explain_output_gradients(source: NatGradTrace | Any = None, *, gamma: float = 1.0, xi_transform: Any = None,
                             rtol: float | None = None, atol: float | None = None) -> Explanation:  # fmt: skip
    """Explain, with numbers, what ``output_gradients`` does in GPflow's natural-gradient step.

    Args:
        source: a :class:`NatGradTrace`, a :class:`SeedScenario` (or any
            ``(q_mu, q_sqrt, q_mu_grad, q_sqrt_grad)`` tuple), or ``None`` for ``seed_scenario()``.
        gamma, xi_transform: passed to :func:`natgrad_trace` when ``source`` is not a trace.
        rtol, atol: tolerances for "equal" (default from the dtype: 1e-10/1e-12 in float64).

    Returns:
        A frozen :class:`Explanation`; ``str()`` is the lesson, ``checks`` its claims (a)-(e).
        It never raises on a failed check; see ``Explanation.passed``.
    """
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    trace = _trace_of(seed_scenario() if source is None else source, gamma, xi_transform)
    tol = resolve(trace.eta1.dtype, "exact", rtol=rtol, atol=atol)
    close = functools.partial(close_check, rtol=tol.rtol, atol=tol.atol)
    J = natgrad_map_jacobian(trace.eta1, trace.eta2, method="autodiff")  # the lesson says: from tape.jacobian
    mean_path = np.tensordot(trace.dL_dmean, J.block(0, 0), axes=2)
    varsqrt_path = np.tensordot(trace.dL_dvarsqrt, J.block(1, 0), axes=3)
    checks = _claims_a_to_c(trace, J, mean_path, varsqrt_path, close)
    ce, ce_check = _counter_example(trace.q_mu[:, 0].copy(), trace.dL_dmean[:, 0].copy(), close)
    checks.append(ce_check)
    row_label = f"varsqrt[0,{trace.num_inducing - 1},0]"
    seed_vs = np.zeros_like(trace.eta2)  # that row of J via output_gradients = one-hot, on a fresh tape (an independent route)
    seed_vs[0, -1, 0] = 1.0
    _, grads = vjp(expectation_to_meanvarsqrt, [trace.eta1, trace.eta2], [np.zeros_like(trace.eta1), seed_vs])
    onehot = np.concatenate([g.numpy().ravel() for g in grads])
    checks.append(close("e_onehot_row", f"output_gradients one-hot at {row_label} returns that row of J from "
                        "tape.jacobian", onehot, J.row(row_label)))  # fmt: skip
    return Explanation(
        trace=trace, jacobian=J, naive_product=trace.naive_product1, mean_path=mean_path, varsqrt_path=varsqrt_path,
        counter_example=ce, row_label=row_label, onehot_row=onehot, checks=tuple(checks), rtol=tol.rtol, atol=tol.atol,
    )


def _claims_a_to_c(t: NatGradTrace, J: BlockJacobian, mean_path: Array, varsqrt_path: Array,
                   close: Callable[..., Check]) -> list[Check]:  # fmt: skip
    """Claims (a)-(c): Jᵀ·v, Jᵀ·1 and its split, the two paths, and the naive product against Jᵀ·v."""
    checks = [
        close("a_vjp_equals_contraction",
              "output_gradients=[dL_dmean, dL_dvarsqrt] returns Jᵀ·v, the explicit Jacobian contracted with v",
              (t.dL_deta1, t.dL_deta2), J.vjp([t.dL_dmean, t.dL_dvarsqrt])),
        close("b_default_seed_is_summed_gradient",
              "output_gradients=None returns Jᵀ·1, the gradient of the sum of all elements of mean and varsqrt",
              (t.dtheta_deta1, t.dtheta_deta2), J.summed_gradient()),
        close("b_default_seed_split",
              "dtheta/deta1 = 1 (the mean path seeded with ones) + Σ over varsqrt elements of ∂varsqrt/∂eta1",
              t.dtheta_deta1, 1.0 + J.block(1, 0).sum(axis=(0, 1, 2))),
        close("c_split", "dL/deta1 = mean path (∂mean/∂eta1)ᵀ·dL/dmean + varsqrt path (∂varsqrt/∂eta1)ᵀ·dL/dvarsqrt",
              t.dL_deta1, mean_path + varsqrt_path),
    ]  # fmt: skip
    # the naive product is Jᵀ·v for every v exactly when eta1's columns of J are the identity's: ∂varsqrt/∂eta1 = 0,
    # which J's being diagonal implies, and eta1 = 0 gives too (varsqrt = chol(eta2 − eta1·eta1ᵀ) is flat there)
    apart = bool(np.any(J.block(1, 0)))
    claim = ("varsqrt depends on eta1 (∂varsqrt/∂eta1 ≠ 0), so J is not diagonal and the naive product (Jᵀ·1)⊙v "
             "differs from Jᵀ·v" if apart else "∂varsqrt/∂eta1 = 0 here (eta1 = 0), so the naive product equals Jᵀ·v")
    naive_vs_vjp = close("c_naive_product_differs", claim, t.naive_product1, t.dL_deta1)
    checks.append(replace(
        naive_vs_vjp,
        status=status_of(naive_vs_vjp.passed != apart),  # differs (not close) exactly when varsqrt depends on eta1
        detail=f"max |(Jᵀ·1)⊙v − Jᵀ·v| = {format_number(naive_vs_vjp.max_abs_error)}; the mean path alone equals "
        f"dL/dmean to {format_number(max_abs_diff(mean_path, t.dL_dmean))}",
        expect_difference=apart,
    ))  # fmt: skip
    return checks
