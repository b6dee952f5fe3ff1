"""The fast mode's compiled engine: tf.function pieces for one model, ξ transform and data signature, cached per model."""

from __future__ import annotations

import weakref
from typing import Any

from natgrad_diag.natgrad.tensors import fisher_matrix_free_tensors, loss_and_grads, step_tensors

__all__ = ["ENGINES", "FastEngine", "fast_engine"]

#: What ``FastEngine.ours`` keeps of the step, so that the graph prunes the rest (the default-seed gradient Jᵀ·1).
_KEEP = ("dL_dmean", "dL_dvarsqrt", "dL_deta1", "dL_deta2", "nat_dL_xi1", "nat_dL_xi2", "new_q_mu", "new_q_sqrt")


def _gpflow_update(model: Any, scratch: Any, opt: Any, gamma_var: Any, xi: Any, has_data: bool) -> Any:
    """A function that copies the model into ``scratch`` and applies GPflow's own update to it."""
    import tensorflow as tf

    from natgrad_diag._gpflow import natgrad_apply_gradients

    src_vars, dst_vars = list(model.variables), list(scratch.variables)

    def update(data: Any, g_mu: Any, g_sq: Any, gamma: Any) -> dict[str, Any]:
        for src, dst in zip(src_vars, dst_vars):
            dst.assign(src)
        gamma_var.assign(gamma)
        natgrad_apply_gradients(opt, g_mu, g_sq, scratch.q_mu, scratch.q_sqrt, xi)
        return dict(
            gp_q_mu=tf.convert_to_tensor(scratch.q_mu), gp_q_sqrt=tf.convert_to_tensor(scratch.q_sqrt),
            loss_after=scratch.training_loss(data) if has_data else scratch.training_loss(),
        )  # fmt: skip

    return update


class FastEngine:
    """Compiled (tf.function) pieces for one model, ξ transform and data signature, reused across calls.

    ``loss_at(data, q_mu, q_sqrt)`` is the training loss of the scratch copy at another q(u) (the loss-gradient check's
    finite differences; valid after ``run`` or ``sync``, which copy the model's other variables into the scratch copy).
    ``run`` computes, in compiled pieces called in turn: the loss and its gradients (GPflow's tape), natgrad-diag's step
    (the closed form where it applies, else ``natgrad_tensors``), GPflow's own update (``natgrad_diag._gpflow.natgrad_apply_gradients``) applied with the
    same gradients to a scratch deep copy of the model, the loss after GPflow's step, and the matrix-free Fisher
    products. The scratch copy's variables are overwritten from the model's at every call; the model is only read.
    When a Cholesky fails inside a piece, :func:`natgrad_diag.natgrad.step.take_step_fast` finds out which part failed.
    """

    def __init__(self, model: Any, xi: Any, has_data: bool, fisher: bool = True) -> None:
        import gpflow
        import tensorflow as tf

        # A weak reference: the engine lives in a WeakKeyDictionary keyed by the model, so it must not keep the
        # model alive (the compiled graphs hold the variables they read, not the model).
        self._model_ref = weakref.ref(model)
        self._fisher_on = fisher
        self.scratch = gpflow.utilities.deepcopy(model)
        self.gamma_var = tf.Variable(1.0, dtype=model.q_mu.dtype, trainable=False)
        self.opt = gpflow.optimizers.NaturalGradient(gamma=self.gamma_var, xi_transform=xi)
        model_ref, update = self._model_ref, _gpflow_update(model, self.scratch, self.opt, self.gamma_var, xi, has_data)

        def grads_only(data: Any) -> dict[str, Any]:
            loss, g_mu, g_sq = loss_and_grads(model_ref(), data if has_data else None)
            return dict(loss=loss, g_mu=g_mu, g_sq=g_sq)

        def ours(g_mu: Any, g_sq: Any, gamma: Any) -> dict[str, Any]:
            return {k: v for k, v in step_tensors(model_ref(), g_mu, g_sq, gamma, xi, closed_form=True).items() if k in _KEEP}

        scratch = self.scratch

        def loss_at(data: Any, q_mu: Any, q_sqrt: Any) -> Any:
            scratch.q_mu.assign(q_mu)
            scratch.q_sqrt.assign(q_sqrt)
            return scratch.training_loss(data) if has_data else scratch.training_loss()

        self.grads_only = tf.function(grads_only)
        self.loss_at = tf.function(loss_at)
        self.ours = tf.function(ours)
        self.gpflow_apply = tf.function(update)
        self.fisher = tf.function(fisher_matrix_free_tensors)

    def run(self, data: Any, gamma: Any) -> dict[str, Any]:
        """Every piece on the model's current parameters: the loss, both steps, the loss after, F·∇ηL and ∇θL."""
        import tensorflow as tf

        # Compiled pieces called in turn, not one fused graph: in one graph TensorFlow ran the independent
        # branches (our step, GPflow's update) concurrently, and on 2 cores that oversubscription made the
        # whole about 25% slower than its parts (measured at M = 1000).
        g = self.grads_only(data)
        out = dict(self.ours(g["g_mu"], g["g_sq"], gamma))
        out.update(g)
        out.update(self.gpflow_apply(data, g["g_mu"], g["g_sq"], gamma))
        if self._fisher_on:
            model = self._model_ref()
            q_mu, q_sqrt = tf.convert_to_tensor(model.q_mu), tf.convert_to_tensor(model.q_sqrt)
            out.update(self.fisher(q_mu, q_sqrt, out["dL_dmean"], out["dL_dvarsqrt"], out["dL_deta1"], out["dL_deta2"]))
        return out

    def sync(self, model: Any) -> None:
        """Copy every variable of the model into the scratch copy (hyperparameters may have changed)."""
        for src, dst in zip(model.variables, self.scratch.variables):
            dst.assign(src)


#: The engines of each live model, keyed by the model (weakly: a deleted model frees its engines).
ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fast_engine(model: Any, xi: Any, has_data: bool, fisher: bool = True) -> FastEngine:
    """The cached :class:`FastEngine` for ``model``, ``xi``, the data signature and ``fisher``; built on first use."""
    per_model = ENGINES.setdefault(model, {})
    # the compiled graphs capture the model's variables: a replaced Parameter needs a new engine
    key = (
        type(xi).__name__, id(xi) if type(xi).__module__ != "gpflow.optimizers.natgrad" else 0, has_data, fisher,
        tuple(id(v) for v in model.variables),
    )  # fmt: skip
    if key not in per_model:
        while len(per_model) >= 4:  # replaced parameters or other ξ transforms: keep the newest few
            per_model.pop(next(iter(per_model)))
        per_model[key] = FastEngine(model, xi, has_data, fisher)
    return per_model[key]
