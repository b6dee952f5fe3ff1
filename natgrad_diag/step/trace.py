"""``natgrad_trace``: GPflow's natural-gradient step (maths in :mod:`natgrad_diag.step`) recorded, assigning nothing.

The fast paths are the ones :func:`~natgrad_diag.step.backend.step_backend` picks: LAPACK's record, or a
``tf.function`` (traced once per key) of the TensorFlow closed form or of the eager path's operations. A fast path
that sees anything unusual defers to the eager path, which names every error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from natgrad_diag import _compile
from natgrad_diag._gpflow import constrained_array, is_lower_triangular_transform, to_constrained
from natgrad_diag._validate import dtype_name, input_error, param_parts, require_positive_float, shape_str, validate_grad, validate_q
from natgrad_diag.exceptions import DTypeMismatchError, NatGradDiagError, ShapeMismatchError, StepFailedError
from natgrad_diag.exceptions import error_line, raised_as_is
from natgrad_diag.step.backend import StepBackend, closed_form_xi, step_backend
from natgrad_diag.step.closed_form import default_seed_gradient, natgrad_tensors_closed_form
from natgrad_diag.step.lapack import natgrad_record_lapack
from natgrad_diag.typing import Array, FloatArray

__all__ = ["NatGradTrace", "constrained_arrays", "natgrad_tensors", "natgrad_trace", "resolve_xi_transform", "step_from_eta"]


@dataclass(frozen=True)
class NatGradTrace:
    """Every intermediate of one natural-gradient step, as float arrays; every pair (x1, x2) is ([M, L], [L, M, M]).

    Attributes:
        eta1, eta2: η₁ = m, η₂ = S + m mᵀ.
        dL_dmean, dL_dvarsqrt: ∂L/∂m, ∂L/∂L_S (``_to_constrained`` of the gradients with the parameters' transforms).
        dL_deta1, dL_deta2: ``tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=[dL_dmean, dL_dvarsqrt])`` = Jᵀ·v.
        dtheta_deta1, dtheta_deta2: ``tape.gradient(meanvarsqrt, [eta1, eta2])``, the default seed: Jᵀ·1 (the fast
            paths compute it in closed form, :func:`default_seed_gradient`, equal to rounding).
        xi1, xi2: the current ξ = ``xi_transform.meanvarsqrt_to_xi(q_mu, q_sqrt)``.
        nat_dL_xi1, nat_dL_xi2: the natural gradient in ξ coordinates (= ∂L/∂η for XiNat).
        new_q_mu, new_q_sqrt: what GPflow's step would assign for ``gamma``.
        gamma, xi_transform: the step length; the name of the ξ transform's class.
    """

    eta1: Array
    eta2: Array
    dL_dmean: Array
    dL_dvarsqrt: Array
    dL_deta1: Array
    dL_deta2: Array
    dtheta_deta1: Array
    dtheta_deta2: Array
    xi1: Array
    xi2: Array
    nat_dL_xi1: Array
    nat_dL_xi2: Array
    new_q_mu: Array
    new_q_sqrt: Array
    gamma: float
    xi_transform: str
    q_mu: Array = field(repr=False, default=None)  # type: ignore[assignment, arg-type, unused-ignore]
    q_sqrt: Array = field(repr=False, default=None)  # type: ignore[assignment, arg-type, unused-ignore]

    @property
    def num_inducing(self) -> int:
        """M."""
        return int(self.eta1.shape[0])

    @property
    def num_latent(self) -> int:
        """L."""
        return int(self.eta1.shape[1])

    @property
    def naive_product1(self) -> Array:
        """[M, L], the user's guess ``dtheta_deta1 * dL_dmean``, i.e. (Jᵀ·1) ⊙ v for η₁."""
        return self.dtheta_deta1 * self.dL_dmean

    def __str__(self) -> str:
        return (
            f"NatGradTrace(M={self.num_inducing}, L={self.num_latent}, dtype={self.eta1.dtype}, "
            f"xi_transform={self.xi_transform}, gamma={self.gamma:g}, "
            f"max|ΔL_S|={np.max(np.abs(self.new_q_sqrt - self.q_sqrt)):.3g}, "
            f"max|Δm|={np.max(np.abs(self.new_q_mu - self.q_mu)):.3g})"
        )


