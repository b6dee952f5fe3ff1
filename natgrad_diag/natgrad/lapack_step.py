"""The closed-form record of GPflow's natural-gradient step, computed by LAPACK's triangular kernels on numpy arrays.

:func:`natgrad_record_lapack` returns what ``natgrad_tensors_closed_form`` (natgrad_diag.natgrad.closed_form)
returns, with the same maths — the derivations (Murray 2016's Cholesky VJP and JVP, the reversed
Cholesky of B = I + γ(P + Pᵀ) for XiNat, the collapsed XiSqrtMeanVar step) are in that module's docstring,
items 1-4 — but with the kernels TensorFlow lacks: a triangular inverse (``trtri``), the product of a
triangle with its transpose (``lauum``) and triangle × matrix products (``trmm``), each about a third of a
dense product. TensorFlow's matmul, ``triangular_solve`` with an M×M right-hand side and Cholesky treat
every triangle as a full matrix, so the record by LAPACK costs a fraction of the tf.function's time.

Per latent GP, with C = L_S·D (D = diag(sign L_S,ii), the Cholesky factor of S with a positive diagonal):

    C⁻¹ = trtri(C)                     once, reused everywhere below
    Λ = S⁻¹ = C⁻ᵀC⁻¹ = lauum(C⁻¹)      (XiNat's ξ = (Λm, −½Λ))
    S = C Cᵀ = J·lauum(JCJ)·J           (η₂ = S + m mᵀ; J reverses rows and columns, JCJ is upper)
    P = Φ(Cᵀ G)                        one trmm (Φ: lower triangle, diagonal halved)
    ∂L/∂S = sym(C⁻ᵀ P C⁻¹)             two trmm; ∂L/∂η₂ = ∂L/∂S, ∂L/∂η₁ = ∂L/∂m − 2 ∂L/∂S m
    Jᵀ·1 = sym(C⁻ᵀ diag(s) (cumsum₋(C⁻¹) + ½C⁻¹)), s = column sums of C   (``default_seed_gradient``)
    XiNat:          K = potrf(JBJ), U = JKJ (B = UUᵀ), q_sqrt_new = C U⁻ᵀ (trsm), q_mu_new = m − γ S_new ∂L/∂m
    XiSqrtMeanVar:  L_S Φ(L_Sᵀ G) = C P (the signs D cancel), q_mu_new = m − γ S ∂L/∂m

The kernels run in one BLAS thread (threadpoolctl, restored afterwards). Two reasons: the record is then
the same to the bit whatever the machine's load or thread count (a diagnostic's second call gives the same
answer), and on a busy machine (more runnable processes than cores) OpenBLAS's multi-threaded ``trtri``,
``lauum`` and ``potrf`` at M = 1000 were measured 5-15× slower than one thread, while on an idle 2-core
machine a second thread gains less than 2×.

LAPACK needs Fortran-ordered matrices: every kernel here reads and writes Fortran arrays (f2py copies a
C-ordered argument once), ``overwrite_*`` is set only on this module's own temporaries, and the results
are copied into C-ordered [L, M, M] arrays at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.exceptions import SingularCovarianceError, StepFailedError

__all__ = ["natgrad_record_lapack"]

_KEYS = (
    "eta1", "eta2", "dL_deta1", "dL_deta2", "dtheta_deta1", "dtheta_deta2",
    "xi1", "xi2", "nat_dL_xi1", "nat_dL_xi2", "new_q_mu", "new_q_sqrt",
)  # fmt: skip
_MATRIX_KEYS = ("eta2", "dL_deta2", "dtheta_deta2", "xi2", "nat_dL_xi2", "new_q_sqrt")


@dataclass(frozen=True)
class _Kernels:
    """BLAS/LAPACK routines of one precision (``d``/``s`` prefix chosen by scipy from the dtype)."""

    trmm: Any
    trsm: Any
    trmv: Any
    gemv: Any
    trtri: Any
    lauum: Any
    potrf: Any


_CONTROLLER: list[Any] = []  # threadpoolctl's controller, made once (after scipy has loaded its BLAS)


def _one_blas_thread() -> Any:
    """A context in which every BLAS library of the process runs one thread (the previous limits come back)."""
    from threadpoolctl import ThreadpoolController

    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="blas")


def _kernels(dtype: np.dtype[Any]) -> _Kernels:
    from scipy.linalg import get_blas_funcs, get_lapack_funcs

    probe = np.zeros((1, 1), dtype=dtype, order="F")
    trmm, trsm, trmv, gemv = get_blas_funcs(("trmm", "trsm", "trmv", "gemv"), (probe,))
    trtri, lauum, potrf = get_lapack_funcs(("trtri", "lauum", "potrf"), (probe,))
    return _Kernels(trmm=trmm, trsm=trsm, trmv=trmv, gemv=gemv, trtri=trtri, lauum=lauum, potrf=potrf)


def _sym_from_lower(x: np.ndarray) -> np.ndarray:
    """The symmetric matrix whose lower triangle is x's (LAPACK's ``lauum`` writes one triangle only)."""
    low = np.tril(x)
    return np.asfortranarray(low + np.tril(low, -1).T)


def _sym(x: np.ndarray) -> np.ndarray:
    """½(X + Xᵀ), exactly symmetric, as TensorFlow's Cholesky gradient returns it."""
    return np.asfortranarray(0.5 * (x + x.T))


