"""Natural-gradient checks on a real GPflow SVGP or VGP model, without touching it.

For q(u) = N(m, S), m = q_mu [M, L], S = L_S L_Sᵀ with L_S = q_sqrt [L, M, M], the natural parameters
are θ = (S⁻¹m, −½S⁻¹) and the expectation parameters η = (m, S + m mᵀ). GPflow's step (equation [10] of
Salimbeni, Eleftheriadis and Hensman, "Natural Gradients in Practice", AISTATS 2018) is

    ξ_new = ξ − γ · (∂ξ/∂θ) · ∂L/∂η,

and it is a natural-gradient step because of the Fisher identity for exponential families: the Fisher
information in θ is F = ∂η/∂θ = ∂²A/∂θ² (A the log-partition), so

    F⁻¹ · ∇θL = F⁻¹ · Fᵀ · ∇ηL = ∇ηL                        (F symmetric).

:func:`check_natgrad` checks, on the user's model:

a. ``reproduction``: natgrad-diag's step equals the one ``gpflow.optimizers.NaturalGradient`` applies to a copy;
b. ``fisher_identity``: F⁻¹·∇θL = ∇ηL with explicit Jacobians (full mode) or F·∇ηL = ∇θL matrix-free (fast
   mode); ``xi_forward_mode`` (ξ ≠ θ): GPflow's double-backward product equals a direct JVP of ξ(θ);
c. ``conjugate_optimality`` and ``conjugate_fixed_point`` (Gaussian likelihood): one step with γ = 1 reaches
   SGPR's bound (SVGP) or GPR's marginal likelihood with noise σ² + jitter (VGP), and a second step stays there;
d. ``step_health``: the new q_sqrt is finite, lower-triangular with a positive diagonal, S is positive definite;
   the largest γ of a grid that keeps this and lowers the loss is suggested;
e. ``gradient_mapping``: ``_to_constrained(grad, transform)`` is the right map from unconstrained to
   constrained gradients only for linear isometric transforms (identity, FillTriangular).

References:
    Salimbeni, Eleftheriadis, Hensman (2018), Natural Gradients in Practice: Non-Conjugate Variational
    Inference in Gaussian Process Models, AISTATS. Titsias (2009), Variational Learning of Inducing Variables in
    Sparse Gaussian Processes, AISTATS (the bound SGPR computes).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from natgrad_diag.exceptions import InputError, NatGradCheckError, UnsupportedModelError, error_line
from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section, Table, close_check, format_number, max_abs_diff, to_jsonable

__all__ = [
    "GAMMA_GRID",
    "NatGradReport",
    "assert_natgrad",
    "assert_natgrad_step_matches_gpflow",
    "check_natgrad",
    "check_natgrad_cli",
    "natgrad_tolerances",
]

#: Step lengths tried, largest first, for the suggested gamma.
GAMMA_GRID = (1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001)

#: mode="auto" runs the full checks (explicit Jacobians) when M·L is at most this.
AUTO_FULL_MAX_ML = 50

#: fast mode checks the Fisher identity (matrix-free, about one more step's cost) up to this M unless told.
FAST_FISHER_MAX_M = 256

_MODES = ("auto", "full", "fast")


# --------------------------------------------------------------------------------------------------
# Tolerances
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerances:
    """Tolerances of the checks for one dtype (all relative ones scale the largest reference value).

    Attributes:
        rtol, atol: reproduction and gradient mapping: |a − b| ≤ atol + rtol·max|b|.
        fisher_rtol: Fisher identity: |a − b| ≤ max|b| · (fisher_rtol + 100·ε·cond(F)).
        conjugate_rtol: conjugate optimality and fixed point: |ELBO − bound| ≤ conjugate_rtol · |bound|.
    """

    rtol: float
    atol: float
    fisher_rtol: float
    conjugate_rtol: float


def natgrad_tolerances(dtype: Any) -> Tolerances:
    """Default :class:`Tolerances` for ``dtype``: tight in float64, scaled to the precision in float32."""
    if np.dtype(dtype) == np.float64:
        return Tolerances(rtol=1e-10, atol=1e-10, fisher_rtol=1e-8, conjugate_rtol=1e-10)
    return Tolerances(rtol=1e-4, atol=1e-4, fisher_rtol=1e-3, conjugate_rtol=1e-4)


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GammaTrial:
    """One step length tried for the suggestion: was the step healthy, and the loss after it."""

    gamma: float
    healthy: bool
    loss: float | None
    reason: str = ""


@dataclass(frozen=True)
class NatGradReport(Report):
    """The natural-gradient checks on one model, one step length and one ξ transform.

    Attributes:
        model_name: the model's class name ("SVGP", "VGP", ...).
        likelihood: the likelihood's class name.
        num_inducing: M (N for a VGP).
        num_latent: L.
        num_data: N of the data used (None if unknown).
        dtype: "float64" or "float32".
        whiten: SVGP's whitening (True for a VGP, whose q(u) is always whitened).
        xi_transform: the ξ transform's class name.
        gamma: the step length checked.
        mode: "full" (explicit Jacobians, grid search) or "fast" (matrix-free, compiled).
        loss_before: the training loss at the current parameters.
        loss_after: the training loss after the step (None if the step failed).
        suggested_gamma: the largest γ of the grid tried that keeps the step healthy and lowers the loss
            (None if none did or none was searched).
        step_error: why the step failed ("" when it did not).
        gamma_trials: the step lengths tried for the suggestion.
        skipped: (check name, reason) for checks that do not apply or were skipped in fast mode.
        warnings: texts of the warnings issued (also sent through ``warnings.warn``).
        numbers: (name, value) pairs of further numbers (jitter share, cond(F), ...).
        checks: the named checks.
        new_q_mu, new_q_sqrt: [M, L] and [L, M, M], the step natgrad-diag computed (None if it failed); not in
            ``to_dict()``.
        dL_deta1, dL_deta2: [M, L] and [L, M, M], ∂L/∂η of the step (None if unavailable); not in ``to_dict()``.
    """

    model_name: str
    likelihood: str
    num_inducing: int
    num_latent: int
    num_data: int | None
    dtype: str
    whiten: bool
    xi_transform: str
    gamma: float
    mode: str
    loss_before: float | None
    loss_after: float | None
    suggested_gamma: float | None
    step_error: str
    gamma_trials: tuple[GammaTrial, ...]
    skipped: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...]
    numbers: tuple[tuple[str, float], ...]
    checks: tuple[Check, ...]
    new_q_mu: np.ndarray | None = field(default=None, repr=False, compare=False)
    new_q_sqrt: np.ndarray | None = field(default=None, repr=False, compare=False)
    dL_deta1: np.ndarray | None = field(default=None, repr=False, compare=False)
    dL_deta2: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def title(self) -> str:  # type: ignore[override]
        return (
            f"Natural-gradient checks: {self.model_name} ({self.likelihood}), M = {self.num_inducing}, "
            f"L = {self.num_latent}, {self.dtype}, {self.xi_transform}, gamma = {self.gamma:g}, {self.mode} mode"
        )

    def check(self, name: str) -> Check:
        """The check called ``name``; raises KeyError listing the names if there is none."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check named {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def number(self, name: str) -> float:
        """One of ``numbers`` by name."""
        return dict(self.numbers)[name]

    def sections(self) -> tuple[Section, ...]:
        info = Table(
            columns=("", "value"),
            rows=(
                ("model", f"{self.model_name}, {self.likelihood} likelihood, whiten={self.whiten}"),
                ("M, L, N", f"{self.num_inducing}, {self.num_latent}, {self.num_data if self.num_data is not None else '-'}"),
                ("dtype", self.dtype),
                ("xi_transform, gamma", f"{self.xi_transform}, {self.gamma:g}"),
                ("mode", self.mode),
                ("loss before step", format_number(self.loss_before, 10)),
                ("loss after step", format_number(self.loss_after, 10) if self.step_error == "" else "step failed"),
                ("suggested gamma", "-" if self.suggested_gamma is None else f"{self.suggested_gamma:g}"),
            ),
        )  # fmt: skip
        out = [Section("Model and step", "", (info,))]
        if self.step_error:
            out.append(Section("The step failed", self.step_error))
        if self.gamma_trials:
            trials = Table(
                columns=("gamma", "healthy", "loss after", "note"),
                rows=tuple(
                    (f"{t.gamma:g}", "yes" if t.healthy else "no", format_number(t.loss, 10), t.reason)
                    for t in self.gamma_trials
                ),
                title="Step lengths tried (largest first)",
            )
            out.append(Section("Suggested step length", "", (trials,)))
        if self.numbers:
            nums = Table(columns=("number", "value"), rows=tuple((k, format_number(v, 6)) for k, v in self.numbers))
            out.append(Section("Further numbers", "", (nums,)))
        if self.skipped:
            out.append(Section("Not checked", "\n".join(f"- {name}: {why}" for name, why in self.skipped)))
        if self.warnings:
            out.append(Section("Warnings", "\n".join(f"- {w}" for w in self.warnings)))
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.update(
            model=self.model_name,
            likelihood=self.likelihood,
            M=self.num_inducing,
            L=self.num_latent,
            N=self.num_data,
            dtype=self.dtype,
            whiten=self.whiten,
            xi_transform=self.xi_transform,
            gamma=self.gamma,
            mode=self.mode,
            loss_before=self.loss_before,
            loss_after=self.loss_after,
            suggested_gamma=self.suggested_gamma,
            step_error=self.step_error,
            gamma_trials=[dict(gamma=t.gamma, healthy=t.healthy, loss=t.loss, reason=t.reason) for t in self.gamma_trials],
            skipped=[dict(check=n, reason=r) for n, r in self.skipped],
            warnings=list(self.warnings),
            numbers=dict(self.numbers),
        )
        return to_jsonable(d)