def resolve_xi_transform(xi_transform: Any) -> Any:
    """``None`` means ``XiNat()`` (GPflow's default); a class is refused with a hint to instantiate it."""
    from gpflow.optimizers import XiNat, XiTransform

    if xi_transform is None:
        return XiNat()
    if isinstance(xi_transform, type):
        raise input_error("xi_transform must be an instance, not a class.", "xi_transform",
                          "an instance such as XiNat()", f"the class {xi_transform.__name__}",
                          f"pass xi_transform={xi_transform.__name__}().")
    needed = ("meanvarsqrt_to_xi", "xi_to_meanvarsqrt", "naturals_to_xi")
    if not isinstance(xi_transform, XiTransform) and not all(callable(getattr(xi_transform, n, None)) for n in needed):
        raise input_error("xi_transform is not a gpflow XiTransform.", "xi_transform", "gpflow.optimizers.XiTransform",
                          type(xi_transform).__name__,
                          "pass XiNat(), XiSqrtMeanVar() or a subclass of gpflow.optimizers.XiTransform.")
    return xi_transform


def _validate_gamma(gamma: Any) -> float:
    remedy = "pass a step length in (0, 1]; 1 is the exact step for a Gaussian likelihood."
    return require_positive_float(gamma, "gamma", remedy=remedy)


def _precheck(q_mu: Any, q_sqrt: Any) -> None:
    """What every path needs before any work: eager mode, float32/float64, M ≥ 1 and L ≥ 1, a lower-triangular
    q_sqrt (or a lower-triangular transform, which makes it one)."""
    import gpflow
    import tensorflow as tf

    if not tf.executing_eagerly():
        raise input_error(
            "natgrad_trace was called inside a tf.function (or a graph): it records numpy values, which need eager mode.",
            "q_mu", "eager tensors (natgrad_trace called outside tf.function)", "symbolic tensors",
            "call natgrad_trace eagerly, outside tf.function; it compiles its own step from the second call.",
        )  # fmt: skip
    for name, x, dims in (("q_mu", q_mu, "[M, L]"), ("q_sqrt", q_sqrt, "[L, M, M]")):
        if dtype_name(x) in ("float16", "bfloat16"):
            raise input_error(f"{name} is {dtype_name(x)}: GPflow's natural-gradient step needs float32 or float64 "
                              "(its Cholesky and triangular solves have no half-precision kernels).", name,
                              "float64 (or float32)", dtype_name(x), "build the model in float64 (GPflow's default: "
                              "gpflow.config.set_default_float(np.float64)).", kind=DTypeMismatchError)
        shape = getattr(x, "shape", None)
        if shape is not None and 0 in tuple(shape):
            raise input_error(f"{name} is empty (M = 0 inducing points or L = 0 latent GPs): there is no step to "
                              "trace.", name, f"{dims} with M ≥ 1 and L ≥ 1", shape_str(shape), "pass the q_mu and "
                              "q_sqrt of a model with at least one inducing point and one latent GP.",
                              kind=ShapeMismatchError)
    if isinstance(q_sqrt, gpflow.Parameter) and is_lower_triangular_transform(q_sqrt.transform):
        return
    try:
        a = np.asarray(q_sqrt.numpy() if hasattr(q_sqrt, "numpy") else q_sqrt)
    except (TypeError, ValueError):
        return  # param_parts names what is wrong with it
    if a.ndim != 3 or a.shape[-1] != a.shape[-2] or a.dtype.kind != "f":
        return  # validate_q names the shape or dtype
    if len(above := np.argwhere(np.triu(a, 1) != 0)):
        l_idx, i, j = (int(k) for k in above[0])
        raise input_error("q_sqrt has non-zero entries above the diagonal; GPflow's step would mix the full matrix (in "
                          "S = q_sqrt q_sqrtᵀ) with its lower triangle (in the triangular solves).", "q_sqrt",
                          "lower-triangular [L, M, M] (zeros above the diagonal)",
                          f"{shape_str(a.shape)} with q_sqrt[{l_idx}, {i}, {j}] = {a[l_idx, i, j]:.6g}",
                          "pass np.tril(q_sqrt) (the Cholesky factor), or a gpflow.Parameter with "
                          "transform=gpflow.utilities.triangular().")


