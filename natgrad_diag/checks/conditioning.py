"""Condition numbers measured on the model: κ(S) before and after the step, κ(Kuu), κ(F) (measured or estimated).

They set the rounding term of every natural-gradient check's bound (:mod:`natgrad_diag.checks.tolerances`):
a backward-stable computation with condition number κ carries a forward error of order ε·κ relative to the
scale of its result (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §1.6, §7.1, §10.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.step.lapack import one_blas_thread
from natgrad_diag.typing import Array

__all__ = ["Conditioning", "factor_extremes", "fisher_condition_estimate", "kappa", "measure_conditioning"]


def _eigvalsh(a: Array) -> Array:
    """The eigenvalues of one symmetric matrix [M, M] given by its lower triangle, ascending (LAPACK's ``syevd``)."""
    import scipy.linalg

    eigenvalues: Array = scipy.linalg.eigvalsh(a, lower=True, overwrite_a=True, check_finite=False, driver="evd")
    return eigenvalues


def _ratio(lo: Array, hi: Array) -> Array:
    return np.where(lo > 0, hi / np.where(lo > 0, lo, 1.0), np.inf)


def kappa(matrices: Any) -> tuple[float, float, float]:
    """(worst κ, smallest λmin, largest λmax) over symmetric matrices [..., M, M] (κ = λmax/λmin; ∞ if λmin ≤ 0).

    The lower triangle is read (the matrices are symmetric up to rounding).

    Examples:
        >>> kappa(np.diag([1.0, 4.0])[None])
        (4.0, 1.0, 4.0)
    """
    a = np.asarray(matrices, np.float64)
    a = a.reshape((-1,) + a.shape[-2:])
    if not np.all(np.isfinite(a)):
        return float("inf"), float("nan"), float("nan")
    with one_blas_thread():
        lam = np.stack([_eigvalsh(np.array(m, order="F")) for m in a])  # a copy: LAPACK overwrites its input
    lo, hi = lam[:, 0], lam[:, -1]
    return float(_ratio(lo, hi).max()), float(lo.min()), float(hi.max())


def factor_extremes(factors: Any) -> tuple[Array, Array]:
    """λmin and λmax [L] of S = C Cᵀ for lower-triangular factors C [L, M, M], without forming C Cᵀ.

    C Cᵀ and Cᵀ C have the same eigenvalues (the squared singular values of C), and LAPACK's ``lauum`` forms
    Cᵀ C for a triangular C in M³/3 flops (a general product takes 2M³), so λ(S) costs one ``lauum`` and one
    symmetric eigenvalue solve per latent GP. Both products carry the same rounding, ε·‖C‖² in absolute terms.
    A factor that is not lower triangular (a user's own pair) is multiplied out instead.

    Examples:
        >>> lo, hi = factor_extremes(np.array([[[2.0, 0.0], [0.0, 1.0]]]))
        >>> float(lo[0]), float(hi[0])
        (1.0, 4.0)
    """
    import scipy.linalg

    c = np.asarray(factors, np.float64)
    c = c.reshape((-1,) + c.shape[-2:])
    lo, hi = np.full(c.shape[0], np.nan), np.full(c.shape[0], np.nan)
    lauum = scipy.linalg.get_lapack_funcs("lauum", (c,))
    upper = np.triu_indices(c.shape[-1], 1)
    with one_blas_thread():
        for i, ci in enumerate(c):
            lo[i], hi[i] = _extremes_of_one(ci, lauum, upper)
    return lo, hi


def _extremes_of_one(ci: Array, lauum: Any, upper: Any) -> tuple[float, float]:
    """(λmin, λmax) of ci ciᵀ, NaN when ci is not finite (see :func:`factor_extremes`)."""
    if not np.all(np.isfinite(ci)):
        return float("nan"), float("nan")
    if np.any(ci[upper]):  # not triangular: form C Cᵀ
        lam = _eigvalsh(np.asfortranarray(ci @ ci.T))
    else:
        ctc, info = lauum(ci, lower=1)  # Cᵀ C in the lower triangle of a copy (ci is not overwritten)
        if info != 0:
            return float("nan"), float("nan")
        lam = _eigvalsh(ctc)
    return float(lam[0]), float(lam[-1])


def fisher_condition_estimate(q_mu: Array, q_sqrt: Array, extremes: tuple[Array, Array] | None = None) -> float:
    """An estimate of κ(F), F = ∂η/∂θ, without forming F (fast mode), worst over the L latent GPs.

    For one dimension F = [[s, 2ms], [2ms, 2s² + 4m²s]] (s the variance, m the mean), det F = 2s³, so
    κ(F) ≈ tr(F)²/det F = (s(1 + 4m²) + 2s²)²/(2s³). Per latent GP this takes s = λmax(S) in the trace, s = λmin(S)
    in the determinant and m = ‖m‖∞, never less than κ(S)² (the θ₂ block alone is S ⊗ S). ``extremes`` are
    λmin(S), λmax(S) [L] when already known (:func:`factor_extremes`).
    """
    lo_all, hi_all = extremes if extremes is not None else factor_extremes(q_sqrt)
    out = 1.0
    for l_ in range(q_sqrt.shape[0]):
        lo, hi = float(lo_all[l_]), float(hi_all[l_])
        k = float(_ratio(np.array(lo), np.array(hi)))
        m2 = float(np.max(np.abs(q_mu[:, l_]))) ** 2
        est = (hi * (1.0 + 4.0 * m2) + 2.0 * hi**2) ** 2 / (2.0 * lo**3) if lo > 0 else np.inf
        out = max(out, est, k**2)
    return float(out)


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
        kappa_F: κ(F), F = ∂η/∂θ: measured in full mode, else :func:`fisher_condition_estimate`.
        kappa_F_measured: whether ``kappa_F`` was measured on the explicit F.
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

        GPflow's step recovers S = η₂ − η₁η₁ᵀ from η₂ = S + m mᵀ, with relative error ε·κ_η, κ_η =
        (λmax(S) + ‖m‖²)/λmin(S) ≥ κ(S) (:attr:`kappa_eta`), and ∂L/∂η and θ = (S⁻¹m, −½S⁻¹) inherit it;
        θ_new = θ − γ·∂L/∂η loses the factor ``cancellation``; inverting θ₂_new back to S_new and q_sqrt_new
        amplifies by κ(S_new). (On GPflow's #767 state, q_sqrt = 1e-3·I and ‖m‖ ≈ 1, κ_η ≈ 10⁶ while κ(S) = 1,
        and GPflow's step is 2e-5 away from a 40-digit evaluation of the same formula; the closed form is 1e-11 away.)
        """
        return max(self.kappa_S, self.kappa_eta or 0.0) * (self.kappa_S_new or 1.0) * self.cancellation

    def numbers(self) -> tuple[tuple[str, float], ...]:
        out = [("κ(S) (worst latent GP)", self.kappa_S)]
        if self.kappa_eta is not None:
            out.append(("κ_η = (λmax(S) + ‖m‖²)/λmin(S)", self.kappa_eta))
        if self.kappa_S_new is not None:
            out += [("κ(S) after the step", self.kappa_S_new), ("cancellation λmin(S_new)/λmin(S)", self.cancellation)]
        if self.kappa_Kuu is not None:
            out.append(("κ(Kuu + jitter·I)", self.kappa_Kuu))
        if not self.kappa_F_measured:  # a measured κ(F) is already in the numbers as cond(F)
            out.append(("κ(F) estimate", self.kappa_F))
        return tuple(out)


def _kuu(model: Any) -> Array | None:
    """Kuu + jitter·I (SVGP-like) or K(X) + jitter·I (VGP), as a stack of square matrices; None if not formed."""
    import gpflow

    jitter = gpflow.config.default_jitter()
    try:
        if isinstance(model, gpflow.models.VGP):
            X = model.data[0]
            KX = model.kernel(X, full_cov=True) if not isinstance(model.kernel, gpflow.kernels.MultioutputKernel) else model.kernel(X, full_cov=True, full_output_cov=False)
            K = np.asarray(KX)
            n = K.shape[-1]
            K_jittered: Array = K + jitter * np.eye(n)
            return K_jittered
        K = np.asarray(gpflow.covariances.Kuu(model.inducing_variable, model.kernel, jitter=jitter))
    except Exception:  # noqa: BLE001 - an exotic kernel or inducing variable: κ(Kuu) is then not reported
        return None
    if K.ndim == 4:  # [M, L, M, L]
        M, L = K.shape[0], K.shape[1]
        return K.reshape(M * L, M * L)[None]
    stack: Array = K if K.ndim == 3 else K[None]
    return stack


def measure_conditioning(model: Any, q_mu: Array, q_sqrt: Array, new_q_sqrt: Array | None, kappa_F: float | None = None) -> Conditioning:
    """κ(S), κ(S_new), the cancellation, κ(Kuu) and κ(F) (``kappa_F`` when measured, else estimated).

    Each matrix is factored once: λ(S) and λ(S_new) from their factors (:func:`factor_extremes`), λ(Kuu) by one
    symmetric eigenvalue solve per matrix. At M = 1000 this takes about 0.15 s (numpy's general products and
    ``eigvalsh`` took 0.6 s).
    """
    q_mu, q_sqrt = np.asarray(q_mu, np.float64), np.asarray(q_sqrt, np.float64)
    lo_S, hi_S = factor_extremes(q_sqrt)
    k_S, lo = float(_ratio(lo_S, hi_S).max()), float(lo_S.min())
    m2 = np.sum(q_mu.reshape(-1, lo_S.shape[0]) ** 2, axis=0) if q_mu.size else np.zeros_like(lo_S)  # ‖m_l‖² [L]
    k_eta = float(_ratio(lo_S, hi_S + m2).max())
    k_new, cancel = None, 1.0
    if new_q_sqrt is not None and np.all(np.isfinite(new_q_sqrt)):
        lo_N, hi_N = factor_extremes(new_q_sqrt)
        k_new, lo_new = float(_ratio(lo_N, hi_N).max()), float(lo_N.min())
        cancel = max(1.0, lo_new / lo) if lo > 0 and lo_new > 0 else float("inf")
    K = _kuu(model) if model is not None else None
    k_K, lo_K = (kappa(K)[:2] if K is not None else (None, None))
    measured = kappa_F is not None and np.isfinite(kappa_F)
    k_F = float(kappa_F) if measured and kappa_F is not None else fisher_condition_estimate(q_mu, q_sqrt, (lo_S, hi_S))
    return Conditioning(k_S, k_new, float(cancel), k_K, lo_K, k_F, measured, k_eta)