# --------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------


def _maxabs(a: Any) -> float:
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0:
        return 0.0
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.max(np.abs(a)))


def _scale(arrays: Sequence[Any]) -> float:
    return max(_maxabs(a) for a in arrays)


def _finite(*arrays: Any) -> bool:
    return all(np.all(np.isfinite(np.asarray(a))) for a in arrays)


@dataclass
class _Ctx:
    """Everything the checks share (mutable while the report is being built)."""

    model: Any
    data: Any  # (X, Y) tensors, or None for models that hold their data
    xi: Any
    gamma: float
    mode: str
    tol: Tolerances
    np_dtype: Any
    M: int
    L: int
    fisher: bool = True
    checks: list[Check] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    numbers: list[tuple[str, float]] = field(default_factory=list)

    def loss_fn(self, model: Any) -> Any:
        return model.training_loss() if self.data is None else model.training_loss(self.data)


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


def _validate_model(model: Any) -> None:
    import gpflow

    q_mu = getattr(model, "q_mu", None)
    q_sqrt = getattr(model, "q_sqrt", None)
    if not isinstance(model, gpflow.models.GPModel) or not isinstance(q_mu, gpflow.Parameter) or not isinstance(q_sqrt, gpflow.Parameter):
        raise UnsupportedModelError(
            "natural gradients need a GPflow model with a variational q(u) = N(q_mu, q_sqrt q_sqrtᵀ).",
            context=[("Argument", "model"), ("Expected", "gpflow.models.SVGP or gpflow.models.VGP (q_mu and q_sqrt Parameters)"), ("Got", type(model).__name__)],
            remedy="pass an SVGP or VGP model; GPR and SGPR have no variational parameters to take natural steps on.",
        )
    if getattr(model, "q_diag", False) or len(q_sqrt.shape) == 2:
        raise UnsupportedModelError(
            "q_sqrt is diagonal (q_diag=True); GPflow's NaturalGradient supports only the full covariance "
            "parametrisation q_sqrt [L, M, M].",
            context=[("Argument", "model.q_sqrt"), ("Expected", "[L, M, M] (q_diag=False)"), ("Actual", f"{list(q_sqrt.shape)} (q_diag=True)")],
            remedy="build the model with q_diag=False (the default) to use natural gradients.",
        )
    if len(q_mu.shape) != 2 or len(q_sqrt.shape) != 3 or tuple(q_sqrt.shape) != (q_mu.shape[1], q_mu.shape[0], q_mu.shape[0]):
        raise UnsupportedModelError(
            "q_mu and q_sqrt do not have GPflow's shapes q_mu [M, L], q_sqrt [L, M, M].",
            context=[("Argument", "model.q_mu / model.q_sqrt"), ("Expected", "[M, L] and [L, M, M]"), ("Actual", f"{list(q_mu.shape)} and {list(q_sqrt.shape)}")],
            remedy="natural gradients need one full-covariance q(u) per latent GP, as SVGP and VGP build them.",
        )
    if q_mu.dtype not in (np.float64, np.float32) and getattr(q_mu.dtype, "name", "") not in ("float64", "float32"):
        raise InputError(
            "the model's variational parameters must be float64 or float32.",
            context=[("Argument", "model.q_mu"), ("Expected", "float64 (or float32)"), ("Got", str(q_mu.dtype))],
            remedy="build the model under gpflow.config.set_default_float(np.float64).",
        )


def _validate_data(model: Any, data: Any, dtype: Any) -> Any:
    import gpflow
    import tensorflow as tf

    internal = isinstance(model, gpflow.models.InternalDataTrainingLossMixin)
    if internal:
        if data is not None:
            raise InputError(
                f"{type(model).__name__} holds its own data; data must be None.",
                context=[("Argument", "data"), ("Expected", "None (the data are in model.data)"), ("Got", type(data).__name__)],
                remedy="call check_natgrad(model) without data.",
            )
        return None
    if data is None:
        raise InputError(
            f"{type(model).__name__}'s training loss needs data.",
            context=[("Argument", "data"), ("Expected", "a tuple (X [N, D], Y [N, P])"), ("Got", "None")],
            remedy="pass the full batch, check_natgrad(model, (X, Y)), as you pass it to model.training_loss.",
        )
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise InputError(
            "data must be a pair (X, Y).",
            context=[("Argument", "data"), ("Expected", "a tuple (X [N, D], Y [N, P])"), ("Got", type(data).__name__ + (f" of length {len(data)}" if hasattr(data, "__len__") else ""))],
            remedy="pass data=(X, Y).",
        )
    X, Y = (np.asarray(d) for d in data)
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise InputError(
            "X and Y must be matrices with the same number of rows.",
            context=[("Argument", "data"), ("Expected", "X [N, D] and Y [N, P]"), ("Got", f"X {list(X.shape)} and Y {list(Y.shape)}")],
            remedy="reshape with X[:, None] / Y[:, None] for one-dimensional arrays.",
        )
    for name, arr in (("X", X), ("Y", Y)):
        if not np.issubdtype(arr.dtype, np.number) or not np.all(np.isfinite(arr)):
            raise InputError(
                f"data {name} must be finite numbers.",
                context=[("Argument", f"data[{0 if name == 'X' else 1}] ({name})"), ("Expected", "finite floats"), ("Got", f"dtype {arr.dtype}, {int(np.sum(~np.isfinite(arr.astype(float))))} non-finite" if np.issubdtype(arr.dtype, np.number) else f"dtype {arr.dtype}")],
                remedy=f"drop or impute the non-finite rows of {name}.",
            )
    return tf.constant(X.astype(dtype)), tf.constant(Y.astype(dtype))


# --------------------------------------------------------------------------------------------------
# TensorFlow pieces (eager in full mode, compiled and cached in fast mode)
# --------------------------------------------------------------------------------------------------