def natgrad_tensors(
    q_mu: Any, q_sqrt: Any, dL_dmean: Any, dL_dvarsqrt: Any, gamma: Any, xi_transform: Any, *, default_seed: str = "tape"
) -> dict[str, Any]:
    """GPflow's ``_natgrad_apply_gradients`` on constrained tensors, recorded; no checks (tf.function-able): its lines
    to ∂L/∂η, then :func:`step_from_eta` (the same operations, the ξ double backward pass on a tape of its own).

    Also records the default-seed gradient ``dtheta_deta = tape.gradient(meanvarsqrt, [eta1, eta2])``
    (``default_seed="tape"``, the user's line) or the same by :func:`default_seed_gradient` (``"closed_form"``).
    """
    import tensorflow as tf
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation

    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch([q_mu, q_sqrt])
        eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt)
        meanvarsqrt = expectation_to_meanvarsqrt(eta1, eta2)
    dL_deta1, dL_deta2 = tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=[dL_dmean, dL_dvarsqrt])
    closed = default_seed == "closed_form"
    dtheta_deta1, dtheta_deta2 = default_seed_gradient(eta1, meanvarsqrt[1]) if closed else tape.gradient(meanvarsqrt, [eta1, eta2])
    del tape
    return dict(
        eta1=eta1, eta2=eta2, dL_deta1=dL_deta1, dL_deta2=dL_deta2, dtheta_deta1=dtheta_deta1, dtheta_deta2=dtheta_deta2,
        **step_from_eta(q_mu, q_sqrt, dL_deta1, dL_deta2, gamma, xi_transform),
    )  # fmt: skip


def step_from_eta(q_mu: Any, q_sqrt: Any, dL_deta1: Any, dL_deta2: Any, gamma: Any, xi_transform: Any) -> dict[str, Any]:
    """GPflow's step from ∂L/∂η on (tensors of one dtype): nat_dL_xi = (∂ξ/∂θ)·∂L/∂η (∂L/∂η itself for XiNat, else
    GPflow's double backward pass through ``naturals_to_xi`` with a dummy of ones), ξ_new = ξ − γ·nat_dL_xi mapped back
    by ``xi_to_meanvarsqrt``: ``{xi1, xi2, nat_dL_xi1, nat_dL_xi2, new_q_mu [M, L], new_q_sqrt [L, M, M]}``."""
    import tensorflow as tf
    from gpflow.optimizers import XiNat
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

    if isinstance(xi_transform, XiNat):
        nat_dL_xi1, nat_dL_xi2 = dL_deta1, dL_deta2
    else:
        nat1, nat2 = meanvarsqrt_to_natural(q_mu, q_sqrt)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch([nat1, nat2])
            xi1_nat, xi2_nat = xi_transform.naturals_to_xi(nat1, nat2)
        dummy_tensors = tf.ones_like(xi1_nat), tf.ones_like(xi2_nat)
        with tf.GradientTape(watch_accessed_variables=False) as forward_tape:
            forward_tape.watch(dummy_tensors)
            dummy_gradients = tape.gradient([xi1_nat, xi2_nat], [nat1, nat2], output_gradients=dummy_tensors)
        nat_dL_xi1, nat_dL_xi2 = forward_tape.gradient(dummy_gradients, dummy_tensors, output_gradients=[dL_deta1, dL_deta2])
    xi1, xi2 = xi_transform.meanvarsqrt_to_xi(q_mu, q_sqrt)
    new_q_mu, new_q_sqrt = xi_transform.xi_to_meanvarsqrt(xi1 - gamma * nat_dL_xi1, xi2 - gamma * nat_dL_xi2)
    return dict(xi1=xi1, xi2=xi2, nat_dL_xi1=nat_dL_xi1, nat_dL_xi2=nat_dL_xi2, new_q_mu=new_q_mu, new_q_sqrt=new_q_sqrt)


def _transform_key(transform: Any) -> Any:
    """A hashable key for a parameter transform that depends only on what it computes (``"identity"`` for None, or a
    TFP bijector's class and its plain-valued constructor parameters), or None when it cannot be keyed."""
    if transform is None:
        return "identity"
    params = getattr(transform, "parameters", None)
    if not isinstance(params, dict) or any(v is not None and not isinstance(v, (bool, int, float, str)) for v in params.values()):
        return None
    return (type(transform), tuple(sorted(params.items())))