def _phi(x: np.ndarray) -> np.ndarray:
    """Φ(X): the lower triangle of X with its diagonal halved (a new Fortran array)."""
    p = np.asfortranarray(np.tril(x))
    idx = np.arange(x.shape[0])
    p[idx, idx] *= 0.5
    return p


def _chol_times(k: _Kernels, chol: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(chol cholᵀ) v for a lower-triangular chol [M, M] and v [M], by two triangular products."""
    w = k.trmv(chol, v, lower=1, trans=1)  # cholᵀ v, a new array (v is not overwritten)
    return np.asarray(k.trmv(chol, w, lower=1, trans=0, overwrite_x=1))


def _times(k: _Kernels, a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """a v by scipy's BLAS: every product in this module runs in one BLAS library, never in numpy's own
    OpenBLAS, whose idle threads spin for a while after a call and then slow scipy's down (by up to 10×
    measured on 2 busy cores)."""
    return np.asarray(k.gemv(1.0, a, v))


def _covariances(k: _Kernels, c: np.ndarray, c_inv: np.ndarray, nat: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """S = C Cᵀ (lauum of the reversed, upper-triangular JCJ) and, for XiNat, Λ = C⁻ᵀC⁻¹ (lauum of C⁻¹)."""
    rev = np.array(c[::-1, ::-1], order="F")  # JCJ, upper triangular, our own copy (never a view, even for M = 1)
    jsj, info = k.lauum(rev, lower=0, overwrite_c=1)  # upper triangle of (JCJ)(JCJ)ᵀ = J S J
    _require(info, "lauum")
    cov = np.triu(jsj)[::-1, ::-1]  # the lower triangle of S
    cov = np.asfortranarray(cov + np.tril(cov, -1).T)
    if not nat:
        return cov, None
    lam, info = k.lauum(c_inv, lower=1, overwrite_c=0)  # lower triangle of C⁻ᵀC⁻¹; C⁻¹ is reused
    _require(info, "lauum")
    return cov, _sym_from_lower(lam)


def _require(info: int, routine: str) -> None:
    if info < 0:  # an illegal argument: a bug here, never the user's input
        raise RuntimeError(f"LAPACK {routine} rejected argument {-info}")


def _default_seed(k: _Kernels, c: np.ndarray, c_inv: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Jᵀ·1 of ``expectation_to_meanvarsqrt`` (closed_form.default_seed_gradient): one trmm."""
    s = c.sum(axis=0)  # column sums of C
    rows = np.zeros_like(c_inv, order="F")
    np.cumsum(c_inv[:-1], axis=0, out=rows[1:])  # exclusive cumulative sum over rows
    rows += 0.5 * c_inv
    rows *= s[:, None]  # diag(s) (cumsum₋(C⁻¹) + ½C⁻¹)
    a = k.trmm(1.0, c_inv, rows, side=0, lower=1, trans_a=1, overwrite_b=1)  # C⁻ᵀ · (...)
    sigma_bar = _sym(a)
    return 1.0 - 2.0 * _times(k, sigma_bar, m), sigma_bar


def _latent(k: _Kernels, m: np.ndarray, ls: np.ndarray, dm: np.ndarray, g: np.ndarray, gamma: float, xi: str) -> dict[str, np.ndarray]:
    """The record for one latent GP: m, dm [M]; ls = L_S, g = G [M, M]."""
    signs = np.where(np.diagonal(ls) < 0, -1.0, 1.0).astype(ls.dtype)
    c = np.multiply(ls, signs[None, :], order="F")  # C = L_S·D
    c_inv, info = k.trtri(c, lower=1, overwrite_c=0)
    _require(info, "trtri")
    if info > 0:
        raise SingularCovarianceError(f"q_sqrt has a zero on its diagonal (entry {info - 1}).")
    p = _phi(k.trmm(1.0, c, g, side=0, lower=1, trans_a=1))  # P = Φ(CᵀG)
    y = k.trmm(1.0, c_inv, p, side=1, lower=1)  # P C⁻¹
    y = k.trmm(1.0, c_inv, y, side=0, lower=1, trans_a=1, overwrite_b=1)  # C⁻ᵀ P C⁻¹
    dL_dS = _sym(y)
    dtheta1, dtheta2 = _default_seed(k, c, c_inv, m)
    cov, lam = _covariances(k, c, c_inv, xi == "nat")
    out = dict(
        eta1=m, eta2=cov + np.outer(m, m), dL_deta1=dm - 2.0 * _times(k, dL_dS, m), dL_deta2=dL_dS,
        dtheta_deta1=dtheta1, dtheta_deta2=dtheta2,
    )  # fmt: skip
    if xi == "sqrtmeanvar":
        nat2 = k.trmm(1.0, c, p, side=0, lower=1)  # L_S Φ(L_Sᵀ G) = C P
        nat1 = _times(k, cov, dm)
        out.update(xi1=m, xi2=ls, nat_dL_xi1=nat1, nat_dL_xi2=nat2, new_q_mu=m - gamma * nat1, new_q_sqrt=ls - gamma * nat2)
        return out
    assert lam is not None
    out.update(xi1=_times(k, lam, m), xi2=-0.5 * lam, nat_dL_xi1=out["dL_deta1"], nat_dL_xi2=dL_dS)
    b = gamma * (p + p.T)
    b[np.diag_indices_from(b)] += 1.0  # B = I + γ(P + Pᵀ)
    kk, info = k.potrf(np.array(b[::-1, ::-1], order="F"), lower=1, clean=1, overwrite_a=1)  # JBJ = K Kᵀ
    _require(info, "potrf")
    if info > 0:
        raise StepFailedError(f"with gamma = {gamma:g} the updated precision is not positive definite (B's Cholesky failed at {info}).")
    u = np.asfortranarray(kk[::-1, ::-1])  # U = JKJ, upper, B = U Uᵀ
    new_sqrt = np.tril(k.trsm(1.0, u, c, side=1, lower=0, trans_a=1))  # X Uᵀ = C: X = C U⁻ᵀ
    out.update(new_q_mu=m - gamma * _chol_times(k, new_sqrt, dm), new_q_sqrt=new_sqrt)
    return out


