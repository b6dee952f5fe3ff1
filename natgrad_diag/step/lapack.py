"""The closed-form record of GPflow's natural-gradient step, computed by LAPACK's triangular kernels on numpy arrays.

:func:`natgrad_record_lapack` returns what ``natgrad_tensors_closed_form`` returns (items 1-5 of
:mod:`natgrad_diag.step.closed_form`), on kernels TensorFlow lacks: ``trtri`` and ``lauum`` (M³/3 flops against 2M³
for a dense product), ``trmm`` and ``sygst`` (M³). Per latent GP:

    C⁻¹ = trtri(C), once;  Λ = C⁻ᵀC⁻¹ = lauum(C⁻¹);  S = CCᵀ = J·lauum(JCᵀJ)·J;  P = Φ(CᵀG) by trmm
    ∂L/∂S = ½C⁻ᵀ(P + Pᵀ)C⁻¹ by sygst;  Jᵀ·1 by one trmm;  XiSqrtMeanVar's L_S Φ(L_Sᵀ G) = C P by trmm
    XiNat: K = potrf(JBJ), U = JKJ, q_sqrt_new = C U⁻ᵀ by trsm

**Layout.** LAPACK reads Fortran-ordered matrices, and a C-ordered q_sqrt[l] *is* the Fortran array L_Sᵀ. So the
record works with transposes (U = Cᵀ, V = C⁻ᵀ = trtri(U), Pᵀ, Gᵀ, (C U⁻ᵀ)ᵀ), the triangle flags flipped: no
matrix is copied to be transposed (such a copy costs as much as a small kernel at M = 1000); reversals (J·X·J)
are cheap copies. ``overwrite_*`` is set only on this module's own temporaries (never on a view of an input: a
1×1 array is both C- and Fortran-ordered).

**Threads.** The kernels run in one BLAS thread (threadpoolctl): the record is the same to the bit whatever the load,
and OpenBLAS's multi-threaded LAPACK collapses on a busy machine (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np

from natgrad_diag.exceptions import SingularCovarianceError, StepFailedError
from natgrad_diag.typing import FloatArray

__all__ = ["natgrad_record_lapack", "one_blas_thread"]

_CONTROLLER: list[Any] = []  # threadpoolctl's controller, made once (after scipy has loaded its BLAS)
_LOCK = threading.Lock()  # two threads restoring the BLAS limit in interleaved order would leave the process at one


@contextlib.contextmanager
def one_blas_thread(*, limit: bool = True) -> Iterator[None]:
    """Run the body with every BLAS library of the process at one thread (unless ``limit=False``), one such body at a
    time: this record and :mod:`natgrad_diag.checks.bounds` run in it (module docstring, Threads)."""
    from threadpoolctl import ThreadpoolController

    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    with _LOCK, (_CONTROLLER[0].limit(limits=1, user_api="blas") if limit else contextlib.nullcontext()):
        yield  # the previous limits come back on exit


def _kernels(dtype: Any) -> Any:
    """The BLAS/LAPACK routines of one precision (scipy picks the ``d``/``s`` prefix from the dtype) as attributes."""
    from scipy.linalg import get_blas_funcs, get_lapack_funcs

    probe = [np.zeros((1, 1), dtype=dtype, order="F")]
    blas, lapack = ("trmm", "trsm", "trmv", "gemv"), ("trtri", "lauum", "potrf", "sygst")
    return SimpleNamespace(**dict(zip(blas + lapack, get_blas_funcs(blas, probe) + get_lapack_funcs(lapack, probe))))


def _sym_tri(x: FloatArray) -> FloatArray:
    """The symmetric matrix with x's triangle, for x zero strictly on the other side (``lauum`` of a triangle
    writes its own triangle and leaves the zeros): X + Xᵀ with X's diagonal. Exactly symmetric."""
    full = x + x.T
    np.fill_diagonal(full, np.diagonal(x))
    return full


def _c_layout(x: FloatArray) -> FloatArray:
    """An exactly symmetric x as a C-ordered array without a transposing copy (xᵀ = x), for the output."""
    return x.T if x.flags.f_contiguous and not x.flags.c_contiguous else x