def _fast_parts(x: Any) -> tuple[Any, Any]:
    """(the tensor the step reads, its transform) without running the transform; (None, None) if unusual."""
    import gpflow
    import tensorflow as tf

    if isinstance(x, gpflow.Parameter):
        return x.unconstrained_variable, x.transform
    if isinstance(x, (tf.Variable, tf.Tensor)):
        return x, None
    return (tf.convert_to_tensor(x), None) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else (None, None)


def _record(out: dict[str, Any], g: float, xi: Any) -> NatGradTrace:
    """The frozen trace from a record of the step and its inputs q_mu, q_sqrt, dL_dmean, dL_dvarsqrt."""
    arrays = {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in out.items()}
    if bad := [k for k in ("new_q_mu", "new_q_sqrt") if not np.all(np.isfinite(arrays[k]))]:
        raise StepFailedError(
            f"with gamma = {g:g} the step produced NaN or Inf in {', '.join(bad)}.",
            context=[("gamma", g), ("xi_transform", type(xi).__name__)],
            remedy="use a smaller gamma, or float64 if you are in float32.",
        )
    return NatGradTrace(gamma=g, xi_transform=type(xi).__name__, **arrays)


def _compiled_step(key: Any, xi: Any, backend: StepBackend, t_mu: Any, t_sq: Any, *, build: bool) -> Any:
    """The cached tf.function for ``key`` (``natgrad_tensors_closed_form`` or ``natgrad_tensors``, by ``backend``);
    ``None`` when there is none and ``build`` is false: the first call with a key only records it, the second compiles."""
    import tensorflow as tf

    ckey, keep = ("natgrad_tensors", key), (xi, t_mu, t_sq)
    seen = _compile.recall(ckey) is not None
    _compile.remember(ckey, True, keep=keep)  # the next call with this key compiles
    if not build and not seen:
        return None

    def make() -> Any:
        def step(mu_in: Any, sq_in: Any, g_mu: Any, g_sq: Any, gamma: Any) -> dict[str, Any]:
            _compile.note_trace("natgrad_tensors")
            q_mu, q_sqrt = to_constrained(mu_in, t_mu), to_constrained(sq_in, t_sq)  # the eager path's maps
            dL_dmean, dL_dvarsqrt = to_constrained(g_mu, t_mu), to_constrained(g_sq, t_sq)
            args = (q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, gamma, xi)
            out = natgrad_tensors(*args, default_seed="closed_form") if backend.xi is None else natgrad_tensors_closed_form(*args, backend.xi)
            finite = [tf.reduce_all(tf.math.is_finite(t)) for t in (q_mu, q_sqrt, g_mu, g_sq)]
            nonsingular = tf.reduce_all(tf.not_equal(tf.linalg.diag_part(q_sqrt), 0))
            ok = tf.reduce_all(tf.stack(finite + [nonsingular]))
            return dict(out, q_mu=q_mu, q_sqrt=q_sqrt, dL_dmean=dL_dmean, dL_dvarsqrt=dL_dvarsqrt, inputs_ok=ok)

        # traced here, once for this key; calling the concrete function skips tf.function's dispatch
        shapes, dtype = key[0], tf.as_dtype(key[1])
        signature = tuple(tf.TensorSpec(s, dtype) for s in shapes) + (tf.TensorSpec([], dtype),)
        return tf.function(step, input_signature=signature, autograph=False).get_concrete_function()

    return _compile.compiled(ckey, make, keep=keep)


