"""The Jacobian of GPflow's natgrad map (η₁, η₂) ↦ (mean, varsqrt), in closed form or by autodiff."""

from __future__ import annotations

from typing import Any

import numpy as np

from natgrad_diag.autodiff.blocks import BlockJacobian
from natgrad_diag.autodiff.dense import jacobian
from natgrad_diag.autodiff.memory import DEFAULT_MAX_BYTES, check_memory
from natgrad_diag.exceptions import InputError, SingularCovarianceError

__all__ = ["natgrad_map_jacobian"]


def _natgrad_map(eta1: Any, eta2: Any) -> Any:
    """GPflow's ``expectation_to_meanvarsqrt`` (one function object, so the compiled Jacobian is cached)."""
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    return expectation_to_meanvarsqrt(eta1, eta2)


def _natgrad_map_closed_form(eta1: Any, eta2: Any, *, symmetric: bool, max_bytes: int, chunk_size: int | None) -> BlockJacobian:
    """J of ``expectation_to_meanvarsqrt`` in closed form, one JVP per stored column, in chunks.

    mean = η₁, so ∂mean/∂η₁ = I and ∂mean/∂η₂ = 0. For latent GP l, varsqrt_l = chol(S_l) with
    S_l = η₂,l − η₁,l η₁,lᵀ, and the derivative of a Cholesky factor C along a symmetric dS is
    (Murray 2016, "Differentiation of the Cholesky decomposition", eq. 9)

        dC = C·Φ(C⁻¹ dS C⁻ᵀ),    Φ(X) = the lower triangle of X with its diagonal halved.

    Every tangent here is dS = s(p qᵀ + q pᵀ) with p, q columns of C⁻¹ (or w = C⁻¹η₁,l), so
    C⁻¹ dS C⁻ᵀ = s(C⁻¹p (C⁻¹q)ᵀ + ...) is a rank-2 outer product and a column costs one M×M matmul:

        η₁[m, l]:            dS = −(E_m η₁,lᵀ + η₁,l E_mᵀ)       (p = e_m, q = η₁,l, s = −1)
        η₂ vech (a, b), a>b: dS = E_ab + E_ba                  (s = 1);   diagonal (a, a): dS = E_aa
        η₂ general (a, b):   dS = ½(E_ab + E_ba)               (TensorFlow's symmetrised gradient)

    The columns are written into one preallocated array; ``.block(i, j)`` equals ``tape.jacobian``'s.
    """
    e1 = np.asarray(eta1)
    e2 = np.asarray(eta2)
    if e1.dtype not in (np.float32, np.float64):
        e1, e2 = e1.astype(np.float64), e2.astype(np.float64)
    dtype = e1.dtype
    M, L = e1.shape
    K2 = M * (M + 1) // 2 if symmetric else M * M
    n_rows, n_cols = M * L + L * M * M, M * L + L * K2
    check_memory(n_rows * n_cols * dtype.itemsize, max_bytes, f"the natgrad map at M = {M}, L = {L}")
    out = np.zeros((n_rows, n_cols), dtype=dtype)
    out[np.arange(M * L), np.arange(M * L)] = 1.0  # ∂mean/∂η₁ = I
    a_idx, b_idx, scale2 = _eta2_tangents(M, symmetric, dtype)
    per = max(1, (32 * 1024**2) // (3 * M * M * dtype.itemsize)) if chunk_size is None else int(chunk_size)
    for l in range(L):
        C = _cholesky(e2[l] - np.outer(e1[:, l], e1[:, l]), l)
        Cinv = np.tril(np.linalg.solve(C, np.eye(M, dtype=dtype)))
        w = Cinv @ e1[:, l]
        # tangents of latent l: η₁ columns (m*L + l) then η₂ columns (M*L + l*K2 + k)
        P = np.concatenate([Cinv.T, Cinv.T[a_idx]])  # rows are C⁻¹ columns
        Q = np.concatenate([np.tile(w, (M, 1)), Cinv.T[b_idx]])
        sc = np.concatenate([-np.ones(M, dtype=dtype), scale2])
        cols = np.concatenate([np.arange(M) * L + l, M * L + l * K2 + np.arange(K2)])
        rows = slice(M * L + l * M * M, M * L + (l + 1) * M * M)
        _write_cholesky_jvps(out, rows, cols, C, P, Q, sc, per)
    return BlockJacobian.from_compact(
        out, ("mean", "varsqrt"), ("eta1", "eta2"), [(M, L), (L, M, M)], [(M, L), (L, M, M)], (False, bool(symmetric))
    )


def _eta2_tangents(M: int, symmetric: bool, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stored η₂ columns of one latent GP: (p index, q index, scale s) of dS = s(p qᵀ + q pᵀ)."""
    if symmetric:
        a_idx, b_idx = np.tril_indices(M)
        scale2 = np.ones(len(a_idx), dtype=dtype)
        scale2[a_idx == b_idx] = 0.5  # E_aa = ½(c cᵀ + c cᵀ) in the rank-2 form
    else:
        a_idx, b_idx = (g.ravel() for g in np.meshgrid(np.arange(M), np.arange(M), indexing="ij"))
        scale2 = np.full(len(a_idx), 0.5, dtype=dtype)  # ½(E_ab + E_ba); on the diagonal E_aa
    return a_idx, b_idx, scale2


def _cholesky(S: np.ndarray, l: int) -> np.ndarray:
    """chol(S) of latent GP ``l``, or a SingularCovarianceError that names it."""
    try:
        return np.linalg.cholesky(S)
    except np.linalg.LinAlgError:
        raise SingularCovarianceError(
            f"eta2 − eta1·eta1ᵀ is not positive definite for latent GP {l}, so varsqrt = chol(·) has no derivative.",
            context=[("Argument", "eta2"), ("Latent GP", l), ("min eigenvalue", float(np.linalg.eigvalsh(S).min()))],
            remedy="pass expectation parameters of a valid q(u): eta2 = S + eta1·eta1ᵀ with S positive definite.",
        ) from None


def _write_cholesky_jvps(
    out: np.ndarray, rows: slice, cols: np.ndarray, C: np.ndarray, P: np.ndarray, Q: np.ndarray, sc: np.ndarray, per: int
) -> None:
    """out[rows, cols[k]] = C·Φ(s_k(p_k q_kᵀ + q_k p_kᵀ)), ``per`` columns at a time (Murray 2016, eq. 9)."""
    M = C.shape[0]
    phi = np.tril(np.ones((M, M), dtype=C.dtype)) - 0.5 * np.eye(M, dtype=C.dtype)
    for k0 in range(0, len(cols), per):
        p, q, s_ = P[k0 : k0 + per], Q[k0 : k0 + per], sc[k0 : k0 + per]
        X = p[:, :, None] * q[:, None, :]
        X = s_[:, None, None] * (X + np.swapaxes(X, 1, 2))
        dC = np.matmul(C, X * phi)  # [k, M, M]
        out[rows, cols[k0 : k0 + per]] = dC.reshape(len(s_), M * M).T


def natgrad_map_jacobian(
    eta1: Any,
    eta2: Any,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    symmetric: bool = True,
    chunk_size: int | None = None,
    method: str = "closed_form",
) -> BlockJacobian:
    """J = ∂(mean, varsqrt)/∂(eta1, eta2) of GPflow's ``expectation_to_meanvarsqrt`` at (η₁, η₂).

    mean = η₁ and varsqrt = chol(η₂ − η₁η₁ᵀ). eta1 is [M, L], eta2 is [L, M, M]; the blocks are
    labelled mean, varsqrt / eta1, eta2. With ``symmetric=True`` (default) η₂ is differentiated along
    symmetric tangents only (M + M(M+1)/2 columns per latent GP instead of M + M²: about half the time
    and memory); ``.block(i, 1)`` still has the general shape [..., L, M, M] and equals
    ``tape.jacobian``'s block, because TensorFlow's Cholesky gradient is symmetrised.

    ``method="closed_form"`` (default) computes each column as a closed-form JVP of the Cholesky factor
    (see ``_natgrad_map_closed_form``), so its cost is proportional to the number of columns;
    ``method="autodiff"`` builds the same matrix with TensorFlow through
    :func:`natgrad_diag.autodiff.dense.jacobian`.

    Raises:
        SingularCovarianceError: η₂ − η₁η₁ᵀ is not positive definite for some latent GP.
        MemoryLimitError: the stored Jacobian would exceed ``max_bytes``.
        InputError: an unknown ``method``.

    Examples:
        >>> import numpy as np
        >>> eta1 = np.array([[0.5], [-1.0]])  # M = 2 inducing points, L = 1 latent GP
        >>> eta2 = (np.eye(2) + eta1 @ eta1.T)[None]  # S = I
        >>> J = natgrad_map_jacobian(eta1, eta2)
        >>> J.compact.shape  # rows: 2 mean + 4 varsqrt; columns: 2 eta1 + 3 vech(eta2)
        (6, 5)
        >>> J.block(0, 0).reshape(2, 2)  # ∂mean/∂η₁ = I
        array([[1., 0.],
               [0., 1.]])
    """
    if method == "closed_form":
        return _natgrad_map_closed_form(eta1, eta2, symmetric=bool(symmetric), max_bytes=max_bytes, chunk_size=chunk_size)
    if method != "autodiff":
        raise InputError(
            "unknown method.",
            context=[("Argument", "method"), ("Expected", "'closed_form' or 'autodiff'"), ("Got", repr(method))],
            remedy="pass method='closed_form' (default) or method='autodiff' (TensorFlow's tape).",
        )
    return jacobian(
        _natgrad_map,
        [eta1, eta2],
        input_names=("eta1", "eta2"),
        output_names=("mean", "varsqrt"),
        max_bytes=max_bytes,
        symmetric=(False, bool(symmetric)),
        chunk_size=chunk_size,
    )
