"""Small seeded GPflow models and data for the CLI, the tests and the scripts.

Every builder is deterministic in ``seed``: the same arguments give bit-identical data and parameters.
Letters follow GPflow: N data, M inducing points, L latent GPs, D input dimensions.

The data are 1-D inputs X ~ U(0, 10) and L latent functions fₗ(x) = sin(x + l) + 0.3·cos(2.3x), observed
through the chosen likelihood:

    gaussian   y = f + ε, ε ~ N(0, 0.1²)
    bernoulli  y ~ Bernoulli(Φ(2f))            (GPflow's probit link)
    poisson    y ~ Poisson(exp(f))
    studentt   y = f + 0.1·t₃

TensorFlow and GPflow are imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.exceptions import InputError
from natgrad_diag.checks.evaluator import dtype_context
from natgrad_diag.checks.evaluator import float_dtype as _dtype
from natgrad_diag.typing import Array

__all__ = ["DemoModel", "LIKELIHOODS", "MODELS", "dtype_context", "make_data", "make_model"]

#: Likelihood names understood by :func:`make_model` and ``natgrad-diag check --likelihood``.
LIKELIHOODS = ("gaussian", "bernoulli", "poisson", "studentt")
#: Model names understood by :func:`make_model` and ``natgrad-diag check --model``.
MODELS = ("svgp", "vgp")


def _choice(value: Any, allowed: tuple[str, ...], name: str) -> str:
    text = str(value).lower()
    if text not in allowed:
        raise InputError(
            f"{name} must be one of {', '.join(allowed)}.",
            context=[("Argument", name), ("Expected", " | ".join(allowed)), ("Got", repr(value))],
            remedy=f"pass {name}={allowed[0]!r} or another of the listed names.",
        )
    return text


def _count(value: Any, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise InputError(
            f"{name} must be an integer ≥ {minimum}.",
            context=[("Argument", name), ("Expected", f"an int ≥ {minimum}"), ("Got", repr(value))],
            remedy=f"pass {name} as a positive integer.",
        )
    return int(value)


def _seed(value: Any) -> int:
    """A numpy seed: an int ≥ 0 (numpy refuses a negative one with a bare ValueError)."""
    from natgrad_diag._validate import require_int

    return require_int(value, "seed", minimum=0, expected="an int ≥ 0", remedy="pass e.g. seed=0 (numpy seeds are non-negative).")


def model_nbytes(name: str, *, M: int, N: int, L: int, itemsize: int) -> int:
    """Bytes :func:`make_model` allocates at its peak, estimated before anything is built.

    With m = M (SVGP) or N (VGP): the builder's temporaries A, A Aᵀ, S and its Cholesky factor (4 m²), q_sqrt
    [L, m, m] with its stacked copy, GPflow's constrained value and its unconstrained variable (4 L m²), the
    kernel matrices K_mm and K_mn (m² + m·N), and the data.

    Examples:
        >>> model_nbytes("svgp", M=10, N=50, L=1, itemsize=8)
        12080
    """
    m = N if name == "vgp" else M
    return itemsize * ((4 + 4 * L) * m * m + m * m + m * N + N * (1 + L) + m * L)


def _check_model_memory(name: str, *, M: int, N: int, L: int, itemsize: int) -> None:
    from natgrad_diag.autodiff.memory import check_memory, memory_limit

    size = f"M = {M}, N = {N}, L = {L}" if name == "svgp" else f"N = {N}, L = {L} (M = N for a VGP)"
    check_memory(
        model_nbytes(name, M=M, N=N, L=L, itemsize=itemsize), memory_limit(), f"the demo {name.upper()}",
        title=f"The demo {name.upper()} with {size}",
        remedy="use a smaller num_inducing (--num-inducing) or num_data (--num-data); the limit is half of this machine's memory.",
        argument="num_inducing" if name == "svgp" and M * M >= N * N else "num_data",
    )  # fmt: skip


def make_data(
    *,
    num_data: int = 50,
    num_latent: int = 1,
    likelihood: str = "gaussian",
    dtype: Any = "float64",
    seed: int = 0,
) -> tuple[Array, Array]:
    """Seeded 1-D regression/classification/count data.

    Args:
        num_data: N.
        num_latent: L, the number of output columns (one per latent GP).
        likelihood: one of :data:`LIKELIHOODS`; decides how y is drawn from f.
        dtype: "float64" or "float32".
        seed: numpy seed.

    Returns:
        (X [N, 1], Y [N, L]) as numpy arrays of ``dtype``.
    """
    N = _count(num_data, "num_data")
    L = _count(num_latent, "num_latent")
    lik = _choice(likelihood, LIKELIHOODS, "likelihood")
    dt = _dtype(dtype)
    seed = _seed(seed)
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0.0, 10.0, size=(N, 1)), axis=0)
    F = np.concatenate([np.sin(X + l) + 0.3 * np.cos(2.3 * X) for l in range(L)], axis=1)
    if lik == "gaussian":
        Y = F + 0.1 * rng.normal(size=F.shape)
    elif lik == "bernoulli":
        from math import erf, sqrt

        p = 0.5 * (1.0 + np.vectorize(erf)(2.0 * F / sqrt(2.0)))
        Y = (rng.uniform(size=F.shape) < p).astype(float)
    elif lik == "poisson":
        Y = rng.poisson(np.exp(F)).astype(float)
    else:
        Y = F + 0.1 * rng.standard_t(3.0, size=F.shape)
    return X.astype(dt), Y.astype(dt)


@dataclass(frozen=True)
class DemoModel:
    """A demo model and its data.

    Attributes:
        model: a ``gpflow.models.SVGP`` or ``gpflow.models.VGP``.
        data: (X [N, 1], Y [N, L]) as numpy arrays.
        name: "svgp" or "vgp".
        likelihood: the likelihood's name.
    """

    model: Any
    data: tuple[Array, Array]
    name: str
    likelihood: str

    def __iter__(self):  # ``model, data = make_model()``
        return iter((self.model, self.data))


def _likelihood(name: str) -> Any:
    import gpflow

    if name == "gaussian":
        return gpflow.likelihoods.Gaussian(variance=0.1)
    if name == "bernoulli":
        return gpflow.likelihoods.Bernoulli()
    if name == "poisson":
        return gpflow.likelihoods.Poisson()
    return gpflow.likelihoods.StudentT(scale=0.1)


def make_model(
    model: str = "svgp",
    likelihood: str = "gaussian",
    *,
    num_inducing: int = 10,
    num_latent: int = 1,
    num_data: int = 50,
    whiten: bool = True,
    q_diag: bool = False,
    dtype: Any = "float64",
    seed: int = 0,
) -> DemoModel:
    """A seeded SVGP or VGP on :func:`make_data`, with a non-trivial q(u) so a step does something.

    SVGP: squared-exponential kernel (shared by the L latent GPs), M inducing points spread over the
    inputs, ``num_data = N`` (full batch). q_mu [M, L] and q_sqrt [L, M, M] are set to seeded random
    values (q_sqrt lower-triangular, positive diagonal). VGP: the same kernel and likelihood; its
    q_mu [N, L] and q_sqrt [L, N, N] are seeded the same way (M = N for a VGP; ``num_inducing`` is ignored).

    Args:
        model: "svgp" or "vgp".
        likelihood: one of :data:`LIKELIHOODS`.
        num_inducing: M (SVGP only).
        num_latent: L.
        num_data: N.
        whiten: SVGP whitening (VGP is always whitened).
        q_diag: build SVGP with a diagonal q_sqrt [M, L] (which natural gradients do not support).
        dtype: "float64" or "float32"; parameters and data are built in this dtype.
        seed: numpy seed.

    Returns:
        A :class:`DemoModel`; ``model, data = make_model(...)`` works.

    Raises:
        InputError: an unknown name or a non-positive count.
    """
    import gpflow

    name = _choice(model, MODELS, "model")
    lik = _choice(likelihood, LIKELIHOODS, "likelihood")
    M = _count(num_inducing, "num_inducing")
    L = _count(num_latent, "num_latent")
    N = _count(num_data, "num_data")
    dt = _dtype(dtype)
    seed = _seed(seed)
    _check_model_memory(name, M=M, N=N, L=L, itemsize=np.dtype(dt).itemsize)
    X, Y = make_data(num_data=N, num_latent=L, likelihood=lik, dtype=dt, seed=seed)
    rng = np.random.default_rng(seed + 1)
    with dtype_context(dt):
        kernel = gpflow.kernels.SquaredExponential(lengthscales=1.5, variance=1.0)
        if name == "svgp":
            Z: Array = np.linspace(0.2, 9.8, M)[:, None].astype(dt)
            q_mu: Array = (0.3 * rng.normal(size=(M, L))).astype(dt)
            q_sqrt: Array | None = None
            if q_diag:
                q_sqrt = rng.uniform(0.3, 0.9, size=(M, L)).astype(dt)
            else:
                q_sqrt = _random_tril(rng, M, L).astype(dt)
            m = gpflow.models.SVGP(
                kernel, _likelihood(lik), gpflow.inducing_variables.InducingPoints(Z),
                num_latent_gps=L, q_diag=q_diag, q_mu=q_mu, q_sqrt=q_sqrt, whiten=bool(whiten), num_data=N,
            )  # fmt: skip
        else:
            m = gpflow.models.VGP((X, Y), kernel, _likelihood(lik), num_latent_gps=L)
            m.q_mu.assign((0.3 * rng.normal(size=(N, L))).astype(dt))
            m.q_sqrt.assign(_random_tril(rng, N, L).astype(dt))
    return DemoModel(model=m, data=(X, Y), name=name, likelihood=lik)


def _random_tril(rng: np.random.Generator, M: int, L: int) -> Array:
    """[L, M, M]: Cholesky factors of S = diag(U(0.16, 0.81)) + 0.1·A Aᵀ/M, A standard normal.

    A random lower-triangular matrix is ill-conditioned for large M (its condition number grows exponentially);
    a factor of a well-conditioned S keeps cond(S) ≤ about 10 at every M.
    """
    out = []
    for _ in range(L):
        A = rng.normal(size=(M, M))
        S = np.diag(rng.uniform(0.4, 0.9, size=M) ** 2) + 0.1 * (A @ A.T) / M
        out.append(np.linalg.cholesky(S))
    return np.stack(out)
