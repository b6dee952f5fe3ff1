"""One cache for every compiled (tf.function) path: keyed LRU entries, a weak per-model store, one lock, one trace
counter. ``build`` runs under the re-entrant lock, once per key; a build that raises stores nothing.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

__all__ = [
    "MAX_ENTRIES", "MAX_PER_MODEL", "compiled", "for_model", "model_entries", "note_trace", "recall", "remember",
    "trace_count",
]

#: Entries kept (compiled functions and first-call records together); the least recently used goes first.
MAX_ENTRIES = 96

_LOCK = threading.RLock()
_ENTRIES: collections.OrderedDict[Hashable, tuple[Any, tuple[Any, ...]]] = collections.OrderedDict()
_TRACES: collections.Counter[str] = collections.Counter()
_MISSING = object()

#: Entries kept per model (other ξ transforms, data signatures or replaced parameters); the least recently used goes.
MAX_PER_MODEL = 4

_MODELS: weakref.WeakKeyDictionary[Any, collections.OrderedDict[Hashable, Any]] = weakref.WeakKeyDictionary()


def _put(entries: collections.OrderedDict[Hashable, Any], key: Hashable, value: Any, limit: int) -> None:
    """``entries[key] = value`` as the most recently used; the least recently used go past ``limit``."""
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > limit:
        entries.popitem(last=False)


def _get(slot: Hashable) -> Any:
    if slot not in _ENTRIES:
        return _MISSING
    _ENTRIES.move_to_end(slot)
    return _ENTRIES[slot][0]


def compiled(key: Hashable, build: Callable[[], Any], *, keep: tuple[Any, ...] = ()) -> Any:
    """The cached value for ``key`` (the path's name and all the traced graph depends on: shapes, dtypes, options,
    ``id`` of captured objects, which ``keep`` keeps alive), built by ``build()`` on the first request (trace inside
    it: ``get_concrete_function()``).

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
            _put(_ENTRIES, slot, (value, tuple(keep)), MAX_ENTRIES)
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
        entries = _MODELS.setdefault(model, collections.OrderedDict())
        if key in entries:
            entries.move_to_end(key)
            return entries[key]
        value = build()
        _put(entries, key, value, MAX_PER_MODEL)
        return value


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
        value = _get(("seen", key))
    return None if value is _MISSING else value


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
