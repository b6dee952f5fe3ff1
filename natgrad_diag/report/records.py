"""Result records at the bottom of the package: a named check, a table, a section, number formatting. Imports nothing
else of natgrad-diag (and no TensorFlow); the report base class, which knows its renderers, is in ``report.base``."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["STATUSES", "TEXT_WIDTH", "Check", "Section", "Table", "close_check", "format_number", "matrix_table", "max_abs_diff", "status_of", "to_jsonable", "worst_status", "wrap"]


def format_number(value: float | None, digits: int = 4) -> str:
    """A float as a short string: ``4`` significant digits, scientific for tiny and huge values.

    Example:
        >>> format_number(3.14159), format_number(1.2345e-5), format_number(0.0), format_number(None)
        ('3.142', '1.23e-05', '0', '-')
    """
    if value is None:
        return "-"
    if not math.isfinite(value := float(value)):
        return str(value)
    if value == 0.0:
        return "0"
    return f"{value:.{digits}g}" if 1e-3 <= abs(value) < 1e5 else f"{value:.{max(digits - 2, 1)}e}"


def loss_rose(before: float, after: float) -> str:
    """"the loss rose from ``before`` to ``after``", each with enough significant digits (at least 4) to show the
    rise to two: 4 digits would print a rise of 0.02 on 820.93 as "from 820.9 to 821".

    Example:
        >>> loss_rose(820.9344, 820.9563), loss_rose(1.0, 2.5)
        ('the loss rose from 820.9344 to 820.9563', 'the loss rose from 1 to 2.5')
    """
    rise, scale = abs(after - before), max(abs(before), abs(after))
    digits = 4 if not rise or not math.isfinite(rise) else min(17, max(4, math.ceil(math.log10(scale / rise)) + 2))
    shown = [format_number(v, digits + (not 1e-3 <= abs(v) < 1e5)) for v in (before, after)]  # scientific: 1 digit less
    return f"the loss rose from {shown[0]} to {shown[1]}"


TEXT_WIDTH = 80


def wrap(text: str, **kwargs: Any) -> str:
    """Wrap each line of ``text`` at :data:`TEXT_WIDTH`; indented lines (code) are left alone."""
    code = not kwargs.get("initial_indent")
    return "\n".join(line if code and line.startswith(" ") else
                     textwrap.fill(line, TEXT_WIDTH, break_long_words=False, break_on_hyphens=False, **kwargs)
                     for line in text.splitlines() or [""])  # fmt: skip


def to_jsonable(value: Any) -> Any:
    """``value`` as strict JSON data: numpy arrays and scalars to Python lists and numbers, recursively; non-finite
    floats to the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has none): ``json.dumps(..., allow_nan=False)`` works.

    Examples:
        >>> to_jsonable({"x": np.array([1.0, np.inf]), 2: np.float64("nan")})
        {'x': [1.0, 'inf'], '2': 'nan'}
    """
    if isinstance(value, (np.ndarray, np.generic)):
        return to_jsonable(value.tolist())
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


#: A check's three outcomes, best first: the claim holds; inconclusive (the problem is too ill-conditioned to
#: verify the claim at this precision); the claim does not hold.
STATUSES = ("pass", "warn", "fail")


def worst_status(statuses: Any) -> str:
    """The worst of ``statuses`` ("pass" for none).

    Examples:
        >>> worst_status(["pass", "warn", "pass"]), worst_status([])
        ('warn', 'pass')
    """
    return max(statuses, key=STATUSES.index, default="pass")


def status_of(ok: Any) -> str:
    """ "pass" when ``ok`` is true, else "fail": the :attr:`Check.status` of a yes/no claim.

    Examples:
        >>> status_of(1e-12 <= 1e-10), status_of(False)
        ('pass', 'fail')
    """
    return "pass" if bool(ok) else "fail"


@dataclass(frozen=True)
class Check:
    """One claim a report makes, with the numbers that decide it.

    Attributes:
        name: short identifier, e.g. ``"vjp_equals_contraction"``.
        claim: the sentence the check establishes, written from the computed numbers.
        status: "pass", "warn" (inconclusive at this precision) or "fail"; a bool is read as "pass"/"fail".
        max_abs_error: the largest absolute difference behind the verdict (``None`` if not numeric).
        tolerance: the bound ``max_abs_error`` was compared with (``None`` if not numeric).
        detail: further numbers or the reason a check failed.
        expect_difference: the claim is that the two sides differ (the error is expected to exceed the tolerance).

    Examples:
        >>> Check("c", "a claim", True).status, Check("c", "a claim", "warn").passed
        ('pass', False)
    """

    name: str
    claim: str
    status: str
    max_abs_error: float | None = None
    tolerance: float | None = None
    detail: str = ""
    expect_difference: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.status, (bool, np.bool_)):
            object.__setattr__(self, "status", "pass" if self.status else "fail")
        if self.status not in STATUSES:
            raise ValueError(f"Check status must be one of {STATUSES} or a bool, got {self.status!r} instead.")

    @property
    def passed(self) -> bool:
        """Whether the status is "pass" ("warn" is not a pass)."""
        return self.status == "pass"

    @property
    def mark(self) -> str:
        """"PASS", "WARN" or "FAIL"."""
        return self.status.upper()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "claim": self.claim, "status": self.status, "passed": bool(self.passed),
            "max_abs_error": None if self.max_abs_error is None else float(self.max_abs_error),
            "tolerance": None if self.tolerance is None else float(self.tolerance), "detail": self.detail,
            "expect_difference": self.expect_difference,
        }

    def numbers(self) -> tuple[str, str]:
        """(max abs error, "≤ tol" / "> tol", with " (must differ)" for an expected difference) as every check table
        prints them; "-" where there is none."""
        if self.max_abs_error is None or self.tolerance is None:
            return format_number(self.max_abs_error), "-"
        bound = f"{'≤' if self.max_abs_error <= self.tolerance else '>'} {format_number(self.tolerance)}"  # NaN: ">"
        return format_number(self.max_abs_error), bound + (" (must differ)" if self.expect_difference else "")

    def __str__(self) -> str:
        err, bound = self.numbers()
        bound = "" if self.tolerance is None else " " + bound.removesuffix(" (must differ)")
        nums = "" if self.max_abs_error is None else f"  (max abs error {err}{bound})"
        text = wrap(f"[{self.mark}] {self.name}: {self.claim}{nums}", subsequent_indent="       ")
        if self.detail:
            text += "\n" + wrap(self.detail, initial_indent="       ", subsequent_indent="       ")
        return text


def _pairs(got: Any, want: Any) -> list[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
    """``(got, want)`` as pairs of float64 arrays: one pair, or one per element of two sequences."""
    pairs = zip(got, want) if isinstance(got, (tuple, list)) and isinstance(want, (tuple, list)) else [(got, want)]
    return [(np.asarray(g, np.float64), np.asarray(w, np.float64)) for g, w in pairs]


def max_abs_diff(got: Any, want: Any) -> float:
    """max |got − want| over every element (of every pair, for sequences of arrays); 0 for empty arrays."""
    return max((float(np.max(np.abs(g - w), initial=0.0)) for g, w in _pairs(got, want)), default=0.0)


def close_check(name: str, claim: str, got: Any, want: Any, *, rtol: float, atol: float, detail: str = "") -> Check:
    """A :class:`Check` that ``got`` equals ``want``: max |got − want| ≤ atol + rtol · max |want|.

    ``got`` and ``want`` are arrays, or sequences of arrays compared pair by pair (one bound for all, scaled by the
    largest |want|). Pairs of different shapes fail the check, with both shapes in ``detail``: no broadcasting.

    Example:
        >>> check = close_check("same", "two arrays agree", [1.0, 2.0], [1.0, 2.0 + 1e-13], rtol=1e-12, atol=0.0)
        >>> check.passed, check.tolerance  # 1e-13 ≤ atol + rtol·max|want| = 2e-12
        (True, 2.0000000000000997e-12)
        >>> close_check("shapes", "no broadcast", [[1.0, 2.0]], [1.0, 2.0], rtol=1e-12, atol=0.0).detail
        '1 array(s) against 2'
    """
    if isinstance(got, (tuple, list)) and isinstance(want, (tuple, list)) and len(got) != len(want):
        return Check(name=name, claim=claim, status="fail", detail=f"{len(got)} array(s) against {len(want)}")
    pairs = _pairs(got, want)
    for g, w in pairs:
        if g.shape != w.shape:
            return Check(name=name, claim=claim, status="fail", detail=f"shapes differ: {list(g.shape)} vs {list(w.shape)}")
    err = max_abs_diff(got, want)
    tol = atol + rtol * max((float(np.max(np.abs(w), initial=0.0)) for _, w in pairs), default=0.0)
    return Check(name=name, claim=claim, status=status_of(err <= tol), max_abs_error=err, tolerance=tol, detail=detail)


@dataclass(frozen=True)
class Table:
    """A table of already formatted cells; ``columns`` are the headers."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    title: str = ""

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(
                    f"Table row {i} has {len(row)} cells, expected {len(self.columns)} (columns {self.columns}).")


def matrix_table(corner: str, matrix: Any, title: str, row: str = "[{}]", col: str = "[{}]") -> Table:
    """A :class:`Table` of a 2-D ``matrix`` [R, C]: headers ``corner``, then ``col`` numbered; ``row`` numbered per row."""
    return Table((corner, *(col.format(k) for k in range(matrix.shape[1]))),
                 tuple((row.format(r), *map(format_number, cells)) for r, cells in enumerate(matrix)), title)


@dataclass(frozen=True)
class Section:
    """A heading, a paragraph and any number of tables; then, where the report places them, ``checks`` (a checks
    table: the renderers draw the report's checks at the end unless a section carries them) and the pictures named
    ``figures`` (:attr:`Picture.name`; pictures no section names go under "Pictures" at the end)."""

    heading: str
    text: str = ""
    tables: tuple[Table, ...] = ()
    checks: tuple[Check, ...] | None = None
    figures: tuple[str, ...] = ()
