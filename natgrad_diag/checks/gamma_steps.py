"""The loss after k natural-gradient steps with one γ on a scratch copy, in one tf.function traced once per model.

The γ search of :mod:`natgrad_diag.checks.health` measures each γ of the grid by the loss after one step; with
``check_natgrad(..., gamma_steps=k)`` it measures the loss after k steps instead. From the current q(u)
(m₀, L₀) and the gradient g₀ of the loss at it, with the hyperparameters held fixed,

    (m_j, L_j) = step_γ(m_{j−1}, L_{j−1}, g_{j−1}),   g_j = ∂L/∂(q_mu, q_sqrt) at (m_j, L_j),   j = 1 … k,

where ``step_γ`` is GPflow's update (equation [10] of Salimbeni, Eleftheriadis and Hensman, "Natural Gradients in
Practice", AISTATS 2018): :func:`natgrad_diag.step.closed_form.natgrad_step_closed_form` where
:func:`~natgrad_diag.step.backend.step_backend` picks a closed form (XiNat, XiSqrtMeanVar with a lower-triangular
q_sqrt), else :func:`natgrad_diag.step.trace.natgrad_tensors`. The trial's value is L(m_k, L_k). A trial fails at
the first step j whose Cholesky fails, whose new q(u) is unhealthy (the caller's test, e.g. q_sqrt leaves the
positive-definite cone) or whose loss is not finite; the reason names j.

**Cost.** One compiled ``tf.function`` runs the k steps of one γ in a ``tf.while_loop`` on a scratch copy: each step
takes GPflow's update from the gradient it is given, assigns the new q(u), and computes the loss and its gradient
there (GPflow's tape), so a step costs one update and one loss-with-gradient; the loop stops after the first step
whose cheap in-graph health test fails. γ and k are tensor arguments: the function is traced once per (model, ξ
transform, data signature) and reused for every γ, every k and every later call (:func:`runner`, cached per model
weakly). Measured at M = 200, N = 400, k = 5 (SVGP, StudentT, XiNat, two shared CPU cores, best of 20): 35–40 ms per
γ for the while_loop against 40–42 ms for a Python loop calling a compiled single step k times (the loop pays a
call and a device-to-host read per step), so the while_loop is used. The single step stays as the fallback that
replays a trial step by step when an op raises inside the while_loop, to name the step that raised.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from natgrad_diag.exceptions import InputError, error_line
from natgrad_diag.checks.tensors import loss_and_grads

__all__ = ["MAX_GAMMA_STEPS", "RUNNERS", "GammaStepsRunner", "runner", "validate_gamma_steps"]

#: The largest ``gamma_steps`` accepted: each γ of the grid costs k steps, so 1000 steps × 10 γ is already far
#: more than a diagnostic should spend (a training run, not a check).
MAX_GAMMA_STEPS = 1000


def validate_gamma_steps(gamma_steps: Any) -> int:
    """``gamma_steps`` as an int in [1, :data:`MAX_GAMMA_STEPS`]; an :class:`InputError` naming it otherwise.

    Examples:
        >>> validate_gamma_steps(5)
        5
        >>> validate_gamma_steps(True)
        Traceback (most recent call last):
        ...
        natgrad_diag.exceptions.InputError: Invalid input. gamma_steps must be an integer from 1 to 1000 (a bool is not a step count).
          Argument: gamma_steps
            Expected: an int, 1 ≤ gamma_steps ≤ 1000
            Got:      True
          To fix: pass gamma_steps=1 (the loss after one step, the default) or e.g. gamma_steps=5.
    """
    expected = f"an int, 1 ≤ gamma_steps ≤ {MAX_GAMMA_STEPS}"
    remedy = "pass gamma_steps=1 (the loss after one step, the default) or e.g. gamma_steps=5."
    is_int = isinstance(gamma_steps, (int, np.integer)) and not isinstance(gamma_steps, (bool, np.bool_))
    if not is_int or not 1 <= int(gamma_steps) <= MAX_GAMMA_STEPS:
        why = (
            " (a bool is not a step count)" if isinstance(gamma_steps, (bool, np.bool_))
            else f" (each γ of the grid costs gamma_steps steps; more than {MAX_GAMMA_STEPS} is a training run, not a check)"
            if is_int and int(gamma_steps) > MAX_GAMMA_STEPS else ""
        )  # fmt: skip
        raise InputError(
            f"gamma_steps must be an integer from 1 to {MAX_GAMMA_STEPS}{why}.",
            context=[("Argument", "gamma_steps"), ("Expected", expected), ("Got", repr(gamma_steps))],
            remedy=remedy,
        )
    return int(gamma_steps)


def _all_finite(x: Any) -> Any:
    import tensorflow as tf

    return tf.reduce_all(tf.math.is_finite(x))


def _looks_healthy(new_q_mu: Any, new_q_sqrt: Any) -> Any:
    """In the graph, health's cheap tests (:func:`natgrad_diag.checks.health.health`): finite, q_sqrt [L, M, M]
    lower-triangular to 100·ε·max(max|q_sqrt|, 1) with a positive diagonal; a scalar bool tensor."""
    import tensorflow as tf

    eps = float(np.finfo(new_q_sqrt.dtype.as_numpy_dtype).eps)
    scale = tf.maximum(tf.reduce_max(tf.abs(new_q_sqrt)), 1.0)
    upper = tf.reduce_max(tf.abs(new_q_sqrt - tf.linalg.band_part(new_q_sqrt, -1, 0)))
    diag_ok = tf.reduce_all(tf.linalg.diag_part(new_q_sqrt) > 0)
    return _all_finite(new_q_mu) & _all_finite(new_q_sqrt) & (upper <= 100 * eps * scale) & diag_ok


def _assign(param: Any, value: Any) -> None:
    """``param.assign(value)`` without GPflow's NaN guard: a NaN step is found by the health test, not raised mid-graph."""
    transform = param.transform
    param.unconstrained_variable.assign(value if transform is None else transform.inverse(value))


