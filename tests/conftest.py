"""Shared test set-up: quiet TensorFlow, float64, deterministic hypothesis, numpy oracles."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# pytest runs two workers on two cores: one thread each for TensorFlow's and BLAS's pools, not two workers x two
for _threads in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

import numpy as np  # noqa: E402 - after the thread settings, which must precede numpy's and TensorFlow's import
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "natgrad-diag",
    deadline=None,
    derandomize=True,
    max_examples=20,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("natgrad-diag")


@pytest.fixture(autouse=True)
def _restore_gpflow_config():
    """Tests may change GPflow's config (float type, jitter); restore it afterwards."""
    import gpflow

    saved = gpflow.config.config()  # an immutable record
    yield
    gpflow.config.set_config(saved)


def np_meanvarsqrt(eta1: np.ndarray, eta2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy oracle of GPflow's expectation_to_meanvarsqrt: eta1 [M, L], eta2 [L, M, M]."""
    L = eta1.shape[1]
    varsqrt = np.stack([np.linalg.cholesky(eta2[l] - np.outer(eta1[:, l], eta1[:, l])) for l in range(L)])
    return eta1.copy(), varsqrt


def random_q(M: int, L: int, seed: int, *, scale: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """A random q_mu [M, L] and a lower-triangular q_sqrt [L, M, M] with a positive diagonal."""
    rng = np.random.default_rng(seed)
    q_mu = rng.normal(size=(M, L))
    q_sqrt = np.tril(rng.normal(size=(L, M, M)) * scale, -1)
    q_sqrt += np.stack([np.diag(rng.uniform(0.5, 1.5, size=M)) for _ in range(L)])
    return q_mu, q_sqrt
