"""One cache for every compiled (tf.function) path: keyed LRU entries, a weak per-model store, one lock, one trace counter."""

# How to use it:
#
#     from natgrad_diag import _compile
#
#     def build():                                   # called once per key, under the cache's lock
#         def body(x):
#             _compile.note_trace("my_path")         # runs once per trace, not per call
#             return tf.linalg.cholesky(x)
#         return tf.function(body, input_signature=[...]).get_concrete_function()
#
#     fn = _compile.compiled(("my_path", shapes, dtype), build, keep=(user_fn,))
#     fn(x)                                          # the second call with that key reuses fn
#     _compile.trace_count("my_path")               # how often "my_path" was traced (tests)
#
# * ``key`` is any hashable; start it with the path's name so that paths never share an entry. When
#   the key holds ``id(obj)``, pass ``keep=(obj,)``: the entry keeps ``obj`` alive, so its id cannot be
#   reused by another object while the entry lives.
# * ``remember(key, value)`` / ``recall(key)`` record what a first (eager) call learned, so that a
#   second call with the same key compiles ("compile on the second call"; the records share the LRU).
# * ``build`` runs under the lock (a re-entrant lock: a build may itself call ``compiled``), so each
#   key is built once even when several threads ask for it at the same time. A build that raises
#   stores nothing. Trace inside ``build`` (``get_concrete_function()``) to trace under the lock too.
# * ``for_model(model, key, build)`` is the same for what belongs to one model (a scratch copy of it and the
#   functions compiled on it): the store is weak on the model, so a deleted model frees its entries, and keeps
#   the ``MAX_PER_MODEL`` most recently used keys of each model. Its values must not hold the model itself.

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["MAX_ENTRIES", "MAX_PER_MODEL", "compiled", "for_model", "model_entries", "note_trace", "recall", "remember", "trace_count"]

#: Entries kept (compiled functions and first-call records together); the least recently used goes first.
MAX_ENTRIES = 96

_LOCK = threading.RLock()
_ENTRIES: collections.OrderedDict[Hashable, tuple[Any, tuple[Any, ...]]] = collections.OrderedDict()
_TRACES: collections.Counter[str] = collections.Counter()
_MISSING = object()

#: Entries kept per model (other ξ transforms, data signatures or replaced parameters); the least recently used goes.
MAX_PER_MODEL = 4

_MODELS: weakref.WeakKeyDictionary[Any, collections.OrderedDict[Hashable, Any]] = weakref.WeakKeyDictionary()


def _put(slot: Hashable, value: Any, keep: tuple[Any, ...]) -> None:
    _ENTRIES[slot] = (value, keep)
    _ENTRIES.move_to_end(slot)
    while len(_ENTRIES) > MAX_ENTRIES:
        _ENTRIES.popitem(last=False)


def _get(slot: Hashable) -> Any:
    entry = _ENTRIES.get(slot)
    if entry is None:
        return _MISSING
    _ENTRIES.move_to_end(slot)
    return entry[0]


def compiled(key: Hashable, build: Callable[[], Any], *, keep: tuple[Any, ...] = ()) -> Any:
    """The cached value for ``key``, built by ``build()`` on the first request (like ``functools.lru_cache``).

    Args:
        key: a hashable naming the compiled path and everything the traced graph depends on
            (shapes, dtypes, options, ``id`` of captured objects).
        build: no-argument function returning the compiled function; runs under the lock, once per key.
        keep: objects the entry keeps alive (those whose ``id`` is part of ``key``).

    Returns:
        What ``build()`` returned for this key, now or on an earlier call.

    Examples:
        >>> calls = []
        >>> def build():
        ...     calls.append(1)
        ...     return len(calls)
        >>> compiled(("doctest", 1), build), compiled(("doctest", 1), build), compiled(("doctest", 2), build)
        (1, 1, 2)
    """
    slot = ("compiled", key)
    with _LOCK:
        value = _get(slot)
        if value is _MISSING:
            value = build()
            _put(slot, value, tuple(keep))
        return value


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
        entries = _MODELS.get(model)
        if entries is None:
            entries = _MODELS[model] = collections.OrderedDict()
        if key in entries:
            entries.move_to_end(key)
            return entries[key]
        value = build()
        entries[key] = value
        while len(entries) > MAX_PER_MODEL:
            entries.popitem(last=False)
        return value


def model_entries(model: Any = None) -> int:
    """How many entries :func:`for_model` holds for ``model`` (for every live model, when ``None``)."""
    with _LOCK:
        if model is None:
            return sum(len(e) for e in _MODELS.values())
        return len(_MODELS.get(model, ()))


def remember(key: Hashable, value: Any, *, keep: tuple[Any, ...] = ()) -> None:
    """Record ``value`` for ``key`` (what a first, eager call learned); :func:`recall` returns it."""
    with _LOCK:
        _put(("seen", key), value, tuple(keep))


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
        value = _get(("seen", key))
    return None if value is _MISSING else value


def note_trace(kind: str) -> None:
    """Count one trace of the compiled path ``kind``: call it in the Python body that ``tf.function`` traces."""
    with _LOCK:
        _TRACES[kind] += 1


def trace_count(kind: str | None = None) -> int:
    """How many times path ``kind`` (every path, when ``None``) has been traced in this process.

    Tests use it: a repeated call with the same key must not add to it.

    Examples:
        >>> before = trace_count("doctest")
        >>> note_trace("doctest")
        >>> trace_count("doctest") - before
        1
    """
    with _LOCK:
        return sum(_TRACES.values()) if kind is None else _TRACES[kind]
