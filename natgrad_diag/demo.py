"""Small seeded GPflow models and data for the docs, the CLI, the tests and the scripts (public).

Deterministic in ``seed``: the same arguments give bit-identical data and parameters (N data, M inducing
points, L latent GPs). The data are X ~ U(0, 10) [N, 1] and L latent functions fₗ(x) = sin(x + l) + 0.3·cos(2.3x),
observed through the chosen likelihood:

    gaussian   y = f + ε, ε ~ N(0, 0.1²)
    bernoulli  y ~ Bernoulli(Φ(2f))            (GPflow's probit link)
    poisson    y ~ Poisson(exp(f))
    studentt   y = f + 0.1·t₃
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag._validate import input_error, require_int
from natgrad_diag.checks.evaluator import dtype_context, float_dtype
from natgrad_diag.typing import Array

__all__ = ["DemoModel", "LIKELIHOODS", "MODELS", "dtype_context", "make_data", "make_model", "svgp_options"]

#: Likelihood names understood by :func:`make_model` and ``natgrad-diag check --likelihood``.
LIKELIHOODS = ("gaussian", "bernoulli", "poisson", "studentt")
#: Model names understood by :func:`make_model` and ``natgrad-diag check --model``.
MODELS = ("svgp", "vgp")


def _choice(value: Any, allowed: tuple[str, ...], name: str) -> str:
    if (text := str(value).lower()) not in allowed:
        raise input_error(f"{name} must be one of {', '.join(allowed)}.", name, " | ".join(allowed), repr(value),
                          f"pass {name}={allowed[0]!r} or another of the listed names.")
    return text


def _count(value: Any, name: str) -> int:
    return require_int(value, name, minimum=1, remedy=f"pass {name} as a positive integer.")


def svgp_options(model: str, num_inducing: int | None = None, whiten: bool | None = None, *, flags: bool = False) -> tuple[int, bool]:
    """(M, whiten) of a demo ``model``: an SVGP's defaults, M = 10 inducing points, whitened, where not given.

    Raises:
        InputError: either is given with ``model="vgp"``, whose q(u) is over its N data points (no inducing points,
            no whitening); the arguments are named as command-line options with ``flags``.

    Examples:
        >>> svgp_options("svgp", whiten=False)
        (10, False)
    """
    given = {name: value for name, value in (("num_inducing", num_inducing), ("whiten", whiten)) if value is not None}
    if str(model).lower() == "vgp" and given:
        show = (lambda name: "--" + name.replace("_", "-")) if flags else str
        raise input_error("a VGP has no inducing points and no whitening: its q(u) is over the N data points.",
                          ", ".join(map(show, given)), f"neither with {'--model vgp' if flags else 'model=vgp'}",
                          ", ".join(f"{show(k)}{' ' if flags else '='}{v}" for k, v in given.items()),
                          f"leave them out ({show('num_data')} sets the VGP's size) or check an SVGP.")  # fmt: skip
    return (10 if num_inducing is None else num_inducing), (True if whiten is None else whiten)


def _seed(value: Any) -> int:
    """A numpy seed: an int ≥ 0 (numpy refuses a negative one with a bare ValueError)."""
    return require_int(value, "seed", minimum=0, expected="an int ≥ 0", remedy="pass e.g. seed=0 (numpy seeds are non-negative).")


def model_nbytes(name: str, *, M: int, N: int, L: int, itemsize: int) -> int:
    """Bytes :func:`make_model` and a check of it take at their peak, estimated before anything is built: with m = M
    (SVGP) or N (VGP), 4 m² temporaries, q_sqrt with its copies (4 L m²), K_mm, K_mn and three more [m, N] arrays on the
    loss's tape (m² + 4 m·N: at M = 10, N = 1e8 the check peaked at 22 GB, 2.75·M·N floats) and the data.

    Examples:
        >>> model_nbytes("svgp", M=10, N=50, L=1, itemsize=8)
        24080
    """
    m = N if name == "vgp" else M
    return itemsize * ((4 + 4 * L) * m * m + m * m + 4 * m * N + N * (1 + L) + m * L)


def check_model_memory(name: str, *, M: int, N: int, L: int, itemsize: int) -> None:
    """MemoryLimitError when :func:`model_nbytes` exceeds the limit (half of this machine's memory); no GPflow."""
    from natgrad_diag.autodiff.memory import check_memory, memory_limit

    size = f"M = {M}, N = {N}, L = {L}" if name == "svgp" else f"N = {N}, L = {L} (M = N for a VGP)"
    check_memory(
        model_nbytes(name, M=M, N=N, L=L, itemsize=itemsize), memory_limit(), f"the demo {name.upper()}",
        title=f"The demo {name.upper()} with {size}",
        remedy="use a smaller num_inducing (--num-inducing) or num_data (--num-data); the limit is half of this machine's memory.",
        argument="num_inducing" if name == "svgp" and M * M >= N * N else "num_data",
    )  # fmt: skip


#: ``natgrad-diag check``'s cost model (float64, 2 cores like CI's, fitted to the command's wall-clock times): the
#: start (TensorFlow's import, the tracing) in seconds, then per step of the check its fixed cost (op dispatch) and
#: the seconds per unit of L·m³ (dense factorisations), of L (TensorFlow's batched ops cost per matrix when m is
#: small) and of N·m·(m + L) (the SVGP's predictions at the data).
CHECK_COST = (15.0, 5e-3, 2.5e-10, 3e-5, 2e-10)

#: ``natgrad-diag check`` refuses, before building the model, a run estimated to take longer (``--max-minutes``):
#: the demo's check takes seconds, and minutes mean sizes beyond what a check of the set-up needs.
CHECK_MAX_MINUTES = 2.0


def check_seconds(name: str, *, M: int, N: int, L: int, gamma_steps: int) -> tuple[float, str]:
    """Seconds ``natgrad-diag check`` is estimated to take, and the size option that costs the most; no GPflow.

    With m = M (SVGP) or N (VGP) and s = 12 + 9·K steps (the reproduction and the finite differences, then K =
    ``gamma_steps`` steps for each of the nine γ a search may try), t ≈ t₀ + s·(d + a·L·m³ + b·L + c·N·m·(m + L)),
    (t₀, d, a, b, c) = :data:`CHECK_COST`. An estimate within a factor of about three: enough to refuse an hour's run.

    Examples:
        >>> round(check_seconds("vgp", M=10, N=5000, L=1, gamma_steps=5)[0] / 60)  # minutes
        30
        >>> check_seconds("svgp", M=10, N=50, L=100_000, gamma_steps=5)[1]
        '--num-latent'
    """
    start, step, cube, latent, datum = CHECK_COST
    m = N if name == "vgp" else M
    size = "--num-inducing" if name == "svgp" else "--num-data"
    terms = {"--gamma-steps": step, "--num-latent": latent * L, "--num-data": datum * N * m * (m + L) if name == "svgp" else 0.0}
    terms[size] = terms.get(size, 0.0) + cube * L * m**3
    return start + (12 + 9 * gamma_steps) * sum(terms.values()), max(terms, key=terms.__getitem__)


def check_model_work(name: str, *, M: int, N: int, L: int, gamma_steps: int, max_minutes: float) -> None:
    """InputError naming the costliest size option when :func:`check_seconds` exceeds ``max_minutes`` (0: no limit);
    the other arguments are checked as :func:`make_model` and ``check_natgrad`` check them."""
    from natgrad_diag.checks.api import validate_gamma_steps

    name, M, N, L = _choice(name, MODELS, "model"), _count(M, "num_inducing"), _count(N, "num_data"), _count(L, "num_latent")
    gamma_steps = validate_gamma_steps(gamma_steps)
    if isinstance(max_minutes, bool) or not isinstance(max_minutes, (int, float)) or not 0 <= max_minutes < float("inf"):
        raise input_error("max_minutes must be a finite number ≥ 0.", "max_minutes", "a float ≥ 0 (0: no limit)",
                          repr(max_minutes), "pass e.g. max_minutes=10, or 0 for no limit.")  # fmt: skip
    seconds, argument = check_seconds(name, M=M, N=N, L=L, gamma_steps=gamma_steps)
    if max_minutes and seconds > 60 * max_minutes:
        about = f"{np.ceil(seconds):.0f} seconds" if seconds < 120 else f"{np.ceil(seconds / 60):.0f} minutes"  # not down to the limit
        raise input_error(
            f"The check would take about {about} on a 2-core machine, more than --max-minutes {max_minutes:g}.",
            argument, f"a run estimated under {max_minutes:g} minutes",
            f"{name.upper()} with {f'M = {M}, ' if name == 'svgp' else ''}N = {N}, L = {L}, --gamma-steps {gamma_steps}",
            f"use a smaller {argument}{' (or --gamma-steps 1)' if argument != '--gamma-steps' else ''}, or pass "
            "--max-minutes 0 to run it anyway.",
        )


def make_data(
    *, num_data: int = 50, num_latent: int = 1, likelihood: str = "gaussian", dtype: Any = "float64", seed: int = 0,
) -> tuple[Array, Array]:
    """Seeded data (X [N, 1], Y [N, L]) as numpy arrays of ``dtype`` ("float64" or "float32"), N = ``num_data``,
    L = ``num_latent``, y drawn from f through ``likelihood`` (one of :data:`LIKELIHOODS`)."""
    N, L = _count(num_data, "num_data"), _count(num_latent, "num_latent")
    lik, dt, seed = _choice(likelihood, LIKELIHOODS, "likelihood"), float_dtype(dtype), _seed(seed)
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0.0, 10.0, size=(N, 1)), axis=0)
    F = np.concatenate([np.sin(X + l) + 0.3 * np.cos(2.3 * X) for l in range(L)], axis=1)
    if lik == "gaussian":
        Y = F + 0.1 * rng.normal(size=F.shape)
    elif lik == "bernoulli":
        from math import erf, sqrt

        Y = (rng.uniform(size=F.shape) < 0.5 * (1.0 + np.vectorize(erf)(2.0 * F / sqrt(2.0)))).astype(float)
    elif lik == "poisson":
        Y = rng.poisson(np.exp(F)).astype(float)
    else:
        Y = F + 0.1 * rng.standard_t(3.0, size=F.shape)
    return X.astype(dt), Y.astype(dt)