def _loss_and_grads(model: Any, data: Any) -> tuple[Any, Any, Any]:
    """The training loss and its gradients w.r.t. q_mu's and q_sqrt's unconstrained variables (GPflow's tape)."""
    import tensorflow as tf

    q_mu_v, q_sqrt_v = model.q_mu.unconstrained_variable, model.q_sqrt.unconstrained_variable
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch([q_mu_v, q_sqrt_v])
        loss = model.training_loss() if data is None else model.training_loss(data)
    g_mu, g_sq = tape.gradient(loss, [q_mu_v, q_sqrt_v], unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return loss, g_mu, g_sq


def _step_tensors(model: Any, g_mu: Any, g_sq: Any, gamma: Any, xi: Any) -> dict[str, Any]:
    """natgrad_diag.natgrad.trace.natgrad_tensors on the model's current q(u): the step, not assigned."""
    import tensorflow as tf
    from gpflow.base import _to_constrained

    from natgrad_diag.natgrad.trace import natgrad_tensors

    dL_dmean = _to_constrained(g_mu, model.q_mu.transform)
    dL_dvarsqrt = _to_constrained(g_sq, model.q_sqrt.transform)
    out = natgrad_tensors(
        tf.identity(tf.convert_to_tensor(model.q_mu)), tf.identity(tf.convert_to_tensor(model.q_sqrt)),
        dL_dmean, dL_dvarsqrt, gamma, xi,
    )  # fmt: skip
    out["dL_dmean"], out["dL_dvarsqrt"] = dL_dmean, dL_dvarsqrt
    return out


def _direction_tensors(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any) -> tuple[Any, Any]:
    """∂L/∂η by the vector-Jacobian product of GPflow's expectation_to_meanvarsqrt (no step taken)."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation

    eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch([eta1, eta2])
        mean, varsqrt = expectation_to_meanvarsqrt(eta1, eta2)
    return tuple(tape.gradient([mean, varsqrt], [eta1, eta2], output_gradients=[dL_dmean, dL_dvarsqrt]))  # type: ignore[return-value]


def _fisher_matrix_free_tensors(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, dL_deta1: Any, dL_deta2: Any) -> dict[str, Any]:
    """F·∇ηL in closed form and ∇θL by reverse mode through GPflow's natural_to_meanvarsqrt, at the current q(u).

    For η(θ) = (m, S + m mᵀ) with S = (−2θ₂)⁻¹ and m = Sθ₁, the product of F = ∂η/∂θ with u = (u₁, U₂) is

        dS = 2·S U₂ S,   dη₁ = dS θ₁ + S u₁ = 2·S U₂ m + S u₁,   dη₂ = dS + dη₁ mᵀ + m dη₁ᵀ,

    a few matrix products (no Jacobian, no forward-mode pass through a Cholesky factorisation).
    """
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural, natural_to_meanvarsqrt

    S = tf.linalg.matmul(q_sqrt, q_sqrt, transpose_b=True)  # [L, M, M]
    m = tf.linalg.adjoint(q_mu)[:, :, None]  # [L, M, 1]
    u1 = tf.linalg.adjoint(dL_deta1)[:, :, None]
    SU2 = tf.linalg.matmul(S, dL_deta2)
    dS = 2.0 * tf.linalg.matmul(SU2, S)
    d1 = 2.0 * tf.linalg.matmul(SU2, m) + tf.linalg.matmul(S, u1)
    d2 = dS + tf.linalg.matmul(d1, m, transpose_b=True) + tf.linalg.matmul(m, d1, transpose_b=True)
    nat1, nat2 = meanvarsqrt_to_natural(q_mu, q_sqrt)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch([nat1, nat2])
        mean, varsqrt = natural_to_meanvarsqrt(nat1, nat2)
    g1, g2 = tape.gradient([mean, varsqrt], [nat1, nat2], output_gradients=[dL_dmean, dL_dvarsqrt])
    g2 = 0.5 * (g2 + tf.linalg.matrix_transpose(g2))  # the gradient along symmetric θ₂
    return dict(F_u1=tf.linalg.adjoint(d1[:, :, 0]), F_u2=d2, grad_theta1=g1, grad_theta2=g2)


def _xi_jvp_tensors(q_mu: Any, q_sqrt: Any, dL_deta1: Any, dL_deta2: Any, xi: Any) -> tuple[Any, Any]:
    """(∂ξ/∂θ)·∇ηL by forward mode (tf.autodiff.ForwardAccumulator) through xi.naturals_to_xi."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

    nat1, nat2 = meanvarsqrt_to_natural(q_mu, q_sqrt)
    with tf.autodiff.ForwardAccumulator(primals=[nat1, nat2], tangents=[dL_deta1, dL_deta2]) as acc:
        x1, x2 = xi.naturals_to_xi(nat1, nat2)
    return tuple(acc.jvp([x1, x2], unconnected_gradients=tf.UnconnectedGradients.ZERO))  # type: ignore[return-value]


class _FastEngine:
    """Compiled (tf.function) pieces for one model, ξ transform and data signature, reused across calls.

    ``run`` computes, in compiled pieces called in turn: the loss and its gradients (GPflow's tape), natgrad-diag's step
    (``natgrad_tensors``), GPflow's own update ``NaturalGradient._natgrad_apply_gradients`` applied with the same
    gradients to a scratch deep copy of the model, the loss after GPflow's step, and the matrix-free Fisher
    products. The scratch copy's variables are overwritten from the model's at every call; the model is only read.
    When a Cholesky fails inside a piece, ``_take_step_fast`` finds out which part failed.
    """

    def __init__(self, model: Any, xi: Any, has_data: bool, fisher: bool = True) -> None:
        import gpflow
        import tensorflow as tf

        # A weak reference: the engine lives in a WeakKeyDictionary keyed by the model, so it must not keep the
        # model alive (the compiled graphs hold the variables they read, not the model).
        model_ref = weakref.ref(model)
        self.scratch = gpflow.utilities.deepcopy(model)
        dtype = model.q_mu.dtype
        self.gamma_var = tf.Variable(1.0, dtype=dtype, trainable=False)
        self.opt = gpflow.optimizers.NaturalGradient(gamma=self.gamma_var, xi_transform=xi)
        scratch, opt, gamma_var = self.scratch, self.opt, self.gamma_var
        src_vars, dst_vars = list(model.variables), list(self.scratch.variables)

        def loss_of(m: Any, data: Any) -> Any:
            return m.training_loss() if not has_data else m.training_loss(data)

        def gpflow_update(data: Any, g_mu: Any, g_sq: Any, gamma: Any) -> dict[str, Any]:
            for src, dst in zip(src_vars, dst_vars):
                dst.assign(src)
            gamma_var.assign(gamma)
            opt._natgrad_apply_gradients(g_mu, g_sq, scratch.q_mu, scratch.q_sqrt, xi)
            return dict(
                gp_q_mu=tf.convert_to_tensor(scratch.q_mu), gp_q_sqrt=tf.convert_to_tensor(scratch.q_sqrt),
                loss_after=loss_of(scratch, data),
            )  # fmt: skip

        keep = ("dL_dmean", "dL_dvarsqrt", "dL_deta1", "dL_deta2", "nat_dL_xi1", "nat_dL_xi2", "new_q_mu", "new_q_sqrt")
        fisher_on = fisher

        @tf.function
        def grads_only(data: Any) -> dict[str, Any]:
            loss, g_mu, g_sq = _loss_and_grads(model_ref(), data if has_data else None)
            return dict(loss=loss, g_mu=g_mu, g_sq=g_sq)

        @tf.function
        def ours(g_mu: Any, g_sq: Any, gamma: Any) -> dict[str, Any]:
            # only what the checks use, so that the graph prunes the rest (the default-seed gradient Jᵀ·1)
            return {k: v for k, v in _step_tensors(model_ref(), g_mu, g_sq, gamma, xi).items() if k in keep}

        @tf.function
        def gpflow_apply(data: Any, g_mu: Any, g_sq: Any, gamma: Any) -> dict[str, Any]:
            return gpflow_update(data, g_mu, g_sq, gamma)

        @tf.function
        def fisher(q_mu: Any, q_sqrt: Any, dmean: Any, dvarsqrt: Any, d1: Any, d2: Any) -> dict[str, Any]:
            return _fisher_matrix_free_tensors(q_mu, q_sqrt, dmean, dvarsqrt, d1, d2)

        def run(data: Any, gamma: Any) -> dict[str, Any]:
            # Compiled pieces called in turn, not one fused graph: in one graph TensorFlow ran the independent
            # branches (our step, GPflow's update) concurrently, and on 2 cores that oversubscription made the
            # whole about 25% slower than its parts (measured at M = 1000).
            g = grads_only(data)
            out = dict(ours(g["g_mu"], g["g_sq"], gamma))
            out.update(g)
            out.update(gpflow_apply(data, g["g_mu"], g["g_sq"], gamma))
            if fisher_on:
                model = model_ref()
                q_mu, q_sqrt = tf.convert_to_tensor(model.q_mu), tf.convert_to_tensor(model.q_sqrt)
                out.update(fisher(q_mu, q_sqrt, out["dL_dmean"], out["dL_dvarsqrt"], out["dL_deta1"], out["dL_deta2"]))
            return out

        self.run = run
        self.grads_only = grads_only
        self.ours = ours
        self.gpflow_apply = gpflow_apply
        self.fisher = fisher

    def sync(self, model: Any) -> None:
        """Copy every variable of the model into the scratch copy (hyperparameters may have changed)."""
        for src, dst in zip(model.variables, self.scratch.variables):
            dst.assign(src)


_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fast_engine(model: Any, xi: Any, has_data: bool, fisher: bool = True) -> _FastEngine:
    per_model = _ENGINES.setdefault(model, {})
    # the compiled graphs capture the model's variables: a replaced Parameter needs a new engine
    key = (
        type(xi).__name__, id(xi) if type(xi).__module__ != "gpflow.optimizers.natgrad" else 0, has_data, fisher,
        tuple(id(v) for v in model.variables),
    )  # fmt: skip
    if key not in per_model:
        while len(per_model) >= 4:  # replaced parameters or other ξ transforms: keep the newest few
            per_model.pop(next(iter(per_model)))
        per_model[key] = _FastEngine(model, xi, has_data, fisher)
    return per_model[key]


# --------------------------------------------------------------------------------------------------
# The step (both modes) and the checks
# --------------------------------------------------------------------------------------------------


@dataclass
class _Step:
    loss: float
    g_mu: np.ndarray
    g_sq: np.ndarray
    dL_dmean: np.ndarray
    dL_dvarsqrt: np.ndarray
    dL_deta1: np.ndarray | None = None
    dL_deta2: np.ndarray | None = None
    nat_dL_xi1: np.ndarray | None = None
    nat_dL_xi2: np.ndarray | None = None
    new_q_mu: np.ndarray | None = None
    new_q_sqrt: np.ndarray | None = None
    error: str = ""


def _take_step_full(ctx: _Ctx) -> _Step:
    import tensorflow as tf
    from gpflow.base import _to_constrained

    from natgrad_diag.exceptions import StepFailedError
    from natgrad_diag.natgrad.trace import natgrad_trace

    loss, g_mu, g_sq = _loss_and_grads(ctx.model, ctx.data)
    step = _Step(
        loss=float(loss.numpy()), g_mu=g_mu.numpy(), g_sq=g_sq.numpy(),
        dL_dmean=_to_constrained(g_mu, ctx.model.q_mu.transform).numpy(),
        dL_dvarsqrt=_to_constrained(g_sq, ctx.model.q_sqrt.transform).numpy(),
    )  # fmt: skip
    if not _finite(step.loss, step.g_mu, step.g_sq):
        return step
    try:
        t = natgrad_trace(ctx.model.q_mu, ctx.model.q_sqrt, g_mu, g_sq, gamma=ctx.gamma, xi_transform=ctx.xi)
    except StepFailedError as e:
        step.error = e.detail
    except tf.errors.InvalidArgumentError as e:  # a custom ξ transform failing before the step
        step.error = error_line(e)
    else:
        step.dL_deta1, step.dL_deta2 = t.dL_deta1, t.dL_deta2
        step.nat_dL_xi1, step.nat_dL_xi2 = t.nat_dL_xi1, t.nat_dL_xi2
        step.new_q_mu, step.new_q_sqrt = t.new_q_mu, t.new_q_sqrt
    return step


def _take_step_fast(ctx: _Ctx, engine: _FastEngine) -> tuple[_Step, dict[str, Any]]:
    """The step, GPflow's step and the Fisher products from one compiled call (see :class:`_FastEngine`)."""
    import tensorflow as tf
    from gpflow.base import _to_constrained

    gamma = tf.constant(ctx.gamma, dtype=ctx.model.q_mu.dtype)
    data = ctx.data if ctx.data is not None else ()
    try:
        out = {k: v.numpy() for k, v in engine.run(data, gamma).items()}
    except tf.errors.InvalidArgumentError:
        # something failed inside the graph: run the parts one by one to say which
        g = engine.grads_only(data)
        step = _Step(
            loss=float(g["loss"].numpy()), g_mu=g["g_mu"].numpy(), g_sq=g["g_sq"].numpy(),
            dL_dmean=_to_constrained(g["g_mu"], ctx.model.q_mu.transform).numpy(),
            dL_dvarsqrt=_to_constrained(g["g_sq"], ctx.model.q_sqrt.transform).numpy(),
        )  # fmt: skip
        extra: dict[str, Any] = {}
        if not _finite(step.loss, step.g_mu, step.g_sq):
            return step, extra
        try:
            o = {k: v.numpy() for k, v in engine.ours(g["g_mu"], g["g_sq"], gamma).items()}
        except tf.errors.InvalidArgumentError as e:
            step.error = f"with gamma = {ctx.gamma:g} the updated covariance is not positive definite ({error_line(e)})."
        else:
            step.dL_deta1, step.dL_deta2 = o["dL_deta1"], o["dL_deta2"]
            step.nat_dL_xi1, step.nat_dL_xi2 = o["nat_dL_xi1"], o["nat_dL_xi2"]
            step.new_q_mu, step.new_q_sqrt = o["new_q_mu"], o["new_q_sqrt"]
            if not _finite(step.new_q_mu, step.new_q_sqrt):
                step.error = f"with gamma = {ctx.gamma:g} the step produced NaN or Inf in the new q_mu or q_sqrt."
        try:
            gp = engine.gpflow_apply(data, g["g_mu"], g["g_sq"], gamma)
            extra = dict(gp_q_mu=gp["gp_q_mu"].numpy(), gp_q_sqrt=gp["gp_q_sqrt"].numpy(), gp_error="", loss_after=gp["loss_after"].numpy())
        except tf.errors.InvalidArgumentError as e2:
            extra = dict(gp_error=error_line(e2))
        return step, extra
    step = _Step(
        loss=float(out["loss"]), g_mu=out["g_mu"], g_sq=out["g_sq"], dL_dmean=out["dL_dmean"], dL_dvarsqrt=out["dL_dvarsqrt"],
        dL_deta1=out["dL_deta1"], dL_deta2=out["dL_deta2"], nat_dL_xi1=out["nat_dL_xi1"], nat_dL_xi2=out["nat_dL_xi2"],
        new_q_mu=out["new_q_mu"], new_q_sqrt=out["new_q_sqrt"],
    )  # fmt: skip
    if _finite(step.loss, step.g_mu, step.g_sq) and not _finite(step.new_q_mu, step.new_q_sqrt):
        step.error = f"with gamma = {ctx.gamma:g} the step produced NaN or Inf in the new q_mu or q_sqrt."
    out["gp_error"] = "" if _finite(out["gp_q_mu"], out["gp_q_sqrt"]) else "NaN or Inf in the new q_mu or q_sqrt"
    return step, out


def _fill_direction(ctx: _Ctx, step: _Step) -> None:
    """∂L/∂η when the step itself failed (the direction does not depend on γ)."""
    import tensorflow as tf
    from gpflow.optimizers import XiNat

    if step.dL_deta1 is not None:
        return
    try:
        d1, d2 = _direction_tensors(
            tf.convert_to_tensor(ctx.model.q_mu), tf.convert_to_tensor(ctx.model.q_sqrt),
            tf.constant(step.dL_dmean), tf.constant(step.dL_dvarsqrt),
        )  # fmt: skip
    except tf.errors.InvalidArgumentError:
        return
    step.dL_deta1, step.dL_deta2 = d1.numpy(), d2.numpy()
    if isinstance(ctx.xi, XiNat):
        step.nat_dL_xi1, step.nat_dL_xi2 = step.dL_deta1, step.dL_deta2


def _health(new_q_mu: np.ndarray | None, new_q_sqrt: np.ndarray | None, dtype: Any) -> tuple[bool, str, dict[str, float]]:
    """Is the new q(u) usable: finite, q_sqrt lower-triangular with a positive diagonal, S = q_sqrt q_sqrtᵀ PD."""
    if new_q_mu is None or new_q_sqrt is None:
        return False, "no new parameters (the step failed)", {}
    if not _finite(new_q_mu, new_q_sqrt):
        n_bad = int(np.sum(~np.isfinite(new_q_mu)) + np.sum(~np.isfinite(new_q_sqrt)))
        return False, f"{n_bad} NaN/Inf value(s) in the new q_mu or q_sqrt", {}
    eps = float(np.finfo(dtype).eps)
    scale = max(_maxabs(new_q_sqrt), 1.0)
    upper = _maxabs(np.triu(new_q_sqrt, 1))
    diag = np.diagonal(new_q_sqrt, axis1=-2, axis2=-1)
    nums = {"max |upper triangle of new q_sqrt|": upper, "min diagonal of new q_sqrt": float(diag.min())}
    if upper > 100 * eps * scale:
        return False, f"the new q_sqrt is not lower-triangular (max |upper entry| {format_number(upper)})", nums
    if not (diag > 0).all():
        l_idx, m_idx = (int(i) for i in np.argwhere(diag <= 0)[0])
        return False, f"the new q_sqrt has a non-positive diagonal entry q_sqrt[{l_idx}, {m_idx}, {m_idx}] = {format_number(float(diag[l_idx, m_idx]))}", nums
    S = np.matmul(new_q_sqrt, np.swapaxes(new_q_sqrt, -1, -2)).astype(dtype)
    try:
        np.linalg.cholesky(S)
    except np.linalg.LinAlgError:
        return False, f"S = q_sqrt q_sqrtᵀ is not numerically positive definite in {np.dtype(dtype).name} (Cholesky failed)", nums
    ratio = float((diag.max(axis=-1) / diag.min(axis=-1)).max())
    nums["cond(S) lower bound (max/min diag of q_sqrt)²"] = ratio**2
    return True, "", nums


def _loss_at(ctx: _Ctx, scratch: Any, new_q_mu: np.ndarray, new_q_sqrt: np.ndarray) -> float | None:
    import tensorflow as tf

    try:
        scratch.q_mu.assign(new_q_mu)
        scratch.q_sqrt.assign(new_q_sqrt)
        value = float(ctx.loss_fn(scratch).numpy())
    except (tf.errors.InvalidArgumentError, ValueError):
        return None
    return value if np.isfinite(value) else None


def _trial(ctx: _Ctx, scratch: Any, gamma: float, loss_before: float, g: tuple[Any, Any, Any]) -> GammaTrial:
    """One step length: take the step (GPflow's maths via natgrad_tensors), check health and the loss."""
    import tensorflow as tf

    try:
        out = _step_tensors(ctx.model, g[1], g[2], tf.constant(gamma, ctx.model.q_mu.dtype), ctx.xi)
    except tf.errors.InvalidArgumentError:
        return GammaTrial(gamma, False, None, "Cholesky failed")
    new_mu, new_sq = out["new_q_mu"].numpy(), out["new_q_sqrt"].numpy()
    ok, why, _ = _health(new_mu, new_sq, ctx.np_dtype)
    if not ok:
        return GammaTrial(gamma, False, None, why)
    loss = _loss_at(ctx, scratch, new_mu, new_sq)
    if loss is None:
        return GammaTrial(gamma, False, None, "the loss after the step is not finite")
    return GammaTrial(gamma, True, loss, "lowers the loss" if loss < loss_before else "raises the loss")


def _suggest(ctx: _Ctx, scratch: Any, step: _Step, healthy: bool, loss_after: float | None, advance: Any) -> tuple[float | None, tuple[GammaTrial, ...]]:
    """The largest γ of :data:`GAMMA_GRID` whose step is healthy and lowers the loss.

    Full mode tries the grid from the top; fast mode only searches below γ when the step at γ is unhealthy
    or does not lower the loss (otherwise γ itself is the suggestion, and nothing else is computed).
    """
    if ctx.mode == "fast":
        if healthy and loss_after is not None and loss_after < step.loss:
            return ctx.gamma, ()
        grid = [g for g in GAMMA_GRID if g < ctx.gamma]
    else:
        grid = list(GAMMA_GRID)
    trials = []
    grads: list[Any] = []
    for g in grid:
        if ctx.mode == "full" and g == ctx.gamma and loss_after is not None:
            t = GammaTrial(g, healthy, loss_after, "lowers the loss" if loss_after < step.loss else "raises the loss")
        elif ctx.mode == "full" and g == ctx.gamma and not healthy:
            t = GammaTrial(g, False, None, step.error or "unhealthy step")
        else:
            if not grads:
                grads.append(_loss_and_grads(ctx.model, ctx.data))
            t = _trial(ctx, scratch, g, step.loss, grads[0])
        trials.append(t)
        advance()
        if t.healthy and t.loss is not None and t.loss < step.loss:
            return g, tuple(trials)
    return None, tuple(trials)


def _check_reproduction(ctx: _Ctx, step: _Step, gp_mu: np.ndarray | None, gp_sq: np.ndarray | None, gp_error: str) -> Check:
    tol = ctx.tol
    ours_failed = step.new_q_mu is None or bool(step.error)
    if ours_failed or gp_error:
        agree = ours_failed and bool(gp_error)
        return Check(
            name="reproduction",
            claim=(
                "natgrad-diag and gpflow.optimizers.NaturalGradient both find that this step fails"
                if agree else "natgrad-diag's step and GPflow's NaturalGradient agree on whether the step succeeds"
            ),
            passed=agree,
            detail=f"natgrad-diag: {(step.error or 'step succeeded').rstrip('.')}; GPflow: {(gp_error or 'step succeeded').rstrip('.')}.",
        )
    return close_check(
        "reproduction",
        f"the step natgrad-diag computes (natgrad_tensors, {type(ctx.xi).__name__}, gamma = {ctx.gamma:g}) equals "
        "what gpflow.optimizers.NaturalGradient assigns to a copy of the model",
        (step.new_q_mu, step.new_q_sqrt), (gp_mu, gp_sq), rtol=tol.rtol, atol=tol.atol,
        detail=f"q_mu: {format_number(max_abs_diff(step.new_q_mu, gp_mu))}, q_sqrt: {format_number(max_abs_diff(step.new_q_sqrt, gp_sq))}",
    )  # fmt: skip


def _gpflow_step_full(ctx: _Ctx) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """GPflow's NaturalGradient.minimize on a deep copy; the copy's new q_mu, q_sqrt (or why it failed)."""
    import gpflow
    import tensorflow as tf

    copy_ = gpflow.utilities.deepcopy(ctx.model)
    opt = gpflow.optimizers.NaturalGradient(gamma=ctx.gamma, xi_transform=ctx.xi)
    try:
        opt.minimize(lambda: ctx.loss_fn(copy_), [(copy_.q_mu, copy_.q_sqrt)])
    except tf.errors.InvalidArgumentError as e:
        return None, None, error_line(e)
    mu, sq = copy_.q_mu.numpy(), copy_.q_sqrt.numpy()
    if not _finite(mu, sq):
        return None, None, "NaN or Inf in the new q_mu or q_sqrt"
    return mu, sq, ""


def _vech_maps(M: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For vech (row-major lower triangle, P = M(M+1)/2 entries): the vech position of every (i, j) of a
    symmetric M×M matrix [M·M], the flat positions of the lower triangle [P], and the dual weights [P]
    (1 on the diagonal, 2 off it)."""
    rows, cols = np.tril_indices(M)
    pos = np.zeros((M, M), dtype=np.int64)
    pos[rows, cols] = np.arange(rows.size)
    pos[cols, rows] = np.arange(rows.size)
    return pos.ravel(), rows * M + cols, np.where(rows == cols, 1.0, 2.0)


def _theta2_of_vech(b: Any) -> Any:
    """θ₂ [L, M, M] symmetric from its vech b [L, P]."""
    import tensorflow as tf

    P = int(b.shape[-1])
    M = int(round((np.sqrt(8 * P + 1) - 1) / 2))
    full_pos, _, _ = _vech_maps(M)
    return tf.reshape(tf.gather(b, full_pos, axis=1), [-1, M, M])


def _fisher_eta_of_theta(a: Any, b: Any) -> tuple[Any, Any]:
    """(θ₁ [M, L], vech θ₂ [L, P]) ↦ (η₁ [M, L], dual-vech η₂ [L, P]); its Jacobian is the Fisher matrix."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import natural_to_expectation

    M = int(a.shape[0])
    _, lower_flat, weights = _vech_maps(M)
    e1, e2 = natural_to_expectation(a, _theta2_of_vech(b))
    return e1, tf.gather(tf.reshape(e2, [-1, M * M]), lower_flat, axis=1) * tf.constant(weights, e2.dtype)


def _fisher_msqrt_of_theta(a: Any, b: Any) -> tuple[Any, Any]:
    """(θ₁ [M, L], vech θ₂ [L, P]) ↦ (m [M, L], L_S [L, M, M]) by GPflow's natural_to_meanvarsqrt."""
    from gpflow.optimizers.natgrad import natural_to_meanvarsqrt

    return natural_to_meanvarsqrt(a, _theta2_of_vech(b))


def _check_fisher_full(ctx: _Ctx, step: _Step, advance: Any) -> Check:
    """F⁻¹·∇θL = ∇ηL with explicit Jacobians, in coordinates where F is a true (symmetric) Fisher matrix.

    θ = (θ₁, vech θ₂) (lower triangle of the symmetric θ₂) and η' = (η₁, dual-vech η₂) (diagonal, and twice the
    strict lower triangle), so that ⟨θ, η'⟩ = θ₁ᵀη₁ + tr(θ₂η₂). Then F = ∂η'/∂θ = ∂²A/∂θ² and
    ∇_η' L = (∂L/∂η₁, vech(∂L/∂η₂)) for GPflow's symmetric ∂L/∂η₂. All L latent GPs at once (F is block-diagonal).
    """
    import tensorflow as tf
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

    from natgrad_diag.autodiff.dense import jacobian

    M, L = ctx.M, ctx.L
    nat1, nat2 = meanvarsqrt_to_natural(tf.convert_to_tensor(ctx.model.q_mu), tf.convert_to_tensor(ctx.model.q_sqrt))
    _, lower_flat, _ = _vech_maps(M)
    # The oracle runs in float64 whatever the model's dtype (float32 is compared with float32 tolerances).
    w1 = tf.cast(nat1, tf.float64)
    w2 = tf.gather(tf.reshape(tf.cast(nat2, tf.float64), [L, M * M]), lower_flat, axis=1)
    F = jacobian(_fisher_eta_of_theta, [w1, w2], input_names=("theta1", "vech_theta2"), output_names=("eta1", "dual_vech_eta2")).matrix
    advance()
    K = jacobian(_fisher_msqrt_of_theta, [w1, w2], input_names=("theta1", "vech_theta2"), output_names=("mean", "varsqrt"))
    advance()
    grad_theta = np.concatenate([np.ravel(g) for g in K.vjp([step.dL_dmean, step.dL_dvarsqrt])])
    want = np.concatenate([np.ravel(step.dL_deta1), np.ravel(step.dL_deta2.reshape(L, M * M)[:, lower_flat])])
    eps = float(np.finfo(ctx.np_dtype).eps)
    F64 = F.astype(np.float64)
    try:
        got = np.linalg.solve(F64, grad_theta.astype(np.float64))
        cond = float(np.linalg.cond(F64))
    except np.linalg.LinAlgError:
        got, cond = np.full_like(want, np.inf), float("inf")
    err = _maxabs(got - want)
    bound = _scale([want]) * (ctx.tol.fisher_rtol + 100 * eps * cond) + ctx.tol.atol
    sym = _maxabs(F64 - F64.T) / max(_maxabs(F64), 1e-300)
    ctx.numbers.append(("cond(F)", cond))
    ctx.numbers.append(("max |F − Fᵀ| / max |F|", sym))
    n = L * (M + M * (M + 1) // 2)
    return Check(
        name="fisher_identity",
        claim=(
            "F⁻¹·∇θL = ∇ηL: the explicit Fisher matrix F = ∂η/∂θ (natural_to_expectation) solved against "
            "∇θL (the explicit Jacobian of natural_to_meanvarsqrt contracted with ∂L/∂(m, L_S)) gives the "
            "∂L/∂η of GPflow's step"
        ),
        passed=bool(err <= bound),
        max_abs_error=err,
        tolerance=bound,
        detail=f"F is {n} × {n}; cond(F) = {format_number(cond)}, F symmetric to {format_number(sym)} (relative)",
    )


def _check_fisher_fast(ctx: _Ctx, step: _Step, engine: _FastEngine | None, out: dict[str, Any]) -> Check:
    """F·∇ηL = ∇θL matrix-free: one forward-mode product and one vector-Jacobian product."""
    import tensorflow as tf

    if "F_u1" not in out:
        args = [
            tf.convert_to_tensor(ctx.model.q_mu), tf.convert_to_tensor(ctx.model.q_sqrt),
            tf.constant(step.dL_dmean), tf.constant(step.dL_dvarsqrt), tf.constant(step.dL_deta1), tf.constant(step.dL_deta2),
        ]  # fmt: skip
        fn = engine.fisher if engine is not None else _fisher_matrix_free_tensors
        try:
            out = {k: v.numpy() for k, v in fn(*args).items()}
        except tf.errors.InvalidArgumentError as e:
            return Check(name="fisher_identity", claim="F·∇ηL = ∇θL (matrix-free)", passed=False, detail=f"could not evaluate: {error_line(e)}")
    want = (out["grad_theta1"], out["grad_theta2"])
    err = max_abs_diff((out["F_u1"], out["F_u2"]), want)
    eps = float(np.finfo(ctx.np_dtype).eps)
    # matrix-free: no cond(F); a product F·u loses about cond(S)·ε, bounded by the size of F·u's terms
    bound = _scale(want) * (ctx.tol.fisher_rtol + 100 * eps * ctx.M) + ctx.tol.atol
    return Check(
        name="fisher_identity",
        claim=(
            "F·∇ηL = ∇θL, matrix-free: the Fisher matrix F = ∂η/∂θ applied in closed form (dS = 2·S U₂ S, ...) to "
            "GPflow's ∂L/∂η equals the vector-Jacobian product of natural_to_meanvarsqrt with ∂L/∂(m, L_S)"
        ),
        passed=bool(err <= bound),
        max_abs_error=err,
        tolerance=bound,
        detail="equivalent to F⁻¹·∇θL = ∇ηL without forming F (fast mode)",
    )


def _check_xi_forward(ctx: _Ctx, step: _Step) -> Check:
    import tensorflow as tf

    try:
        j1, j2 = _xi_jvp_tensors(
            tf.convert_to_tensor(ctx.model.q_mu), tf.convert_to_tensor(ctx.model.q_sqrt),
            tf.constant(step.dL_deta1), tf.constant(step.dL_deta2), ctx.xi,
        )  # fmt: skip
    except tf.errors.InvalidArgumentError as e:
        return Check(name="xi_forward_mode", claim="(∂ξ/∂θ)·∇ηL by forward mode", passed=False, detail=f"could not evaluate: {error_line(e)}")
    want = (j1.numpy(), j2.numpy())
    err = max_abs_diff((step.nat_dL_xi1, step.nat_dL_xi2), want)
    bound = ctx.tol.atol + ctx.tol.fisher_rtol * _scale(want)
    detail = f"vs ForwardAccumulator: {format_number(err)}"
    if ctx.mode == "full":
        from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

        from natgrad_diag.autodiff.dense import jacobian

        nat1, nat2 = meanvarsqrt_to_natural(tf.convert_to_tensor(ctx.model.q_mu), tf.convert_to_tensor(ctx.model.q_sqrt))
        nat1, nat2 = tf.cast(nat1, tf.float64), tf.cast(nat2, tf.float64)  # the oracle in float64
        from natgrad_diag.exceptions import MemoryLimitError

        try:
            J = jacobian(ctx.xi.naturals_to_xi, [nat1, nat2], input_names=("nat1", "nat2"), output_names=("xi1", "xi2"), symmetric=(False, True))
        except MemoryLimitError as e:
            detail += f"; explicit Jacobian skipped ({e.detail})"
        else:
            want_j = J.jvp([step.dL_deta1, step.dL_deta2])
            err_j = max_abs_diff((step.nat_dL_xi1, step.nat_dL_xi2), want_j)
            detail += f"; vs the explicit Jacobian ∂ξ/∂θ contracted with ∇ηL: {format_number(err_j)}"
            err = max(err, err_j)
            bound = max(bound, ctx.tol.atol + ctx.tol.fisher_rtol * _scale(want_j))
    return Check(
        name="xi_forward_mode",
        claim=(
            f"GPflow's forward-mode product (differentiating twice, for {type(ctx.xi).__name__}) equals a direct "
            "JVP (∂ξ/∂θ)·∇ηL from tf.autodiff.ForwardAccumulator"
        ),
        passed=bool(err <= bound),
        max_abs_error=err,
        tolerance=bound,
        detail=detail,
    )


def _conjugate_applicable(ctx: _Ctx) -> str:
    """'' if the conjugate checks apply, else the reason they do not."""
    import gpflow

    m = ctx.model
    if type(m.likelihood) is not gpflow.likelihoods.Gaussian:
        return f"needs a Gaussian likelihood (this model has {type(m.likelihood).__name__})"
    if isinstance(m, gpflow.models.SVGP):
        if isinstance(m.kernel, gpflow.kernels.MultioutputKernel) or not isinstance(m.inducing_variable, gpflow.inducing_variables.InducingPoints):
            return "SGPR's bound needs a single kernel and InducingPoints"
        N = int(ctx.data[0].shape[0])
        if m.num_data is not None and int(m.num_data) != N:
            return f"needs the full batch (model.num_data = {int(m.num_data)} but {N} rows were passed)"
        return ""
    if isinstance(m, gpflow.models.VGP):
        return ""
    return f"closed form known only for SVGP and VGP (this is {type(m).__name__})"


def _elbo(model: Any, data: Any) -> float:
    return float((model.elbo() if data is None else model.elbo(data)).numpy())


def _nat_step_on(ctx: _Ctx, copy_: Any) -> None:
    """One XiNat step with γ = 1 (natgrad_trace, the core), assigned to ``copy_``."""
    from gpflow.optimizers import XiNat

    from natgrad_diag.natgrad.trace import natgrad_trace

    _, g_mu, g_sq = _loss_and_grads(copy_, ctx.data)
    t = natgrad_trace(copy_.q_mu, copy_.q_sqrt, g_mu, g_sq, gamma=1.0, xi_transform=XiNat())
    copy_.q_mu.assign(t.new_q_mu)
    copy_.q_sqrt.assign(t.new_q_sqrt)


def _check_conjugate(ctx: _Ctx) -> list[Check]:
    """One γ = 1 XiNat step reaches the collapsed bound (SGPR / GPR); a second step stays there."""
    import gpflow
    import tensorflow as tf

    from natgrad_diag.exceptions import StepFailedError

    m = ctx.model
    copy_ = gpflow.utilities.deepcopy(m)
    rtol = ctx.tol.conjugate_rtol
    try:
        _nat_step_on(ctx, copy_)
        elbo1 = _elbo(copy_, ctx.data)
        _nat_step_on(ctx, copy_)
        elbo2 = _elbo(copy_, ctx.data)
    except (StepFailedError, tf.errors.InvalidArgumentError) as e:
        why = e.detail if isinstance(e, StepFailedError) else error_line(e)
        return [Check(name="conjugate_optimality", claim="one γ = 1 step reaches the collapsed bound", passed=False, detail=f"the step failed: {why}")]
    noise = m.likelihood.variance.numpy()
    if isinstance(m, gpflow.models.SVGP):
        ref = gpflow.models.SGPR(
            ctx.data, kernel=m.kernel, inducing_variable=m.inducing_variable, mean_function=m.mean_function, noise_variance=noise,
        ).elbo().numpy()  # fmt: skip
        ref = float(ref)
        err = abs(elbo1 - ref)
        bound = rtol * abs(ref)
        checks = [Check(
            name="conjugate_optimality",
            claim="after one full-batch XiNat step with γ = 1, SVGP's ELBO equals SGPR's bound (Titsias 2009) for the same kernel, Z and noise",
            passed=bool(err <= bound), max_abs_error=err, tolerance=bound,
            detail=f"SVGP ELBO {elbo1!r}, SGPR bound {ref!r} (relative {format_number(err / max(abs(ref), 1e-300))})",
        )]  # fmt: skip
        ctx.numbers.append(("SGPR bound", ref))
    else:
        X, Y = m.data
        jitter = gpflow.config.default_jitter()
        lml = float(gpflow.models.GPR((X, Y), kernel=m.kernel, mean_function=m.mean_function, noise_variance=noise).log_marginal_likelihood().numpy())
        lml_j = float(gpflow.models.GPR((X, Y), kernel=m.kernel, mean_function=m.mean_function, noise_variance=noise + jitter).log_marginal_likelihood().numpy())
        err = abs(elbo1 - lml_j)
        bound = rtol * abs(lml_j)
        share = lml_j - lml
        ctx.numbers += [("GPR log marginal likelihood (noise σ²)", lml), ("GPR log marginal likelihood (noise σ² + jitter)", lml_j),
                        ("jitter's share: VGP ELBO − GPR(σ²)", elbo1 - lml), ("GPR(σ² + jitter) − GPR(σ²)", share)]  # fmt: skip
        checks = [Check(
            name="conjugate_optimality",
            claim=(
                f"after one XiNat step with γ = 1, VGP's ELBO equals GPR's log marginal likelihood with noise σ² + jitter "
                f"(jitter = {jitter:g}, VGP adds it to K)"
            ),
            passed=bool(err <= bound), max_abs_error=err, tolerance=bound,
            detail=(
                f"VGP ELBO {elbo1!r}; GPR(σ² + jitter) {lml_j!r}; GPR(σ²) {lml!r}: the gap to GPR(σ²), "
                f"{format_number(elbo1 - lml)}, is the jitter's share ({format_number(share)})"
            ),
        )]  # fmt: skip
    d = abs(elbo2 - elbo1)
    checks.append(Check(
        name="conjugate_fixed_point",
        claim="a second XiNat step with γ = 1 does not change the ELBO (the optimum is a fixed point)",
        passed=bool(d <= rtol * abs(elbo1)), max_abs_error=d, tolerance=rtol * abs(elbo1),
        detail=f"ELBO after one step {elbo1!r}, after two {elbo2!r}",
    ))  # fmt: skip
    return checks


def _user_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the first caller outside natgrad_diag."""
    import sys

    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("natgrad_diag"):
        frame = frame.f_back
        level += 1
    return level


def _is_isometric(transform: Any) -> bool:
    import tensorflow_probability as tfp

    if transform is None:
        return True
    return type(transform) in (tfp.bijectors.Identity, tfp.bijectors.FillTriangular)


def _check_gradient_mapping(ctx: _Ctx, step: _Step) -> Check:
    """GPflow's ``_to_constrained(grad, T) = T.forward(grad)`` against the chain rule.

    With c = T.forward(u), the correct ∂L/∂c = (∂u/∂c)ᵀ·∂L/∂u: the VJP of T.inverse at c. It is what the VJP of
    T.forward at u maps back to ∂L/∂u, which is checked too (the consistency number).
    """
    import tensorflow as tf

    parts = []
    worst, worst_bound, passed, worst_margin = 0.0, 0.0, True, -np.inf
    details = []
    for name, param, g, gp in (("q_mu", ctx.model.q_mu, step.g_mu, step.dL_dmean), ("q_sqrt", ctx.model.q_sqrt, step.g_sq, step.dL_dvarsqrt)):
        T = param.transform
        tname = "identity" if T is None else type(T).__name__
        if T is None:
            parts.append(f"{name}: identity (exact)")
            continue
        if ctx.mode == "fast" and _is_isometric(T):  # exact by construction; full mode computes it
            parts.append(f"{name}: {tname} (linear isometric: exact, not recomputed in fast mode)")
            continue
        # fresh tensors: tfp bijectors cache forward/inverse pairs by tensor, which would hide the ops from the tape
        c = tf.identity(tf.convert_to_tensor(param))
        u = tf.identity(tf.convert_to_tensor(param.unconstrained_variable))
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(c)
            u_of_c = T.inverse(c)
        correct = tape.gradient(u_of_c, c, output_gradients=tf.constant(g), unconnected_gradients=tf.UnconnectedGradients.ZERO)
        # only the entries of c that move with u carry gradient (FillTriangular's upper triangle is fixed at 0)
        tangent = tf.constant(np.random.default_rng(0).uniform(0.5, 1.5, size=u.shape).astype(ctx.np_dtype))
        with tf.autodiff.ForwardAccumulator(primals=u, tangents=tangent) as acc:
            moving = acc.jvp(T.forward(u), unconnected_gradients=tf.UnconnectedGradients.ZERO).numpy() != 0
        correct = tf.where(moving, correct, tf.zeros_like(correct))
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(u)
            c_of_u = T.forward(u)
        back = tape.gradient(c_of_u, u, output_gradients=correct).numpy()
        correct = correct.numpy()
        err = _maxabs(np.where(moving, gp - correct, 0.0))
        bound = ctx.tol.atol + ctx.tol.rtol * _scale([correct])
        consistency = _maxabs(back - g)
        ok = err <= bound
        passed = passed and ok
        if err - bound >= worst_margin:
            worst, worst_bound, worst_margin = err, bound, err - bound
        parts.append(f"{name}: {tname} ({'linear isometric' if _is_isometric(T) else 'not linear isometric'}), error {format_number(err)}")
        details.append(f"{name}: VJP of forward maps the correct ∂L/∂{name} back to ∂L/∂u to {format_number(consistency)}")
        if not ok:
            msg = (
                f"{name} has the transform {tname}: GPflow's natural gradient maps its gradient with "
                f"_to_constrained(grad, transform) = transform.forward(grad), which is the chain rule only for linear "
                f"isometric transforms (identity, FillTriangular); here it is off by up to {format_number(err)}, so "
                f"the step is not a natural-gradient step. Use gpflow.utilities.triangular() for q_sqrt and no transform for q_mu."
            )
            ctx.warnings.append(msg)
            warnings.warn(msg, UserWarning, stacklevel=_user_stacklevel())
    return Check(
        name="gradient_mapping",
        claim=(
            "GPflow's _to_constrained(grad, transform) equals the correct map to constrained gradients "
            "(the VJP of the bijector's inverse, (∂u/∂c)ᵀ·∂L/∂u) for q_mu and q_sqrt"
        ),
        passed=bool(passed),
        max_abs_error=worst if worst_margin > -np.inf else 0.0,
        tolerance=worst_bound if worst_bound else None,
        detail="; ".join(parts + details),
    )


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------


def _resolve_mode(mode: Any, M: int, L: int) -> str:
    if mode not in _MODES:
        raise InputError(
            "mode must be 'auto', 'full' or 'fast'.",
            context=[("Argument", "mode"), ("Expected", "'auto' | 'full' | 'fast'"), ("Got", repr(mode))],
            remedy="pass mode='auto' (full checks for small M·L, fast otherwise).",
        )
    if mode == "auto":
        return "full" if M * L <= AUTO_FULL_MAX_ML else "fast"
    return mode


def check_natgrad(
    model: Any,
    data: Any = None,
    *,
    gamma: float = 1.0,
    xi_transform: Any = None,
    mode: str = "auto",
    rtol: float | None = None,
    atol: float | None = None,
    fisher_rtol: float | None = None,
    conjugate_rtol: float | None = None,
    fisher: bool | None = None,
    progress: bool = True,
) -> NatGradReport:
    """Check GPflow's natural-gradient step on ``model`` against independent oracles; never changes the model.

    The checks (see the module docstring for the maths): ``reproduction`` (against
    ``gpflow.optimizers.NaturalGradient`` on a copy), ``fisher_identity`` (F⁻¹·∇θL = ∇ηL, F = ∂η/∂θ),
    ``xi_forward_mode`` (ξ ≠ θ only), ``conjugate_optimality`` and ``conjugate_fixed_point`` (Gaussian
    likelihood, full mode), ``step_health`` with a suggested γ, and ``gradient_mapping``.

    Full mode forms explicit Jacobians (per latent GP, (M + M(M+1)/2)² entries), searches the γ grid and runs the
    conjugate checks; fast mode compiles the step, GPflow's step and a matrix-free Fisher check with tf.function
    (cached per model, so a second call does not retrace) and skips the conjugate checks.

    Args:
        model: a ``gpflow.models.SVGP`` or ``gpflow.models.VGP`` (any likelihood, L ≥ 1, whitened or not),
            q_mu [M, L] and q_sqrt [L, M, M].
        data: (X [N, D], Y [N, P]) for models whose loss takes data (SVGP); None for VGP. For the conjugate
            checks pass the full batch.
        gamma: the step length γ > 0 to check.
        xi_transform: a ``gpflow.optimizers.XiTransform`` instance; None means ``XiNat()``.
        mode: "auto" (full when M·L ≤ 50), "full" or "fast".
        rtol, atol, fisher_rtol, conjugate_rtol: override :func:`natgrad_tolerances` for the model's dtype.
        fisher: run the Fisher-identity check in fast mode (it costs about one more natural-gradient step);
            None: when M ≤ :data:`FAST_FISHER_MAX_M`. Full mode always runs it.
        progress: show a progress bar (on a terminal) in full mode.

    Returns:
        A frozen :class:`NatGradReport`; ``report.passed`` is the verdict. Failed checks never raise.

    Raises:
        UnsupportedModelError: not an SVGP/VGP-like model, or q_diag=True.
        InputError: bad data, gamma, mode or xi_transform.

    Warns:
        UserWarning: q_mu or q_sqrt has a transform for which GPflow's gradient mapping is wrong.

    Example:
        >>> from natgrad_diag.demo import make_model
        >>> model, data = make_model("svgp", "gaussian", num_inducing=5)
        >>> check_natgrad(model, data).passed
        True
    """
    from natgrad_diag.demo import dtype_context
    from natgrad_diag.progress import progress_bar
    from natgrad_diag.natgrad.trace import _validate_gamma, resolve_xi_transform

    _validate_model(model)
    xi = resolve_xi_transform(xi_transform)
    g = _validate_gamma(gamma)
    np_dtype = np.dtype(model.q_mu.dtype.as_numpy_dtype)
    M, L = int(model.q_mu.shape[0]), int(model.q_mu.shape[1])
    resolved = _resolve_mode(mode, M, L)
    d_tol = natgrad_tolerances(np_dtype)
    tol = Tolerances(
        rtol=d_tol.rtol if rtol is None else float(rtol),
        atol=d_tol.atol if atol is None else float(atol),
        fisher_rtol=d_tol.fisher_rtol if fisher_rtol is None else float(fisher_rtol),
        conjugate_rtol=d_tol.conjugate_rtol if conjugate_rtol is None else float(conjugate_rtol),
    )
    with dtype_context(np_dtype):
        tf_data = _validate_data(model, data, np_dtype)
        ctx = _Ctx(model=model, data=tf_data, xi=xi, gamma=g, mode=resolved, tol=tol, np_dtype=np_dtype, M=M, L=L)
        ctx.fisher = resolved == "full" or (M <= FAST_FISHER_MAX_M if fisher is None else bool(fisher))
        n_stages = 6 + (2 if resolved == "full" else 0) + (len(GAMMA_GRID) if resolved == "full" else 0)
        with progress_bar(n_stages if resolved == "full" else None, "natgrad check", enabled=progress and resolved == "full") as advance:
            return _run_checks(ctx, advance)


def _run_checks(ctx: _Ctx, advance: Any) -> NatGradReport:
    import gpflow
    from gpflow.optimizers import XiNat

    model = ctx.model
    engine = _fast_engine(model, ctx.xi, ctx.data is not None, ctx.fisher) if ctx.mode == "fast" else None
    fast_out: dict[str, Any] = {}
    if engine is None:
        step = _take_step_full(ctx)
    else:
        step, fast_out = _take_step_fast(ctx, engine)
    advance()
    if not _finite(step.loss, step.g_mu, step.g_sq):
        f32 = ctx.np_dtype == np.float32
        msg = (
            "the training loss or its gradient is not finite at the current parameters"
            + (" — in float32 this is usually a failed Cholesky of K or Kuu (GPflow's jitter is too small for float32); "
               "use float64 or raise gpflow.config's jitter" if f32 else "; the model is already broken before any step")
        )  # fmt: skip
        return _report(ctx, step, None, None, (), msg, [Check(name="finite_gradients", claim="the loss and its gradients are finite", passed=False, detail=msg)])

    # (a) reproduction against GPflow's optimizer on a copy
    if engine is None:
        gp_mu, gp_sq, gp_err = _gpflow_step_full(ctx)
        scratch = gpflow.utilities.deepcopy(model)
        loss_after = None
    else:
        gp_err = fast_out.get("gp_error", "")
        gp_mu, gp_sq = fast_out.get("gp_q_mu"), fast_out.get("gp_q_sqrt")
        if gp_err:
            gp_mu = gp_sq = None
        la = fast_out.get("loss_after")
        loss_after = float(la) if la is not None and np.isfinite(la) and not step.error else None
        scratch = engine.scratch
    ctx.checks.append(_check_reproduction(ctx, step, gp_mu, gp_sq, gp_err))
    advance()

    # (b) Fisher identity, and the ξ forward-mode product
    _fill_direction(ctx, step)
    if not ctx.fisher:
        ctx.skipped.append(("fisher_identity", f"fast mode skips it for M > {FAST_FISHER_MAX_M} (it costs about one more "
                            "step); pass fisher=True, or run mode='full' on a smaller model"))  # fmt: skip
    elif step.dL_deta1 is None:
        ctx.skipped.append(("fisher_identity", "∂L/∂η could not be computed at the current q(u)"))
    elif ctx.mode == "full":
        from natgrad_diag.exceptions import MemoryLimitError

        try:
            ctx.checks.append(_check_fisher_full(ctx, step, advance))
        except MemoryLimitError as e:
            c = _check_fisher_fast(ctx, step, None, {})
            note = f"the explicit F would exceed the memory limit ({e.detail}); checked matrix-free instead"
            ctx.checks.append(Check(c.name, c.claim, c.passed, c.max_abs_error, c.tolerance, note))
    else:
        ctx.checks.append(_check_fisher_fast(ctx, step, engine, fast_out))
    if not isinstance(ctx.xi, XiNat):
        if step.nat_dL_xi1 is None:
            ctx.skipped.append(("xi_forward_mode", "GPflow's product could not be computed (the step failed)"))
        else:
            ctx.checks.append(_check_xi_forward(ctx, step))
    advance()

    # (c) conjugate optimality
    why_not = _conjugate_applicable(ctx)
    if why_not:
        ctx.skipped.append(("conjugate_optimality", why_not))
    elif ctx.mode == "fast":
        ctx.skipped.append(("conjugate_optimality", "skipped in fast mode (two more steps and a collapsed bound); run mode='full'"))
    else:
        ctx.checks.extend(_check_conjugate(ctx))
    advance()

    # (d) step health and the suggested gamma
    healthy, why, nums = _health(step.new_q_mu, step.new_q_sqrt, ctx.np_dtype)
    if step.error:
        healthy, why = False, step.error
    if healthy and loss_after is None:
        loss_after = _loss_at(ctx, scratch, step.new_q_mu, step.new_q_sqrt)
        if loss_after is None:
            healthy, why = False, "the loss after the step is not finite"
    if engine is not None and not (healthy and loss_after is not None and loss_after < step.loss):
        engine.sync(model)  # the grid search evaluates the loss on the scratch copy
    suggested, trials = _suggest(ctx, scratch, step, healthy, loss_after if healthy else None, advance)
    ctx.numbers.extend(nums.items())
    f32_note = " In float32 the Cholesky factorisations of the step are fragile: try float64." if ctx.np_dtype == np.float32 and not healthy else ""
    hint = f" Suggested gamma: {suggested:g}." if suggested is not None else " No gamma of the grid gives a healthy step that lowers the loss."
    if healthy:
        change = loss_after - step.loss
        claim = f"the step with gamma = {ctx.gamma:g} keeps q(u) valid: finite, q_sqrt lower-triangular with a positive diagonal, S positive definite"
        detail = f"loss {step.loss!r} → {loss_after!r} ({'lower' if change < 0 else 'HIGHER'} by {format_number(abs(change))}).{hint}"
    else:
        claim = f"the step with gamma = {ctx.gamma:g} keeps q(u) valid"
        detail = f"{why.rstrip('.')}.{f32_note}{hint}"
    ctx.checks.append(Check(name="step_health", claim=claim, passed=bool(healthy), detail=detail))
    advance()

    # (e) gradient mapping
    ctx.checks.append(_check_gradient_mapping(ctx, step))
    advance()
    return _report(ctx, step, loss_after if healthy else None, suggested, trials, "" if healthy else why, [])


def _report(ctx: _Ctx, step: _Step, loss_after: float | None, suggested: float | None, trials: tuple[GammaTrial, ...], step_error: str, extra: list[Check]) -> NatGradReport:
    import gpflow

    m = ctx.model
    if isinstance(m, gpflow.models.SVGP):
        N = int(ctx.data[0].shape[0])
    elif hasattr(m, "data"):
        N = int(m.data[0].shape[0])
    else:
        N = None
    return NatGradReport(
        model_name=type(m).__name__,
        likelihood=type(m.likelihood).__name__,
        num_inducing=ctx.M,
        num_latent=ctx.L,
        num_data=N,
        dtype=np.dtype(ctx.np_dtype).name,
        whiten=bool(getattr(m, "whiten", True)),
        xi_transform=type(ctx.xi).__name__,
        gamma=ctx.gamma,
        mode=ctx.mode,
        loss_before=step.loss if np.isfinite(step.loss) else None,
        loss_after=loss_after,
        suggested_gamma=suggested,
        step_error=step_error,
        gamma_trials=trials,
        skipped=tuple(ctx.skipped),
        warnings=tuple(ctx.warnings),
        numbers=tuple((k, float(v)) for k, v in ctx.numbers),
        checks=tuple(extra + ctx.checks),
        new_q_mu=step.new_q_mu if not step.error else None,
        new_q_sqrt=step.new_q_sqrt if not step.error else None,
        dL_deta1=step.dL_deta1,
        dL_deta2=step.dL_deta2,
    )


def assert_natgrad(model: Any, data: Any = None, **kwargs: Any) -> NatGradReport:
    """:func:`check_natgrad`, raising :class:`NatGradCheckError` if any check fails; returns the report otherwise.

    Raises:
        NatGradCheckError: names each failed check with its numbers and tolerance.
    """
    report = check_natgrad(model, data, **kwargs)
    if not report.passed:
        failed = [c for c in report.checks if not c.passed]
        raise NatGradCheckError(
            f"{len(failed)} of {len(report.checks)} check(s) failed on {report.model_name} "
            f"({report.xi_transform}, gamma = {report.gamma:g}).",
            context=[(c.name, _describe(c)) for c in failed],
            remedy=_remedy(failed, report),
        )
    return report


def _describe(c: Check) -> str:
    nums = ""
    if c.max_abs_error is not None:
        nums = f" (max abs error {format_number(c.max_abs_error)}"
        nums += f" > tolerance {format_number(c.tolerance)})" if c.tolerance is not None else ")"
    return f"{c.claim}{nums}" + (f"\n{c.detail}" if c.detail else "")


def _remedy(failed: list[Check], report: NatGradReport) -> str:
    names = {c.name for c in failed}
    if "step_health" in names or "finite_gradients" in names:
        if report.suggested_gamma is not None:
            return f"use gamma = {report.suggested_gamma:g} (the largest healthy step of the grid that lowers the loss)."
        return "use a smaller gamma, or float64 if you are in float32."
    if "gradient_mapping" in names:
        return "give q_mu no transform and q_sqrt gpflow.utilities.triangular(), as GPflow's models do."
    return "print the report (str(check_natgrad(...))) for every number; report a reproduction mismatch as a bug."


def assert_natgrad_step_matches_gpflow(
    model: Any,
    data: Any = None,
    *,
    gamma: float = 1.0,
    xi_transform: Any = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> Check:
    """Assert that natgrad-diag's step equals the one ``gpflow.optimizers.NaturalGradient`` applies.

    GPflow's optimizer runs ``minimize`` on a deep copy of ``model``; natgrad-diag's step is
    :func:`natgrad_diag.natgrad_trace` on the model's own parameters. The model is not changed.

    Args:
        model: an SVGP or VGP (see :func:`check_natgrad`).
        data: (X, Y) for SVGP, None for VGP.
        gamma: the step length γ > 0.
        xi_transform: a ``gpflow.optimizers.XiTransform`` instance; None means ``XiNat()``.
        atol, rtol: |ours − GPflow's| ≤ atol + rtol·max|GPflow's| (default 1e-10 each in float64, 1e-4 in float32).

    Returns:
        The passing ``reproduction`` :class:`~natgrad_diag.report.records.Check`.

    Raises:
        NatGradCheckError: the steps differ, or only one of them fails.
        UnsupportedModelError, InputError: as :func:`check_natgrad`.
    """
    from natgrad_diag.demo import dtype_context
    from natgrad_diag.natgrad.trace import _validate_gamma, resolve_xi_transform

    _validate_model(model)
    xi = resolve_xi_transform(xi_transform)
    g = _validate_gamma(gamma)
    np_dtype = np.dtype(model.q_mu.dtype.as_numpy_dtype)
    d = natgrad_tolerances(np_dtype)
    tol = Tolerances(rtol=d.rtol if rtol is None else float(rtol), atol=d.atol if atol is None else float(atol),
                     fisher_rtol=d.fisher_rtol, conjugate_rtol=d.conjugate_rtol)  # fmt: skip
    with dtype_context(np_dtype):
        tf_data = _validate_data(model, data, np_dtype)
        M, L = int(model.q_mu.shape[0]), int(model.q_mu.shape[1])
        ctx = _Ctx(model=model, data=tf_data, xi=xi, gamma=g, mode="full", tol=tol, np_dtype=np_dtype, M=M, L=L)
        step = _take_step_full(ctx)
        if not _finite(step.loss, step.g_mu, step.g_sq):
            step.error = step.error or "the loss or its gradient is not finite"
        gp_mu, gp_sq, gp_err = _gpflow_step_full(ctx)
        check = _check_reproduction(ctx, step, gp_mu, gp_sq, gp_err)
    if not check.passed:
        raise NatGradCheckError(
            f"natgrad-diag's step and GPflow's NaturalGradient differ on {type(model).__name__} ({type(xi).__name__}, gamma = {g:g}).",
            context=[("Check", check.name), ("Expected", "GPflow's new q_mu, q_sqrt"), ("Actual", _describe(check))],
            remedy="if the difference is just above the tolerance, pass a larger atol; otherwise report it with the model.",
        )
    return check


def check_natgrad_cli(
    *,
    model: str = "svgp",
    likelihood: str = "gaussian",
    num_inducing: int = 10,
    num_latent: int = 1,
    num_data: int = 50,
    xi: str = "nat",
    gamma: float = 1.0,
    dtype: str = "float64",
    whiten: bool = True,
    mode: str = "auto",
    seed: int = 0,
) -> NatGradReport:
    """``natgrad-diag check``: build a seeded demo model (:func:`natgrad_diag.demo.make_model`) and check it."""
    from gpflow.optimizers import XiNat, XiSqrtMeanVar

    from natgrad_diag.demo import make_model

    if xi not in ("nat", "meanvar"):
        raise InputError(
            "xi must be 'nat' or 'meanvar'.",
            context=[("Argument", "--xi"), ("Expected", "nat | meanvar"), ("Got", repr(xi))],
            remedy="pass --xi nat (GPflow's default) or --xi meanvar.",
        )
    demo = make_model(
        model, likelihood, num_inducing=num_inducing, num_latent=num_latent, num_data=num_data,
        whiten=whiten, dtype=dtype, seed=seed,
    )  # fmt: skip
    data = demo.data if demo.name == "svgp" else None
    return check_natgrad(demo.model, data, gamma=gamma, xi_transform=XiNat() if xi == "nat" else XiSqrtMeanVar(), mode=mode)
