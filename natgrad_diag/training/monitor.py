"""``NatGradMonitor``: the cheap natural-gradient checks inside a training loop, as a ``gpflow.monitor.MonitorTask``
(so this module imports GPflow; :mod:`natgrad_diag` imports it on first access to ``NatGradMonitor``)."""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import numpy as np
from gpflow.monitor import MonitorTask

from natgrad_diag import _compile
from natgrad_diag._validate import input_error, require_bool, require_int, require_positive_float, validate_data, validate_model
from natgrad_diag.checks.api import check_natgrad, validate_gamma_steps
from natgrad_diag.exceptions import NatGradCheckError, error_line
from natgrad_diag.training.guard import ON_FAILURE, StepGuard, lower_after_check, qu_valid, require_step
from natgrad_diag.training.tensorboard import ScalarLog
from natgrad_diag.training.records import GuardRecord, NatGradRecord
from natgrad_diag.checks.pairs import refuse_misplaced, trainable_note, variational_pairs
from natgrad_diag.report.timeline import timeline_html

__all__ = ["SEARCH_EVERY", "NatGradMonitor"]

#: The periodic check searches γ at its first call, every SEARCH_EVERY-th, after a failed record and when γ fails;
#: between, it judges the checked γ alone (a fast check costs about one step then) and keeps the last suggestion.
SEARCH_EVERY = 10