def _step_fn(scratch: Any, xi: Any, name: str | None, has_data: bool) -> Callable[..., dict[str, Any]]:
    """One step on ``scratch`` from the gradient given (not compiled): the new q(u), assigned; the loss and its
    gradient there; the graph's health flags (q_ok: :func:`_looks_healthy`, loss_ok, g_ok)."""
    import tensorflow as tf

    from natgrad_diag._gpflow import to_constrained
    from natgrad_diag.step.closed_form import natgrad_step_closed_form
    from natgrad_diag.step.trace import natgrad_tensors

    def step(data: Any, g_mu: Any, g_sq: Any, gamma: Any) -> dict[str, Any]:
        q_mu, q_sqrt = tf.convert_to_tensor(scratch.q_mu), tf.convert_to_tensor(scratch.q_sqrt)
        dL_dmean, dL_dvarsqrt = to_constrained(g_mu, scratch.q_mu.transform), to_constrained(g_sq, scratch.q_sqrt.transform)
        if name is not None:
            new_mu, new_sq = natgrad_step_closed_form(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, gamma, name)
        else:
            out = natgrad_tensors(q_mu, q_sqrt, dL_dmean, dL_dvarsqrt, gamma, xi)
            new_mu, new_sq = out["new_q_mu"], out["new_q_sqrt"]
        _assign(scratch.q_mu, new_mu)
        _assign(scratch.q_sqrt, new_sq)
        loss, g_mu_new, g_sq_new = loss_and_grads(scratch, data if has_data else None)
        return dict(
            new_q_mu=new_mu, new_q_sqrt=new_sq, loss=loss, g_mu=g_mu_new, g_sq=g_sq_new,
            q_ok=_looks_healthy(new_mu, new_sq), loss_ok=_all_finite(loss), g_ok=_all_finite(g_mu_new) & _all_finite(g_sq_new),
        )  # fmt: skip

    return step


