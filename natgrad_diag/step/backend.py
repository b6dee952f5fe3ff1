"""Which code computes the natural-gradient step: GPflow's autodiff, the TensorFlow closed form, or LAPACK.

:func:`step_backend` is the one place this is decided; ``natgrad_trace``, the drop-in ``NaturalGradient``, the checks'
evaluator and the k-step γ trials all ask it.

* The closed form holds for GPflow's own ``XiNat`` and ``XiSqrtMeanVar`` (the exact classes: a subclass may override
  the maps it relies on) on a ``q_sqrt`` kept lower triangular by a lower ``tfp.bijectors.FillTriangular`` (GPflow's
  ``triangular()``) or any subclass of it (``isinstance``: a subclass takes the class's path). Else: GPflow's autodiff.
* There LAPACK computes it on the CPU; when TensorFlow sees a GPU, or the tensors live on one, the TensorFlow closed
  form runs instead, where they are (LAPACK would copy them to the host).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from natgrad_diag._gpflow import is_lower_triangular_transform

__all__ = ["StepBackend", "closed_form_xi", "is_lower_triangular_transform", "step_backend"]


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
    """The code that computes the step for ``xi_transform`` on a ``q_sqrt`` with ``q_sqrt_transform``.

    Args:
        xi_transform: a ``gpflow.optimizers.XiTransform`` instance.
        q_sqrt_transform: q_sqrt's transform (``q_sqrt.transform``; None for a plain tensor).
        tensors: the step's tensors, whose device decides between LAPACK (CPU) and the TensorFlow closed form.

    Returns:
        ``StepBackend("lapack" | "closed_form", "nat" | "sqrtmeanvar")`` or ``StepBackend("autodiff")``.

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
