"""The error bounds of the natural-gradient checks: condition numbers measured on the model, the tolerances read from
the package's one policy (:mod:`natgrad_diag.tolerance`), and the array helpers they use.

Every check's bound is c·ε·κ·scale plus the policy's floor (:func:`natgrad_diag.tolerance.rounding_bound`; Higham 2002,
§7.1, §10.1). The condition numbers are κ(S) before and after the step, κ(Kuu) and κ(F) (measured or estimated).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.report.records import Check, format_number
from natgrad_diag.step.lapack import one_blas_thread
from natgrad_diag.tolerance import default_tolerance, eps, rounding_bound, validate_tolerance
from natgrad_diag.typing import Array

__all__ = ["Before", "Bound", "Conditioning", "FISHER_WIDENING", "MEANINGFUL", "ROUNDING_FACTOR", "Tolerances", "before_step", "bounded_check", "factor_extremes", "finite", "fisher_condition_estimate", "kappa", "kappa_eta", "maxabs", "measure_conditioning", "natgrad_bound", "natgrad_tolerances", "new_extremes", "scale", "with_overrides"]


def maxabs(a: Any) -> float:
    """max |a| as a float: 0 for an empty array, inf when anything is not finite."""
    a = np.asarray(a, dtype=np.float64)
    return float(np.max(np.abs(a), initial=0.0)) if np.all(np.isfinite(a)) else float("inf")


def scale(arrays: Sequence[Any]) -> float:
    """The largest :func:`maxabs` of several arrays (the scale a relative tolerance multiplies)."""
    return max(maxabs(a) for a in arrays)


def finite(*arrays: Any) -> bool:
    """Whether every entry of every array is finite."""
    return all(np.all(np.isfinite(np.asarray(a))) for a in arrays)


def _eigvalsh(a: Array) -> Array:
    """The eigenvalues of one symmetric matrix [M, M] given by its lower triangle, ascending (LAPACK's ``syevd``)."""
    import scipy.linalg

    return np.asarray(scipy.linalg.eigvalsh(a, lower=True, overwrite_a=True, check_finite=False, driver="evd"))


def _ratio(lo: Array, hi: Array) -> Array:
    return np.where(lo > 0, hi / np.where(lo > 0, lo, 1.0), np.inf)


def kappa(matrices: Any) -> tuple[float, float, float]:
    """(worst κ, smallest λmin, largest λmax) over symmetric matrices [..., M, M] (κ = λmax/λmin; ∞ if λmin ≤ 0).

    The lower triangle is read (symmetric up to rounding); callers limit BLAS's threads (``one_blas_thread``).
    """
    a = np.asarray(matrices, np.float64)
    a = a.reshape((-1,) + a.shape[-2:])
    if not np.all(np.isfinite(a)):
        return float("inf"), float("nan"), float("nan")
    lam = np.stack([_eigvalsh(np.array(m, order="F")) for m in a])  # a copy: LAPACK overwrites its input
    lo, hi = lam[:, 0], lam[:, -1]
    return float(_ratio(lo, hi).max()), float(lo.min()), float(hi.max())


def factor_extremes(factors: Any) -> tuple[Array, Array]:
    """λmin and λmax [L] of S = C Cᵀ for lower-triangular factors C [L, M, M], without forming C Cᵀ.

    C Cᵀ and Cᵀ C have the same eigenvalues (the squared singular values of C), and LAPACK's ``lauum`` forms
    Cᵀ C for a triangular C in M³/3 flops (a general product takes 2M³), so λ(S) costs one ``lauum`` and one
    symmetric eigenvalue solve per latent GP. Both products carry the same rounding, ε·‖C‖² in absolute terms.
    A factor that is not lower triangular (a user's own pair) is multiplied out instead; one that is not finite gets
    NaN. As :func:`kappa`, in the caller's BLAS threads.
    """
    import scipy.linalg

    c = np.asarray(factors, np.float64)
    c = c.reshape((-1,) + c.shape[-2:])
    lo, hi = np.full(c.shape[0], np.nan), np.full(c.shape[0], np.nan)
    lauum = scipy.linalg.get_lapack_funcs("lauum", (c,))
    upper = np.triu_indices(c.shape[-1], 1)
    for i, ci in enumerate(c):
        if not np.all(np.isfinite(ci)):
            continue
        # not triangular: form C Cᵀ; else Cᵀ C in the lower triangle of a copy (ci is not overwritten)
        lam = _eigvalsh(np.asfortranarray(ci @ ci.T) if np.any(ci[upper]) else lauum(ci, lower=1)[0])
        lo[i], hi[i] = lam[0], lam[-1]
    return lo, hi


def fisher_condition_estimate(q_mu: Array, q_sqrt: Array, extremes: tuple[Array, Array] | None = None) -> float:
    """An upper bound on κ(F), F = ∂η/∂θ in the explicit Fisher check's coordinates, without forming F (fast mode).

    F's quadratic form at a direction (a, B), B symmetric, is Var(aᵀx + xᵀBx) under x ~ N(m, S), that is
    (a + 2Bm)ᵀS(a + 2Bm) + 2·tr(BSBS). With λ(S) in [lo, hi] and μ = ‖m‖ per latent GP, on ‖a‖² + ‖B‖²_F = 1 it lies
    between min(lo/2, 2lo²/(1 + 8μ²)) (from ‖a‖ ≤ ‖a + 2Bm‖ + 2μ‖B‖) and hi·(1 + 4μ²) + 2hi² (Cauchy–Schwarz).
    The check's coordinates (θ₁, vech θ₂) give F = DᵀGD with D the duplication, 1 ≤ ‖Dv‖²/‖v‖² ≤ 2, which widens
    the ratio by at most 2; F is block-diagonal over the L latent GPs, so the bound is 2·(largest upper)/(smallest
    lower). ``extremes`` are λmin(S), λmax(S) [L] when already known (:func:`factor_extremes`).

    Examples:
        >>> fisher_condition_estimate(np.zeros((2, 1)), np.eye(2)[None])  # m = 0, S = I: F = diag(1, 1, 2, 4, 2), κ = 4
        12.0
    """
    lo, hi = (np.asarray(a, np.float64) for a in (extremes if extremes is not None else factor_extremes(q_sqrt)))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a q(u) far out (a diverging walk): ∞
        mu2 = np.sum(np.reshape(np.asarray(q_mu, np.float64), (-1, lo.shape[0])) ** 2, axis=0)  # ‖m_l‖² [L]
        upper = float(np.max(hi * (1.0 + 4.0 * mu2) + 2.0 * hi**2))
        lower = float(np.min(np.minimum(lo / 2.0, 2.0 * lo**2 / (1.0 + 8.0 * mu2))))
        bound = 2.0 * upper / lower if lower > 0 else np.inf
    return float(bound) if bound == bound else np.inf


@dataclass(frozen=True)
class Conditioning:
    """The condition numbers behind the checks' rounding terms.

    Attributes:
        kappa_S: worst κ(S) over the L latent GPs, S = q_sqrt q_sqrtᵀ [L, M, M], before the step.
        kappa_S_new: the same after the step (None when the step failed).
        cancellation: max(1, λmin(S_new)/λmin(S)) = ‖θ₂‖/‖θ₂_new‖ (θ₂ = −½S⁻¹): how many digits the step's
            θ₂ − γ·∂L/∂η₂ cancels (1e5 on GPflow's #767 state, q_sqrt = 1e-3·I).
        kappa_Kuu: κ(Kuu + jitter·I) (K(X) + jitter·I for a VGP); None when it could not be formed.
        min_eig_Kuu: λmin of that matrix (None with it).
        kappa_F: κ(F), F = ∂η/∂θ: measured in full mode (``kappa_F_measured``), else :func:`fisher_condition_estimate`.
        kappa_eta: worst (λmax(S) + ‖m‖²)/λmin(S) over the L latent GPs: the condition of GPflow's route through the
            expectation parameters, which recovers S = η₂ − η₁η₁ᵀ with η₂ = S + m mᵀ and so loses ‖η₂‖/λmin(S)
            digits to cancellation (None: not measured, taken as κ(S)).
    """

    kappa_S: float
    kappa_S_new: float | None
    cancellation: float
    kappa_Kuu: float | None
    min_eig_Kuu: float | None
    kappa_F: float
    kappa_F_measured: bool = False
    kappa_eta: float | None = None

    @property
    def step_condition(self) -> float:
        """κ_η·κ(S_new)·cancellation: the amplification of rounding in GPflow's new q_mu, q_sqrt.

        :attr:`kappa_eta` (≥ κ(S)) in GPflow's S, so in ∂L/∂η and θ; ``cancellation`` in θ_new = θ − γ·∂L/∂η; κ(S_new)
        inverting θ₂_new to S_new and q_sqrt_new (GPflow's #767 state, q_sqrt = 1e-3·I, ‖m‖ ≈ 1: κ_η ≈ 10⁶, κ(S) = 1).
        """
        return max(self.kappa_S, self.kappa_eta or 0.0) * (self.kappa_S_new or 1.0) * self.cancellation

    def numbers(self) -> tuple[tuple[str, float], ...]:
        rows = (
            ("κ(S) (worst latent GP)", self.kappa_S),
            ("κ_η = (λmax(S) + ‖m‖²)/λmin(S)", self.kappa_eta),
            ("κ(S) after the step", self.kappa_S_new),
            ("cancellation λmin(S_new)/λmin(S)", None if self.kappa_S_new is None else self.cancellation),
            ("κ(Kuu + jitter·I)", self.kappa_Kuu),
            ("κ(F) estimate", None if self.kappa_F_measured else self.kappa_F),  # a measured κ(F) is already cond(F)
        )
        return tuple((name, value) for name, value in rows if value is not None)


def _kuu(model: Any) -> Array | None:
    """Kuu + jitter·I (SVGP-like) or K(X) + jitter·I (VGP), as a stack of square matrices; None if not formed."""
    import gpflow

    jitter = gpflow.config.default_jitter()
    try:
        if isinstance(model, gpflow.models.VGP):
            multi = {"full_output_cov": False} if isinstance(model.kernel, gpflow.kernels.MultioutputKernel) else {}
            K: Array = np.asarray(model.kernel(model.data[0], full_cov=True, **multi)) + jitter * np.eye(model.data[0].shape[0])
        else:
            K = np.asarray(gpflow.covariances.Kuu(model.inducing_variable, model.kernel, jitter=jitter))
    except Exception:  # noqa: BLE001 - an exotic kernel or inducing variable: κ(Kuu) is then not reported
        return None
    if K.ndim == 4:  # [M, L, M, L]
        return K.reshape(K.shape[0] * K.shape[1], -1)[None]
    return K if K.ndim == 3 else K[None]


def kappa_eta(q_mu: Array, lo_S: Array, hi_S: Array) -> float:
    """The worst (λmax(S) + ‖m‖²)/λmin(S) over the L latent GPs (:attr:`Conditioning.kappa_eta`), from q_mu [M, L]
    and λmin(S), λmax(S) [L]."""
    m2 = np.sum(np.reshape(q_mu, (-1, lo_S.shape[0])) ** 2, axis=0)  # ‖m_l‖² [L]
    return float(_ratio(lo_S, hi_S + m2).max())


@dataclass(frozen=True)
class Before:
    """What :func:`measure_conditioning` needs from before the step: λ(S) per latent GP [L], κ(Kuu), λmin(Kuu) (None
    without a model), κ_η and the estimate of κ(F)."""

    lo_S: Array
    hi_S: Array
    kappa_Kuu: float | None
    min_eig_Kuu: float | None
    kappa_eta: float
    kappa_F: float

    def after(self, new_extremes: tuple[Array | None, Array | None]) -> Conditioning:
        """The :class:`Conditioning`, given λ(S_new)'s extremes (:func:`new_extremes`; (None, None): no new factor)."""
        lo_S, hi_S, (lo_N, hi_N) = self.lo_S, self.hi_S, new_extremes
        k_S, lo = float(_ratio(lo_S, hi_S).max()), float(lo_S.min())
        k_new, cancel = None, 1.0
        if lo_N is not None and hi_N is not None:
            k_new, lo_new = float(_ratio(lo_N, hi_N).max()), float(lo_N.min())
            cancel = max(1.0, lo_new / lo) if lo > 0 and lo_new > 0 else float("inf")
        return Conditioning(k_S, k_new, float(cancel), self.kappa_Kuu, self.min_eig_Kuu, self.kappa_F, False, self.kappa_eta)


def before_step(model: Any, q_mu: Array, q_sqrt: Array) -> Before:
    """κ(Kuu) (``model`` None: not measured), λ(S) from its factor (:func:`factor_extremes`, in a second thread: LAPACK
    releases the GIL), κ_η and the κ(F) estimate; the eigenvalue solves run in one BLAS thread, so the numbers do not
    depend on the split. Needs nothing from the step: a check computes it while the gradients are taken."""
    q_mu, q_sqrt = np.asarray(q_mu, np.float64), np.asarray(q_sqrt, np.float64)
    with one_blas_thread(), ThreadPoolExecutor(1) as pool:
        before = pool.submit(factor_extremes, q_sqrt)
        K = _kuu(model) if model is not None else None
        k_K, lo_K = (kappa(K)[:2] if K is not None else (None, None))
        lo_S, hi_S = before.result()
    return Before(lo_S, hi_S, k_K, lo_K, kappa_eta(q_mu, lo_S, hi_S), fisher_condition_estimate(q_mu, q_sqrt, (lo_S, hi_S)))


def new_extremes(new_q_sqrt: Array | None) -> tuple[Array | None, Array | None]:
    """λmin, λmax of S_new per latent GP from the step's factor, in one BLAS thread; (None, None) for none or a
    non-finite one."""
    if new_q_sqrt is None or not finite(new_q_sqrt):
        return None, None
    with one_blas_thread():
        return factor_extremes(new_q_sqrt)


def measure_conditioning(model: Any, q_mu: Array, q_sqrt: Array, new_q_sqrt: Array | None) -> Conditioning:
    """The :class:`Conditioning` of a step: :func:`before_step`, then :func:`new_extremes` of the step's factor."""
    return before_step(model, q_mu, q_sqrt).after(new_extremes(new_q_sqrt))


#: The constant c of every rounding term c·ε·κ·scale. A Cholesky factorisation, a triangular solve or a product of
#: M×M matrices has a backward error of at most about M·ε per entry (Higham 2002, Theorems 8.5 and 10.3); the
#: checks chain a handful of them at M up to a few hundred, and the norm-wise κ already takes the worst direction,
#: so c = 100 is the margin of a few such steps.
ROUNDING_FACTOR = 100.0

#: A bound whose rounding term alone exceeds this fraction of the compared quantity's scale cannot tell a right
#: answer from a wrong one: the check is then "warn" (inconclusive), not "pass".
MEANINGFUL = 1e-2

#: fisher_rtol = FISHER_WIDENING[dtype] · rtol: the Fisher identity compares a solve (or a closed-form product)
#: with an independent vector-Jacobian product, two routes with more rounding between them than an exact
#: reproduction; its condition-number term (100·ε·cond(F)) is added by the check itself.
FISHER_WIDENING = {"float64": 100.0, "float32": 10.0}


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
    """Default :class:`Tolerances` for ``dtype``, from ``default_tolerance(dtype, "exact")``.

    rtol is the policy's exact rtol (10⁴·ε-ish: only rounding separates two exact routes). atol is the same
    number, an absolute floor at the unit scale of q(u)'s entries (the policy's atol is for references that are
    exactly zero; the step's entries are O(1)). Any dtype other than float64 gets the float32 values.

    Examples:
        >>> natgrad_tolerances("float64")
        Tolerances(rtol=1e-10, atol=1e-10, fisher_rtol=1e-08, conjugate_rtol=1e-10)
        >>> natgrad_tolerances("float32").fisher_rtol
        0.001
    """
    name = "float64" if np.dtype(dtype) == np.float64 else "float32"
    rtol = default_tolerance(name, "exact").rtol
    return Tolerances(rtol=rtol, atol=rtol, fisher_rtol=FISHER_WIDENING[name] * rtol, conjugate_rtol=rtol)


def with_overrides(base: Tolerances, **overrides: float | None) -> Tolerances:
    """``base`` with every override that is not None, each a finite number ≥ 0 (an :class:`InputError` naming it
    otherwise: ``atol=inf`` would pass every check, a negative or NaN one fail a correct model)."""
    values = {k: (getattr(base, k) if v is None else validate_tolerance(k, v)) for k, v in overrides.items()}
    return Tolerances(**{**base.__dict__, **values})


@dataclass(frozen=True)
class Bound:
    """The bound a check compares its error with: ``total = rounding + user``, the rounding term
    ``factor · ε · condition · scale`` (``factor`` = :data:`ROUNDING_FACTOR` unless a check states another) plus the
    user's (or the policy's) tolerance ``user = atol + rtol · scale``, ``scale`` the size of the compared quantity
    and ``condition_name`` how κ was formed (e.g. "κ(F)")."""

    rounding: float
    user: float
    scale: float
    condition: float
    condition_name: str
    dtype: str
    factor: float = ROUNDING_FACTOR

    @property
    def total(self) -> float:
        return self.rounding + self.user

    @property
    def inconclusive(self) -> bool:
        """True when the rounding term alone exceeds :data:`MEANINGFUL` of the scale (or is not finite)."""
        return not np.isfinite(self.rounding) or self.rounding > MEANINGFUL * max(self.scale, float(np.finfo(np.float64).tiny))

    def describe(self) -> str:
        """The bound's parts, as a sentence for a check's detail."""
        return (
            f"bound {format_number(self.total)} = rounding {format_number(self.rounding)} "
            f"({self.factor:g}·ε·κ·scale, {self.condition_name} = {format_number(self.condition)}, ε = "
            f"{format_number(eps(self.dtype))}, scale {format_number(self.scale)}) + tolerance {format_number(self.user)}"
        )

    def needed(self) -> str:
        """What precision a verdict would need, for an inconclusive bound."""
        kappa_max = MEANINGFUL / self.factor
        text = (
            f"inconclusive: the rounding term alone is {format_number(self.rounding / max(self.scale, 1e-300))} of the "
            f"scale (more than {MEANINGFUL:g}), so this check cannot tell right from wrong here; a verdict needs "
            f"{self.condition_name}·ε < {kappa_max:g}"
        )
        if self.dtype != "float64" and self.condition * eps("float64") < kappa_max:
            return text + ": use float64."
        return text + ": use float64 with a larger jitter, or start from a better-conditioned q(u) (e.g. q_sqrt = I)."


def natgrad_bound(
    dtype: Any, *, condition: float, condition_name: str, scale: float, rtol: float, atol: float, factor: float = ROUNDING_FACTOR
) -> Bound:
    """:class:`Bound` with rounding term ``rounding_bound(dtype, condition=κ, scale=scale, factor=factor)``."""
    name = "float64" if np.dtype(dtype) == np.float64 else "float32"
    condition = float(condition) if np.isfinite(condition) else float("inf")
    rounding = rounding_bound(name, condition=condition, scale=scale, factor=factor) if np.isfinite(condition) else float("inf")
    return Bound(rounding, atol + rtol * scale, float(scale), condition, condition_name, name, factor)


def bounded_check(name: str, claim: str, err: float, bound: Bound, detail: str = "") -> Check:
    """A :class:`Check` of ``err`` against ``bound``: "fail" beyond it, "warn" within an inconclusive bound or beyond
    one whose first-order rounding term is void (factor·ε·κ ≥ 1), else "pass".

    The detail carries the bound's parts, and for "warn" the precision a verdict would need.
    """
    # a first-order bound holds only while factor·ε·κ < 1: beyond, exceeding it shows no error (Higham 2002, §7.1)
    valid = bound.factor * eps(bound.dtype) * bound.condition < 1
    status = "fail" if not err <= bound.total and valid else ("warn" if bound.inconclusive else "pass")
    parts = [detail, bound.describe(), bound.needed() if status == "warn" else ""]
    return Check(name=name, claim=claim, status=status, max_abs_error=float(err), tolerance=bound.total, detail="; ".join(filter(None, parts)))
