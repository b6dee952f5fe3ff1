"""NatGradCallback: NatGradMonitor's guard around every training batch of a Keras fit (GPflux's NatGradModel).

``gpflux.optimization.NatGradModel.fit`` takes one ``NaturalGradient`` step per ``GPLayer``, then an Adam step. The
callback opens ``monitor.guard(step, model.natgrad_optimizers)`` when a batch begins and closes it when it ends (see
:mod:`natgrad_diag.training.guard`; a rollback sets each layer's optimizer to its layer's γ). Build those optimizers
with ``gamma=tf.Variable(...)``: Keras compiles the train step, and a Python-number γ changed afterwards does not
reach it. A step that raises inside ``fit`` stops ``fit`` (Keras lets no callback catch it).

``fit``'s loss is GPflux's per-datapoint −ELBO/N, so a Keras γ is N times the γ of the same step on −ELBO, the scale
of GPflow's ``training_loss`` and of natgrad-diag's γ grid. The monitor's records, searches and ``gamma`` are on
−ELBO's scale; the callback divides the optimizers' γ by the DeepGP's ``num_data`` and multiplies back what it sets.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NatGradCallback"]  # noqa: F822 (built by __getattr__ on first access)

_CLASS: dict[str, type] = {}  # NatGradCallback, built once


def _build() -> type:
    from gpflow.keras import tf_keras

    import tensorflow as tf

    from natgrad_diag._validate import input_error
    from natgrad_diag.training.guard import read_gamma, set_gammas
    from natgrad_diag.training.monitor import NatGradMonitor

    class OnElbo:
        """A Keras NaturalGradient as the guard sees it. ``fit`` minimises GPflux's per-datapoint loss −ELBO/N, so
        its step with γ is GPflow's step with γ/N on −ELBO, the loss the monitor measures and searches: ``gamma``
        holds γ/N, read before a batch; a γ the guard sets is written back times N after it."""

        def __init__(self, optimizer: Any, num_data: int) -> None:
            self.optimizer, self.num_data, self.xi_transform = optimizer, num_data, getattr(optimizer, "xi_transform", None)
            self.read = read_gamma(optimizer)
            self.gamma = tf.Variable(self.read / num_data, dtype=tf.float64)

        def pull(self) -> OnElbo:
            """γ/N read again where something else (a schedule) set the optimizer's γ since: γ·N/N may round."""
            if (now := read_gamma(self.optimizer)) != self.read:
                self.read = now
                self.gamma.assign(now / self.num_data)
            self.written = read_gamma(self)
            return self

        def push(self) -> None:
            if (gamma := read_gamma(self)) != self.written:
                set_gammas([self.optimizer], [self.read], [gamma * self.num_data], {})
                self.read, self.written = read_gamma(self.optimizer), gamma

    class NatGradCallback(tf_keras.callbacks.Callback):  # type: ignore[misc, name-defined, unused-ignore]
        """Guard every training batch with ``monitor`` (a :class:`~natgrad_diag.NatGradMonitor`).

        Args:
            monitor: the monitor whose model is the GPflux ``DeepGP`` (or whose ``var_list`` holds the layers' pairs).
            optimizers: the natural-gradient optimizers whose γ a rollback sets; None: the Keras model's
                ``natgrad_optimizers`` (GPflux's NatGradModel).
        """

        def __init__(self, monitor: Any, optimizers: Any = None) -> None:
            if not isinstance(monitor, NatGradMonitor):
                raise input_error("NatGradCallback needs the NatGradMonitor whose guard wraps every batch.", "monitor",
                                  "a natgrad_diag.NatGradMonitor", type(monitor).__name__,
                                  "pass NatGradCallback(NatGradMonitor(deep_gp, data, on_failure='rollback')).")  # fmt: skip
            super().__init__()
            self.monitor, self.optimizers, self.step = monitor, optimizers, 0
            self._guard: Any = None
            self._seen: dict[int, OnElbo] = {}  # id(optimizer) -> its view on −ELBO, one per optimizer for the γ caps
            # a DeepGP's −ELBO is N times fit's loss; a loss_fn or var_list monitor measures what the user gave
            self._per_datapoint = (getattr(monitor.model, "num_data", None) or 1) if getattr(monitor.model, "f_layers", None) else 1

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            optimizers = self.optimizers if self.optimizers is not None else self.model.natgrad_optimizers
            self._views = [self._seen.setdefault(id(o), OnElbo(o, self._per_datapoint)).pull() for o in optimizers]
            self._guard = self.monitor.guard(self.step, self._views)
            self._guard.__enter__()
            for view in self._views:  # a γ the guard held (a schedule set it above the guard's) reaches this batch
                view.push()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            guard, self._guard = self._guard, None
            self.step += 1
            if guard is not None:
                for view in self._views:  # a γ a callback after this one set is the one fit's step took
                    view.pull()
                guard.__exit__(None, None, None)
                for view in self._views:
                    view.push()

    NatGradCallback.__module__, NatGradCallback.__qualname__ = "natgrad_diag.keras", "NatGradCallback"  # its public home
    return NatGradCallback


def __getattr__(name: str) -> Any:
    """``NatGradCallback`` derives from tf_keras' Callback: built on first access so that importing this module is light."""
    if name == "NatGradCallback":
        return _CLASS.get(name) or _CLASS.setdefault(name, _build())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
