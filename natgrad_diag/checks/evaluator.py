"""What the checks compute on a model, eagerly (full mode) or compiled (fast mode): the evaluator.

Without changing the model, an evaluator computes the training loss and its gradients (GPflow's tape); natgrad-diag's
step (equation [10], maths in :mod:`natgrad_diag.step`); GPflow's own update (through :mod:`natgrad_diag._gpflow`)
and the loss after it; the loss at any q(u); F·∇ηL and ∇θL matrix-free (F = ∂η/∂θ the Fisher matrix) and
(∂ξ/∂θ)·∇ηL by forward mode; ∇ηL at any θ; the loss after k steps with one γ, hyperparameters held fixed. Each model has one
scratch copy, cached with the compiled pieces; the checks make no other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag import _compile
from natgrad_diag._gpflow import natgrad_apply_gradients, read_once, to_constrained
from natgrad_diag._validate import input_error
from natgrad_diag.checks.bounds import Conditioning, Tolerances, finite
from natgrad_diag.exceptions import SingularCovarianceError, StepFailedError, error_line
from natgrad_diag.report.records import Check, loss_rose
from natgrad_diag.step.backend import step_backend
from natgrad_diag.step.closed_form import natgrad_step_closed_form, natgrad_tensors_closed_form
from natgrad_diag.step.lapack import natgrad_record_lapack
from natgrad_diag.step.trace import natgrad_tensors, natgrad_trace
from natgrad_diag.typing import Array

__all__ = [
    "CompiledEvaluator", "Context", "Evaluator", "GpflowStep", "Healthy", "Point", "Rise", "Run", "Step", "Taken", "dtype_context", "evaluator",
    "finite_loss", "float_dtype", "gpflow_update", "gradients", "loss_and_grads", "nat_gradient_at", "raised", "resolve_mode", "step_from_gradients",
    "stepwise", "traced", "trial_steps", "Trial",
]  # fmt: skip

#: (new_q_mu [M, L], new_q_sqrt [L, M, M]) → (usable, why not): the full health test of a trial's q(u).
Healthy = Callable[[Any, Any], tuple[bool, str]]

#: A q(u) where a check needs the loss: (q_mu [M, L], q_sqrt [L, M, M]).
Point = tuple[Array, Array]

#: The rise of the loss a trial's step may make: (at its first step, at each later one) (checks.health.rounding).
Rise = tuple[float, float]

_DTYPES = {"float64": np.float64, "float32": np.float32}

#: mode="auto" runs the full checks (explicit Jacobians, eagerly) when M·L is at most this.
AUTO_FULL_MAX_ML = 50

def float_dtype(dtype: Any) -> type:
    """``np.float64`` or ``np.float32`` for a dtype given by name, numpy or TensorFlow; InputError otherwise."""
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    if name not in _DTYPES:
        raise input_error("dtype must be float64 or float32.", "dtype", "'float64' | 'float32'", repr(dtype),
                          "pass dtype='float64' (recommended) or dtype='float32'.")
    return _DTYPES[name]


@contextlib.contextmanager
def dtype_context(dtype: Any) -> Iterator[None]:
    """GPflow's config with ``default_float`` set to ``dtype`` inside the block, restored afterwards."""
    import gpflow

    with gpflow.config.as_context(dataclasses.replace(gpflow.config.config(), float=float_dtype(dtype))):
        yield


@dataclass(frozen=True)
class Context:
    """The validated inputs of one run: the model (None in the var_list form), data (X [N, D], Y [N, P]) or None,
    ξ, γ, tolerances, numpy dtype, M (N for a VGP), L, k = ``gamma_steps``, whether to search γ for a suggestion,
    (check, why) of the checks skipped, and the user's optimizer whose step ``custom_step`` checks (None: no check)."""

    model: Any
    data: Any
    xi: Any
    gamma: float
    tol: Tolerances
    np_dtype: Any
    M: int
    L: int
    gamma_steps: int = 1
    search: bool = True
    skip: tuple[tuple[str, str], ...] = ()
    optimizer: Any = None

    def skipped(self, name: str) -> str:
        """Why the check ``name`` is left out for its cost ("" when it runs)."""
        return dict(self.skip).get(name, "")

    def loss(self, model: Any) -> Any:
        """``model``'s training loss on this context's data."""
        return model.training_loss() if self.data is None else model.training_loss(self.data)


@dataclass(frozen=True)
class Step:
    """natgrad-diag's step as arrays (None where not computed): the loss, the unconstrained and constrained gradients,
    ∂L/∂η, the natural gradient in ξ, the new q(u), and why it failed ("")."""

    loss: float
    g_mu: Array
    g_sq: Array
    dL_dmean: Array
    dL_dvarsqrt: Array
    dL_deta1: Array | None = None
    dL_deta2: Array | None = None
    nat_dL_xi1: Array | None = None
    nat_dL_xi2: Array | None = None
    new_q_mu: Array | None = None
    new_q_sqrt: Array | None = None
    error: str = ""

    @property
    def gradients_finite(self) -> bool:
        """Whether the loss and its gradients are finite."""
        return finite(self.loss, self.g_mu, self.g_sq)


@dataclass(frozen=True)
class GpflowStep:
    """What GPflow's update assigns (None when it fails), and the loss after it (None when not finite)."""

    q_mu: Array | None
    q_sqrt: Array | None
    error: str = ""
    loss_after: float | None = None


@dataclass(frozen=True)
class Taken:
    """What :meth:`Evaluator.take` computed: both steps and the loss at each point asked for (None where not finite)."""

    step: Step
    gp: GpflowStep
    losses: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class Run:
    """What every stage of a run of the checks sees: the evaluator, both steps, the conditioning, the progress bar,
    the checks the stages before it made, and the points the stage asked for with the loss at each."""

    ev: Evaluator
    step: Step
    gp: GpflowStep
    cond: Conditioning
    advance: Callable[..., Any]
    earlier: tuple[Check, ...] = ()
    probes: tuple[tuple[Point, float | None], ...] = ()


