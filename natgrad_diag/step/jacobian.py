"""The Jacobian of GPflow's natgrad map (η₁, η₂) ↦ (mean, varsqrt), in closed form or by autodiff."""

from __future__ import annotations

from typing import Any

import numpy as np

from natgrad_diag._validate import input_error, require_bool, require_finite, shape_str
from natgrad_diag.autodiff.blocks import BlockJacobian
from natgrad_diag.autodiff.dense import jacobian
from natgrad_diag.autodiff.memory import DEFAULT_MAX_BYTES, check_memory
from natgrad_diag.exceptions import DTypeMismatchError, ShapeMismatchError, SingularCovarianceError
from natgrad_diag.tolerance import rounding_bound
from natgrad_diag.typing import Array

__all__ = ["natgrad_map_jacobian"]


def _validated(eta1: Any, eta2: Any) -> tuple[Array, Array, list[Array]]:
    """(η₁ [M, L], η₂ [L, M, M]) as float arrays of one dtype, finite, η₂ symmetric, and the L factors
    chol(η₂ − η₁η₁ᵀ) [M, M] (a SingularCovarianceError when one is not positive definite).

    Symmetry is judged against the rounding of forming η₂ = L_S L_Sᵀ + m mᵀ: inner products of M + 1 terms, whose
    triangles may differ by 2(M + 1)·ε·max|η₂| (Higham 2002, §3.1); the factor 4(M + 1) leaves a factor 2 of room.
    """
    e1, e2 = np.asarray(eta1), np.asarray(eta2)
    for name, arr, want in (("eta1", e1, "[M, L]"), ("eta2", e2, "[L, M, M]")):
        if arr.ndim != len(want.split(",")):
            raise input_error(f"{name} has the wrong rank.", name, want, shape_str(arr.shape), "pass eta1 = q_mu "
                              "[M, L] and eta2 = S + q_mu q_muᵀ per latent GP, [L, M, M].", kind=ShapeMismatchError)
    M, L = e1.shape
    if e2.shape != (L, M, M):
        raise input_error("eta2 does not match eta1.", "eta2", f"[L, M, M] = [{L}, {M}, {M}] (from eta1 [M, L] = "
                          f"[{M}, {L}])", shape_str(e2.shape), "pass the eta1 [M, L] and eta2 [L, M, M] of the same "
                          "q(u) (note GPflow's [M, L] / [L, M, M] order).", kind=ShapeMismatchError)
    floats = (np.float32, np.float64)
    if e1.dtype in floats and e2.dtype in floats and e1.dtype != e2.dtype:
        raise input_error("eta2 has another dtype than eta1.", "eta2", f"{e1.dtype} (like eta1)", str(e2.dtype),
                          "cast both to one dtype, e.g. float64.", kind=DTypeMismatchError)
    for name, arr in (("eta1", e1), ("eta2", e2)):
        if arr.dtype.kind not in "biuf":
            raise input_error(f"{name} is not real numbers.", name, "a float (or integer) array", str(arr.dtype),
                              "pass real arrays, e.g. float64.", kind=DTypeMismatchError)
    dtype = next((a.dtype for a in (e1, e2) if a.dtype in floats), np.dtype(np.float64))  # integers take the float's
    e1, e2 = e1.astype(dtype, copy=False), e2.astype(dtype, copy=False)
    require_finite(e1, "eta1")
    require_finite(e2, "eta2")
    diff = np.abs(e2 - np.swapaxes(e2, -1, -2))
    asym = float(np.max(diff, initial=0.0))
    bound = rounding_bound(e2.dtype, condition=1.0, scale=float(np.max(np.abs(e2), initial=0.0)), factor=4.0 * (M + 1))
    if asym > bound:
        l, a, b = (int(i) for i in np.unravel_index(np.argmax(diff), e2.shape))
        raise input_error("eta2 is not symmetric.", "eta2", f"eta2[l] = eta2[l]ᵀ (to {bound:.3g}, the rounding of "
                          f"forming it)", f"|eta2[{l}, {a}, {b}] − eta2[{l}, {b}, {a}]| = {asym:.3g}",
                          "pass eta2 = S + eta1·eta1ᵀ (symmetric); to symmetrise, use 0.5·(eta2 + eta2ᵀ).")
    return e1, e2, [_cholesky(e2[l] - np.outer(e1[:, l], e1[:, l]), l) for l in range(L)]


