"""PyTorch's seed rules for every ``tf.GradientTape.gradient`` call: a context, a pytest plugin and a script runner.

Public: ``__all__`` (``strict_gradients`` is also ``natgrad_diag.strict_gradients``), the pytest plugin (``pytest
--strict-gradients``, the ``strict_gradients`` marker and fixture) and ``python -m natgrad_diag.strict SCRIPT``. The
modules ``context``, ``rules``, ``callsite`` and ``runner`` are internal. Importing this package imports no TensorFlow.
"""

import importlib
from typing import Any

__all__ = ["StrictGradients", "StrictGradientsWarning", "Violation", "strict_gradients"]

#: The module of each public name, imported on first use.
_HOME = dict(StrictGradients="context", strict_gradients="context", StrictGradientsWarning="rules", Violation="rules")


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
