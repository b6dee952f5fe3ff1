"""PyTorch's side of the ``grad_outputs`` lesson: the same numbers from ``torch.autograd.grad`` (public).

``torch.autograd.grad(outputs, inputs, grad_outputs=v)`` computes the same vector-Jacobian product as
``tape.gradient(target, sources, output_gradients=v)``, (Jᵀ·v)_j = Σ_i Σ_a v_i[a] · ∂output_i[a]/∂input_j, but
checks each v_i against its output's shape first. PyTorch is an optional extra (install a CPU build first, see
:data:`INSTALL_HINT`), imported only inside these functions.

References: ``torch.autograd.grad`` and ``torch.autograd.functional.jacobian`` (https://pytorch.org/docs/stable/autograd.html).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag._validate import call_fn, flat_outputs
from natgrad_diag.autodiff.seeded import vjp
from natgrad_diag.exceptions import MissingExtraError
from natgrad_diag.report.records import Check, close_check
from natgrad_diag.tolerance import validate_tolerance
from natgrad_diag.typing import Array

__all__ = ["INSTALL_HINT", "TorchOuter", "compare_with_tensorflow", "require_torch", "torch_available", "torch_outer", "torch_vjp"]

#: How to install PyTorch without the multi-GB CUDA build.
INSTALL_HINT = ("a CPU build: pip install torch --index-url https://download.pytorch.org/whl/cpu "
                "(on the CI machine, pip install torch==2.13.0 takes the CPU build on disk)")  # fmt: skip


def torch_available() -> bool:
    """True when PyTorch can be imported (without importing it)."""
    return importlib.util.find_spec("torch") is not None


def require_torch() -> Any:
    """Import and return ``torch``; MissingExtraError (also an ``ImportError``) when PyTorch is not installed."""
    try:
        import torch
    except ImportError as e:
        raise MissingExtraError(
            "the PyTorch cross-check needs torch.",
            context=[("Extra", "torch"), ("Expected", "an importable torch (>= 2.3)"), ("Got", f"ImportError: {e}")],
            remedy=f"install {INSTALL_HINT}, then pip install natgrad-diag[torch].",
        ) from e
    return torch


@dataclass(frozen=True)
class TorchOuter:
    """``y = torch.outer(x, x)`` differentiated by ``torch.autograd.grad`` in float64 (n = len(x)).

    Attributes:
        x, gradient_ones_seed, jacobian, dL_dy, chain_two_step, chain_one_step: :class:`~natgrad_diag.OuterExample`'s
            numbers of these names, by ``torch.autograd.grad`` (``jacobian``: [n, n, n], J[j, k, i] = ∂y_jk/∂x_i, by
            ``torch.autograd.functional.jacobian``).
        wrong_seed_error: torch's own message for ``grad_outputs=ones_like(x)`` ("" if torch accepted it).
        torch_version: ``torch.__version__``.
    """

    x: Array
    gradient_ones_seed: Array
    jacobian: Array
    dL_dy: Array
    chain_two_step: Array
    chain_one_step: Array
    wrong_seed_error: str
    torch_version: str


def torch_outer(x: Sequence[float] | Array) -> TorchOuter:
    """The ``torch.outer`` example of the ``grad_outputs`` docs run by PyTorch in float64 on CPU at ``x`` [n], every
    number as a numpy array; MissingExtraError without PyTorch.
    """
    torch = require_torch()
    xn = np.array(x, dtype=np.float64).reshape(-1)
    try:
        torch_vjp(lambda a: torch.outer(a, a), [xn], [np.ones_like(xn)])
        wrong = ""
    except RuntimeError as e:
        wrong = str(e)
    jac = torch.autograd.functional.jacobian(lambda a: torch.outer(a, a), torch.tensor(xn, dtype=torch.float64))
    # the chain x → y = x xᵀ → z = y², in two vector-Jacobian steps and in one
    (y,), (g_ones,) = torch_vjp(lambda a: torch.outer(a, a), [xn], [np.ones((xn.size, xn.size))])
    _, (dL_dy,) = torch_vjp(lambda b: b**2, [y], [np.ones_like(y)])
    _, (two,) = torch_vjp(lambda a: torch.outer(a, a), [xn], [dL_dy])
    _, (one,) = torch_vjp(lambda a: torch.outer(a, a) ** 2, [xn], [np.ones_like(y)])
    return TorchOuter(x=xn, gradient_ones_seed=g_ones, jacobian=jac.numpy().copy(), dL_dy=dL_dy, chain_two_step=two,
                      chain_one_step=one, wrong_seed_error=wrong, torch_version=str(torch.__version__))


def torch_vjp(
    fn: Callable[..., Any], primals: Sequence[Any], cotangents: Sequence[Any]
) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    """The outputs of ``fn(*primals)`` and Jᵀ·v by ``torch.autograd.grad`` in float64, as tuples of numpy arrays.

    ``fn`` takes torch tensors and returns a tensor or a tuple/list of them; ``cotangents`` has one array per output
    (torch checks their shapes); an input ``fn`` does not use gets zeros. Raises MissingExtraError without PyTorch,
    and torch's own RuntimeError, e.g. for a cotangent of the wrong shape.
    """
    torch = require_torch()
    xs = [torch.tensor(np.asarray(p, dtype=np.float64), dtype=torch.float64, requires_grad=True) for p in primals]
    out = fn(*xs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    vs = [torch.tensor(np.asarray(v, dtype=np.float64), dtype=torch.float64) for v in cotangents]
    grads = torch.autograd.grad(outs, xs, grad_outputs=vs, allow_unused=True, materialize_grads=True)
    return tuple(o.detach().numpy().copy() for o in outs), tuple(g.detach().numpy().copy() for g in grads)


def compare_with_tensorflow(
    tf_fn: Callable[..., Any], torch_fn: Callable[..., Any], primals: Sequence[Any], cotangents: Sequence[Any], *,
    name: str = "tf_equals_torch", rtol: float = 1e-12, atol: float = 1e-12,
) -> Check:
    """Jᵀ·v of one function written for TensorFlow (:func:`natgrad_diag.vjp`) and for PyTorch (:func:`torch_vjp`) at
    ``primals`` (float64) with one seed per output, compared: a :class:`~natgrad_diag.Check` named ``name`` that
    passes when max |tf − torch| ≤ atol + rtol · max |torch| over every output and gradient; never raises on a
    disagreement.

    Raises:
        MissingExtraError: PyTorch is not installed.
        OutputGradientsError, InputError: a cotangent does not match TensorFlow's output (checked first), or torch_fn
            fails where tf_fn did not (another output shape, a detached or numpy output: torch's error named).
    """
    rtol, atol = validate_tolerance("rtol", rtol), validate_tolerance("atol", atol)  # a negative one failed every check
    f_out, f_grads = vjp(tf_fn, [np.asarray(p, dtype=np.float64) for p in primals], [np.asarray(v, dtype=np.float64) for v in cotangents])
    f_out = flat_outputs(f_out, "tf_fn")
    t_out, t_grads = call_fn(lambda: torch_vjp(torch_fn, primals, cotangents), [], "torch_fn", at=" under torch_vjp",
                             remedy="write torch_fn as tf_fn for float64 torch tensors, returning differentiable tensors of tf_fn's shapes.")
    # both libraries check each seed against its output's shape, so the shapes here agree
    return close_check(name, "TensorFlow's output_gradients and PyTorch's grad_outputs give the same outputs and Jᵀ·v",
                       [*f_out, *f_grads], [*t_out, *t_grads], rtol=rtol, atol=atol,
                       detail=f"{len(f_out)} output(s), {len(f_grads)} input(s), float64")  # fmt: skip

