"""Where a ``tape.gradient`` call was made: the caller's file, line and source text, autograph mapped back."""

from __future__ import annotations

import contextlib
import functools
import io
import linecache
import os
import re
import tokenize
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = ["CallSite", "call_site", "is_exempt"]

#: natgrad_diag/ itself: its lessons compute the default seed on purpose, and its frames are never the user's.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@dataclass(frozen=True)
class CallSite:
    """A line of the user's code: ``filename:lineno``, its source text and the module it is in."""

    filename: str
    lineno: int
    code: str
    module: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


@functools.lru_cache(maxsize=1)
def _tensorflow_dirs() -> tuple[str, str, str]:
    """(tensorflow/, tensorflow/python/autograph/, the file of GradientTape) as path prefixes."""
    import tensorflow as tf
    from tensorflow.python.eager import backprop

    root = os.path.dirname(os.path.abspath(tf.__file__)) + os.sep
    return root, os.path.join(root, "python", "autograph") + os.sep, os.path.abspath(backprop.__file__)


def is_exempt(caller: FrameType | None) -> bool:
    """True when ``tape.gradient`` was called by TensorFlow's tape code (``tape.jacobian`` and ``batch_jacobian``
    call it per row without a seed) or by natgrad-diag (its lessons use the default seed on purpose), looking
    through AutoGraph's dispatch frames."""
    _, autograph_dir, backprop_file = _tensorflow_dirs()
    frame = caller
    while frame is not None and frame.f_code.co_filename.startswith(autograph_dir):  # AutoGraph's converted_call
        frame = frame.f_back
    filename = "" if frame is None else frame.f_code.co_filename
    return filename == backprop_file or filename.startswith(_PACKAGE_DIR)


def call_site(caller: FrameType | None) -> CallSite:
    """The first frame at or above ``caller`` outside natgrad-diag and TensorFlow, as a :class:`CallSite`
    (``<unknown>:0`` when there is none); AutoGraph's generated code is mapped back to the user's line with the
    converted function's ``ag_source_map``, as TensorFlow's own error messages do."""
    tf_dir, _, _ = _tensorflow_dirs()
    frame = caller
    while frame is not None and frame.f_code.co_filename.startswith((tf_dir, _PACKAGE_DIR)):
        frame = frame.f_back
    if frame is None:
        return CallSite("<unknown>", 0, "", "")
    module = str(frame.f_globals.get("__name__", ""))
    if (origin := _autograph_origin(frame)) is not None:
        return CallSite(origin.loc.filename, int(origin.loc.lineno), _without_comment(origin), module)
    return CallSite(frame.f_code.co_filename, frame.f_lineno or 0, _call_text(frame), module)


def _autograph_origin(frame: FrameType) -> Any:
    """The OriginInfo (user's file, line, source) of the current line of AutoGraph's tf.function code, else None."""
    if (outer := frame.f_back) is None or "__autograph_generated_file" not in frame.f_code.co_filename:
        return None
    from tensorflow.python.autograph.pyct import origin_info

    key = origin_info.LineLocation(frame.f_code.co_filename, frame.f_lineno)
    # converted_call holds the converted function
    maps = (getattr(value, "ag_source_map", None) for value in list(outer.f_locals.values()))
    return next((m[key] for m in maps if isinstance(m, dict) and key in m), None)


def _without_comment(origin: Any) -> str:
    """The user's source line of an AutoGraph OriginInfo, without its trailing comment."""
    text = str(origin.source_code_line)
    with contextlib.suppress(tokenize.TokenError, SyntaxError):  # a line that opens a bracket it does not close
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                text = text[: token.start[1]]
                break
    return text.strip()


def _call_text(frame: FrameType) -> str:
    """The source text of the call the frame is executing (``tape.gradient(y, x)``), on one line: the
    instruction's span (``co_positions``, Python 3.11+), else the frame's line."""
    code = frame.f_code
    try:
        start, end, col, end_col = list(code.co_positions())[frame.f_lasti // 2]  # type: ignore[attr-defined]  # 3.11+
    except (AttributeError, IndexError):
        start, end, col, end_col = frame.f_lineno, frame.f_lineno, None, None
    if start is None:
        return ""
    lines = [linecache.getline(code.co_filename, n, frame.f_globals) for n in range(start, (end or start) + 1)]
    if not any(lines):
        return ""
    if col is not None and end_col is not None:  # UTF-8 byte offsets: col in the first line, end_col in the last
        text = "".join(lines).encode()
        return _one_line(text[col : len(text) - len(lines[-1].encode()) + end_col].decode(errors="replace"))
    return _gradient_call(_one_line("\n".join(lines)))


def _gradient_call(line: str) -> str:
    """The ``<name>.gradient(...)`` call in a source line (Python 3.10 has no column spans), else the line.

    Examples:
        >>> _gradient_call("_ = tape.gradient(y, [a, b(c)])  # note")
        'tape.gradient(y, [a, b(c)])'
        >>> _gradient_call("g = tf.GradientTape().gradient(y, x)")
        'tf.GradientTape().gradient(y, x)'
    """
    if (match := re.search(r"[\w.]*(?:\([^()]*\))?[\w.]*\.gradient\(", line)) is None:
        return line
    depth = 0
    for k in range(match.end() - 1, len(line)):
        depth += {"(": 1, ")": -1}.get(line[k], 0)
        if depth == 0:
            return line[match.start() : k + 1]
    return line


def _one_line(text: str) -> str:
    """A call written over several lines, joined (no space after an opening or before a closing bracket)."""
    if len(parts := [part.strip() for part in str(text).splitlines() if part.strip()]) <= 1:
        return parts[0] if parts else ""
    return re.sub(r"([(\[{])\s+", r"\1", re.sub(r"\s+([)\]}])", r"\1", " ".join(parts)))