def _natgrad_trace_compiled(
    q_mu: Any, q_sqrt: Any, q_mu_grad: Any, q_sqrt_grad: Any, g: float, xi: Any, *, build: bool = True
) -> NatGradTrace | None:
    """A fast path's trace, or ``None`` when the eager path must decide (an unusual input, one not finite or singular,
    a failed Cholesky, NaN or Inf) or, with ``build=False``, when the tf.function for this key is not compiled yet
    (LAPACK runs anyway)."""
    import tensorflow as tf

    parts = map(_fast_parts, (q_mu, q_sqrt, q_mu_grad, q_sqrt_grad))
    (mu_in, t_mu), (sq_in, t_sq), (g_mu, t_gmu), (g_sq, t_gsq) = parts
    if any(t is None for t in (mu_in, sq_in, g_mu, g_sq)) or t_gmu is not None or t_gsq is not None:
        return None  # unusual, or a gradient that is a Parameter
    tensors, dtype = (mu_in, sq_in, g_mu, g_sq), mu_in.dtype
    if not dtype.is_floating or any(t.dtype != dtype for t in tensors):
        return None
    shapes = [tuple(t.shape.as_list()) for t in tensors]
    if shapes[2] != shapes[0] or shapes[3] != shapes[1] or any(d is None for s in shapes for d in s):
        return None
    backend = step_backend(xi, t_sq, mu_in, sq_in)
    if backend.code == "lapack":  # no tracing
        try:
            arrays = constrained_arrays(tensors, t_mu, t_sq)
        except Exception:  # noqa: BLE001 - a transform that fails on these values: the eager path names the problem
            return None
        if arrays is None:
            return None
        mu, sq, d_mu, d_sq = arrays  # constrained
        try:
            record = natgrad_record_lapack(mu, sq, d_mu, d_sq, g, str(backend.xi))
            return _record(dict(record, q_mu=mu, q_sqrt=sq, dL_dmean=d_mu, dL_dvarsqrt=d_sq), g, xi)
        except NatGradDiagError:  # SingularCovarianceError, StepFailedError (NaN or Inf too): the eager path names them
            return None
    k_mu, k_sq = _transform_key(t_mu), _transform_key(t_sq)
    if k_mu is None or k_sq is None:
        return None
    # GPflow's own ξ classes are stateless, so the class decides; another ξ is keyed by its object (kept alive)
    key = (tuple(shapes), dtype.name, backend, closed_form_xi(xi) or (type(xi), id(xi)), k_mu, k_sq)
    try:
        if (fn := _compiled_step(key, xi, backend, t_mu, t_sq, build=build)) is None:
            return None
        out = fn(mu_in, sq_in, g_mu, g_sq, tf.constant(g, dtype))
    except Exception:  # noqa: BLE001 - the eager reference path re-raises what is genuine
        return None  # a shape the step cannot trace, or a failed Cholesky: the eager path says which
    mu_shape, sq_shape = tuple(out["q_mu"].shape), tuple(out["q_sqrt"].shape)
    if not bool(out.pop("inputs_ok")) or len(mu_shape) != 2 or sq_shape != (mu_shape[1], mu_shape[0], mu_shape[0]):
        return None
    return _record(out, g, xi)


def constrained_arrays(tensors: tuple[Any, ...], t_mu: Any, t_sq: Any) -> tuple[FloatArray, ...] | None:
    """(q_mu [M, L], q_sqrt [L, M, M], ∂L/∂m, ∂L/∂L_S) as numpy arrays for the LAPACK path, from ``tensors`` =
    (the unconstrained q_mu, q_sqrt and their gradients) and the parameters' transforms, bit for bit the eager
    path's (:func:`natgrad_diag._gpflow.to_constrained`). ``None`` when the eager reference path must decide (and
    name the problem): an input that is not finite, a zero on q_sqrt's diagonal, shapes that do not fit.
    """
    q_mu, q_sqrt, d_mu, d_sq = (constrained_array(x, t) for x, t in zip(tensors, (t_mu, t_sq, t_mu, t_sq)))
    M, L = q_mu.shape if q_mu.ndim == 2 else (0, 0)
    if q_mu.ndim != 2 or q_sqrt.shape != (L, M, M) or d_mu.shape != q_mu.shape or d_sq.shape != q_sqrt.shape:
        return None
    raw = [np.asarray(x.numpy() if hasattr(x, "numpy") else x) for x in tensors[2:]]  # as the eager path checks them
    finite = all(np.all(np.isfinite(a)) for a in (q_mu, q_sqrt, d_mu, d_sq, *raw))
    return None if not finite or np.any(np.diagonal(q_sqrt, 0, 1, 2) == 0) else (q_mu, q_sqrt, d_mu, d_sq)