def _times(k: Any, a: FloatArray, v: FloatArray) -> FloatArray:
    """a v by scipy's BLAS (never numpy's own OpenBLAS: one BLAS library, one thread limit); a C-ordered a
    is passed as the Fortran array aᵀ with trans=1, so f2py copies nothing."""
    return np.asarray(k.gemv(1.0, a, v) if a.flags.f_contiguous else k.gemv(1.0, a.T, v, trans=1))


def _default_seed(k: Any, u: FloatArray, v: FloatArray, m: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Jᵀ·1 (closed_form.default_seed_gradient) from U = Cᵀ and V = C⁻ᵀ: Σ̄ = sym(Aᵀ) with
    Aᵀ = (cumsum₋(C⁻¹) + ½C⁻¹)ᵀ diag(s) C⁻¹ = (cumsum₋ over the columns of V + ½V) diag(s) Vᵀ, one trmm."""
    s = u.sum(axis=1)  # the column sums of C
    w = np.zeros_like(v, order="F")
    np.cumsum(v[:, :-1], axis=1, out=w[:, 1:])  # exclusive cumulative sum over the columns of V = over the rows of C⁻¹
    w += 0.5 * v
    w *= s[None, :]
    a_t = k.trmm(1.0, v, w, side=1, lower=0, trans_a=1, overwrite_b=1)  # (...)·Vᵀ = Aᵀ
    sigma_bar = 0.5 * (a_t + a_t.T)  # exactly symmetric, as TensorFlow's Cholesky gradient returns it
    return 1.0 - 2.0 * _times(k, sigma_bar, m), sigma_bar


def _xinat_step(k: Any, u: FloatArray, x: FloatArray, m: FloatArray, dm: FloatArray, gamma: Any) -> tuple[FloatArray, FloatArray]:
    """XiNat's new (q_mu, q_sqrtᵀ): B = I + γ(P + Pᵀ) = U_B U_Bᵀ with U_B = JKJ, K = potrf(JBJ);
    q_sqrt_newᵀ = U_B⁻¹ Cᵀ (trsm), q_mu_new = m − γ q_sqrt_new q_sqrt_newᵀ ∂L/∂m (two trmv). x is the
    upper triangle of P + Pᵀ: potrf of the lower triangle of JBJ reads B's upper triangle only."""
    b = gamma * x
    b[np.diag_indices_from(b)] += 1.0
    kk, info = k.potrf(np.array(b[::-1, ::-1], order="F"), lower=1, clean=1, overwrite_a=1)  # JBJ = K Kᵀ
    if info > 0:
        raise StepFailedError(f"with gamma = {gamma:g} the updated precision is not positive definite (B's Cholesky failed at {info}).")
    ub = np.array(kk[::-1, ::-1], order="F")  # U_B = JKJ, upper: B = U_B U_Bᵀ
    new_t = k.trsm(1.0, ub, u, side=0, lower=0)  # U_B X = Cᵀ: X = U_B⁻¹Cᵀ = (C U_B⁻ᵀ)ᵀ, upper
    w = k.trmv(new_t, dm, lower=0, trans=0)  # q_sqrt_newᵀ ∂L/∂m
    w = k.trmv(new_t, w, lower=0, trans=1, overwrite_x=1)  # q_sqrt_new q_sqrt_newᵀ ∂L/∂m
    return m - gamma * w, new_t


def _latent(
    k: Any, m: FloatArray, ls_t: FloatArray, dm: FloatArray, g_t: FloatArray, gamma: Any, xi: str, full: bool = True
) -> dict[str, FloatArray]:
    """The record for one latent GP: m, dm [M]; ls_t = L_Sᵀ, g_t = Gᵀ [M, M], Fortran views of the C-ordered inputs
    (module docstring, Layout); each output matrix is a C-ordered view. ``full=False``: the step and ∂L/∂η only."""
    u = np.multiply(ls_t, np.where(np.diagonal(ls_t) < 0, -1.0, 1.0).astype(ls_t.dtype)[:, None], order="F")  # U = Cᵀ = D L_Sᵀ
    v, info = k.trtri(u, lower=0, overwrite_c=0)  # V = C⁻ᵀ, upper, computed once
    if info > 0:
        raise SingularCovarianceError(f"q_sqrt has a zero on its diagonal (entry {info - 1}).")
    x = np.triu(k.trmm(1.0, u, g_t, side=1, lower=0, trans_a=1))  # GᵀC's upper triangle = (P + Pᵀ)'s
    half, _ = k.sygst(x, v, itype=2, lower=0, overwrite_a=0)  # upper triangle of V (P + Pᵀ) Vᵀ
    dL_dS = 0.5 * _sym_tri(half)  # ½ C⁻ᵀ (P + Pᵀ) C⁻¹
    out = dict(dL_deta1=dm - 2.0 * _times(k, dL_dS, m), dL_deta2=_c_layout(dL_dS))
    if full or xi == "sqrtmeanvar":
        jsj = _sym_tri(k.lauum(np.array(u[::-1, ::-1], order="F"), lower=1, overwrite_c=1)[0])  # (JUJ)ᵀ(JUJ) = JSJ
    if full:
        dtheta1, dtheta2 = _default_seed(k, u, v, m)
        cov = jsj[::-1, ::-1]  # S = C Cᵀ
        out.update(eta1=m, eta2=_c_layout(cov + np.outer(m, m)), dtheta_deta1=dtheta1, dtheta_deta2=_c_layout(dtheta2))
    if xi == "sqrtmeanvar":
        x[np.diag_indices_from(x)] *= 0.5  # now Pᵀ = Φ(CᵀG)ᵀ (x is not needed after this)
        nat2_t = k.trmm(1.0, u, x, side=1, lower=0, overwrite_b=1)  # Pᵀ Cᵀ = (C P)ᵀ = (L_S Φ(L_Sᵀ G))ᵀ
        nat1 = _times(k, jsj, dm[::-1])[::-1]  # S ∂L/∂m = J (JSJ) J ∂L/∂m
        out.update(nat_dL_xi1=nat1, nat_dL_xi2=nat2_t.T, new_q_mu=m - gamma * nat1, new_q_sqrt=(ls_t - gamma * nat2_t).T)
        if full:
            out.update(xi1=m, xi2=ls_t.T)
        return out
    new_mu, new_t = _xinat_step(k, u, x, m, dm, gamma)
    out.update(nat_dL_xi1=out["dL_deta1"], nat_dL_xi2=out["dL_deta2"], new_q_mu=new_mu, new_q_sqrt=new_t.T)
    if full:
        lam = _sym_tri(k.lauum(v, lower=0, overwrite_c=0)[0])  # V Vᵀ = C⁻ᵀC⁻¹ = Λ (from its upper triangle)
        out.update(xi1=_times(k, lam, m), xi2=_c_layout(-0.5 * lam))
    return out


def natgrad_record_lapack(
    q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, gamma: float, xi: str, *, full: bool = True,
    one_thread: bool = True,
) -> dict[str, FloatArray]:
    """``natgrad_tensors_closed_form``'s record by LAPACK, one latent GP at a time.

    Args:
        q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, gamma, xi: as for :func:`.closed_form.natgrad_step_closed_form` (arrays, a
            float γ); q_sqrt zero above the diagonal (natgrad_trace checks it), a negative diagonal fine.
        full: ``False`` leaves out η, Jᵀ·1 and ξ (the fast check needs only ∂L/∂η, the natural gradient, the step).
        one_thread: ``False`` runs the kernels at the BLAS library's own thread count (the benchmark's comparison).

    Returns:
        ``{key: array}`` for NatGradTrace's arrays besides the inputs ([M, L] or [L, M, M], the inputs' dtype).

    Raises:
        SingularCovarianceError: a zero on q_sqrt's diagonal.
        StepFailedError: XiNat, when B = I + γ(P + Pᵀ) is not positive definite (γ too long; GPflow fails too).
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
    dtype = np.asarray(q_mu).dtype
    q_mu, dL_dmean = (np.asarray(x, dtype=dtype) for x in (q_mu, dL_dmean))
    q_sqrt, dL_dvarsqrt = (np.ascontiguousarray(x, dtype=dtype) for x in (q_sqrt, dL_dvarsqrt))  # so that [j].T is Fortran
    k, g = _kernels(dtype), dtype.type(gamma)
    with one_blas_thread(limit=one_thread):
        per = [_latent(k, q_mu[:, j], q_sqrt[j].T, dL_dmean[:, j], dL_dvarsqrt[j].T, g, xi, full) for j in range(q_mu.shape[1])]
    return {  # [L, M, M] matrices, [M, L] vectors, of the inputs' dtype
        key: np.stack([p[key] for p in per], axis=0 if first.ndim == 2 else 1).astype(dtype, copy=False)
        for key, first in per[0].items()
    }
