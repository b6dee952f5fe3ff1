"""Points for GPflow's natgrad maps built with numpy (not with the maps under test), shared by the gradcheck tests."""

from __future__ import annotations

import numpy as np

from tests.conftest import random_q


def gpflow_points(M: int, L: int, seed: int) -> dict[str, list[np.ndarray]]:
    """q_mu [M, L], q_sqrt [L, M, M]; eta = (m, S + m mᵀ); theta = (S⁻¹m, −½S⁻¹), all in numpy."""
    m, A = random_q(M, L, seed, scale=0.4)
    S = A @ np.swapaxes(A, -1, -2)
    eta2 = S + np.einsum("ml,nl->lmn", m, m)
    S_inv = np.linalg.inv(S)
    nat1 = np.einsum("lmn,nl->ml", S_inv, m)
    nat2 = -0.5 * S_inv
    nat2 = 0.5 * (nat2 + np.swapaxes(nat2, -1, -2))  # exactly symmetric
    eta2 = 0.5 * (eta2 + np.swapaxes(eta2, -1, -2))
    return {"meanvarsqrt": [m, A], "expectation": [m, eta2], "natural": [nat1, nat2]}
