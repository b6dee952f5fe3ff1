"""The fast mode's compiled engine: tf.function pieces for one model, ξ transform and data signature, cached per model."""

from __future__ import annotations

import weakref
from typing import Any

from natgrad_diag.checks.tensors import fisher_matrix_free_tensors, loss_and_grads, step_tensors

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
    (the closed form by LAPACK where it applies, else ``natgrad_tensors``), GPflow's own update (``natgrad_diag._gpflow.natgrad_apply_gradients``) applied with the
    same gradients to a scratch deep copy of the model, the loss after GPflow's step, and the matrix-free Fisher
    products. The scratch copy's variables are overwritten from the model's at every call; the model is only read.
    When a Cholesky fails inside a piece, :func:`natgrad_diag.checks.step.take_step_fast` finds out which part failed.
    """

    def __init__(self, model: Any, xi: Any, has_data: bool, fisher: bool = True) -> None:
        import gpflow
        import tensorflow as tf

        from natgrad_diag._gpflow import to_constrained
        from natgrad_diag.step.backend import step_backend

        #: "nat"/"sqrtmeanvar" when natgrad-diag's step is the LAPACK record (natgrad.lapack_step), else None
        backend = step_backend(xi, model.q_sqrt.transform, model.q_sqrt)
        self.lapack_xi = backend.xi if backend.code == "lapack" else None
        # A weak reference: the engine lives in a WeakKeyDictionary keyed by the model, so it must not keep the
        # model alive (the compiled graphs hold the variables they read, not the model).
        self._model_ref = weakref.ref(model)
        self._fisher_on = fisher
        self.scratch = gpflow.utilities.deepcopy(model)
        self.gamma_var = tf.Variable(1.0, dtype=model.q_mu.dtype, trainable=False)
        self.opt = gpflow.optimizers.NaturalGradient(gamma=self.gamma_var, xi_transform=xi)
        model_ref, update = self._model_ref, _gpflow_update(model, self.scratch, self.opt, self.gamma_var, xi, has_data)

        def grads_only(data: Any) -> dict[str, Any]:
            m = model_ref()
            assert m is not None  # the engine is reached through fast_engine(model): the model is alive
            loss, g_mu, g_sq = loss_and_grads(m, data if has_data else None)
            return dict(
                loss=loss, g_mu=g_mu, g_sq=g_sq, q_mu=tf.convert_to_tensor(m.q_mu), q_sqrt=tf.convert_to_tensor(m.q_sqrt),
                dL_dmean=to_constrained(g_mu, m.q_mu.transform), dL_dvarsqrt=to_constrained(g_sq, m.q_sqrt.transform),
            )  # fmt: skip

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
        """Every piece on the model's current parameters, as numpy arrays: the loss and its gradients, both steps,
        the loss after GPflow's, F·∇ηL and ∇θL.

        natgrad-diag's step is the closed form by LAPACK (:func:`~natgrad_diag.step.lapack.natgrad_record_lapack`)
        for XiNat and XiSqrtMeanVar, else the compiled ``natgrad_tensors``. When the LAPACK record refuses the step
        (γ too long, a singular q_sqrt) the compiled closed form runs instead, so that the failure is TensorFlow's
        ``InvalidArgumentError``, which :func:`~natgrad_diag.checks.step.take_step_fast` explains piece by piece.
        """
        import tensorflow as tf

        # Compiled pieces called in turn, not one fused graph: in one graph TensorFlow ran the independent
        # branches (our step, GPflow's update) concurrently, and on 2 cores that oversubscription made the
        # whole about 25% slower than its parts (measured at M = 1000).
        g = {k: v.numpy() for k, v in self.grads_only(data).items()}
        out = dict(g)
        out.update(self._ours(g, gamma))
        out.update({k: v.numpy() for k, v in self.gpflow_apply(data, g["g_mu"], g["g_sq"], gamma).items()})
        if self._fisher_on:
            args = [tf.constant(out[k]) for k in ("q_mu", "q_sqrt", "dL_dmean", "dL_dvarsqrt", "dL_deta1", "dL_deta2")]
            out.update({k: v.numpy() for k, v in self.fisher(*args).items()})
        return out

    def _ours(self, g: dict[str, Any], gamma: Any) -> dict[str, Any]:
        """natgrad-diag's step from the gradients ``g`` (numpy), the keys of ``_KEEP``."""
        from natgrad_diag.exceptions import SingularCovarianceError, StepFailedError
        from natgrad_diag.step.lapack import natgrad_record_lapack

        if self.lapack_xi is not None:
            try:
                rec = natgrad_record_lapack(g["q_mu"], g["q_sqrt"], g["dL_dmean"], g["dL_dvarsqrt"], float(gamma), self.lapack_xi, full=False)
            except (StepFailedError, SingularCovarianceError):
                pass  # the compiled step below fails too, with TensorFlow's error
            else:
                return {k: rec[k] for k in _KEEP if k in rec}
        return {k: v.numpy() for k, v in self.ours(g["g_mu"], g["g_sq"], gamma).items()}

    def sync(self, model: Any) -> None:
        """Copy every variable of the model into the scratch copy (hyperparameters may have changed)."""
        for src, dst in zip(model.variables, self.scratch.variables):
            dst.assign(src)


#: The engines of each live model, keyed by the model (weakly: a deleted model frees its engines).
ENGINES: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], FastEngine]] = weakref.WeakKeyDictionary()


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