# --- the maths on tensors (eager, or inside a tf.function) ------------------------------------------------------


def gradients(loss: Callable[[], Any], variables: list[Any], unconnected: str = "zero") -> tuple[Any, list[Any]]:
    """``loss()`` and its gradients w.r.t. ``variables`` (one tape, as ``minimize`` takes them; ``unconnected``: 0 or None)."""
    import tensorflow as tf

    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(variables)
        value = loss()
    return value, tape.gradient(value, variables, unconnected_gradients=tf.UnconnectedGradients(unconnected))


def loss_and_grads(model: Any, data: Any) -> tuple[Any, list[Any]]:
    """(training loss, [g_mu, g_sq]): its gradients w.r.t. q_mu's and q_sqrt's unconstrained variables (one tape)."""
    variables = [model.q_mu.unconstrained_variable, model.q_sqrt.unconstrained_variable]
    return gradients(lambda: model.training_loss() if data is None else model.training_loss(data), variables)


def _constrained(q_mu: Any, q_sqrt: Any, g_mu: Any, g_sq: Any) -> tuple[Any, Any]:
    """GPflow's dL/dmean, dL/dvarsqrt from the unconstrained gradients (``_to_constrained``)."""
    return to_constrained(g_mu, q_mu.transform), to_constrained(g_sq, q_sqrt.transform)


def step_from_gradients(q_mu: Any, q_sqrt: Any, loss: Any, g_mu: Any, g_sq: Any) -> Step:
    """The loss and gradients as a :class:`Step` (not taken yet), with GPflow's constrained gradients."""
    d_mean, d_varsqrt = _constrained(q_mu, q_sqrt, g_mu, g_sq)
    return Step(loss=float(loss), g_mu=np.asarray(g_mu), g_sq=np.asarray(g_sq), dL_dmean=np.asarray(d_mean), dL_dvarsqrt=np.asarray(d_varsqrt))


def traced(step: Step, q_mu: Any, q_sqrt: Any, g_mu: Any, g_sq: Any, ctx: Context, *, compiled: bool | None) -> Step:
    """``step`` with natgrad-diag's step by :func:`natgrad_diag.natgrad_trace`, or with why it failed."""
    import tensorflow as tf

    if not step.gradients_finite:  # the finite_gradients check reports it (natgrad_trace would refuse the input)
        return step
    try:
        t = natgrad_trace(q_mu, q_sqrt, g_mu, g_sq, gamma=ctx.gamma, xi_transform=ctx.xi, compiled=compiled)
    except StepFailedError as e:
        return dataclasses.replace(step, error=e.detail)
    except tf.errors.InvalidArgumentError as e:  # a custom ξ transform failing before the step
        return dataclasses.replace(step, error=error_line(e))
    return dataclasses.replace(step, **{k: getattr(t, k) for k in _KEEP})


def _closed(step: Step, model: Any, ctx: Context) -> Step:
    """``step`` with the closed form's new q(u) where it applies (even where the trace failed): arithmetic independent
    of GPflow's route through η, which ``natgrad_trace`` follows (both would lose precision together)."""
    import tensorflow as tf

    xi = step_backend(ctx.xi, model.q_sqrt.transform).xi
    if xi is None or not finite(step.dL_dmean, step.dL_dvarsqrt):
        return step
    q_mu, q_sqrt = tf.convert_to_tensor(model.q_mu), tf.convert_to_tensor(model.q_sqrt)
    try:
        new_mu, new_sq = natgrad_step_closed_form(q_mu, q_sqrt, tf.constant(step.dL_dmean), tf.constant(step.dL_dvarsqrt), tf.constant(ctx.gamma, q_mu.dtype), xi)
    except tf.errors.InvalidArgumentError as e:
        return dataclasses.replace(step, error=f"with gamma = {ctx.gamma:g} the updated covariance is not positive definite ({error_line(e)}).")
    if not finite(new_mu, new_sq):
        return dataclasses.replace(step, error=f"with gamma = {ctx.gamma:g} the step produced NaN or Inf in the new q_mu or q_sqrt.")
    return dataclasses.replace(step, new_q_mu=new_mu.numpy(), new_q_sqrt=new_sq.numpy(), error="")


def gpflow_update(ctx: Context, g_mu: Any, g_sq: Any, q_mu: Any, q_sqrt: Any, loss: Callable[[], Any]) -> GpflowStep:
    """GPflow's update (``NaturalGradient._natgrad_apply_gradients``, as ``minimize`` applies it) assigned to the
    parameters ``q_mu``, ``q_sqrt``, and ``loss()`` after it."""
    import gpflow
    import tensorflow as tf

    try:
        natgrad_apply_gradients(gpflow.optimizers.NaturalGradient(ctx.gamma, ctx.xi), g_mu, g_sq, q_mu, q_sqrt, ctx.xi)
    except tf.errors.InvalidArgumentError as e:
        return GpflowStep(None, None, error_line(e))
    mu, sq = q_mu.numpy(), q_sqrt.numpy()
    return _gpflow_step(mu, sq, finite_loss(loss) if finite(mu, sq) else None)


