"""``strict_gradients()``: PyTorch's seed rules on every ``tf.GradientTape.gradient`` call made in a block.

Entering the first context (in any thread) replaces ``tf.GradientTape.gradient`` with a thin wrapper; leaving the
last one puts TensorFlow's method back, also after an exception. The wrapper judges a call only in a thread inside
a context (a ``threading.local`` stack, innermost wins), reads static shapes (a target whose element count is unknown
while tracing: an assertion run with the graph), then calls TensorFlow's method with the arguments as given.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar, overload

from natgrad_diag._validate import input_error, require_bool
from natgrad_diag.strict.callsite import call_site, is_exempt
from natgrad_diag.strict.rules import StrictGradientsWarning, Violation, check_call, run_time_check

__all__ = ["StrictGradients", "strict_gradients"]

F = TypeVar("F", bound=Callable[..., Any])


class _Local(threading.local):
    def __init__(self) -> None:
        self.stack: list[StrictGradients] = []  # the contexts this thread is inside, innermost last


_local = _Local()


class _Patch:
    """The one replacement of ``tf.GradientTape.gradient``, counted across threads."""

    lock = threading.Lock()
    count = 0
    original: Any = None
    wrapper: Any = None


class StrictGradients(contextlib.ContextDecorator):
    """A context manager and decorator applying PyTorch's seed rules to ``tape.gradient`` calls.

    Attributes:
        action: ``"raise"`` or ``"warn"``.
        allow_implicit_sum: targets without a seed are allowed (only given seeds are checked).
        violations: every rule broken in this context so far (in this thread, nested contexts too), in order.
        checked_calls: how many ``tape.gradient`` calls this context judged.
    """

    def __init__(self, action: str = "raise", *, allow_implicit_sum: bool = False) -> None:
        if action not in ("raise", "warn"):
            raise input_error("action must say what a violation does.", "action", '"raise" or "warn"', repr(action),
                              'pass action="raise" (an OutputGradientsError at the call) or action="warn" (a warning, '
                              "and TensorFlow's result).")
        self.action = action
        self.allow_implicit_sum = require_bool(allow_implicit_sum, "allow_implicit_sum")
        self.violations: list[Violation] = []
        self.checked_calls = 0

    def __repr__(self) -> str:
        return f"strict_gradients(action={self.action!r}, allow_implicit_sum={self.allow_implicit_sum})"

    def __enter__(self) -> StrictGradients:  # noqa: PYI034  # not meant to be subclassed
        import tensorflow as tf

        with _Patch.lock:
            if _Patch.count == 0:
                _Patch.original = tf.GradientTape.__dict__["gradient"]
                _Patch.wrapper = _make_wrapper(_Patch.original)
                tf.GradientTape.gradient = _Patch.wrapper
            _Patch.count += 1
        _local.stack.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        import tensorflow as tf

        stack = _local.stack
        if self not in stack:  # an exit too many would drive the count below 0 and switch every later context off
            raise input_error("this strict_gradients context was exited without being entered (in this thread).",
                              "strict_gradients", "one __exit__ per __enter__ (a with block)", "an extra __exit__",
                              "use `with nd.strict_gradients():` rather than calling __enter__/__exit__ by hand.")
        del stack[len(stack) - 1 - stack[::-1].index(self)]  # the innermost entry of this context
        with _Patch.lock:
            _Patch.count -= 1
            if _Patch.count == 0:
                if tf.GradientTape.__dict__.get("gradient") is _Patch.wrapper:  # else someone else's patch: leave it
                    tf.GradientTape.gradient = _Patch.original
                _Patch.original = _Patch.wrapper = None

    def _recreate_cm(self) -> StrictGradients:
        # as a decorator: a fresh context per call, so recursion and threads do not share one
        return StrictGradients(self.action, allow_implicit_sum=self.allow_implicit_sum)

    def _judge(self, caller: FrameType | None, args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[Violation | None, Any]:  # fmt: skip
        """The call's violation (or None), and the context to call TensorFlow's method in (the run-time checks)."""
        if (not args and "target" not in kwargs) or is_exempt(caller):  # TensorFlow reports a missing target itself
            return None, contextlib.nullcontext()
        target = args[0] if args else kwargs["target"]
        output_gradients = args[2] if len(args) > 2 else kwargs.get("output_gradients")
        self.checked_calls += 1
        found = check_call(target, output_gradients, allow_implicit_sum=self.allow_implicit_sum, site=lambda: call_site(caller))
        if found is not None:  # every active context lists it: the fixture's sees what the plugin's inner one judged
            for ctx in _local.stack:
                ctx.violations.append(found)
        if found is not None or self.allow_implicit_sum or self.action == "warn":
            return found, contextlib.nullcontext()
        return None, run_time_check(target, output_gradients, site=lambda: call_site(caller))


@overload
def strict_gradients(action: F) -> F: ...
@overload
def strict_gradients(action: str = "raise", *, allow_implicit_sum: bool = False) -> StrictGradients: ...


def strict_gradients(action: Any = "raise", *, allow_implicit_sum: bool = False) -> Any:
    """Apply PyTorch's seed rules to every ``tf.GradientTape.gradient`` call in a block or function.

    As PyTorch does, eager or while a ``tf.function`` is traced, it refuses a target of more than one element
    without a seed (TensorFlow silently returns ∂(Σ y)/∂x) and a seed of the wrong count, shape or dtype
    (:func:`~natgrad_diag.checked_gradient`'s message), naming the call and its ``file:line``; a refused call
    computes nothing, everything else is TensorFlow's own method. An unseeded target whose element count is unknown
    while tracing is judged when the graph runs (``action="raise"`` only; the check stays in the traced graph): more
    than one element fails with an ``InvalidArgumentError`` carrying the same message. Not judged: ``tape.jacobian``,
    ``tape.batch_jacobian``, natgrad-diag's lessons, other threads, a ``tf.function`` traced before the context,
    and seed dims unknown while tracing.

    Args:
        action: ``"raise"`` (default) raises :class:`~natgrad_diag.exceptions.OutputGradientsError` at
            the call; ``"warn"`` issues a :class:`~natgrad_diag.strict.rules.StrictGradientsWarning`
            at the user's line and returns TensorFlow's result. Used bare as a decorator
            (``@strict_gradients``), ``action`` is the function and the default applies.
        allow_implicit_sum: allow targets without a seed (the gradient of the sum, on purpose); the
            seeds that are given are still checked.

    Returns:
        A :class:`StrictGradients`, a context manager (``with ... as strict``; ``strict.violations``
        lists what was found) and a decorator.

    Raises:
        InputError: ``action`` is not ``"raise"`` or ``"warn"``.

    Example:
        >>> import tensorflow as tf
        >>> import natgrad_diag as nd
        >>> x = tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64)
        >>> with tf.GradientTape(persistent=True) as tape:
        ...     tape.watch(x)
        ...     y = x[:, None] * x[None, :]
        >>> with nd.strict_gradients():
        ...     tape.gradient(y, x, output_gradients=tf.ones_like(y)).numpy()
        array([20., 20., 20., 20.])
        >>> with nd.strict_gradients():
        ...     tape.gradient(y, x)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        natgrad_diag.exceptions.OutputGradientsError: Mismatch in output_gradients. grad can be implicitly created only for scalar outputs: target[0] has 16 elements (shape [4, 4]) and no seed, ...
    """
    if callable(action):
        return StrictGradients()(action)
    return StrictGradients(action, allow_implicit_sum=allow_implicit_sum)


def _make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def gradient(self: Any, *args: Any, **kwargs: Any) -> Any:
        checks: Any = contextlib.nullcontext()
        if _local.stack:
            __tracebackhide__ = True  # pytest shows the user's call as the failing line
            active = _local.stack[-1]
            found, checks = active._judge(sys._getframe(1), args, kwargs)
            if found is not None:
                if active.action == "raise":
                    raise found.error
                _warn(found)
        with checks:
            return original(self, *args, **kwargs)

    # AutoGraph calls it as it is inside tf.function (what tf.autograph.experimental.do_not_convert sets)
    gradient.autograph_info__ = frozenset()  # type: ignore[attr-defined]
    return gradient


def _warn(found: Violation) -> None:
    """Warn at the user's line (its file, line and module), not at this package's."""
    __tracebackhide__ = True
    site = found.site
    module = sys.modules.get(site.module)
    registry = getattr(module, "__dict__", {}).setdefault("__warningregistry__", {}) if module is not None else None
    warnings.warn_explicit(str(found.error), StrictGradientsWarning, site.filename, site.lineno, module=site.module or None, registry=registry)
