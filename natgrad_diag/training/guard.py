"""The guard around a user's natural-gradient step: snapshot q(u), judge the step, act, learn γ (docs/training.md
says what each ``on_failure`` does and when γ is lowered or raised). The loss before a step is the one the previous
guarded step left when the batch is the same object, else evaluated; each exit appends a GuardRecord."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from natgrad_diag._validate import input_error, require_bool, require_int
from natgrad_diag.checks.health import GAMMA_GRID, spread
from natgrad_diag.checks.pairs import STOCHASTIC, verify_step
from natgrad_diag.exceptions import NatGradCheckError, error_line
from natgrad_diag.report.records import format_number, loss_rose
from natgrad_diag.training.records import GuardRecord
from natgrad_diag.typing import Array

__all__ = [
    "ON_FAILURE", "RAISE_AFTER", "StepGuard", "lower_after_check", "lower_gamma", "qu_problem", "qu_valid", "read_gamma",
    "require_step", "set_gammas",
]  # fmt: skip

ON_FAILURE = ("warn", "raise", "rollback")

#: Healthy guarded steps in a row after which the guard searches γ again and raises it to a larger suggestion.
RAISE_AFTER = 20

_RETRACE = (
    "natgrad-diag set optimizer.gamma = {new:g} (it was the Python number {old:g}). A tf.function that calls "
    "optimizer.minimize captured the old value as a constant and keeps using it until it is traced again: "
    "build the optimizer with gamma=tf.Variable({old:g}, dtype=tf.float64) so that the new γ reaches compiled code."
)

_HELD = (
    "the loop set optimizer.gamma = {got:g} before training step {step}, above the γ = {held:g} natgrad-diag set when "
    "a step or a periodic check failed; with on_failure='rollback' the guard holds γ at most at the one it set (and "
    "raises it itself once steps hold): a loop that sets γ at every step would repeat the failure at every step. To "
    "follow your own schedule, use on_failure='warn' (the guard then never changes γ)."
)

_IN_BLOCK = (
    "optimizer.gamma changed inside the guarded block at training step {step} ({before:g} → {after:g}): the guard "
    "judges and records the step at the γ the block left, but a γ it sets after a failure is overwritten when the "
    "block sets γ again. Set γ before `with monitor.guard(...)`, outside the step function (in Keras, list a γ "
    "schedule callback before NatGradCallback)."
)

_MOVED = (
    "something other than the guarded natural-gradient step changed {names} since the last guarded step (an "
    "optimizer such as Adam over model.trainable_variables also moves q(u), which undoes the natural-gradient "
    "step). Exclude them from that optimizer: {fix}."
)


def require_step(step: Any) -> int:
    """The training step (a Python or numpy integer, or an integer scalar tensor or tf.Variable) as an int from 0 to
    2⁶³ − 1, as gpflow.monitor's int64; else an InputError naming ``step``."""
    if hasattr(step, "numpy") and getattr(getattr(step, "dtype", None), "is_integer", False) and step.shape.rank == 0:
        step = step.numpy()
    return require_int(step, "step", minimum=0, maximum=2**63 - 1, expected="an int from 0 to 2⁶³ − 1",
                       remedy="pass the loop counter, e.g. monitor(step) inside `for step in range(n)`.",
                       why="gpflow.monitor keeps the step as an int64.")  # fmt: skip


def read_gamma(optimizer: Any) -> float:
    """The optimizer's γ as a float (a Python float is not passed through TensorFlow: it would round it to float32)."""
    gamma = optimizer.gamma
    return float(gamma.numpy()) if hasattr(gamma, "numpy") else float(gamma)


def lower_gamma(gamma: float) -> float:
    """The next γ of :data:`GAMMA_GRID` below ``gamma``; half of ``gamma`` below the grid.

    Examples:
        >>> lower_gamma(0.1), lower_gamma(0.2), lower_gamma(1e-3)
        (0.03, 0.1, 0.0005)
    """
    return next((g for g in GAMMA_GRID if g < gamma * (1 - 1e-12)), gamma / 2)


