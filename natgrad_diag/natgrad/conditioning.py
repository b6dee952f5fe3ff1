"""Condition numbers measured on the model: κ(S) before and after the step, κ(Kuu), κ(F) (measured or estimated).

They set the rounding term of every natural-gradient check's bound (:mod:`natgrad_diag.natgrad.tolerances`):
a backward-stable computation with condition number κ carries a forward error of order ε·κ relative to the
scale of its result (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §1.6, §7.1, §10.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.typing import Array

__all__ = ["Conditioning", "fisher_condition_estimate", "kappa", "measure_conditioning"]


def kappa(matrices: Any) -> tuple[float, float, float]:
    """(worst κ, smallest λmin, largest λmax) over symmetric matrices [..., M, M] (κ = λmax/λmin; ∞ if λmin ≤ 0).

    Examples:
        >>> kappa(np.diag([1.0, 4.0])[None])
        (4.0, 1.0, 4.0)
    """
    a = np.asarray(matrices, np.float64)
    a = a.reshape((-1,) + a.shape[-2:])
    lam = np.linalg.eigvalsh(0.5 * (a + np.swapaxes(a, -1, -2)))
    lo, hi = lam[:, 0], lam[:, -1]
    ratios = np.where(lo > 0, hi / np.where(lo > 0, lo, 1.0), np.inf)
    return float(ratios.max()), float(lo.min()), float(hi.max())


def fisher_condition_estimate(q_mu: Array, q_sqrt: Array) -> float:
    """An estimate of κ(F), F = ∂η/∂θ, without forming F (fast mode), worst over the L latent GPs.

    For one dimension F = [[s, 2ms], [2ms, 2s² + 4m²s]] (s the variance, m the mean), det F = 2s³, so
    κ(F) ≈ tr(F)²/det F = (s(1 + 4m²) + 2s²)²/(2s³). Per latent GP this takes s = λmax(S) in the trace, s = λmin(S)
    in the determinant and m = ‖m‖∞, never less than κ(S)² (the θ₂ block alone is S ⊗ S).
    """
    out = 1.0
    for l_ in range(q_sqrt.shape[0]):
        S = q_sqrt[l_] @ q_sqrt[l_].T
        k, lo, hi = kappa(S[None])
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
    """

    kappa_S: float
    kappa_S_new: float | None
    cancellation: float
    kappa_Kuu: float | None
    min_eig_Kuu: float | None
    kappa_F: float
    kappa_F_measured: bool = False

    @property
    def step_condition(self) -> float:
        """κ(S)·κ(S_new)·cancellation: the amplification of rounding in the step's new q_mu, q_sqrt.

        θ = (S⁻¹m, −½S⁻¹) is formed with relative error ε·κ(S); θ_new = θ − γ·∂L/∂η loses the factor
        ``cancellation`` to cancellation; inverting θ₂_new back to S_new and q_sqrt_new amplifies by κ(S_new).
        """
        return self.kappa_S * (self.kappa_S_new or 1.0) * self.cancellation

    def numbers(self) -> tuple[tuple[str, float], ...]:
        out = [("κ(S) (worst latent GP)", self.kappa_S)]
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
            K = model.kernel(X, full_cov=True) if not isinstance(model.kernel, gpflow.kernels.MultioutputKernel) else model.kernel(X, full_cov=True, full_output_cov=False)
            K = np.asarray(K)
            n = K.shape[-1]
            return K + jitter * np.eye(n)
        K = np.asarray(gpflow.covariances.Kuu(model.inducing_variable, model.kernel, jitter=jitter))
    except Exception:  # noqa: BLE001 - an exotic kernel or inducing variable: κ(Kuu) is then not reported
        return None
    if K.ndim == 4:  # [M, L, M, L]
        M, L = K.shape[0], K.shape[1]
        return K.reshape(M * L, M * L)[None]
    return K if K.ndim == 3 else K[None]


def measure_conditioning(model: Any, q_mu: Array, q_sqrt: Array, new_q_sqrt: Array | None, kappa_F: float | None = None) -> Conditioning:
    """κ(S), κ(S_new), the cancellation, κ(Kuu) and κ(F) (``kappa_F`` when measured, else estimated)."""
    q_mu, q_sqrt = np.asarray(q_mu, np.float64), np.asarray(q_sqrt, np.float64)
    S = q_sqrt @ np.swapaxes(q_sqrt, -1, -2)
    k_S, lo, _ = kappa(S)
    k_new, cancel = None, 1.0
    if new_q_sqrt is not None and np.all(np.isfinite(new_q_sqrt)):
        new = np.asarray(new_q_sqrt, np.float64)
        k_new, lo_new, _ = kappa(new @ np.swapaxes(new, -1, -2))
        cancel = max(1.0, lo_new / lo) if lo > 0 and lo_new > 0 else float("inf")
    K = _kuu(model)
    k_K, lo_K = (kappa(K)[:2] if K is not None else (None, None))
    measured = kappa_F is not None and np.isfinite(kappa_F)
    k_F = float(kappa_F) if measured else fisher_condition_estimate(q_mu, q_sqrt)
    return Conditioning(k_S, k_new, float(cancel), k_K, lo_K, k_F, measured)