def nat_gradient_at(q_mu: Any, q_sqrt: Any, loss: Callable[[], Any], theta1: Any, theta2: Any) -> tuple[Any, ...]:
    """∇ηL [M, L], [L, M, M] (GPflow's dL/deta, XiNat's natural gradient) and η at the natural parameters θ: q(u) =
    natural_to_meanvarsqrt(θ) assigned to the parameters ``q_mu``, ``q_sqrt``, ``loss()``'s gradient mapped as GPflow's
    step maps it (the vector-Jacobian product of expectation_to_meanvarsqrt)."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, natural_to_expectation, natural_to_meanvarsqrt

    for param, value in zip((q_mu, q_sqrt), natural_to_meanvarsqrt(theta1, theta2)):
        _assign(param, value)
    _, (g_mu, g_sq) = gradients(loss, [q_mu.unconstrained_variable, q_sqrt.unconstrained_variable])
    eta = list(natural_to_expectation(theta1, theta2))
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(eta)
        meanvarsqrt = list(expectation_to_meanvarsqrt(*eta))
    return (*tape.gradient(meanvarsqrt, eta, output_gradients=list(_constrained(q_mu, q_sqrt, g_mu, g_sq))), *eta)


def finite_loss(loss: Callable[[], Any]) -> float | None:
    """``float(loss())``, or None when it is not finite or cannot be evaluated."""
    import tensorflow as tf

    try:
        value = float(loss())
    except (tf.errors.InvalidArgumentError, ValueError):
        return None
    return value if np.isfinite(value) else None


def fisher_products(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, dL_deta1: Any, dL_deta2: Any) -> dict[str, Any]:
    """F·∇ηL in closed form and ∇θL by reverse mode through GPflow's natural_to_meanvarsqrt, at the current q(u).

    For η(θ) = (m, S + m mᵀ) with S = (−2θ₂)⁻¹ and m = Sθ₁, the product of F = ∂η/∂θ with u = (u₁, U₂) is

        dS = 2·S U₂ S,   dη₁ = dS θ₁ + S u₁ = 2·S U₂ m + S u₁,   dη₂ = dS + dη₁ mᵀ + m dη₁ᵀ,

    a few matrix products (no Jacobian, no forward-mode pass through a Cholesky factorisation). ``terms``: the same
    products of the entries' absolute values, the size of what they sum (|fl(AB) − AB| ≤ γ_n·|A||B|, Higham 2002, §3.5).
    """
    import tensorflow as tf

    S = tf.linalg.matmul(q_sqrt, q_sqrt, transpose_b=True)  # [L, M, M]
    m = tf.linalg.adjoint(q_mu)[:, :, None]  # [L, M, 1]
    u1 = tf.linalg.adjoint(dL_deta1)[:, :, None]
    SU2 = tf.linalg.matmul(S, dL_deta2)
    dS = 2.0 * tf.linalg.matmul(SU2, S)
    d1 = 2.0 * tf.linalg.matmul(SU2, m) + tf.linalg.matmul(S, u1)
    d2 = dS + tf.linalg.matmul(d1, m, transpose_b=True) + tf.linalg.matmul(m, d1, transpose_b=True)
    aS, am, aU2 = tf.abs(S), tf.abs(m), tf.abs(dL_deta2)
    a1 = 2.0 * aS @ aU2 @ am + aS @ tf.abs(u1)
    terms = tf.maximum(tf.reduce_max(a1), tf.reduce_max(2.0 * aS @ aU2 @ aS + 2.0 * a1 @ tf.linalg.adjoint(am)))
    g1, g2 = theta_gradients(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt)
    return dict(F_u1=tf.linalg.adjoint(d1[:, :, 0]), F_u2=d2, grad_theta1=g1, grad_theta2=g2, terms=terms)


def theta_gradients(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any) -> tuple[Any, Any]:
    """∇θL [M, L], [L, M, M]: the ordinary gradient in the natural parameters θ, by reverse mode through GPflow's
    natural_to_meanvarsqrt (θ₂'s along symmetric matrices). The natural gradient is ∇ηL = F⁻¹·∇θL, not this."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural, natural_to_meanvarsqrt

    nat1, nat2 = meanvarsqrt_to_natural(q_mu, q_sqrt)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch([nat1, nat2])
        mean, varsqrt = natural_to_meanvarsqrt(nat1, nat2)
    g1, g2 = tape.gradient([mean, varsqrt], [nat1, nat2], output_gradients=[dL_dmean, dL_dvarsqrt])
    return g1, 0.5 * (g2 + tf.linalg.matrix_transpose(g2))  # the gradient along symmetric θ₂


_COPY_LOCK = threading.Lock()


def scratch_copy(model: Any) -> Any:
    """``gpflow.utilities.deepcopy(model)``, one thread at a time. It first clears TensorFlow Probability's bijector
    caches, whose storage threads share: a cached output collected by another thread meanwhile makes the clear raise
    KeyError (the key is gone), so the copy is tried again (3 times at most)."""
    import gpflow

    with _COPY_LOCK:
        for _ in range(2):
            with contextlib.suppress(KeyError):
                return gpflow.utilities.deepcopy(model)
        return gpflow.utilities.deepcopy(model)


def _all_finite(x: Any) -> Any:
    import tensorflow as tf

    return tf.reduce_all(tf.math.is_finite(x))


def _looks_healthy(new_q_mu: Any, new_q_sqrt: Any) -> Any:
    """In the graph, the cheap part of the health test: finite, q_sqrt [L, M, M] lower-triangular to
    100·ε·max(max|q_sqrt|, 1) with a positive diagonal; a scalar bool tensor."""
    import tensorflow as tf

    eps = float(np.finfo(new_q_sqrt.dtype.as_numpy_dtype).eps)
    scale = tf.maximum(tf.reduce_max(tf.abs(new_q_sqrt)), 1.0)
    upper = tf.reduce_max(tf.abs(new_q_sqrt - tf.linalg.band_part(new_q_sqrt, -1, 0)))
    diag_ok = tf.reduce_all(tf.linalg.diag_part(new_q_sqrt) > 0)
    return _all_finite(new_q_mu) & _all_finite(new_q_sqrt) & (upper <= 100 * eps * scale) & diag_ok


def _assign(param: Any, value: Any) -> None:
    """``param.assign(value)`` without GPflow's NaN guard: a NaN step is found by the health test, not raised mid-graph."""
    transform = param.transform
    param.unconstrained_variable.assign(value if transform is None else transform.inverse(value))


def trial_steps(q_mu: Any, q_sqrt: Any, xi: Any, grads: Callable[[Any], Any]) -> tuple[Callable[..., dict[str, Any]], ...]:
    """(natgrad-diag's, GPflow's own) ``step(data, g_mu, g_sq, gamma)``: one step of a k-step trial on ``q_mu``,
    ``q_sqrt`` (eager or traced) by the code :func:`~natgrad_diag.step.backend.step_backend` picks, or by a
    ``NaturalGradient`` with a γ variable; returns the new q(u), ``grads(data)`` there (the loss and its gradient, as
    :func:`loss_and_grads` gives them), and the health flags q_ok (:func:`_looks_healthy`), loss_ok and g_ok."""
    import gpflow
    import tensorflow as tf

    name = step_backend(xi, q_sqrt.transform).xi
    gamma_var = tf.Variable(1.0, dtype=q_mu.dtype, trainable=False)
    opt = gpflow.optimizers.NaturalGradient(gamma_var, xi)

    def step(data: Any, g_mu: Any, g_sq: Any, gamma: Any, own: bool) -> dict[str, Any]:
        if own:
            gamma_var.assign(gamma)
            natgrad_apply_gradients(opt, g_mu, g_sq, q_mu, q_sqrt, xi)
            new_mu, new_sq = tf.convert_to_tensor(q_mu), tf.convert_to_tensor(q_sqrt)
        else:
            args = (tf.convert_to_tensor(q_mu), tf.convert_to_tensor(q_sqrt), *_constrained(q_mu, q_sqrt, g_mu, g_sq), gamma)
            if name is not None:
                new_mu, new_sq = natgrad_step_closed_form(*args, name)
            else:
                out = natgrad_tensors(*args, xi)
                new_mu, new_sq = out["new_q_mu"], out["new_q_sqrt"]
            _assign(q_mu, new_mu)
            _assign(q_sqrt, new_sq)
        value, (g_mu_new, g_sq_new) = grads(data)
        return dict(
            new_q_mu=new_mu, new_q_sqrt=new_sq, loss=value, g_mu=g_mu_new, g_sq=g_sq_new,
            q_ok=_looks_healthy(new_mu, new_sq), loss_ok=_all_finite(value), g_ok=_all_finite(g_mu_new) & _all_finite(g_sq_new),
        )  # fmt: skip

    return functools.partial(step, own=False), functools.partial(step, own=True)


#: A trial's outcome: the loss after each step taken, why it failed ("" when all k steps held) and the failing step.
Trial = tuple[tuple[float, ...], str, "int | None"]


def _verdict(out: dict[str, Any], j: int, k: int, healthy: Healthy, losses: list[float], before: float, rise: Rise) -> Trial:
    """The trial's outcome from the last step taken (step j of k; the trial stopped there), ``before`` being the
    loss before that step: its q(u) fails the full test, its loss is not finite or rose by more than ``rise`` allows
    that step, or (j < k) the gradient for the next step is not finite."""
    at = f"step {j} of {k}: " if k > 1 else ""
    if not out["q_ok"] or j == k or out["ok"]:  # the full test where the graph's failed, and on the last q(u)
        ok, why = healthy(out["new_q_mu"], out["new_q_sqrt"])
        if not ok or not out["q_ok"]:
            return tuple(losses), at + (why or "the new q_sqrt is not lower-triangular with a positive diagonal"), j
    if not out["loss_ok"]:
        return tuple(losses), at + "the loss after it is not finite", j
    loss = float(out["loss"])
    losses = [*losses, loss]
    if loss > before + rise[j > 1]:
        return tuple(losses), at + loss_rose(before, loss), j
    if j < k and not out["g_ok"]:
        return tuple(losses), f"step {j + 1} of {k}: the gradient of the loss before it is not finite", j + 1
    return tuple(losses), "", None


def raised(line: str) -> str:
    """A step's TensorFlow error in a few words."""
    if "Cholesky" in line:
        return "Cholesky failed (a covariance of the step is not positive definite)"
    if "NaN" in line or "Inf" in line:
        return "the step produced NaN or Inf (GPflow refused to assign it)"
    return line


def stepwise(step: Callable[..., dict[str, Any]], args: tuple[Any, ...], k: int, healthy: Healthy, before: float, rise: Rise) -> Trial:
    """Up to k calls of ``step`` (:func:`trial_steps`, eager or compiled) from ``args`` = (data, g_mu, g_sq, gamma) and the
    loss ``before`` them, stopping at the first step that raises, is unhealthy or raises the loss by more than
    ``rise`` (see :func:`_verdict`)."""
    import tensorflow as tf

    data, g_mu, g_sq, gamma = args
    losses: list[float] = []
    for j in range(1, k + 1):
        try:
            out: dict[str, Any] = {key: np.asarray(v) for key, v in step(data, g_mu, g_sq, gamma).items()}
        except tf.errors.InvalidArgumentError as e:
            return tuple(losses), (f"step {j} of {k}: " if k > 1 else "") + raised(error_line(e)), j
        fine = bool(out["q_ok"] and out["loss_ok"] and float(out["loss"]) <= before + rise[j > 1] and (out["g_ok"] or j == k))
        if not fine or j == k:
            return _verdict(dict(out, ok=fine), j, k, healthy, losses, before, rise)
        losses.append(float(out["loss"]))
        before, g_mu, g_sq = float(out["loss"]), out["g_mu"], out["g_sq"]
    raise AssertionError("unreachable")  # pragma: no cover


# --- the evaluators ----------------------------------------------------------------------------------------------


class Evaluator:
    """The checks' computations, eager (full mode) but for its scratch copy's losses; ``ctx.model`` is only read.

    The oracles ask its capabilities, not the mode: ``explicit_jacobians`` (explicit F and ∂ξ/∂θ), ``loss_directions``
    (of the loss-gradient check), ``compares`` (how the reproduction's two steps were computed).
    """

    explicit_jacobians = True
    loss_directions = 3
    compares = "natgrad-diag's closed form against GPflow's update, both eager"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._fisher: Callable[..., dict[str, Any]] = fisher_products
        self.noise: float | None = None  # the loss's σ̂ (the larger of noise_at), once checks.health.noise measured it
        self.noise_at = (0.0, 0.0)  # σ̂ at the current q(u) and where the step lands
        self.stability: Any = None  # checks.health.Stability, once the step_health stage estimated it
        self.reached: dict[float, Point] = {}  # γ → the q(u) its healthy trial's k steps reached
        self.looked: dict[float, str] = {}  # γ → why its longer look-ahead failed ("": it held) (checks.health)

    @functools.cached_property
    def _trial_steps(self) -> tuple[Callable[..., dict[str, Any]], ...]:
        """The k-step trials' steps on the scratch copy, natgrad-diag's and GPflow's own (eager), made when needed."""
        return trial_steps(self.scratch.q_mu, self.scratch.q_sqrt, self.ctx.xi, lambda data: self._scratch_grads())

    @functools.cached_property
    def pieces(self) -> _Pieces:
        """The model's compiled pieces and its scratch copy for this ξ and data signature, cached weakly per model in
        :mod:`natgrad_diag._compile` (checking a model again traces nothing), the copy's variables set to the model's."""
        model, xi = self.ctx.model, self.ctx.xi
        # the graphs capture the model's variables: a replaced Parameter needs new pieces
        key = (
            "checks", type(xi).__name__, id(xi) if type(xi).__module__ != "gpflow.optimizers.natgrad" else 0,
            self.ctx.data is not None, tuple(id(v) for v in model.variables),
        )  # fmt: skip
        pieces: _Pieces = _compile.for_model(model, key, lambda: _Pieces(model, xi, self.ctx.data is not None))
        for src, dst in zip(model.variables, pieces.scratch.variables):
            dst.assign(src)
        return pieces

    @property
    def scratch(self) -> Any:
        """The model's scratch copy (:attr:`pieces`); None in the var_list form, which has no model."""
        return None if self.ctx.model is None else self.pieces.scratch

    def _scratch_grads(self) -> Any:
        """:func:`loss_and_grads` on the scratch copy, compiled: 60 ms eagerly at M = 8, 2 ms after a 0.45 s trace."""
        return self.pieces.scratch_grads(self.data)

    @property
    def data(self) -> Any:
        """The data as the compiled pieces take it: ``ctx.data``, or ``()`` for a model that holds its data."""
        return self.ctx.data if self.ctx.data is not None else ()

    def sync(self) -> Any:
        """The scratch copy, with every variable set to the model's."""
        for src, dst in zip(self.ctx.model.variables, self.scratch.variables):
            dst.assign(src)
        return self.scratch

    @functools.cached_property
    def q_arrays(self) -> tuple[Array, Array]:
        """The model's q_mu [M, L] and q_sqrt [L, M, M] as arrays, read once (the checks never change them)."""
        return self.ctx.model.q_mu.numpy(), self.ctx.model.q_sqrt.numpy()

    def q_tensors(self) -> tuple[Any, Any]:
        """The model's q_mu [M, L] and q_sqrt [L, M, M] as tensors."""
        import tensorflow as tf

        return tf.convert_to_tensor(self.ctx.model.q_mu), tf.convert_to_tensor(self.ctx.model.q_sqrt)

    def take(self, points: Sequence[Point] = (), on_step: Callable[[Step], Any] | None = None) -> Taken:
        """Both steps (:meth:`_steps`), ``on_step(step)`` (natgrad-diag's), then the loss at each of ``points``."""
        step, gp = self._steps()
        if on_step:
            on_step(step)
        return Taken(step, gp, tuple(self.loss_at(*p) for p in points))

    def _steps(self) -> tuple[Step, GpflowStep]:
        """natgrad-diag's eager step on the model's q(u); GPflow's, same gradients, on the scratch copy."""
        ctx, m = self.ctx, self.ctx.model
        loss, (g_mu, g_sq) = loss_and_grads(m, ctx.data)
        step = _closed(traced(step_from_gradients(m.q_mu, m.q_sqrt, loss, g_mu, g_sq), m.q_mu, m.q_sqrt, g_mu, g_sq, ctx, compiled=False), m, ctx)
        scratch = self.sync()
        return step, gpflow_update(ctx, g_mu, g_sq, scratch.q_mu, scratch.q_sqrt, lambda: self._scratch_grads()[0])

    def loss_at(self, q_mu: Array, q_sqrt: Array, *, eager: bool = False) -> float | None:
        """The training loss at q(u) = (q_mu [M, L], q_sqrt [L, M, M]), other variables as the scratch copy holds
        them; None if it is not finite or cannot be evaluated. ``eager``: each call of a stochastic loss draws new
        samples (a compiled function with a global seed set may repeat its draws)."""
        return finite_loss(lambda: self.ctx.loss(self._at(q_mu, q_sqrt)) if eager else self._loss_at(q_mu, q_sqrt))

    def _at(self, q_mu: Array, q_sqrt: Array) -> Any:
        """The scratch copy, with q(u) = (q_mu, q_sqrt) assigned."""
        self.scratch.q_mu.assign(q_mu)
        self.scratch.q_sqrt.assign(q_sqrt)
        return self.scratch

    def _loss_at(self, q_mu: Array, q_sqrt: Array) -> Any:
        self._at(q_mu, q_sqrt)
        return self._scratch_grads()[0]

    def fill_direction(self, step: Step) -> Step:
        """``step`` with ∂L/∂η computed when the step itself failed (the direction does not depend on γ): the
        vector-Jacobian product of GPflow's expectation_to_meanvarsqrt with (dL/dmean, dL/dvarsqrt)."""
        import tensorflow as tf
        from gpflow.optimizers import XiNat
        from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation

        if step.dL_deta1 is not None:
            return step
        try:
            eta1, eta2 = meanvarsqrt_to_expectation(*self.q_tensors())
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch([eta1, eta2])
                mean, varsqrt = expectation_to_meanvarsqrt(eta1, eta2)
            seeds = [tf.constant(step.dL_dmean), tf.constant(step.dL_dvarsqrt)]
            d1, d2 = (t.numpy() for t in tape.gradient([mean, varsqrt], [eta1, eta2], output_gradients=seeds))
        except tf.errors.InvalidArgumentError:
            return step
        nat = (d1, d2) if isinstance(self.ctx.xi, XiNat) else (step.nat_dL_xi1, step.nat_dL_xi2)
        return dataclasses.replace(step, dL_deta1=d1, dL_deta2=d2, nat_dL_xi1=nat[0], nat_dL_xi2=nat[1])

    def fisher_products(self, step: Step) -> dict[str, Array]:
        """F·∇ηL as F_u1 [M, L], F_u2 [L, M, M], ∇θL as grad_theta1, grad_theta2 and ``terms`` (:func:`fisher_products`)."""
        import tensorflow as tf

        args = [tf.constant(a) for a in (step.dL_dmean, step.dL_dvarsqrt, step.dL_deta1, step.dL_deta2)]
        return {k: v.numpy() for k, v in self._fisher(*self.q_tensors(), *args).items()}

    def xi_product(self, step: Step) -> tuple[Array, Array]:
        """(∂ξ/∂θ)·∇ηL [M, L], [L, M, M] by forward mode (tf.autodiff.ForwardAccumulator) through xi.naturals_to_xi."""
        import tensorflow as tf
        from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

        nat1, nat2 = meanvarsqrt_to_natural(*self.q_tensors())
        with tf.autodiff.ForwardAccumulator(primals=[nat1, nat2], tangents=[tf.constant(step.dL_deta1), tf.constant(step.dL_deta2)]) as acc:
            x1, x2 = self.ctx.xi.naturals_to_xi(nat1, nat2)
        j1, j2 = acc.jvp([x1, x2], unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return j1.numpy(), j2.numpy()

    def nat_gradient_at(self, theta1: Array, theta2: Array) -> tuple[Array, ...]:
        """(∇η₁L, ∇η₂L, η₁, η₂) at the natural parameters θ on the scratch copy (:func:`nat_gradient_at`), its other
        variables as they are (:meth:`sync` first). Compiled in both modes: the power iteration's 10-30 gradients (not
        checked values) cost 60 ms each eagerly."""
        return tuple(np.asarray(t) for t in self.pieces.nat_grad(self.data, theta1, theta2))

    def walk(self, steps: int, gamma: float, xi: Any) -> Iterator[Any]:
        """The scratch copy at the model's q(u), then after each of ``steps`` steps with ``gamma`` and ``xi`` (eager
        ``natgrad_trace``); raises StepFailedError or InvalidArgumentError when a step fails."""
        scratch = self.sync()
        yield scratch
        for _ in range(steps):
            _, (g_mu, g_sq) = self._scratch_grads()
            t = natgrad_trace(scratch.q_mu, scratch.q_sqrt, g_mu, g_sq, gamma=gamma, xi_transform=xi, compiled=False)
            yield self._at(t.new_q_mu, t.new_q_sqrt)

    def trial(self, g_mu: Array, g_sq: Array, gamma: float, k: int, healthy: Healthy, before: float, rise: Rise, *, own: bool = False) -> Trial:
        """Up to k steps with ``gamma`` from the model's q(u), whose gradient is ``g_mu``, ``g_sq`` and loss ``before``
        (:func:`stepwise`): by GPflow's own update when ``own`` (the γ being checked), else by natgrad-diag's."""
        import tensorflow as tf

        if not finite(g_mu, g_sq):
            return (), f"step 1 of {k}: the gradient of the loss before it is not finite", 1
        self.sync()
        dtype = self.ctx.model.q_mu.dtype
        args = (self.data, tf.constant(g_mu, dtype), tf.constant(g_sq, dtype), tf.constant(gamma, dtype))
        return self.keep_reached(gamma, self._trial(args, k, healthy, before, rise, own), self.scratch.q_mu, self.scratch.q_sqrt)

    def keep_reached(self, gamma: float, trial: Trial, q_mu: Any, q_sqrt: Any) -> Trial:
        """``trial``; when all its steps held, the q(u) they reached (the parameters ``q_mu``, ``q_sqrt``) kept in
        :attr:`reached`."""
        if not trial[1]:
            self.reached[gamma] = (q_mu.numpy(), q_sqrt.numpy())
        return trial

    def _trial(self, args: tuple[Any, ...], k: int, healthy: Healthy, before: float, rise: Rise, own: bool) -> Trial:
        return stepwise(self._trial_steps[own], args, k, healthy, before, rise)


#: What a Step takes from natgrad-diag's step, all the compiled step returns (the graph prunes the rest: Jᵀ·1).
_KEEP = ("dL_deta1", "dL_deta2", "nat_dL_xi1", "nat_dL_xi2", "new_q_mu", "new_q_sqrt")


def _gpflow_step(q_mu: Array, q_sqrt: Array, loss_after: float | None) -> GpflowStep:
    """GPflow's new q(u) as a :class:`GpflowStep` (a NaN in it is its failure) and the loss after it, if finite."""
    after = loss_after if loss_after is not None and np.isfinite(loss_after) else None
    if finite(q_mu, q_sqrt):
        return GpflowStep(q_mu, q_sqrt, "", after)
    return GpflowStep(None, None, "NaN or Inf in the new q_mu or q_sqrt", after)


class _Pieces:
    """The tf.function pieces of one model, ξ and data signature on one scratch copy, cached weakly per model.

    Called in turn, not fused: one graph runs our step and GPflow's update concurrently, 25% slower on 2 cores.
    """

    def __init__(self, model: Any, xi: Any, has_data: bool) -> None:
        import gpflow
        import tensorflow as tf

        backend = step_backend(xi, model.q_sqrt.transform, model.q_sqrt)
        #: "nat"/"sqrtmeanvar" when natgrad-diag's step is the LAPACK record, else None
        self.lapack_xi, closed = (backend.xi if backend.code == "lapack" else None), backend.xi
        model_ref, dtype = weakref.ref(model), model.q_mu.dtype  # the closures below must not hold the model
        self.scratch = scratch = scratch_copy(model)
        gamma_var = tf.Variable(1.0, dtype=dtype, trainable=False)
        opt = gpflow.optimizers.NaturalGradient(gamma=gamma_var, xi_transform=xi)
        src_vars, dst_vars = list(model.variables), list(scratch.variables)

        def loss(data: Any) -> Any:
            return scratch.training_loss(data) if has_data else scratch.training_loss()

        def scratch_grads(data: Any) -> tuple[Any, list[Any]]:
            _compile.note_trace("scratch_grads")  # each trace (and each eager one-step trial of fast mode)
            return loss_and_grads(scratch, data if has_data else None)

        def grads(data: Any) -> dict[str, Any]:
            m = model_ref()
            assert m is not None  # the pieces are reached through the live model
            value, (g_mu, g_sq) = loss_and_grads(m, data if has_data else None)
            d_mean, d_varsqrt = _constrained(m.q_mu, m.q_sqrt, g_mu, g_sq)
            q_mu, q_sqrt = tf.convert_to_tensor(m.q_mu), tf.convert_to_tensor(m.q_sqrt)
            return dict(loss=value, g_mu=g_mu, g_sq=g_sq, q_mu=q_mu, q_sqrt=q_sqrt, dL_dmean=d_mean, dL_dvarsqrt=d_varsqrt)

        def ours(q_mu: Any, q_sqrt: Any, d_mean: Any, d_varsqrt: Any, gamma: Any) -> dict[str, Any]:
            args = (q_mu, q_sqrt, d_mean, d_varsqrt, gamma, xi)
            out = natgrad_tensors(*args) if closed is None else natgrad_tensors_closed_form(*args, closed)
            return {k: out[k] for k in _KEEP}

        def gpflow_update(data: Any, g_mu: Any, g_sq: Any, gamma: Any, points: Any) -> dict[str, Any]:
            for src, dst in zip(src_vars, dst_vars):
                dst.assign(src)
            gamma_var.assign(gamma)
            natgrad_apply_gradients(opt, g_mu, g_sq, scratch.q_mu, scratch.q_sqrt, xi)
            out = dict(q_mu=tf.convert_to_tensor(scratch.q_mu), q_sqrt=tf.convert_to_tensor(scratch.q_sqrt))
            with read_once(scratch, skip=(scratch.q_mu, scratch.q_sqrt)):  # one Kuu for every loss
                return dict(out, loss_after=loss(data), losses=[loss_at(data, *p) for p in points])

        def loss_at(data: Any, q_mu: Any, q_sqrt: Any) -> Any:
            scratch.q_mu.assign(q_mu)
            scratch.q_sqrt.assign(q_sqrt)
            return loss(data)

        self.steps = steps = trial_steps(scratch.q_mu, scratch.q_sqrt, xi, scratch_grads)

        def k_steps(data: Any, g_mu: Any, g_sq: Any, gamma: Any, k: Any, before: Any, rise: Any, own: bool) -> dict[str, Any]:
            _compile.note_trace("gamma_steps")  # runs once per trace, not per call

            def body(j: Any, ok: Any, losses: Any, out: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
                new = steps[own](data, out["g_mu"], out["g_sq"], gamma)
                fine = new["q_ok"] & new["loss_ok"] & (new["loss"] <= out["loss"] + rise[tf.minimum(j, 1)]) & (new["g_ok"] | tf.equal(j + 1, k))
                losses = losses.write(j, tf.cast(new["loss"], dtype))
                return j + 1, fine, losses, {key: tf.cast(new[key], out[key].dtype) for key in out}

            init = dict(
                new_q_mu=tf.convert_to_tensor(scratch.q_mu), new_q_sqrt=tf.convert_to_tensor(scratch.q_sqrt),
                loss=tf.cast(before, dtype), g_mu=g_mu, g_sq=g_sq, **dict.fromkeys(("q_ok", "loss_ok", "g_ok"), tf.constant(True)),
            )  # fmt: skip
            start = (tf.constant(0), tf.constant(True), tf.TensorArray(dtype, size=0, dynamic_size=True), init)
            j, ok, losses, out = tf.while_loop(lambda j, ok, losses, out: (j < k) & ok, body, start)
            return dict(out, steps=j, ok=ok, losses=losses.stack())

        def single(data: Any, g_mu: Any, g_sq: Any, gamma: Any, own: bool) -> dict[str, Any]:
            _compile.note_trace("gamma_steps_replay")
            return steps[own](data, g_mu, g_sq, gamma)

        def nat_grad(data: Any, theta1: Any, theta2: Any) -> tuple[Any, ...]:
            return nat_gradient_at(scratch.q_mu, scratch.q_sqrt, lambda: loss(data), theta1, theta2)

        pieces = (grads, ours, gpflow_update, loss_at, fisher_products, k_steps, single, nat_grad, scratch_grads)
        (self.grads, self.ours, self.gpflow, self.loss_at, self.fisher, self.k_steps, self.single,
         self.nat_grad, self.scratch_grads) = (_compile.function(f) for f in pieces)


class CompiledEvaluator(Evaluator):
    """The same computations by ``tf.function`` pieces cached per model in :mod:`natgrad_diag._compile` (fast mode),
    natgrad-diag's step by the code :func:`~natgrad_diag.step.backend.step_backend` picks.

    The k-step trials run in one ``tf.while_loop`` traced once per model (γ and k are tensors; a Python loop pays a
    call and a host read per step: 40–42 ms per γ against 35–40 ms at M = 200, N = 400, k = 5); when an op raises
    inside it, the steps are replayed one compiled call at a time.
    """

    explicit_jacobians = False
    loss_directions = 1
    compares = "both compiled"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._fisher = self.pieces.fisher

    def take(self, points: Sequence[Point] = (), on_step: Callable[[Step], Any] | None = None) -> Taken:
        """:meth:`Evaluator.take` by the pieces: the gradients, then GPflow's update with the loss after it and at
        ``points`` (one graph, one Kuu) in a second thread while this one takes the LAPACK record and calls ``on_step``
        (numpy releases the GIL, TensorFlow runs in its own threads). Without the LAPACK record, the compiled step
        waits for GPflow's: two graphs at once are slower on 2 cores. A piece that raises gives the step's error."""
        import tensorflow as tf

        p, ctx = self.pieces, self.ctx
        dtype = ctx.model.q_mu.dtype
        gamma = tf.constant(ctx.gamma, dtype=dtype)
        g = {k: v.numpy() for k, v in p.grads(self.data).items()}
        step = Step(loss=float(g["loss"]), **{k: g[k] for k in ("g_mu", "g_sq", "dL_dmean", "dL_dvarsqrt")})
        with ThreadPoolExecutor(1) as pool:
            args = (self.data, g["g_mu"], g["g_sq"], gamma, [(tf.constant(a, dtype), tf.constant(b, dtype)) for a, b in points])
            theirs = pool.submit(lambda: {k: np.asarray(v) for k, v in p.gpflow(*args).items()})
            ours: dict[str, Any] | None = None  # the LAPACK record's step, unless it refuses (γ too long, singular q_sqrt)
            if p.lapack_xi is not None:
                with contextlib.suppress(StepFailedError, SingularCovarianceError):
                    rec = natgrad_record_lapack(g["q_mu"], g["q_sqrt"], g["dL_dmean"], g["dL_dvarsqrt"], ctx.gamma, p.lapack_xi, full=False)
                    ours = {k: rec[k] for k in _KEEP}
            try:
                if ours is None:  # the compiled step, after GPflow's
                    wait([theirs])
                    ours = {k: v.numpy() for k, v in p.ours(g["q_mu"], g["q_sqrt"], g["dL_dmean"], g["dL_dvarsqrt"], gamma).items()}
                step = dataclasses.replace(step, **ours)
            except tf.errors.InvalidArgumentError as e:
                step = dataclasses.replace(step, error=f"with gamma = {ctx.gamma:g} the updated covariance is not positive definite ({error_line(e)}).")
            if step.gradients_finite and not step.error and not finite(step.new_q_mu, step.new_q_sqrt):
                step = dataclasses.replace(step, error=f"with gamma = {ctx.gamma:g} the step produced NaN or Inf in the new q_mu or q_sqrt.")
            if on_step:
                on_step(step)
            try:
                gp = theirs.result()
            except tf.errors.InvalidArgumentError as e:
                self.sync()
                return Taken(step, GpflowStep(None, None, error_line(e)), tuple(self.loss_at(*q) for q in points))
        losses = tuple(float(x) if np.isfinite(x) else None for x in gp["losses"])
        return Taken(step, _gpflow_step(gp["q_mu"], gp["q_sqrt"], float(gp["loss_after"])), losses)

    def _loss_at(self, q_mu: Array, q_sqrt: Array) -> Any:
        return self.pieces.loss_at(self.data, q_mu, q_sqrt)

    def _trial(self, args: tuple[Any, ...], k: int, healthy: Healthy, before: float, rise: Rise, own: bool) -> Trial:
        import tensorflow as tf

        p = self.pieces
        if k == 1:  # one eager step traces nothing
            return stepwise(p.steps[own], args, k, healthy, before, rise)
        dtype = self.ctx.model.q_mu.dtype
        try:
            out = p.k_steps(*args, tf.constant(k), tf.constant(before, dtype), tf.constant(rise, dtype), own)
        except tf.errors.InvalidArgumentError:
            self.sync()
            return stepwise(lambda *a: p.single(*a, own), args, k, healthy, before, rise)
        out = {key: v.numpy() for key, v in out.items()}
        j, losses = int(out["steps"]), [float(x) for x in out["losses"]]
        return _verdict(out, j, k, healthy, losses[:-1], losses[-2] if j > 1 else before, rise)


def resolve_mode(mode: Any, sizes: list[tuple[int, int]]) -> str:
    """"full" or "fast" for ``mode``: "auto" is full when M·L ≤ :data:`AUTO_FULL_MAX_ML` for every (M, L)."""
    if mode not in ("auto", "full", "fast"):
        raise input_error("mode must be 'auto', 'full' or 'fast'.", "mode", "'auto' | 'full' | 'fast'", repr(mode),
                          "pass mode='auto' (full checks for small M·L, fast otherwise).")
    if mode == "auto":
        return "full" if all(M * L <= AUTO_FULL_MAX_ML for M, L in sizes) else "fast"
    return str(mode)


def evaluator(ctx: Context, *, compiled: bool) -> Evaluator:
    """The evaluator for ``ctx``: :class:`CompiledEvaluator` (fast mode) or :class:`Evaluator` (full mode)."""
    return CompiledEvaluator(ctx) if compiled else Evaluator(ctx)