class NatGradMonitor(MonitorTask):  # type: ignore[misc, valid-type, unused-ignore]
    """A ``gpflow.monitor.MonitorTask``: ``monitor(step)`` runs :func:`~natgrad_diag.check_natgrad` in fast mode when
    ``step % every == 0`` and records whether the next step is healthy and reproduces GPflow's ``NaturalGradient`` (the
    model is not changed); ``monitor.guard`` guards the user's own step (see :mod:`natgrad_diag.training.guard`). Inside
    ``gpflow.monitor.Monitor(MonitorTaskGroup([monitor], period=10))`` leave ``every=1``::

        monitor = NatGradMonitor(model, data, gamma=0.1, on_failure="rollback")
        for step in range(1000):
            with monitor.guard(step, natgrad):
                natgrad.minimize(loss, [(model.q_mu, model.q_sqrt)])
            adam.minimize(loss, hyperparameters)
            monitor(step)

    Args:
        model: the SVGP, VGP or GPflux DeepGP being trained (read only, except for a guard's rollback).
        data: (X, Y) for SVGP, or a zero-argument callable returning the current batch; None for VGP.
        gamma, xi_transform: the step length and ξ transform used in training (None: ``XiNat()``).
        raise_on_failure: raise :class:`~natgrad_diag.exceptions.NatGradCheckError` at the first failed record.
        on_failure: what a guard does with a failed step: "warn", "raise" (NatGradCheckError with the cause and a γ;
            also on a failed periodic check) or "rollback" (restore q(u), set γ to the searched one, go on).
        loss_increase: a guarded step fails when the loss rises by more than ``loss_increase · max(|loss before|,
            1)`` (and a stochastic loss's noise); 0.5 allows minibatch noise and catches blow-ups. ``math.inf`` flags
            only failures and NaN.
        log_dir: write the scalars of :data:`~natgrad_diag.training.tensorboard.SCALARS` for TensorBoard there (a str
            or os.PathLike; the directory is created now).
        loss_fn: a zero-argument callable returning the training loss (default: the model's training loss, or
            −ELBO for a GPflux DeepGP); needed with ``var_list``. Compiled when safe (see :meth:`measure`). The guard
            and the periodic check both judge it (the check in the var_list form).
        var_list: the (q_mu, q_sqrt) pairs the guarded step moves (default: the model's, see
            :func:`natgrad_diag.checks.pairs.variational_pairs`).
        gamma_steps: passed to :func:`~natgrad_diag.check_natgrad` (None: its default): the suggested γ is the one
            with the lowest loss after this many steps.

    Attributes:
        records, guard_records: the :class:`NatGradRecord` s and the :class:`GuardRecord` s (one per guarded step),
            oldest first.
        gamma: the γ the periodic check checks; a guard sets it to its optimizer's γ after every guarded step.

    Warns:
        UserWarning: a q_mu or q_sqrt it watches is trainable (names them and the ``gpflow.set_trainable`` fix); not
            for a GPflux DeepGP, whose NatGradModel keeps q(u) out of its Adam step itself.
    """

    def __init__(
        self, model: Any, data: Any = None, *, gamma: float = 1.0, xi_transform: Any = None, every: int = 1,
        raise_on_failure: bool = False, on_failure: str = "warn", loss_increase: float = 0.5, log_dir: Any = None,
        loss_fn: Any = None, var_list: Any = None, gamma_steps: int | None = None,
    ) -> None:
        super().__init__()
        if on_failure not in ON_FAILURE:
            raise input_error(
                "on_failure must be 'warn', 'raise' or 'rollback'.", "on_failure", "'warn' | 'raise' | 'rollback'",
                repr(on_failure), "pass on_failure='rollback' to restore q(u) and lower γ after a failed step.",
            )  # fmt: skip
        if isinstance(loss_increase, bool) or not isinstance(loss_increase, (int, float)) or not loss_increase >= 0:
            raise input_error("loss_increase must be a number ≥ 0 (math.inf: never flag a rise of the loss).",
                              "loss_increase", "a float ≥ 0", repr(loss_increase),
                              "pass loss_increase=0.5 (a step may raise the loss by half its size).")  # fmt: skip
        if loss_fn is not None and not callable(loss_fn):
            raise input_error(
                "loss_fn must be a zero-argument callable returning the training loss.", "loss_fn",
                "a callable, e.g. model.training_loss_closure(data)", type(loss_fn).__name__,
                "pass the closure you minimise, not its value: loss_fn=lambda: model.training_loss(data).")  # fmt: skip
        every = require_int(every, "every", minimum=1, remedy="pass every=10 to check every tenth step.")
        self.gamma = require_positive_float(gamma, "gamma")
        self.raise_on_failure = require_bool(raise_on_failure, "raise_on_failure") or on_failure == "raise"
        self._pairs = variational_pairs(model, var_list)  # fails now, not at the first guarded step, when there is no q(u)
        self._xis = [item[2] if len(item) == 3 else None for item in var_list] if var_list is not None else [None] * len(self._pairs)
        refuse_misplaced(self._pairs)
        if var_list is None and hasattr(model, "q_mu"):  # the model form: what check_natgrad refuses is refused now
            validate_model(model)
            if loss_fn is None and not callable(data):  # its loss takes these data: checked and cast once
                data = validate_data(model, data, model.q_mu.dtype.as_numpy_dtype)
        self.model, self.data, self.xi_transform, self.every = model, data, xi_transform, every
        self.on_failure, self.loss_increase = on_failure, float(loss_increase)
        self.loss_fn, self.var_list = loss_fn, var_list
        self.gamma_steps = None if gamma_steps is None else validate_gamma_steps(gamma_steps)
        self.records: list[NatGradRecord] = []
        self.guard_records: list[GuardRecord] = []
        self.log = None if log_dir is None else ScalarLog(log_dir)  # the directory made now, once the rest is valid
        self._left_by_guard: list[Any] | None = None  # the pairs' values the last guarded step left
        self._warned: set[str] = set()  # one-time warnings given: 'moved' (q(u) moved), 'held', 'in_block' (γ)
        self._measure: Any = None  # the compiled validity and loss, built at first use
        self._last_loss: tuple[Any, float | None] | None = None  # (batch, loss) the last guarded step left
        self._gamma_cap: dict[int, float] = {}  # slot -> its first guarded γ, lowered below each that failed
        self._gamma_set: dict[int, float] = {}  # slot (place in the guarded list: its optimizer may be new) -> γ set
        self._optimizers: list[Any] = []  # the optimizers the last guard guarded
        self._healthy_run = 0  # healthy guarded steps since γ last changed
        self._checks = 0  # periodic checks run so far
        self._suggestion: float | None = None
        if not hasattr(model, "f_layers") and (note := trainable_note(self._pairs)):
            warnings.warn(note, UserWarning, stacklevel=2)

    _repr_html_ = timeline_html  # the training timeline in a notebook

    def __call__(self, step: int, **kwargs: Any) -> None:
        """Run the periodic check when ``step % every == 0``; ``step`` is an int from 0 to 2⁶³ − 1."""
        super().__call__(require_step(step), **kwargs)

    def guard(self, step: int, optimizer: Any, *, verify: bool = False) -> StepGuard:
        """A context manager around the user's natural-gradient step with ``optimizer``; ``verify=True`` also checks
        that the step is GPflow's natural-gradient step at the optimizer's γ and ξ (for your own optimizer: one more
        gradient and one more GPflow update per pair, from the snapshot) and names the mistake when it is not."""
        return StepGuard(self, step, optimizer, verify=verify)

    @property
    def rollbacks(self) -> int:
        """How many guarded steps were rolled back."""
        return sum(r.rolled_back for r in self.guard_records)

    def variational_pairs(self) -> list[Any]:
        """(name, q_mu, name, q_sqrt) of every pair the guarded step moves."""
        return self._pairs

    def var_list_of_step(self) -> list[tuple[Any, ...]]:
        """(q_mu, q_sqrt) or (q_mu, q_sqrt, ξ) per pair, as NaturalGradient.minimize takes them: a var_list triple's ξ,
        else the monitor's ``xi_transform`` (GPflow's precedence)."""
        xis = [self.xi_transform if xi is None else xi for xi in self._xis]
        return [(mu, sq) if xi is None else (mu, sq, xi) for (_, mu, _, sq), xi in zip(self._pairs, xis)]

    def batch(self) -> Any:
        """The current data: ``data()`` when data is a callable, else ``data``."""
        return self.data() if callable(self.data) else self.data

    def loss_tensor(self, data: Any) -> Any:
        """The training loss on ``data`` now: ``loss_fn()``, the model's training loss, or −ELBO for a GPflux DeepGP."""
        if self.loss_fn is not None:
            return self.loss_fn()
        if hasattr(self.model, "training_loss"):
            return self.model.training_loss() if data is None else self.model.training_loss(data)
        return -self.model.elbo(data)  # a GPflux DeepGP: −ELBO, as GPflow's training_loss

    def loss_value(self, data: Any) -> float | None:
        """The training loss on ``data`` now (None when it is not finite)."""
        return self.measure(data)[1]

    def measure(self, data: Any) -> tuple[bool, float | None]:
        """Whether every q(u) pair is valid (:func:`~natgrad_diag.training.guard.qu_valid`) and the training loss on
        ``data`` (None when not finite), in one compiled call; raises what the loss raises (an InputError naming ``data``
        or ``loss_fn`` for a TypeError or ValueError: the loss cannot take the batch). A ``loss_fn`` is compiled
        only when two compiled calls and one eager call, made at the first use, agree to √ε of its dtype (no Python
        side effects); it is called eagerly otherwise, and a ``tf.function`` is used as it is."""
        try:
            if self._measure is None:
                if _loss_traceable(self.loss_fn):
                    self._measure = _compile.function(lambda data: (qu_valid(self._pairs), self.loss_tensor(data)), by_shape=True, reduce_retracing=True)
                else:
                    valid = _compile.function(lambda: qu_valid(self._pairs))
                    self._measure = lambda data: (valid(), self.loss_tensor(data))
            ok, value = self._measure(data)
            value = float(value)
        except (TypeError, ValueError) as e:  # not a numerical failure of a step: the loss cannot take this batch
            fn = self.loss_fn is not None
            raise input_error(f"the monitor's loss cannot be evaluated: {error_line(e, with_type=True)}", "loss_fn" if fn
                              else "data", "a zero-argument callable returning the scalar training loss" if fn else
                              "(X [N, D], Y [N, P]) that fit the model, or a zero-argument callable returning them",
                              type(self.loss_fn if fn else data).__name__, "call it yourself once to see why, and pass "
                              "what NatGradMonitor's docstring describes.") from e  # fmt: skip
        return bool(ok), value if math.isfinite(value) else None

    def search(self, data: Any, gamma: float) -> Any:
        """:func:`~natgrad_diag.check_natgrad` in fast mode at ``gamma`` with its γ search (the var_list form for a
        GPflux DeepGP or ``var_list``: ``report.pairs[i].suggested_gamma`` is pair i's); the suggestion (the smallest
        pair's; None when a pair has none) is remembered for the records."""
        report = self._report(data, gamma, search=True)
        suggested = report.pair_suggestions()
        self._suggestion = None if None in suggested else min(suggested)  # type: ignore[type-var, unused-ignore]
        return report

    def _report(self, data: Any, gamma: float, search: bool) -> Any:
        kw: dict[str, Any] = {} if self.gamma_steps is None else {"gamma_steps": self.gamma_steps}
        kw.update(gamma=gamma, xi_transform=self.xi_transform, mode="fast", progress=False, gamma_search=search)
        if self.var_list is None and self.loss_fn is None:  # an SVGP, a VGP or a GPflux DeepGP
            return check_natgrad(self.model, data, **kw)
        return check_natgrad(lambda: self.loss_tensor(data), var_list=self.var_list_of_step(), **kw)

    def record_guard(self, record: GuardRecord) -> None:
        """Append a guard's record (and write its scalars with ``log_dir``)."""
        self.guard_records.append(record)
        if self.log is not None:
            self.log.guard(record)

    @property
    def failures(self) -> list[NatGradRecord]:
        """The records whose checks did not all hold."""
        return [r for r in self.records if not r.passed]

    def run(self, **kwargs: Any) -> None:
        step = int(self.current_step)
        if step % self.every:
            return
        last = self.check(step)
        if self.on_failure == "rollback" and not last.step_healthy and last.suggested_gamma is not None:
            last = dataclasses.replace(last, gamma_set=lower_after_check(self, last.suggested_gamma))
        self.records.append(last)
        if self.log is not None:
            self.log.record(step, last)
        if self.raise_on_failure and not last.passed:
            use = f"gamma = {last.suggested_gamma:g}" if last.suggested_gamma else "a smaller gamma, or float64"
            raise NatGradCheckError(f"at training step {step}.", context=[("Record", str(last))], remedy=f"use {use}.")

    def check(self, step: int) -> NatGradRecord:
        """Run the cheap checks at ``monitor.gamma`` now and return the record (not appended).

        The γ search runs as :data:`SEARCH_EVERY` says (a guard's counts as the last). The pair-by-pair checks of a
        GPflux DeepGP or a ``var_list`` fold into one record (largest reproduction error, smallest suggested γ).
        """
        data = self.batch()
        search = self._checks % SEARCH_EVERY == 0 or bool(self.records and not self.records[-1].passed)
        self._checks += 1
        report = self.search(data, self.gamma) if search else self._report(data, self.gamma, search=False)
        if not search and not all(c.passed for c in report.checks if c.name.endswith("step_health")):
            report = self.search(data, self.gamma)  # the suggestion a failure is met with is measured now
        reports = list(report.pairs) or [report]
        reps = [c for r in reports for c in r.checks if c.name == "reproduction"]
        return NatGradRecord(
            step=step, loss=reports[0].loss_before, loss_after=reports[0].loss_after if len(reports) == 1 else None,
            reproduction_error=max((c.max_abs_error for c in reps if c.max_abs_error is not None), default=None),
            reproduction_passed=bool(reps) and all(c.passed for c in reps),
            step_healthy=all(c.passed for c in report.checks if c.name.endswith("step_health")),  # each pair's too
            suggested_gamma=self._suggestion, passed=report.passed,
            detail="; ".join(f"{c.name}: {c.detail or c.claim}" for c in report.checks if not c.passed),
        )


def _loss_traceable(fn: Any) -> bool:
    """Whether the monitor's ``loss_fn`` is safe to trace (see :meth:`NatGradMonitor.measure`)."""
    if fn is None or hasattr(fn, "get_concrete_function"):  # the model's loss, or already a tf.function
        return True
    compiled = _compile.function(fn)
    try:
        a, b, eager = (np.asarray(f()) for f in (compiled, compiled, fn))
    except Exception:  # noqa: BLE001 - Python code that needs eager tensors cannot be traced: stay eager
        return False
    tol = float(np.sqrt(np.finfo(eager.dtype if eager.dtype.kind == "f" else np.float64).eps)) * max(1.0, float(np.abs(eager)))
    return bool(np.all(np.isfinite([a, b, eager])) and abs(a - b) <= tol and abs(a - eager) <= tol)


NatGradMonitor.__module__ = "natgrad_diag"  # where users import it from
