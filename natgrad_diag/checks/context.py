"""What every natural-gradient check shares: the validated model and data, the settings, GPflow's dtype context."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag.exceptions import InputError
from natgrad_diag.checks.bounds import Tolerances

__all__ = ["Context", "dtype_context", "float_dtype"]


_DTYPES = {"float64": np.float64, "float32": np.float32}


def float_dtype(dtype: Any) -> type:
    """``np.float64`` or ``np.float32`` for a dtype given by name, numpy or TensorFlow; InputError otherwise.

    Examples:
        >>> float_dtype("float32")
        <class 'numpy.float32'>
    """
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    if name not in _DTYPES:
        raise InputError(
            "dtype must be float64 or float32.",
            context=[("Argument", "dtype"), ("Expected", "'float64' | 'float32'"), ("Got", repr(dtype))],
            remedy="pass dtype='float64' (recommended) or dtype='float32'.",
        )
    return _DTYPES[name]


@contextlib.contextmanager
def dtype_context(dtype: Any) -> Iterator[None]:
    """GPflow's config with ``default_float`` set to ``dtype`` inside the block, restored afterwards."""
    import dataclasses

    import gpflow

    cfg = dataclasses.replace(gpflow.config.config(), float=float_dtype(dtype))
    with gpflow.config.as_context(cfg):
        yield


@dataclass(frozen=True)
class Context:
    """The validated inputs of one run of the checks (read only: stages return what they find).

    Attributes:
        model: the SVGP or VGP (never changed).
        data: (X [N, D], Y [N, P]) tensors, or None for models that hold their data.
        xi: the ``gpflow.optimizers.XiTransform`` instance.
        gamma: the step length γ > 0.
        mode: "full" or "fast".
        tol: the tolerances.
        np_dtype: the model's numpy dtype.
        M, L: inducing points (N for a VGP) and latent GPs.
        fisher: whether the Fisher identity is checked.
        requested_mode: the mode the user asked for ("auto", "full" or "fast"; "" when not known).
        gamma_steps: k, the γ search measures each γ by the loss after k steps (1: after one step).
    """

    model: Any
    data: Any
    xi: Any
    gamma: float
    mode: str
    tol: Tolerances
    np_dtype: Any
    M: int
    L: int
    fisher: bool = True
    requested_mode: str = ""
    gamma_steps: int = 1

    def loss_fn(self, model: Any) -> Any:
        """``model``'s training loss on this context's data."""
        return model.training_loss() if self.data is None else model.training_loss(self.data)