def set_gammas(optimizers: list[Any], old: list[float], new: Any, set_: dict[int, float]) -> None:
    """Each optimizer's γ set to its new value where it changed: a tf.Variable assigned, else the attribute set (with
    a warning: compiled code keeps the old one); ``set_`` notes the γ set (slot -> γ as read back)."""
    import tensorflow as tf

    for slot, (opt, before, after) in enumerate(zip(optimizers, old, new)):
        if after != before and isinstance(opt.gamma, tf.Variable):
            opt.gamma.assign(np.asarray(after, dtype=opt.gamma.dtype.as_numpy_dtype))  # tf.cast rounds via float32
        elif after != before:
            opt.gamma = after
            warnings.warn(_RETRACE.format(new=after, old=before), UserWarning, stacklevel=3)
        if after != before:
            set_[slot] = read_gamma(opt)


def lower_after_check(monitor: Any, suggested: float) -> float | None:
    """After a periodic check whose ``step_health`` failed, with ``on_failure="rollback"``: the γ of each optimizer the
    monitor last guarded that is above ``suggested`` (the check's search measured it to train) set to it and capped
    below the γ that failed, as after a failed step (the check took no step: nothing is rolled back). The γ set;
    None when no optimizer was guarded yet or none was above it."""
    optimizers = monitor._optimizers
    old = [read_gamma(o) for o in optimizers]
    if not any(g > suggested for g in old):
        return None
    for slot, g in enumerate(old):
        monitor._gamma_cap[slot] = min(monitor._gamma_cap.get(slot, g), lower_gamma(g))
    set_gammas(optimizers, old, [min(g, suggested) for g in old], monitor._gamma_set)
    monitor._healthy_run = 0
    monitor.gamma = gamma = read_gamma(optimizers[0])
    return gamma


def qu_problem(pairs: list[tuple[str, Any, str, Any]]) -> str:
    """Why q(u) is not usable ("" when every q_mu is finite and every q_sqrt has a positive finite diagonal);
    ``pairs`` holds (name of q_mu, q_mu [M, L], name of q_sqrt, q_sqrt [L, M, M])."""
    for mu_name, q_mu, sq_name, q_sqrt in pairs:
        for name, value in ((mu_name, q_mu), (sq_name, q_sqrt)):
            if bad := int(np.sum(~np.isfinite(value.numpy()))):
                return f"{name} has {bad} NaN/Inf value(s) after the step"
        diag = np.diagonal(q_sqrt.numpy(), axis1=-2, axis2=-1)
        if not np.all(diag > 0):
            l_idx, m_idx = (int(i) for i in np.argwhere(diag <= 0)[0])
            return (f"{sq_name} has a non-positive diagonal entry {sq_name}[{l_idx}, {m_idx}, {m_idx}] = "
                    f"{format_number(float(diag[l_idx, m_idx]))} (GPflow's step takes it for chol(S))")
    return ""


def qu_valid(pairs: list[tuple[str, Any, str, Any]]) -> Any:
    """:func:`qu_problem`'s test as a traceable boolean tensor (the guard runs it in the loss's compiled call)."""
    import tensorflow as tf

    ok = []
    for _, q_mu, _, q_sqrt in pairs:
        mu, sq = tf.convert_to_tensor(q_mu), tf.convert_to_tensor(q_sqrt)
        ok += [tf.reduce_all(tf.math.is_finite(mu)), tf.reduce_all(tf.math.is_finite(sq)), tf.reduce_all(tf.linalg.diag_part(sq) > 0)]
    return tf.reduce_all(tf.stack(ok))


def _variables(pairs: list[tuple[str, Any, str, Any]]) -> list[tuple[str, Any]]:
    """(name, unconstrained tf.Variable) of every parameter of the pairs, q_mu then q_sqrt."""
    return [(n, p.unconstrained_variable) for a, mu, b, sq in pairs for n, p in ((a, mu), (b, sq))]


def _values(pairs: list[tuple[str, Any, str, Any]]) -> list[Array]:
    """Copies of the pairs' unconstrained values (``value()``: one read op, no ``identity`` as ``numpy()`` adds)."""
    return [np.array(v.value(), copy=True) for _, v in _variables(pairs)]


