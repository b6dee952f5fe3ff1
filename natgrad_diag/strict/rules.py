"""The per-call rule: does one ``tape.gradient(target, sources, output_gradients)`` break PyTorch's seed rules?

The rules are stated at :func:`~natgrad_diag.strict.context.strict_gradients` (a seed of the wrong shape TensorFlow
broadcasts or fails on deep inside). The seed checks are :func:`natgrad_diag._validate.validate_seeds`, as in
:func:`~natgrad_diag.checked_gradient`; this module adds the no-seed rule and the call site (from static shapes;
:func:`run_time_check` for an element count unknown while tracing).

References:
    PyTorch, ``torch.autograd.grad`` and ``_make_grads`` (torch/autograd/__init__.py).
    TensorFlow, ``tf.GradientTape.gradient`` (tensorflow/python/eager/backprop.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from natgrad_diag._validate import shape_str, validate_seeds
from natgrad_diag.exceptions import OutputGradientsError
from natgrad_diag.strict.callsite import CallSite

__all__ = ["IMPLICIT_SUM", "SEED_MISMATCH", "TORCH_IMPLICIT_MESSAGE", "StrictGradientsWarning", "Violation",
           "check_call", "run_time_check"]  # fmt: skip

#: The rule a call broke: a target of more than one element without a seed.
IMPLICIT_SUM = "implicit_sum"
#: The rule a call broke: a seed of the wrong count, shape or dtype.
SEED_MISMATCH = "seed_mismatch"
#: PyTorch's words for the first rule (``torch.autograd.grad`` on a non-scalar output without a seed).
TORCH_IMPLICIT_MESSAGE = "grad can be implicitly created only for scalar outputs"


class StrictGradientsWarning(UserWarning):
    """A ``tape.gradient`` call broke PyTorch's seed rules under ``strict_gradients(action="warn")``."""


@dataclass(frozen=True)
class Violation:
    """One ``tape.gradient`` call that broke a ``rule`` (:data:`IMPLICIT_SUM` or :data:`SEED_MISMATCH`), the ``site``
    (the user's line) that made it, and the :class:`~natgrad_diag.exceptions.OutputGradientsError` ``error`` raised (or
    warned) for it."""

    rule: str
    site: CallSite
    error: OutputGradientsError

    def __str__(self) -> str:
        return f"{self.site}: {self.error}"


def check_call(target: Any, output_gradients: Any, *, allow_implicit_sum: bool,
               site: Callable[[], CallSite]) -> Violation | None:  # fmt: skip
    """The :class:`Violation` of ``tape.gradient(target, ..., output_gradients=output_gradients)`` (nests flattened as
    TensorFlow does), or ``None`` when it breaks no rule or cannot be judged here (a target that is not a tensor:
    TensorFlow reports that itself); ``site()`` is called only for a violation."""
    import tensorflow as tf

    targets = tf.nest.flatten(target)
    if not targets or not all(hasattr(t, "shape") and hasattr(t, "dtype") for t in targets):
        return None
    seeds = [None] * len(targets) if output_gradients is None else tf.nest.flatten(output_gradients)
    try:
        validate_seeds(seeds, targets)  # all None (no seeds given) always passes
    except OutputGradientsError as e:
        return _locate(SEED_MISMATCH, e, site())
    unseeded = [i for i, (s, t) in enumerate(zip(seeds, targets)) if s is None and _summed(t)]
    if allow_implicit_sum or not unseeded:
        return None
    return _locate(IMPLICIT_SUM, _implicit_sum_error(unseeded, targets, all_none=output_gradients is None), site())


def run_time_check(target: Any, output_gradients: Any, *, site: Callable[[], CallSite]) -> Any:
    """A ``tf.control_dependencies`` context for a call :func:`check_call` passed: inside a ``tf.function``, each
    unseeded target whose element count is unknown while tracing gets an assertion that fails when the graph runs on
    more than one element, with the message :func:`check_call` raises; else a context that does nothing."""
    import tensorflow as tf

    targets = tf.nest.flatten(target)
    seeds = [None] * len(targets) if output_gradients is None else tf.nest.flatten(output_gradients)
    checks = []
    for i, (s, t) in enumerate(zip(seeds, targets)):
        if s is None and _summed(t) is None:
            error = _implicit_sum_error([i], targets, all_none=output_gradients is None)
            message = [str(_locate(IMPLICIT_SUM, error, site()).error), f"Shape of target[{i}] at run time:", tf.shape(t)]
            checks.append(tf.debugging.Assert(tf.size(t) <= 1, message))
    return tf.control_dependencies(checks) if checks else contextlib.nullcontext()


def _summed(target: Any) -> bool | None:
    """True when a seed of ones would sum the target: a differentiable dtype, and in the static shape no dim 0 and a
    known dim above 1; None when only the run time tells (all known dims 1, a dim or the rank unknown while tracing a
    ``tf.function``)."""
    dtype = getattr(target, "dtype", None)
    if not (getattr(dtype, "is_floating", False) or getattr(dtype, "is_complex", False)):
        return False  # integers and booleans get no gradient: nothing is summed
    dims = [None] if target.shape.rank is None else list(target.shape)
    if 0 in dims or all(d == 1 for d in dims):
        return False
    return True if any(d is not None and d > 1 for d in dims) else None


def _shape_str(target: Any) -> str:
    return "<unknown rank>" if target.shape.rank is None else shape_str(target)


def _implicit_sum_error(unseeded: Sequence[int], targets: Sequence[Any], *, all_none: bool) -> OutputGradientsError:
    """The message for targets of more than one element without a seed."""
    if len(unseeded) == 1:
        i, n = unseeded[0], targets[unseeded[0]].shape.num_elements()  # n is None when a dim is unknown while tracing
        count = "more than one element" if n is None else f"{n} elements"
        who, what = f"target[{i}] has {count} (shape {_shape_str(targets[i])})", "its sum"
    else:
        named = [f"target[{i}] ({_shape_str(targets[i])})" for i in unseeded]
        who = f"{', '.join(named[:-1])} and {named[-1]} have more than one element"
        what = "the sum of all their elements"
    detail = (f"{TORCH_IMPLICIT_MESSAGE}: {who} and no seed, so TensorFlow would seed every element with 1 and return "
              f"the gradient of {what}.")
    if all_none:
        argument, actual = "output_gradients", "None (a seed of ones for every target)"
        expected = "one seed per target, of its shape: " + ", ".join(
            f"target[{i}] {_shape_str(t)}" for i, t in enumerate(targets))
    else:
        argument, actual = ", ".join(f"output_gradients[{i}]" for i in unseeded), "None"
        expected = ", ".join(f"a seed of shape {_shape_str(targets[i])} (target[{i}]'s shape)" for i in unseeded)
    remedy = ("pass output_gradients with one seed of each target's shape (dL/dtarget: the result is then Jᵀ·v, the "
              "chain rule), or differentiate tf.reduce_sum(target) if the gradient of the sum is what you mean.")
    context = [("Argument", argument), ("Expected", expected), ("Actual", actual)]
    return OutputGradientsError(detail, context=context, remedy=remedy)


def _locate(rule: str, error: OutputGradientsError, site: CallSite) -> Violation:
    """The violation, its error re-built with the call and its place first in the context."""
    located = type(error)(
        error.detail, context=[("Call", site.code or "tape.gradient(...)"), ("At", str(site)), *error.context], remedy=error.remedy
    )
    located.ag_pass_through = True  # inside tf.function, AutoGraph re-raises it as is
    return Violation(rule=rule, site=site, error=located)
