"""The command's streams: ASCII where a stream cannot encode the reports' symbols, a closed stdout or stderr.

A stream whose encoding (``PYTHONIOENCODING=ascii``, ``latin-1``, a C locale on old systems) lacks a character
of a report (ξ, ≠, Jᵀ·1) gets :func:`ascii_form`'s spelling from the error handler here, not a UnicodeEncodeError.
"""

from __future__ import annotations

import codecs
import os
import sys
import unicodedata

__all__ = ["ERRORS", "ascii_form", "prepare_streams"]

#: The name of the codec error handler that spells unencodable characters in ASCII.
ERRORS = "natgrad_diag_ascii"

_SYMBOLS = {
    "≠": "!=", "≤": "<=", "≥": ">=", "−": "-", "·": "*", "×": "x", "⊙": "(.)", "→": "->", "←": "<-", "∛": "cbrt ",
    "√": "sqrt", "ᵀ": "^T", "⁻": "^-", "…": "...", "—": "--", "–": "-", "≈": "~", "∂": "d", "∇": "grad",
    "‖": "||", "∈": " in ", "∞": "inf", "±": "+/-", "⁄": "/", "✓": "v", "✗": "x", "•": "*", "≲": "<~",
}  # fmt: skip


def _one(ch: str) -> str:
    if ch in _SYMBOLS:
        return _SYMBOLS[ch]
    name = unicodedata.name(ch, "")
    if name.startswith("GREEK ") and " LETTER " in name:  # ξ -> xi, Σ -> Sigma
        letter = name.split()[-1].lower()
        return letter.capitalize() if " CAPITAL " in name else letter
    if name.startswith("SUPERSCRIPT "):  # ² -> ^2
        return "^" + unicodedata.normalize("NFKD", ch)
    return unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode() or "?"  # é -> e, ₁ -> 1


def ascii_form(text: str) -> str:
    """``text`` with every non-ASCII character spelled in ASCII.

    Examples:
        >>> ascii_form("dL/deta1 ≠ Jᵀ·1, ξ, Σ_jk, γ = 1, F⁻¹, ∛ε")
        'dL/deta1 != J^T*1, xi, Sigma_jk, gamma = 1, F^-1, cbrt epsilon'
    """
    return "".join(c if c < "\x80" else _one(c) for c in text).replace("^-^", "^-")


def _handler(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    return ascii_form(error.object[error.start : error.end]), error.end


codecs.register_error(ERRORS, _handler)


def prepare_streams() -> bool:
    """Set up stdout and stderr for a command; False when stdout is closed (``>&-``: nothing to print to).

    A closed stderr (``2>&-``) becomes os.devnull, at descriptor 2 too, so messages and TensorFlow's quieting work.
    """
    if sys.stderr is None:
        if (fd := os.open(os.devnull, os.O_WRONLY)) != 2:
            os.dup2(fd, 2)
            os.close(fd)
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115  # lives as long as the process
    for stream in (sys.stdout, sys.stderr):  # a stream that is not UTF spells what its encoding cannot write
        try:
            utf = codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name.startswith("utf")
        except LookupError:
            utf = False
        if not utf and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=ERRORS)
    return sys.stdout is not None