def _natgrad_map_closed_form(eta1: Array, chols: list[Array], *, symmetric: bool, max_bytes: int) -> BlockJacobian:
    """J of ``expectation_to_meanvarsqrt`` in closed form: O(M²) per column, O(M⁴) in all, written in place.

    mean = η₁, so ∂mean/∂η₁ = I and ∂mean/∂η₂ = 0. For latent GP l, varsqrt = C = chol(S), S = η₂ − η₁η₁ᵀ, moves
    along a symmetric dS by dC = C·Φ(C⁻¹ dS C⁻ᵀ) (Murray 2016, arXiv:1602.07527, eq. 10). **Every tangent is rank 2**,
    dS = s(e_a e_bᵀ + e_b e_aᵀ) or like it:

        η₂ vech (a, b), a > b:  dS = E_ab + E_ba (s = 1);    η₂ vech (a, a):  dS = E_aa (s = ½)
        η₂ general (a, b):      dS = ½(E_ab + E_ba) (s = ½, TensorFlow's symmetrised gradient)
        η₁[m, l]:               dS = −(e_m η₁,lᵀ + η₁,l e_mᵀ) (s = −1)

    so with p = C⁻¹e_a, q = C⁻¹e_b (or w = C⁻¹η₁,l for η₁), C⁻¹ dS C⁻ᵀ = s(p qᵀ + q pᵀ), and **C times Φ of a rank-2
    matrix is a suffix sum**: dC_ik = s·[q_k Σ_{j≥k} C_ij p_j + p_k Σ_{j≥k} C_ij q_j − C_ik p_k q_k] (the last term
    takes back half of the diagonal j = k). With T[i, k, a] = Σ_{j≥k} C_ij (C⁻¹)_ja, T' = T − C_ik (C⁻¹)_ka (one
    [M, M, M] reverse cumulative sum) and U[i, k] = Σ_{j≥k} C_ij w_j, the columns are

        η₂ (a, b):  dC_ik = s·[T'[i,k,a] (C⁻¹)_kb + T[i,k,b] (C⁻¹)_ka],    η₁ m:  dC_ik = −[T'[i,k,m] w_k + U[i,k] (C⁻¹)_km]

    two products per entry. dC_ik = 0 for k > i, so only rows k ≤ i and columns with a ≤ i (m ≤ i) are written, one i
    at a time, straight into the preallocated array. ``.block(i, j)`` equals ``tape.jacobian``'s.
    """
    dtype = eta1.dtype
    M, L = eta1.shape
    K2 = M * (M + 1) // 2 if symmetric else M * M
    n_rows, n_cols = M * L + L * M * M, M * L + L * K2
    check_memory(n_rows * n_cols * dtype.itemsize, max_bytes, f"the natgrad map at M = {M}, L = {L}")
    out = np.zeros((n_rows, n_cols), dtype=dtype)
    out[np.arange(M * L), np.arange(M * L)] = 1.0  # ∂mean/∂η₁ = I
    for l, C in enumerate(chols):
        Cinv = np.tril(np.linalg.solve(C, np.eye(M, dtype=dtype)))
        w = Cinv @ eta1[:, l]
        P = C[:, :, None] * Cinv[None, :, :]  # [i, j, a]: C_ij (C⁻¹)_ja
        T = np.cumsum(P[:, ::-1, :], axis=1)[:, ::-1, :]  # [i, k, a]: Σ_{j≥k}
        T_strict = T - P  # Σ_{j>k}
        U = np.cumsum((C * w[None, :])[:, ::-1], axis=1)[:, ::-1]  # [i, k]
        r0 = M * L + l * M * M
        eta1_cols = out[:, l : M * L : L]  # column m*L + l of η₁[m, l]: a strided view
        for i in range(M):
            n = i + 1  # k ≤ i, and m ≤ i: T'[i,k,m] needs a j with m ≤ j ≤ i, (C⁻¹)_km needs m ≤ k ≤ i
            dest = eta1_cols[r0 + i * M : r0 + i * M + n, :n]
            np.multiply(T_strict[i, :n, :n], -w[:n, None], out=dest)
            dest -= U[i, :n, None] * Cinv[:n, :n]
        _write_eta2_columns(out[:, M * L + l * K2 : M * L + (l + 1) * K2], r0, Cinv, T, T_strict, symmetric)
    return BlockJacobian.from_compact(
        out, ("mean", "varsqrt"), ("eta1", "eta2"), [(M, L), (L, M, M)], [(M, L), (L, M, M)], (False, bool(symmetric))
    )


def _cholesky(S: Array, l: int) -> Array:
    """chol(S) of latent GP ``l``, or a SingularCovarianceError that names it."""
    try:
        return np.linalg.cholesky(S)
    except np.linalg.LinAlgError:
        raise SingularCovarianceError(
            f"eta2 − eta1·eta1ᵀ is not positive definite for latent GP {l}, so varsqrt = chol(·) has no derivative.",
            context=[("Argument", "eta2"), ("Latent GP", l), ("min eigenvalue", float(np.linalg.eigvalsh(S).min()))],
            remedy="pass expectation parameters of a valid q(u): eta2 = S + eta1·eta1ᵀ with S positive definite.",
        ) from None


