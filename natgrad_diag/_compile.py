"""One cache for every compiled (tf.function) path: keyed LRU entries, a weak per-model store, one lock, one trace
counter. ``build`` runs under the re-entrant lock, once per key; a build that raises stores nothing. And the one way
natgrad-diag compiles a model's code: :func:`function`.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

__all__ = [
    "MAX_ENTRIES", "MAX_PER_MODEL", "compiled", "for_model", "function", "model_entries", "note_trace", "recall",
    "remember", "trace_count",
]

#: Entries kept (compiled functions and first-call records together); the least recently used goes first.
MAX_ENTRIES = 96

_Store = collections.OrderedDict[Hashable, tuple[Any, tuple[Any, ...]]]  # key → (value, what it keeps alive)
_LOCK = threading.RLock()
_ENTRIES: _Store = collections.OrderedDict()
_TRACES: collections.Counter[str] = collections.Counter()

#: Entries kept per model (other ξ transforms, data signatures or replaced parameters); the least recently used goes.
MAX_PER_MODEL = 4

_MODELS: weakref.WeakKeyDictionary[Any, _Store] = weakref.WeakKeyDictionary()


def _put(entries: _Store, key: Hashable, value: Any, limit: int) -> None:
    """``entries[key] = value`` as the most recently used; the least recently used go past ``limit``."""
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > limit:
        entries.popitem(last=False)


def _lookup(entries: _Store, key: Hashable, build: Callable[[], Any] | None, limit: int, keep: tuple[Any, ...] = ()) -> Any:
    """The value stored for ``key``, else ``build()``'s, stored (None without ``build``); called under :data:`_LOCK`."""
    if key in entries:
        entries.move_to_end(key)
        return entries[key][0]
    if build is None:
        return None
    value = build()
    _put(entries, key, (value, tuple(keep)), limit)
    return value


def compiled(key: Hashable, build: Callable[[], Any], *, keep: tuple[Any, ...] = (), fresh: bool = False) -> Any:
    """The cached value for ``key`` (the path's name and all the traced graph depends on: shapes, dtypes, options,
    ``id`` of captured objects, which ``keep`` keeps alive), built by ``build()`` on the first request (trace inside
    it: ``get_concrete_function()``); ``fresh`` builds it again.

    Examples:
        >>> calls = []
        >>> def build():
        ...     calls.append(1)
        ...     return len(calls)
        >>> compiled(("doctest", 1), build), compiled(("doctest", 1), build), compiled(("doctest", 2), build)
        (1, 1, 2)
    """
    with _LOCK:
        if fresh:
            _ENTRIES.pop(("compiled", key), None)
        return _lookup(_ENTRIES, ("compiled", key), build, MAX_ENTRIES, keep)


def for_model(model: Any, key: Hashable, build: Callable[[], Any]) -> Any:
    """The value for ``(model, key)``, built by ``build()`` on the first request; weak on ``model``.

    A deleted model frees its entries; each model keeps its :data:`MAX_PER_MODEL` most recently used keys. The
    value must not refer to ``model`` (a weak reference is fine), or the model would never be freed.

    Examples:
        >>> class Model:
        ...     pass
        >>> m = Model()
        >>> for_model(m, "scratch", lambda: [1]) is for_model(m, "scratch", lambda: [2]), model_entries(m)
        (True, 1)
    """
    with _LOCK:
        return _lookup(_MODELS.setdefault(model, collections.OrderedDict()), key, build, MAX_PER_MODEL)


class function:
    """``tf.function(fn, **options)`` without AutoGraph (GPflow's loss traces 2–3× faster), and with it from the first
    trace that raises a TypeError, which AutoGraph may mend: a tensor used as a Python bool or iterated (TensorFlow's
    ``OperatorNotAllowedInGraphError``), or ``len`` of a tensor whose first dimension is unknown (``reduce_retracing``).
    An error AutoGraph does not mend is raised by that second trace.

    With ``by_shape=True``, a call with one tuple of arrays goes straight to the concrete function for their shapes
    and dtypes: the ``tf.function`` spends about 0.15 ms matching its arguments, an eighth of a small SVGP's loss
    (the guard calls it at every training step)."""

    def __init__(self, fn: Callable[..., Any], *, by_shape: bool = False, **options: Any) -> None:
        import tensorflow as tf

        self._fn, self._options, self._converted = fn, options, False
        self._compiled = tf.function(fn, autograph=False, **options)
        self._concrete: dict[tuple[Any, ...], Any] | None = {} if by_shape else None

    def _use(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        try:
            return getattr(self._compiled, method)(*args, **kwargs)
        except TypeError:  # tf.errors.OperatorNotAllowedInGraphError is one
            if self._converted:
                raise
            self._compiled, self._converted = tf.function(self._fn, **self._options), True
            return getattr(self._compiled, method)(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        arrays, concrete = (args[0] if len(args) == 1 and not kwargs else None), self._concrete
        if concrete is not None and isinstance(arrays, tuple) and all(hasattr(a, "shape") and hasattr(a, "dtype") for a in arrays):
            import tensorflow as tf

            key, tensors = tuple((tuple(a.shape), str(a.dtype)) for a in arrays), tuple(map(tf.convert_to_tensor, arrays))
            if key not in concrete:
                concrete[key] = self.get_concrete_function(tensors)
            return concrete[key](tensors)
        return self._use("__call__", *args, **kwargs)

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        return self._use("get_concrete_function", *args, **kwargs)


def model_entries(model: Any = None) -> int:
    """How many entries :func:`for_model` holds for ``model`` (for every live model, when ``None``)."""
    with _LOCK:
        return sum(map(len, _MODELS.values())) if model is None else len(_MODELS.get(model, ()))


def remember(key: Hashable, value: Any, *, keep: tuple[Any, ...] = ()) -> None:
    """Record ``value`` for ``key`` (what a first, eager call learned, so that the second call compiles)."""
    with _LOCK:
        _put(_ENTRIES, ("seen", key), (value, tuple(keep)), MAX_ENTRIES)


def recall(key: Hashable) -> Any:
    """The value :func:`remember` recorded for ``key``, or ``None``.

    Examples:
        >>> remember(("doctest", "seen"), {"shape": (2, 3)})
        >>> recall(("doctest", "seen"))
        {'shape': (2, 3)}
        >>> recall(("doctest", "never")) is None
        True
    """
    with _LOCK:
        return _lookup(_ENTRIES, ("seen", key), None, MAX_ENTRIES)


def note_trace(kind: str) -> None:
    """Count one trace of the compiled path ``kind``: call it in the Python body that ``tf.function`` traces."""
    with _LOCK:
        _TRACES[kind] += 1


def trace_count(kind: str | None = None) -> int:
    """How many times path ``kind`` (every path, when ``None``) has been traced in this process.

    Examples:
        >>> before = trace_count("doctest")
        >>> note_trace("doctest")
        >>> trace_count("doctest") - before
        1
    """
    with _LOCK:
        return sum(_TRACES.values()) if kind is None else _TRACES[kind]