class StepGuard:
    """The context manager ``NatGradMonitor.guard(step, optimizer)`` returns (docs/training.md)."""

    def __init__(self, monitor: Any, step: int, optimizer: Any, *, verify: bool = False) -> None:
        self.verify = require_bool(verify, "verify")
        optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
        if not optimizers or not all(hasattr(o, "gamma") for o in optimizers):
            raise input_error(
                "the guard needs the natural-gradient optimizer, whose γ it reads and sets.", "optimizer",
                "gpflow.optimizers.NaturalGradient or natgrad_diag.NaturalGradient (or a list of them)",
                type(optimizer).__name__, "pass the optimizer whose minimize() the with-block calls: monitor.guard(step, natgrad).",
            )  # fmt: skip
        self.monitor, self.step, self.optimizer, self.optimizers = monitor, require_step(step), optimizers[0], optimizers

    def __enter__(self) -> StepGuard:  # noqa: PYI034 (a final class; typing.Self needs Python 3.11)
        m = self.monitor
        self.pairs = m.variational_pairs()
        self.snapshot = _values(self.pairs)
        mine = {id(v) for _, v in _variables(self.pairs)}  # verify: what else the block moves (Adam in it) is restored
        others = getattr(m.model, "trainable_variables", ()) if self.verify else ()  # a module walk: only when verifying
        self.others = [(v, np.array(v.value(), copy=True)) for v in others if id(v) not in mine]
        self.moved = self._moved_since_last_exit()
        self.data = m.batch()
        last = m._last_loss
        self.loss_before = last[1] if last is not None and last[0] is self.data and last[1] is not None else m.loss_value(self.data)
        self.gammas = [read_gamma(o) for o in self.optimizers]
        if m.on_failure == "rollback":
            self._hold_gammas()
        self.gamma_before = self.gammas[0]
        if m.xi_transform is None:  # not given: the optimizer's, for the searches and checks (as γ follows its γ)
            m.xi_transform = getattr(self.optimizer, "xi_transform", None)
        for slot, g in enumerate(self.gammas):
            m._gamma_cap.setdefault(slot, g)
        m._optimizers = self.optimizers  # the periodic check lowers their γ (lower_after_check)
        return self

    def _set_by_guard(self) -> list[float | None]:
        """Each optimizer's γ as the guard (or a failed periodic check) last set it; None where it never did."""
        return [self.monitor._gamma_set.get(slot) for slot in range(len(self.optimizers))]

    def _hold_gammas(self) -> None:
        """Each γ the loop set above the one the guard last set (a γ schedule) set back to the guard's, with a warning
        the first time: a loop that sets γ at every step would otherwise repeat the failed step at every step."""
        m = self.monitor
        held = [g if s is None else min(g, s) for g, s in zip(self.gammas, self._set_by_guard())]
        if held != self.gammas:
            if "held" not in m._warned:
                m._warned.add("held")
                warnings.warn(_HELD.format(step=self.step, got=self.gammas[0], held=held[0]), UserWarning, stacklevel=3)
            set_gammas(self.optimizers, self.gammas, held, m._gamma_set)
            self.gammas = [read_gamma(o) for o in self.optimizers]

    def _moved_since_last_exit(self) -> tuple[str, ...]:
        """The parameters whose values differ (bitwise) from what the guard left at its last exit; warns once."""
        left, now = self.monitor._left_by_guard, self.snapshot
        if left is None or [a.shape for a in left] != [a.shape for a in now]:
            return ()
        moved = tuple(name for (name, _), a, b in zip(_variables(self.pairs), now, left) if a.tobytes() != b.tobytes())
        if moved and "moved" not in self.monitor._warned:
            self.monitor._warned.add("moved")
            fix = "; ".join(f"gpflow.set_trainable({n}, False)" for n in moved)
            warnings.warn(_MOVED.format(names=", ".join(moved), fix=fix), UserWarning, stacklevel=3)
        return moved

    def _cause(self, exc: BaseException | None) -> tuple[str, float | None]:
        """Why the step failed ("" when it did not) and the loss after it (None when not finite or not computed)."""
        import tensorflow as tf

        if exc is not None:
            return f"the step raised {type(exc).__name__}: {error_line(exc)}", None
        try:
            valid, loss_after = self.monitor.measure(self.data)
        except tf.errors.InvalidArgumentError as e:  # the loss at an invalid q(u) may raise (a Cholesky of NaN)
            return qu_problem(self.pairs) or f"the loss after the step raised {type(e).__name__}: {error_line(e)}", None
        if not valid:
            return qu_problem(self.pairs) or "q(u) is not valid after the step", None
        if loss_after is None:
            return "the loss after the step is not finite", None
        before, allowed = self.loss_before, self.monitor.loss_increase * max(abs(self.loss_before or 0.0), 1.0)
        if before is not None and loss_after - before > allowed:  # a stochastic loss may rise by its noise too
            dtype = self.pairs[0][1].dtype.as_numpy_dtype
            noise = 6.0 * np.sqrt(2.0) * spread(lambda: self.monitor.loss_value(self.data), loss_after, dtype)
            if loss_after - before > allowed + noise:
                ratio = f" (×{format_number(loss_after / before)})" if before > 0 else ""
                plus = f" + 6·√2·σ̂ (the loss's noise) = {format_number(allowed + noise)}" if noise else f" = {format_number(allowed)}"
                return f"{loss_rose(before, loss_after)}{ratio}, more than loss_increase · max(|loss|, 1){plus}", loss_after
        return "", loss_after

    def _verified(self) -> str:
        """"" when the step was GPflow's natural-gradient step for every pair (each optimizer of a list its own pair),
        else the mistake :func:`~natgrad_diag.checks.pairs.verify_step` matches from the snapshot. When the block also
        moved other variables (an Adam step in it), the step is judged with them as they were before the block (the
        natural-gradient step first) and, when that fails, as the block left them (it last), where they end."""
        m = self.monitor  # the monitor's ξ, when given, is the one the training loop passes in var_list
        pairs = m.var_list_of_step()
        moved = [(v, before, v.numpy()) for v, before in self.others if v.numpy().tobytes() != before.tobytes()]

        def judged(state: int) -> list[Any]:
            for v, *values in moved:
                v.assign(values[state])
            loss = lambda: m.loss_tensor(self.data)  # noqa: E731
            if len(self.optimizers) == len(pairs) > 1:
                return [c for i, o in enumerate(self.optimizers) for c in verify_step(o, loss, [pairs[i]], self.snapshot[2 * i:2 * i + 2])]
            return list(verify_step(self.optimizer, loss, pairs, self.snapshot))

        try:
            checks = judged(0)
            if moved and any(c.status == "fail" for c in checks):
                last = judged(1)
                checks = last if all(c.status != "fail" for c in last) else checks
        finally:
            for v, _, after in moved:
                v.assign(after)
        if any(c.detail.startswith(STOCHASTIC) for c in checks):  # not a blind-point warn: the gradients cannot be drawn again
            warnings.warn("verify=True cannot verify these steps: the loss is stochastic (two evaluations at the same q(u) "
                          "differ), so the gradients a step used cannot be drawn again; check the optimizer once with "
                          "check_natgrad(model, data, optimizer=...), which gives it and GPflow's step the same gradients",
                          UserWarning, stacklevel=3)  # one text: Python shows it once, not at every step
        return "; ".join("the step is not GPflow's natural-gradient step: " + c.detail.partition(" To fix: ")[0] for c in checks if c.status == "fail")

    def _suggestions(self, report: Any) -> list[float | None]:
        """Each optimizer's suggested γ (the smallest of the pairs' for one optimizer over several pairs)."""
        suggested: list[float | None] = report.pair_suggestions()
        if len(suggested) != len(self.optimizers):
            found = [g for g in suggested if g is not None]
            suggested = [min(found) if found else None] * len(self.optimizers)
        return suggested

    def _raised(self) -> list[float] | None:
        """After :data:`RAISE_AFTER` healthy steps in a row below the cap: each γ raised to the suggestion of a search
        from the current γ, capped at its first guarded value and below every γ that failed; None when none rises."""
        m = self.monitor
        caps = [m._gamma_cap[slot] for slot in range(len(self.optimizers))]
        # a γ the loop set is the loop's: only a γ the guard set rises
        if m._healthy_run < RAISE_AFTER or self._set_by_guard() != self.gammas or all(g >= c for g, c in zip(self.gammas, caps)):
            return None
        m._healthy_run = 0
        suggested = self._suggestions(m.search(self.data, self.gammas[0]))
        new = [min(s, c) if s is not None and s > g else g for s, g, c in zip(suggested, self.gammas, caps)]
        return new if new != self.gammas else None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        import tensorflow as tf

        m = self.monitor
        if exc is not None and not isinstance(exc, tf.errors.InvalidArgumentError):
            m._last_loss = None
            return False  # not a numerical failure of the step: let it through untouched
        now = [read_gamma(o) for o in self.optimizers]
        if now != self.gammas and now != self._set_by_guard():  # the block set γ itself
            if "in_block" not in m._warned:
                m._warned.add("in_block")
                warnings.warn(_IN_BLOCK.format(step=self.step, before=self.gamma_before, after=now[0]), UserWarning, stacklevel=2)
            self.gammas, self.gamma_before = now, now[0]
        cause, loss_after = self._cause(exc)
        if not cause and self.verify:
            cause = self._verified()
        rolled_back, gammas, unreached = bool(cause) and m.on_failure == "rollback", None, False
        if cause:  # γ is never raised back to one that failed (:meth:`_raised`)
            for slot, g in enumerate(self.gammas):
                m._gamma_cap[slot] = min(m._gamma_cap[slot], lower_gamma(g))
        if rolled_back:
            for (_, var), value in zip(_variables(self.pairs), self.snapshot):
                var.assign(value)
            report = m.search(self.data, self.gamma_before)  # its loss_before: the loss at the restored q(u)
            # each γ: the search's suggestion for its pair when below the γ that failed, else the next grid value below
            gammas = [s if s is not None and s < g else lower_gamma(g) for s, g in zip(self._suggestions(report), self.gammas)]
            loss_after = report.loss_before
            # raised at a Python-number γ the guard set, where GPflow's step holds on a deterministic loss: γ unused
            holds = {c.status for c in report.checks if c.name.endswith("step_health")} == {"pass"}
            unreached = exc is not None and holds and (
                self._set_by_guard() == self.gammas
                and not any(hasattr(o.gamma, "assign") for o in self.optimizers)
                and not spread(lambda: m.loss_value(self.data), loss_after, self.pairs[0][1].dtype.as_numpy_dtype))
            gammas = None if unreached else gammas
        m._healthy_run = 0 if cause else m._healthy_run + 1
        gammas = gammas or self._raised()
        set_gammas(self.optimizers, self.gammas, gammas or (), m._gamma_set)
        gamma_after = m.gamma = read_gamma(self.optimizer)  # a periodic check in the block may have set it
        record = GuardRecord(step=self.step, status="failed" if cause else "ok", rolled_back=rolled_back, cause=cause,
                             gamma_before=self.gamma_before, gamma_after=gamma_after, loss_before=self.loss_before,
                             loss_after=loss_after, moved_by_other=self.moved)  # fmt: skip
        m._left_by_guard = self.snapshot if rolled_back else _values(self.pairs)
        m._last_loss = (self.data, loss_after)
        m.record_guard(record)
        if not cause:
            return False
        if unreached:
            raise NatGradCheckError(
                f"the natural-gradient step at training step {self.step} failed at gamma = {self.gamma_before:g}, the Python "
                "number natgrad-diag set, where GPflow's own step at that gamma holds on the monitor's batch: the step did "
                "not use it (or stepped on other data: give NatGradMonitor a data callable returning the step's batch).",
                context=[("Record", str(record))],
                remedy=f"build the optimizer with gamma=tf.Variable({self.gamma_before:g}, dtype=tf.float64): a tf.function "
                "that calls optimizer.minimize captured the number γ had when it was traced, so no γ the guard sets reaches it.",
            ) from exc
        if m.on_failure == "raise":
            raise NatGradCheckError(
                f"the natural-gradient step at training step {self.step} (gamma = {self.gamma_before:g}) failed: {cause}.",
                context=[("Record", str(record))],
                remedy=f"use gamma = {lower_gamma(self.gamma_before):g}, or on_failure='rollback' to restore q(u) and set γ to the one a search measures.",
            ) from exc
        if m.on_failure == "warn":
            warnings.warn(f"natural-gradient step at training step {self.step} failed: {cause}; {record}", UserWarning, stacklevel=2)
        return rolled_back  # rolled back: the step's error, if any, is swallowed
