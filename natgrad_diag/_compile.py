"""One cache for every compiled (tf.function) path: keyed LRU entries, one lock, one trace counter."""

# How to use it (the whole API is the five functions in ``__all__``):
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

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["MAX_ENTRIES", "compiled", "note_trace", "recall", "remember", "trace_count"]

#: Entries kept (compiled functions and first-call records together); the least recently used goes first.
MAX_ENTRIES = 96

_LOCK = threading.RLock()
_ENTRIES: collections.OrderedDict[Hashable, tuple[Any, tuple[Any, ...]]] = collections.OrderedDict()
_TRACES: collections.Counter[str] = collections.Counter()
_MISSING = object()


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
