"""The exception hierarchy of natgrad-diag, rooted in :class:`NatGradDiagError`. Each subclass also derives from the
builtin exception a user would catch for that kind of problem (``ValueError`` for bad input, ``AssertionError`` for a
failed ``assert_*`` check, ...)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

__all__ = [
    "DTypeMismatchError", "InputError", "JacobianMismatchError", "MemoryLimitError", "MissingExtraError",
    "NatGradCheckError", "NatGradDiagError", "NonFiniteError", "OutputGradientsError", "ReportWriteError",
    "ShapeMismatchError", "SingularCovarianceError", "StepFailedError", "UnconnectedGradientError",
    "UnsupportedModelError", "error_line", "raised_as_is",
]


#: Words that mark the informative line of a numerical failure in a TensorFlow error.
_KEY_WORDS = ("Cholesky", "not invertible", "Input matrix", "NaN", "Inf")
#: Lines TensorFlow adds around the message of an error raised inside a graph.
_NOISE = ("Graph execution error", "Detected at node", "File ", "[[")


def error_line(e: BaseException, *, with_type: bool = False, limit: int = 200) -> str:
    """The one informative line of an error: TensorFlow's graph noise (``{{function_node ...}}``, "Graph execution
    error", "Detected at node", ``[Op:...]``) dropped, a line naming a numerical failure (Cholesky, NaN, ...)
    preferred; ``with_type`` prefixes the class name.

    Example:
        >>> error_line(ValueError("Graph execution error:\\n\\nDetected at node chol\\nCholesky decomposition "
        ...                       "was not successful. [Op:Cholesky]"), with_type=True)
        'ValueError: Cholesky decomposition was not successful.'
    """
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", str(getattr(e, "message", None) or e))
    text = re.sub(r"\s*\[Op:[\w.]+\].*$", "", text, flags=re.S)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(_NOISE)]
    line = next((ln for ln in lines if any(k in ln for k in _KEY_WORDS)), lines[0] if lines else "")[:limit]
    return f"{type(e).__name__}: {line}" if with_type and line else (line or type(e).__name__)


F = TypeVar("F", bound=Callable[..., Any])


def raised_as_is(fn: F) -> F:
    """Inside ``tf.function`` AutoGraph calls ``fn`` unconverted (``autograph_info__``, what
    ``tf.autograph.experimental.do_not_convert`` sets) and re-raises its NatGradDiagError as is, not as a StagingError."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NatGradDiagError as e:
            e.ag_pass_through = True
            raise

    wrapper.autograph_info__ = frozenset()  # type: ignore[attr-defined]
    return cast(F, wrapper)


class NatGradDiagError(Exception):
    """Base class of every error natgrad-diag raises.

    The message is the class's ``error_message`` and ``detail``, then the ``context`` as aligned
    ``label: value`` lines, then ``To fix:`` and the ``remedy``.

    Example:
        >>> error = ShapeMismatchError(
        ...     "q_mu_grad does not match q_mu.",
        ...     context=[("Argument", "q_mu_grad"), ("Expected", "[5, 1]"), ("Actual", "[5]")],
        ...     remedy="pass the gradient with respect to q_mu.unconstrained_variable.",
        ... )
        >>> print(error)
        Shape mismatch. q_mu_grad does not match q_mu.
          Argument: q_mu_grad
            Expected: [5, 1]
            Actual:   [5]
          To fix: pass the gradient with respect to q_mu.unconstrained_variable.
        >>> isinstance(error, ValueError)  # bad input is a ValueError too
        True
    """

    error_message = "An error in natgrad-diag."
    ag_pass_through: bool  # set by :func:`raised_as_is`

    def __init__(self, detail: str = "", *, context: Sequence[tuple[str, object]] = (), remedy: str = "") -> None:
        self.detail, self.context, self.remedy = detail, tuple(context), remedy
        lines = [self.error_message + (f" {detail}" if detail else "")]
        width = max((len(label) for label, _ in self.context), default=0) + 1
        for label, value in self.context:
            indent = "    " if label in ("Expected", "Actual", "Got") else "  "
            lines.append(f"{indent}{(label + ':').ljust(width)} " + str(value).replace("\n", "\n" + " " * 14))
        if remedy:
            lines.append(f"  To fix: {remedy}")
        super().__init__("\n".join(lines))


class InputError(NatGradDiagError, ValueError):
    """An argument does not have the shape, dtype or values that the function needs."""
    error_message = "Invalid input."


class ShapeMismatchError(InputError):
    """An argument's shape does not match what it must have."""
    error_message = "Shape mismatch."


class DTypeMismatchError(InputError):
    """An argument's dtype does not match the dtype it must share with another argument."""
    error_message = "Dtype mismatch."


class NonFiniteError(InputError):
    """An argument contains NaN or Inf."""
    error_message = "Non-finite values."


#: Why a derivative is NaN or Inf where fn is finite (jacobian()'s error and the gradient check's hint).
NO_DERIVATIVE = "TensorFlow's derivative does not exist at this point (tf.norm or tf.sqrt at 0, say)"


class SingularCovarianceError(InputError):
    """q_sqrt has a zero on its diagonal, so S = q_sqrt q_sqrtᵀ is singular."""
    error_message = "Singular covariance."


class OutputGradientsError(InputError):
    """A seed passed as ``output_gradients`` does not match its target (TensorFlow does not check)."""
    error_message = "Mismatch in output_gradients."


class UnsupportedModelError(NatGradDiagError, ValueError):
    """The model or parametrisation is one that GPflow's natural gradient does not support."""
    error_message = "Unsupported model."


class UnconnectedGradientError(NatGradDiagError, ValueError):
    """A source does not influence a target (``unconnected="raise"``)."""
    error_message = "Unconnected gradient."


class StepFailedError(NatGradDiagError, ArithmeticError):
    """The natural-gradient step leaves the positive-definite cone (Cholesky fails) or gives NaN."""
    error_message = "Natural-gradient step failed."


class JacobianMismatchError(NatGradDiagError, AssertionError):
    """``assert_gradients``: a numerical and an analytical derivative disagree."""
    error_message = "Jacobian mismatch."


class NatGradCheckError(NatGradDiagError, AssertionError):
    """``assert_natgrad``: a natural-gradient check failed."""
    error_message = "Natural-gradient check failed."


class MemoryLimitError(NatGradDiagError, MemoryError):
    """A dense Jacobian would exceed the memory limit; nothing was allocated."""
    error_message = "Dense Jacobian too large."


class MissingExtraError(NatGradDiagError, ImportError):
    """An optional dependency (an extra) is not installed."""
    error_message = "Optional dependency missing."


class ReportWriteError(NatGradDiagError, OSError):
    """A report file could not be written; any previous file at that path is intact."""
    error_message = "Could not write the report."
