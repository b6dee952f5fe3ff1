"""natgrad-diag gradcheck: a gradient check of one of GPflow's natgrad maps at a random point of size (M, L)."""

from __future__ import annotations

import math

import numpy as np

from natgrad_diag._validate import input_error, require_int
from natgrad_diag.autodiff.memory import DEFAULT_MAX_BYTES, check_memory, jacobian_nbytes, memory_limit
from natgrad_diag.gradcheck.api import check_gradients
from natgrad_diag.gradcheck.report import GradientCheckReport
from natgrad_diag.gradcheck.structures import GPFLOW_MAPS
from natgrad_diag.typing import Array

__all__ = ["check_gradcheck_size", "gpflow_map_point", "gradcheck_cli"]


def gpflow_map_point(name: str, num_inducing: int, num_latent: int, *, seed: int = 0, dtype: str = "float64") -> list[Array]:
    """A well-conditioned random point for one of GPflow's natgrad maps, built with numpy.

    q_mu = m [M, L] ~ N(0, 1); q_sqrt = L_S [L, M, M] lower-triangular with 0.3/√M·N(0, 1) below a unit
    diagonal (so L_S stays well conditioned at any M); S = L_S L_Sᵀ. Returns (m, L_S),
    (η₁, η₂) = (m, S + m mᵀ) or (θ₁, θ₂) = (S⁻¹m, −½S⁻¹), whichever ``name`` takes.

    Raises:
        InputError: an unknown map name, or M, L < 1.
    """
    if name not in GPFLOW_MAPS:
        raise input_error(f"unknown GPflow map {name!r}.", "map", " or ".join(sorted(GPFLOW_MAPS)), repr(name),
                          "pass the name of a function in gpflow.optimizers.natgrad, e.g. expectation_to_meanvarsqrt.")
    M, L = require_int(num_inducing, "num_inducing", minimum=1), require_int(num_latent, "num_latent", minimum=1)
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((M, L))
    A = np.tril(0.3 / math.sqrt(M) * rng.standard_normal((L, M, M)), -1) + np.eye(M)  # ‖A − I‖₂ ≲ 0.6
    S = A @ np.swapaxes(A, -1, -2)
    if (first := GPFLOW_MAPS[name][0][0]) == "mean":
        point = [m, A]
    elif first == "eta1":
        eta2 = S + np.einsum("ml,nl->lmn", m, m)
        point = [m, 0.5 * (eta2 + np.swapaxes(eta2, -1, -2))]
    else:
        S_inv = np.linalg.inv(S)
        point = [np.einsum("lmn,nl->ml", S_inv, m), -0.25 * (S_inv + np.swapaxes(S_inv, -1, -2))]
    return [p.astype(dtype) for p in point]


def check_gradcheck_size(num_inducing: int, num_latent: int, *, mode: str = "full", dtype: str = "float64") -> None:
    """Refuse, before anything is allocated, a point of size (M, L) this machine cannot hold (about 8 arrays
    [L, M, M]) and, in full mode, analytical plus numerical dense Jacobians over DEFAULT_MAX_BYTES.

    Raises:
        MemoryLimitError: over either limit (the message names --num-inducing and what to do).
    """
    M, L, itemsize = num_inducing, num_latent, np.dtype(dtype).itemsize
    check_memory(8 * L * M * M * itemsize, memory_limit(), "the point", title=f"The gradcheck point with M = {M}, L = {L}",
                 remedy="pass a smaller --num-inducing; the limit is half of this machine's memory.", argument="--num-inducing")
    if mode == "full":
        shapes = [(M, L), (L, M, M)]
        check_memory(2 * jacobian_nbytes(shapes, shapes, itemsize), DEFAULT_MAX_BYTES,
                     "the full-mode check (analytical and numerical Jacobians)", argument="--num-inducing",
                     remedy="pass --mode fast (matrix-free, no dense Jacobian) or a smaller --num-inducing.")


def gradcheck_cli(
    *, map: str = "expectation_to_meanvarsqrt", num_inducing: int = 8, num_latent: int = 2, mode: str = "full",  # noqa: A002
    structure: str = "auto", dtype: str = "float64", seed: int = 0, eps: float | None = None, rtol: float | None = None,
    atol: float | None = None,
) -> GradientCheckReport:  # fmt: skip
    """``natgrad-diag gradcheck``: check one of GPflow's natgrad maps at a random point of size (M, L).

    ``structure`` applies to the map's matrix input (eta2, nat2 or varsqrt [L, M, M]); ``"auto"`` infers
    it (eta2/nat2 symmetric, varsqrt lower-triangular), ``"general"`` shows the false mismatch that
    one-entry checkers report on symmetric inputs. The first input ([M, L]) is always general.
    """
    from gpflow.optimizers import natgrad

    point = gpflow_map_point(map, num_inducing, num_latent, seed=seed, dtype=dtype)
    structures = None if structure == "auto" else {GPFLOW_MAPS[map][0][1]: structure}  # the matrix input's
    return check_gradients(getattr(natgrad, map), point, structure=structures, mode=mode, eps=eps, rtol=rtol, atol=atol,
                           seed=seed)  # fmt: skip