def natgrad_record_lapack(q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, gamma: float, xi: str) -> dict[str, np.ndarray]:
    """``natgrad_tensors_closed_form``'s record (η, ∂L/∂η, Jᵀ·1, ξ, the natural gradient in ξ, the new q(u))
    by LAPACK, one latent GP at a time (the module docstring lists the kernels).

    Args:
        q_mu: [M, L], m.
        q_sqrt: [L, M, M], L_S, lower triangular (negative diagonal entries allowed: C = L_S·D).
        dL_dmean: [M, L], ∂L/∂m.
        dL_dvarsqrt: [L, M, M], G = ∂L/∂L_S (its upper triangle does not enter, as in GPflow).
        gamma: the step length γ.
        xi: ``"nat"`` (XiNat) or ``"sqrtmeanvar"`` (XiSqrtMeanVar).

    Returns:
        A dict with the keys of ``natgrad_tensors_closed_form``: ``eta1``, ``eta2``, ``dL_deta1``, ``dL_deta2``,
        ``dtheta_deta1``, ``dtheta_deta2``, ``xi1``, ``xi2``, ``nat_dL_xi1``, ``nat_dL_xi2``, ``new_q_mu``,
        ``new_q_sqrt`` ([M, L] or [L, M, M] numpy arrays of the inputs' dtype, float32 or float64).

    Raises:
        SingularCovarianceError: a zero on q_sqrt's diagonal.
        StepFailedError: XiNat, when B = I + γ(P + Pᵀ) is not positive definite (γ too long; GPflow's
            step fails there too). natgrad_trace then runs its eager reference path, whose message it shows.
        ValueError: xi is neither ``"nat"`` nor ``"sqrtmeanvar"``.

    Examples:
        >>> import numpy as np
        >>> q_mu, q_sqrt = np.array([[1.0], [2.0]]), np.array([[[1.0, 0.0], [0.5, 2.0]]])
        >>> g_mu, g_sqrt = np.array([[0.1], [0.2]]), np.array([[[0.3, 0.0], [0.1, -0.2]]])
        >>> rec = natgrad_record_lapack(q_mu, q_sqrt, g_mu, g_sqrt, 0.5, "sqrtmeanvar")
        >>> S = q_sqrt[0] @ q_sqrt[0].T
        >>> bool(np.allclose(rec["new_q_mu"][:, 0], q_mu[:, 0] - 0.5 * S @ g_mu[:, 0]))
        True
        >>> rec["new_q_sqrt"].shape
        (1, 2, 2)
    """
    if xi not in ("nat", "sqrtmeanvar"):
        raise ValueError(f"Expected xi 'nat' or 'sqrtmeanvar', got {xi!r} instead.")
    q_mu, q_sqrt = np.asarray(q_mu), np.asarray(q_sqrt)
    dtype = q_mu.dtype
    M, L = q_mu.shape
    k = _kernels(dtype)
    g = dtype.type(gamma)
    with _one_blas_thread():
        per = [
            _latent(k, q_mu[:, j], q_sqrt[j], np.asarray(dL_dmean)[:, j], np.asarray(dL_dvarsqrt)[j], g, xi)  # type: ignore[arg-type]
            for j in range(L)
        ]
    out: dict[str, np.ndarray] = {}
    for key in _KEYS:
        if key in _MATRIX_KEYS:
            arr = np.empty((L, M, M), dtype=dtype)
            for j in range(L):
                arr[j] = per[j][key]
        else:
            arr = np.stack([per[j][key] for j in range(L)], axis=1).astype(dtype, copy=False)
        out[key] = arr
    return out
