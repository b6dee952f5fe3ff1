"""``from natgrad_diag.keras import NatGradCallback``: the Keras callback that guards every training batch (see
:mod:`natgrad_diag.training.keras`). Importing this module imports neither TensorFlow nor Keras."""

from natgrad_diag.training.keras import __getattr__  # noqa: F401 (builds NatGradCallback on first access)

__all__ = ["NatGradCallback"]  # noqa: F822 (built by __getattr__ on first access)
