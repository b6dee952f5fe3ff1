"""PyTorch's seed rules for every ``tf.GradientTape.gradient`` call: a context, a pytest plugin and a script runner.

Public: ``strict_gradients`` (also ``natgrad_diag.strict_gradients``), ``StrictGradients``,
``StrictGradientsWarning`` and ``Violation`` from here; the pytest plugin (``pytest --strict-gradients``,
the ``strict_gradients`` marker and fixture) and ``python -m natgrad_diag.strict SCRIPT``. The modules
``context``, ``rules``, ``callsite`` and ``runner`` are internal. Importing this package imports no TensorFlow.
"""

from typing import Any

__all__ = ["StrictGradients", "StrictGradientsWarning", "Violation", "strict_gradients"]


def __getattr__(name: str) -> Any:
    if name in ("StrictGradients", "strict_gradients"):
        from natgrad_diag.strict import context

        return getattr(context, name)
    if name in ("StrictGradientsWarning", "Violation"):
        from natgrad_diag.strict import rules

        return getattr(rules, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