def _write_eta2_columns(cols: Array, r0: int, Cinv: Array, T: Array, T_strict: Array, symmetric: bool) -> None:
    """cols[r0 + i·M + k, c] = s_c·[T'[i,k,a] (C⁻¹)_kb + T[i,k,b] (C⁻¹)_ka] for k ≤ i, column c = (a, b), a-major
    (vech: b ≤ a, general: every b), so the a-gather is a ``np.repeat``."""
    M = Cinv.shape[0]
    reps = np.arange(1, M + 1) if symmetric else np.full(M, M)
    a_idx, b_idx = np.repeat(np.arange(M), reps), np.concatenate([np.arange(r) for r in reps])  # vech: tril order
    # dS = s(e_a e_bᵀ + e_b e_aᵀ): vech E_ab + E_ba (s = 1), E_aa (s = ½); general ½(E_ab + E_ba) (s = ½)
    scale = (np.where(a_idx == b_idx, 0.5, 1.0) if symmetric else np.full(len(a_idx), 0.5)).astype(Cinv.dtype)
    sA = Cinv[:, a_idx] * scale  # [k, c]: s·(C⁻¹)_ka
    sB = Cinv[:, b_idx] * scale
    buf = np.empty((M, len(b_idx)), dtype=Cinv.dtype)
    for i in range(M):
        n = i + 1  # k ≤ i, and a ≤ i: the columns with a > i vanish (as for η₁), and they are a suffix
        nc = n * (n + 1) // 2 if symmetric else n * M
        dest = cols[r0 + i * M : r0 + i * M + n, :nc]
        np.multiply(np.repeat(T_strict[i, :n, :n], reps[:n], axis=1), sB[:n, :nc], out=dest)
        tmp = buf[:n, :nc]
        np.take(T[i, :n], b_idx[:nc], axis=1, out=tmp, mode="clip")
        tmp *= sA[:n, :nc]
        dest += tmp


def natgrad_map_jacobian(
    eta1: Any, eta2: Any, *, max_bytes: int = DEFAULT_MAX_BYTES, symmetric: bool = True, chunk_size: int | None = None,
    method: str = "closed_form",
) -> BlockJacobian:  # fmt: skip
    """J = ∂(mean, varsqrt)/∂(eta1, eta2) of GPflow's ``expectation_to_meanvarsqrt`` at (η₁ [M, L], η₂ [L, M, M]).

    The blocks are labelled mean, varsqrt / eta1, eta2. ``symmetric=True`` differentiates η₂ along symmetric tangents
    only (M(M+1)/2 columns instead of M² per latent GP); ``.block(i, 1)`` still has the general shape [..., L, M, M]
    and equals ``tape.jacobian``'s block. ``method="closed_form"`` computes each column in O(M²), O(M⁴) in all;
    ``method="autodiff"`` builds the same matrix by :func:`natgrad_diag.autodiff.dense.jacobian` (with ``chunk_size``).

    Raises:
        ShapeMismatchError: eta1 is not [M, L] or eta2 is not [L, M, M] with eta1's M and L.
        DTypeMismatchError: eta1 and eta2 are floats of different dtypes.
        NonFiniteError: eta1 or eta2 holds NaN or Inf.
        InputError: eta2 is not symmetric (beyond the rounding of forming it), an unknown ``method``, or a
            ``symmetric`` that is not a bool.
        SingularCovarianceError: η₂ − η₁η₁ᵀ is not positive definite for some latent GP.
        MemoryLimitError: the stored Jacobian would exceed ``max_bytes``.

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
    if method not in ("closed_form", "autodiff"):
        raise input_error("unknown method.", "method", "'closed_form' or 'autodiff'", repr(method),
                          "pass method='closed_form' (default) or method='autodiff' (TensorFlow's tape).")
    e1, e2, chols = _validated(eta1, eta2)
    symmetric = require_bool(symmetric, "symmetric")
    if method == "closed_form":
        return _natgrad_map_closed_form(e1, chols, symmetric=symmetric, max_bytes=max_bytes)
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    return jacobian(  # one function object, so the compiled Jacobian is cached
        expectation_to_meanvarsqrt, [e1, e2], input_names=("eta1", "eta2"), output_names=("mean", "varsqrt"),
        max_bytes=max_bytes, symmetric=(False, symmetric), chunk_size=chunk_size,
    )