@raised_as_is
def natgrad_trace(
    q_mu: Any, q_sqrt: Any, q_mu_grad: Any, q_sqrt_grad: Any, *, gamma: float = 1.0, xi_transform: Any = None, compiled: bool | None = None
) -> NatGradTrace:
    """Reproduce GPflow's natural-gradient step for (q_mu, q_sqrt) and return every intermediate.

    Nothing is assigned: the parameters are bit-identical afterwards. The paths (module docstring) give the same
    numbers to rounding, ε·κ(S). The eager reference runs the user's lines as written, ``dtheta_deta`` as the literal
    ``tape.gradient(meanvarsqrt, [eta1, eta2])``; one ``tf.function`` per (shapes, dtype, ξ, parameter transforms).

    Args:
        q_mu, q_sqrt: [M, L], [L, M, M], ``gpflow.Parameter``s (q_sqrt usually ``triangular()``); a tf.Variable,
            tensor or array has the identity transform.
        q_mu_grad, q_sqrt_grad: dL/d of their unconstrained variables ([M, L]; [L, M(M+1)/2] if triangular).
        gamma, xi_transform: the step length γ > 0; a ``gpflow.optimizers.XiTransform`` (``None``: ``XiNat()``).
        compiled: ``True``: a fast path (LAPACK, or the cached ``tf.function``, tracing on a first call);
            ``False``: always the eager reference path; ``None`` (default): LAPACK from the first call where it
            applies, else eager on the first call of a key and the ``tf.function`` after.

    Returns:
        A frozen :class:`NatGradTrace`.

    Raises:
        ShapeMismatchError, DTypeMismatchError, NonFiniteError, SingularCovarianceError:
            bad parameters or gradients (the message names the argument).
        UnsupportedModelError: q_sqrt is diagonal ([M, L], q_diag=True).
        StepFailedError: the step for this gamma leaves the positive-definite cone.

    Example:
        >>> from natgrad_diag import seed_scenario
        >>> trace = natgrad_trace(*seed_scenario())
        >>> trace.dL_deta1.shape
        (5, 1)
    """
    _precheck(q_mu, q_sqrt)
    xi, g = resolve_xi_transform(xi_transform), _validate_gamma(gamma)
    if compiled is not False:
        result = _natgrad_trace_compiled(q_mu, q_sqrt, q_mu_grad, q_sqrt_grad, g, xi, build=bool(compiled))
        if result is not None:
            return result
    return _natgrad_trace_eager(q_mu, q_sqrt, q_mu_grad, q_sqrt_grad, g, xi)


def _natgrad_trace_eager(q_mu: Any, q_sqrt: Any, q_mu_grad: Any, q_sqrt_grad: Any, g: float, xi: Any) -> NatGradTrace:
    """The reference path: validate every input (the errors), then the step eagerly."""
    import tensorflow as tf

    mu_p, sq_p = param_parts(q_mu, "q_mu"), param_parts(q_sqrt, "q_sqrt")
    validate_q(mu_p, sq_p)
    g_mu = validate_grad(q_mu_grad, mu_p, "q_mu_grad", "q_mu")
    g_sq = validate_grad(q_sqrt_grad, sq_p, "q_sqrt_grad", "q_sqrt")
    dL_dmean, dL_dvarsqrt = to_constrained(g_mu, mu_p.transform), to_constrained(g_sq, sq_p.transform)
    mu_t, sq_t = tf.identity(mu_p.value), tf.identity(sq_p.value)
    try:
        out = natgrad_tensors(mu_t, sq_t, dL_dmean, dL_dvarsqrt, tf.constant(g, mu_t.dtype), xi)
    except tf.errors.InvalidArgumentError as e:
        raise StepFailedError(
            f"with gamma = {g:g} the updated covariance is not positive definite (Cholesky failed).",
            context=[("gamma", g), ("xi_transform", type(xi).__name__), ("TensorFlow said", error_line(e))],
            remedy="use a smaller gamma (natgrad-diag check suggests one), or float64 if you are in float32.",
        ) from None
    return _record(dict(out, q_mu=mu_t, q_sqrt=sq_t, dL_dmean=dL_dmean, dL_dvarsqrt=dL_dvarsqrt), g, xi)