@dataclass(frozen=True)
class DemoModel:
    """A demo ``model`` (``gpflow.models.SVGP`` or ``VGP``), its ``data`` (X [N, 1], Y [N, L]), its ``name``
    ("svgp" or "vgp") and the ``likelihood``'s name; ``model, data = make_model()`` unpacks it."""

    model: Any
    data: tuple[Array, Array]
    name: str
    likelihood: str

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.data))


def _likelihood(name: str) -> Any:
    from gpflow import likelihoods as lik

    make = {"gaussian": lambda: lik.Gaussian(variance=0.1), "bernoulli": lik.Bernoulli, "poisson": lik.Poisson}
    return make.get(name, lambda: lik.StudentT(scale=0.1))()


def make_model(
    model: str = "svgp", likelihood: str = "gaussian", *, num_inducing: int | None = None, num_latent: int = 1,
    num_data: int = 50, whiten: bool | None = None, q_diag: bool = False, dtype: Any = "float64", seed: int = 0,
) -> DemoModel:
    """A seeded SVGP or VGP on :func:`make_data`, with a non-trivial q(u) so a step does something.

    SVGP: a squared-exponential kernel shared by the L latent GPs, M = ``num_inducing`` inducing points spread over
    the inputs, full batch, ``whiten`` (:func:`svgp_options`: 10, whitened, by default), seeded q_mu [M, L] and q_sqrt [L, M, M] (lower-triangular,
    positive diagonal), or a diagonal q_sqrt [M, L] with ``q_diag`` (which natural gradients do not support).
    VGP: the same kernel and likelihood, q_mu [N, L] and q_sqrt [L, N, N] seeded the same way (M = N).
    Parameters and data are built in ``dtype`` ("float64" or "float32").

    Raises:
        InputError: an unknown name, a non-positive count, or ``num_inducing`` or ``whiten`` with a VGP.
        MemoryLimitError: the model would need more than half of this machine's memory.
    """
    name, lik = _choice(model, MODELS, "model"), _choice(likelihood, LIKELIHOODS, "likelihood")
    num_inducing, whiten = svgp_options(name, num_inducing, whiten)
    M, L, N = _count(num_inducing, "num_inducing"), _count(num_latent, "num_latent"), _count(num_data, "num_data")
    dt, seed = float_dtype(dtype), _seed(seed)
    check_model_memory(name, M=M, N=N, L=L, itemsize=np.dtype(dt).itemsize)
    import gpflow

    X, Y = make_data(num_data=N, num_latent=L, likelihood=lik, dtype=dt, seed=seed)
    rng = np.random.default_rng(seed + 1)
    with dtype_context(dt):
        kernel = gpflow.kernels.SquaredExponential(lengthscales=1.5, variance=1.0)
        if name == "svgp":
            Z: Array = np.linspace(0.2, 9.8, M)[:, None].astype(dt)
            q_mu: Array = (0.3 * rng.normal(size=(M, L))).astype(dt)
            q_sqrt: Array = (rng.uniform(0.3, 0.9, size=(M, L)) if q_diag else _random_tril(rng, M, L)).astype(dt)
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
    """[L, M, M]: Cholesky factors of S = diag(U(0.16, 0.81)) + 0.1·A Aᵀ/M, A standard normal: cond(S) ≤ about 10 at
    every M, where a random lower-triangular matrix's condition number grows exponentially with M."""
    return np.stack([np.linalg.cholesky(np.diag(rng.uniform(0.4, 0.9, size=M) ** 2) + 0.1 * (A @ A.T) / M)
                     for A in (rng.normal(size=(M, M)) for _ in range(L))])  # A, then the diagonal: the seeded order
