"""The loss after k natural-gradient steps with one γ, on a scratch copy, by one compiled step traced once per model.

The γ search of :mod:`natgrad_diag.natgrad.health` measures each γ of the grid by the loss after one step; with
``check_natgrad(..., gamma_steps=k)`` it measures the loss after k steps instead. From the current q(u)
(m₀, L₀) and the gradient g₀ of the loss at it, with the hyperparameters held fixed,

    (m_j, L_j) = step_γ(m_{j−1}, L_{j−1}, g_{j−1}),   g_j = ∂L/∂(q_mu, q_sqrt) at (m_j, L_j),   j = 1 … k,

where ``step_γ`` is GPflow's update (equation [10] of Salimbeni, Eleftheriadis and Hensman, "Natural Gradients in
Practice", AISTATS 2018): :func:`natgrad_diag.natgrad.closed_form.natgrad_step_closed_form` where
:func:`~natgrad_diag.natgrad.closed_form.closed_form_name` applies (XiNat, XiSqrtMeanVar with a lower-triangular
q_sqrt), else :func:`natgrad_diag.natgrad.trace.natgrad_tensors`. The trial's value is L(m_k, L_k). A trial fails at
the first step j whose Cholesky fails, whose new q(u) is unhealthy (the caller's test, e.g. q_sqrt leaves the
positive-definite cone) or whose loss is not finite; the reason names j.

**Cost.** One compiled ``tf.function`` does one step: it reads the scratch copy's q(u), takes the step from the
gradient it is given, assigns the new q(u), and returns the loss and its gradient there (GPflow's tape), so each
step costs one step and one loss-with-gradient. γ is a tensor argument: the function is traced once per (model, ξ
transform, data signature) and reused for every γ and every later call (:func:`runner`, cached per model weakly).
A Python loop calls it k times and stops at the first failed step. A ``tf.while_loop`` over the k steps in one
graph was measured against it at M = 200, N = 400, k = 5 (SVGP, StudentT, XiNat, two CPU cores): 0.146 s for the
loop of compiled steps (numpy health test of each new q(u) included) against 0.141 s for the while_loop (in-graph
test), so the loop's per-step overhead is about 3% at that size; the loop is kept because a failed Cholesky
inside one graph aborts the whole run and loses the number of the step that failed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from natgrad_diag.exceptions import InputError, error_line
from natgrad_diag.natgrad.tensors import loss_and_grads

__all__ = ["MAX_GAMMA_STEPS", "RUNNERS", "GammaStepsRunner", "runner", "validate_gamma_steps"]

#: The largest ``gamma_steps`` accepted: each γ of the grid costs k steps, so 1000 steps × 10 γ is already far
#: more than a diagnostic should spend (a training run, not a check).
MAX_GAMMA_STEPS = 1000


def validate_gamma_steps(gamma_steps: Any, *, var_list: Any = None) -> int:
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
    if var_list is not None and int(gamma_steps) != 1:
        raise InputError(
            "gamma_steps > 1 is supported for SVGP and VGP models only, not with var_list.",
            context=[("Argument", "gamma_steps"), ("Expected", "1 with var_list"), ("Got", repr(gamma_steps))],
            remedy="pass the SVGP or VGP model itself, or leave gamma_steps=1 with var_list.",
        )
    return int(gamma_steps)


def _assign(param: Any, value: Any) -> None:
    """``param.assign(value)`` without GPflow's NaN guard: a NaN step is found by the health test, not raised mid-graph."""
    transform = param.transform
    param.unconstrained_variable.assign(value if transform is None else transform.inverse(value))


class GammaStepsRunner:
    """One compiled natural-gradient step on a scratch copy of one model (ξ transform and data signature fixed).

    Holds no reference to the model: :meth:`trial` takes it, copies its variables into the scratch copy and steps
    the copy, so the model is only read.
    """

    def __init__(self, model: Any, xi: Any, has_data: bool) -> None:
        import gpflow
        import tensorflow as tf

        from natgrad_diag import _compile
        from natgrad_diag._gpflow import to_constrained
        from natgrad_diag.natgrad.closed_form import closed_form_name, natgrad_step_closed_form
        from natgrad_diag.natgrad.trace import natgrad_tensors

        self.scratch = scratch = gpflow.utilities.deepcopy(model)
        self.dtype = model.q_mu.dtype
        name = closed_form_name(xi, scratch.q_sqrt.transform)
        #: "closed form (nat)" or "natgrad_tensors": which maths the step uses.
        self.path = f"closed form ({name})" if name else "natgrad_tensors"

        def step(data: Any, g_mu: Any, g_sq: Any, gamma: Any) -> dict[str, Any]:
            _compile.note_trace("gamma_steps")  # runs once per trace, not per call
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
            return dict(new_q_mu=new_mu, new_q_sqrt=new_sq, loss=loss, g_mu=g_mu_new, g_sq=g_sq_new)

        self.step = tf.function(step)

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
            healthy: (new_q_mu [M, L], new_q_sqrt [L, M, M]) → (usable, why not), applied after every step.

        Returns:
            (loss after step k, "") or (None, "step j of k: why").
        """
        import tensorflow as tf

        for src, dst in zip(model.variables, self.scratch.variables):
            dst.assign(src)  # the current q(u) and hyperparameters, held fixed during the k steps
        args = (data if data is not None else (), tf.constant(g_mu, self.dtype), tf.constant(g_sq, self.dtype))
        gamma_t, loss = tf.constant(gamma, self.dtype), None
        for j in range(1, k + 1):
            at = f"step {j} of {k}"
            if not (np.all(np.isfinite(args[1])) and np.all(np.isfinite(args[2]))):
                return None, f"{at}: the gradient of the loss before it is not finite"
            try:
                out = self.step(*args, gamma_t)
            except tf.errors.InvalidArgumentError as e:
                line = error_line(e)
                return None, f"{at}: " + ("Cholesky failed" if "Cholesky" in line else line)
            ok, why = healthy(out["new_q_mu"].numpy(), out["new_q_sqrt"].numpy())
            if not ok:
                return None, f"{at}: {why}"
            loss = float(out["loss"].numpy())
            if not np.isfinite(loss):
                return None, f"{at}: the loss after it is not finite"
            args = (args[0], out["g_mu"], out["g_sq"])
        return loss, ""


#: The runners of each live model, keyed by the model (weakly: a deleted model frees its runners).
RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runner(model: Any, xi: Any, has_data: bool) -> GammaStepsRunner:
    """The cached :class:`GammaStepsRunner` for ``model``, ``xi`` and whether the loss takes data; built on first use."""
    per_model = RUNNERS.setdefault(model, {})
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