class GammaStepsRunner:
    """k compiled natural-gradient steps on a scratch copy of one model (ξ transform and data signature fixed).

    ``run`` is one ``tf.function`` holding a ``tf.while_loop`` over the steps that stops after the first failed one;
    k and γ are tensor arguments, so it is traced once. ``step`` (the same step alone, compiled on first use) replays
    the steps one by one only when an op raised inside ``run``, to name the step that raised. Holds no reference to
    the model: :meth:`trial` takes it and copies its variables into the scratch copy, so the model is only read.
    """

    def __init__(self, model: Any, xi: Any, has_data: bool) -> None:
        import gpflow
        import tensorflow as tf

        from natgrad_diag import _compile
        from natgrad_diag.step.backend import step_backend

        self.scratch = gpflow.utilities.deepcopy(model)
        self.dtype = model.q_mu.dtype
        name = step_backend(xi, self.scratch.q_sqrt.transform).xi
        #: "closed form (nat)", "closed form (sqrtmeanvar)" or "natgrad_tensors": which maths the step uses.
        self.path = f"closed form ({name})" if name else "natgrad_tensors"
        step = _step_fn(self.scratch, xi, name, has_data)
        flags = ("q_ok", "loss_ok", "g_ok")

        def run(data: Any, g_mu: Any, g_sq: Any, gamma: Any, k: Any) -> dict[str, Any]:
            _compile.note_trace("gamma_steps")  # runs once per trace, not per call

            def body(j: Any, ok: Any, out: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
                new = step(data, out["g_mu"], out["g_sq"], gamma)
                ok = new["q_ok"] & new["loss_ok"] & (new["g_ok"] | tf.equal(j + 1, k))
                return j + 1, ok, {key: tf.cast(new[key], out[key].dtype) for key in out}

            init = dict(
                new_q_mu=tf.convert_to_tensor(self.scratch.q_mu), new_q_sqrt=tf.convert_to_tensor(self.scratch.q_sqrt),
                loss=tf.constant(np.nan, self.dtype), g_mu=g_mu, g_sq=g_sq, **{f: tf.constant(True) for f in flags},
            )  # fmt: skip
            j, ok, out = tf.while_loop(lambda j, ok, out: (j < k) & ok, body, (tf.constant(0), tf.constant(True), init))
            return dict(out, steps=j, ok=ok)

        def single(data: Any, g_mu: Any, g_sq: Any, gamma: Any) -> dict[str, Any]:
            _compile.note_trace("gamma_steps_replay")
            return step(data, g_mu, g_sq, gamma)

        self.run = tf.function(run)
        self.step = tf.function(single)

    def trial(
        self, model: Any, data: Any, g_mu: Any, g_sq: Any, gamma: float, k: int, healthy: Callable[[Any, Any], tuple[bool, str]],
    ) -> tuple[float | None, str]:  # fmt: skip
        """The loss after k steps with ``gamma`` from the model's current q(u), or (None, why) for a failed step.

        Args:
            model: the model the runner was built for (read only: its variables are copied into the scratch copy).
            data: (X [N, D], Y [N, P]) tensors, or None for a model that holds its data.
            g_mu, g_sq: the gradient of the loss at the current q(u) w.r.t. q_mu's and q_sqrt's unconstrained
                variables (the checked step's).
            gamma: the step length γ.
            k: the number of steps.
            healthy: (new_q_mu [M, L], new_q_sqrt [L, M, M]) → (usable, why not): the full test (numpy Cholesky of S
                included), applied to the last step's q(u) and to a step the graph's cheaper test failed.

        Returns:
            (loss after step k, "") or (None, "step j of k: why").
        """
        import tensorflow as tf

        if not (np.all(np.isfinite(g_mu)) and np.all(np.isfinite(g_sq))):
            return None, f"step 1 of {k}: the gradient of the loss before it is not finite"
        self._sync(model)
        args = (data if data is not None else (), tf.constant(g_mu, self.dtype), tf.constant(g_sq, self.dtype), tf.constant(gamma, self.dtype))
        try:
            out = self.run(*args, tf.constant(k))
        except tf.errors.InvalidArgumentError:
            self._sync(model)
            return self._replay(args, k, healthy)
        return _verdict({key: v.numpy() for key, v in out.items()}, int(out["steps"].numpy()), k, healthy)

    def _sync(self, model: Any) -> None:
        for src, dst in zip(model.variables, self.scratch.variables):
            dst.assign(src)  # the current q(u) and hyperparameters, held fixed during the k steps

    def _replay(self, args: tuple[Any, ...], k: int, healthy: Callable[[Any, Any], tuple[bool, str]]) -> tuple[float | None, str]:
        """The steps one compiled call at a time, after an op raised inside :attr:`run`: which step raised, and why."""
        import tensorflow as tf

        data, g_mu, g_sq, gamma = args
        for j in range(1, k + 1):
            try:
                out = {key: v.numpy() for key, v in self.step(data, g_mu, g_sq, gamma).items()}
            except tf.errors.InvalidArgumentError as e:
                line = error_line(e)
                return None, f"step {j} of {k}: " + ("Cholesky failed" if "Cholesky" in line else line)
            out["ok"] = out["q_ok"] and out["loss_ok"] and (out["g_ok"] or j == k)
            if not out["ok"] or j == k:
                return _verdict(out, j, k, healthy)
            g_mu, g_sq = out["g_mu"], out["g_sq"]
        raise AssertionError("unreachable")  # pragma: no cover


def _verdict(out: dict[str, Any], j: int, k: int, healthy: Callable[[Any, Any], tuple[bool, str]]) -> tuple[float | None, str]:
    """The trial's (loss, "") or (None, "step j of k: why") from the last step taken (step j; the run stopped there)."""
    at = f"step {j} of {k}"
    if not out["q_ok"] or out["ok"]:  # the full test where the graph's failed, and on the q(u) the loss is taken at
        ok, why = healthy(out["new_q_mu"], out["new_q_sqrt"])
        if not ok or not out["q_ok"]:
            return None, f"{at}: {why or 'the new q_sqrt is not lower-triangular with a positive diagonal'}"
    if not out["loss_ok"]:
        return None, f"{at}: the loss after it is not finite"
    if not out["ok"]:  # only the gradient for the next step is left
        return None, f"step {j + 1} of {k}: the gradient of the loss before it is not finite"
    return float(out["loss"]), ""


#: The runners of each live model, keyed by the model (weakly: a deleted model frees its runners).
RUNNERS: weakref.WeakKeyDictionary[Any, dict[Any, GammaStepsRunner]] = weakref.WeakKeyDictionary()


def runner(model: Any, xi: Any, has_data: bool) -> GammaStepsRunner:
    """The cached :class:`GammaStepsRunner` for ``model``, ``xi`` and whether the loss takes data; built on first use."""
    per_model: dict[Any, GammaStepsRunner] = RUNNERS.setdefault(model, {})
    # the compiled step captures the scratch copy, built from the model's variables: a replaced Parameter needs a new one
    key = (
        type(xi).__name__, id(xi) if type(xi).__module__ != "gpflow.optimizers.natgrad" else 0, has_data,
        tuple(id(v) for v in model.variables),
    )  # fmt: skip
    if key not in per_model:
        while len(per_model) >= 4:  # replaced parameters or other ξ transforms: keep the newest few
            per_model.pop(next(iter(per_model)))
        per_model[key] = GammaStepsRunner(model, xi, has_data)
    return per_model[key]
