"""Which code computes the natural-gradient step, decided in one place (:func:`step_backend`) for every caller.

* The closed form holds for GPflow's own ``XiNat`` and ``XiSqrtMeanVar`` (the exact classes: a subclass may override
  the maps it relies on) on a ``q_sqrt`` kept lower triangular by a lower ``tfp.bijectors.FillTriangular`` (GPflow's
  ``triangular()``) or a subclass of it. Else: GPflow's autodiff.
* There LAPACK computes it on the CPU; when TensorFlow sees a GPU, or the tensors live on one, the TensorFlow closed
  form runs instead, where they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from natgrad_diag._gpflow import is_lower_triangular_transform

__all__ = ["StepBackend", "closed_form_xi", "step_backend"]


@dataclass(frozen=True)
class StepBackend:
    """The step's code and, for the closed forms, which ξ (``"nat"`` or ``"sqrtmeanvar"``; None for autodiff)."""

    code: Literal["lapack", "closed_form", "autodiff"]
    xi: str | None = None


def closed_form_xi(xi_transform: Any) -> str | None:
    """``"nat"`` for GPflow's ``XiNat``, ``"sqrtmeanvar"`` for ``XiSqrtMeanVar`` (the exact classes), else None.

    Examples:
        >>> import gpflow
        >>> closed_form_xi(gpflow.optimizers.XiNat()), closed_form_xi(None)
        ('nat', None)
    """
    from gpflow.optimizers import XiNat, XiSqrtMeanVar

    return {XiNat: "nat", XiSqrtMeanVar: "sqrtmeanvar"}.get(type(xi_transform))


def _on_gpu(tensors: tuple[Any, ...]) -> bool:
    """Whether TensorFlow sees a GPU, or one of ``tensors`` was placed on one (its ``device`` string names it)."""
    import tensorflow as tf

    placed = " ".join(str(getattr(t, "device", "") or "") for t in tensors).upper()
    return "GPU" in placed or bool(tf.config.list_logical_devices("GPU"))


def step_backend(xi_transform: Any, q_sqrt_transform: Any, *tensors: Any) -> StepBackend:
    """The code for ``xi_transform``, a q_sqrt with ``q_sqrt_transform`` (None: plain) and ``tensors``' device.

    Examples:
        >>> import gpflow
        >>> step_backend(gpflow.optimizers.XiNat(), gpflow.utilities.triangular())
        StepBackend(code='lapack', xi='nat')
        >>> step_backend(gpflow.optimizers.XiSqrtMeanVar(), None)
        StepBackend(code='autodiff', xi=None)
    """
    xi = closed_form_xi(xi_transform)
    if xi is None or not is_lower_triangular_transform(q_sqrt_transform):
        return StepBackend("autodiff")
    return StepBackend("closed_form" if _on_gpu(tensors) else "lapack", xi)
