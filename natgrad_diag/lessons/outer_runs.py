"""The torch.outer lesson's computations: TensorFlow's gradients, the oracles built by hand, and the checks between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from natgrad_diag._validate import shape_str
from natgrad_diag.autodiff.blocks import BlockJacobian
from natgrad_diag.exceptions import MissingExtraError, OutputGradientsError, error_line
from natgrad_diag.report.records import Check, close_check, format_number, status_of
from natgrad_diag.typing import FloatArray

__all__ = ["ByHand", "TensorFlowRun", "by_hand", "first_line", "outer_checks", "tensorflow_run", "torch_checks", "torch_run"]


def first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else ""



@dataclass(frozen=True)
class TensorFlowRun:
    """What TensorFlow computes for y = x xᵀ, z = y², s = sin(x): gradients and the wrong seeds' fates."""

    y: FloatArray
    g_ones: FloatArray
    g_default: FloatArray
    dL_dy: FloatArray
    two: FloatArray
    one: FloatArray
    wrong_seed_error: str
    tf_wrong: str
    broadcast_error: str
    b_shape: tuple[int, ...] | None


def tensorflow_run(xn: FloatArray) -> TensorFlowRun:
    import tensorflow as tf

    from natgrad_diag.autodiff.seeded import checked_gradient

    n = xn.shape[0]
    xt = tf.constant(xn)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xt)
        y = xt[:, None] * xt[None, :]
        z = y**2
        s = tf.sin(xt)
    g_ones = checked_gradient(tape, y, xt, tf.ones_like(y)).numpy()
    g_default = tape.gradient(y, xt).numpy()
    dL_dy = checked_gradient(tape, z, y, tf.ones_like(z))
    two = checked_gradient(tape, y, xt, dL_dy).numpy()
    one = checked_gradient(tape, z, xt, tf.ones_like(z)).numpy()
    wrong_seed_error = tf_wrong = broadcast_error = ""
    try:
        checked_gradient(tape, y, xt, tf.ones_like(xt))
    except OutputGradientsError as e:
        wrong_seed_error = str(e)
    try:
        raw = tape.gradient(y, xt, output_gradients=tf.ones_like(xt))
        tf_wrong = f"no error: returned a \"gradient\" of shape {shape_str(raw.shape)}"
    except (tf.errors.OpError, ValueError, TypeError) as e:
        tf_wrong = error_line(e, with_type=True)
    try:
        checked_gradient(tape, s, xt, tf.ones([n, 1], tf.float64))
    except OutputGradientsError as e:
        broadcast_error = str(e)
    try:
        seed = tf.ones([n, 1], tf.float64)
        b_shape: tuple[int, ...] | None = tuple(int(d) for d in tape.gradient(s, xt, output_gradients=seed).shape)
    except (tf.errors.OpError, ValueError, TypeError):
        b_shape = None
    return TensorFlowRun(
        y=y.numpy(), g_ones=g_ones, g_default=g_default, dL_dy=dL_dy.numpy(), two=two, one=one,
        wrong_seed_error=wrong_seed_error, tf_wrong=tf_wrong, broadcast_error=broadcast_error, b_shape=b_shape,
    )  # fmt: skip


@dataclass(frozen=True)
class ByHand:
    """The oracles: the explicit Jacobian (from :func:`jacobian` and by hand) and the closed forms."""

    J_block: BlockJacobian
    J: FloatArray
    J_hand: FloatArray
    contraction: FloatArray
    closed: FloatArray
    chain_closed: FloatArray


def by_hand(xn: FloatArray) -> ByHand:
    import tensorflow as tf

    from natgrad_diag.autodiff.dense import jacobian

    n = xn.shape[0]
    J_block = jacobian(lambda a: a[:, None] * a[None, :], [tf.constant(xn)], input_names=("x",), output_names=("y",))
    J = J_block.block(0, 0)
    eye = np.eye(n)
    J_hand = np.einsum("ij,k->jki", eye, xn) + np.einsum("j,ik->jki", xn, eye)  # δ_ij x_k + x_j δ_ik at [j, k, i]
    return ByHand(
        J_block=J_block, J=J, J_hand=J_hand, contraction=np.tensordot(np.ones((n, n)), J, axes=2),
        closed=np.full(n, 2.0 * xn.sum()), chain_closed=4.0 * xn * np.sum(xn**2),
    )  # fmt: skip


def outer_checks(xn: FloatArray, r: TensorFlowRun, h: ByHand, *, rtol: float, atol: float) -> list[Check]:
    n = xn.shape[0]
    shapes_named = f"[{n}] and [{n}, {n}]"
    return [
        close_check("ones_seed_is_2_sum_x", f"output_gradients = ones_like(y) gives dL/dx = 2·sum(x) = {format_number(h.closed[0])}",
               r.g_ones, h.closed, rtol=rtol, atol=atol),
        close_check("default_seed_is_ones", "tape.gradient(y, x) with no seed equals the seed of ones (TensorFlow's default)",
               r.g_default, r.g_ones, rtol=rtol, atol=atol),
        close_check("jacobian_closed_form", f"tape.jacobian(y, x) [{n}, {n}, {n}] equals δ_ij x_k + x_j δ_ik built by hand",
               h.J, h.J_hand, rtol=rtol, atol=atol),
        close_check("contraction_equals_gradient", "Σ_jk 1·J[j, k, i], the explicit Jacobian contracted with the seed, "
               "equals the output_gradients result", h.contraction, r.g_ones, rtol=rtol, atol=atol),
        close_check("chain_two_steps_equal_one", "z = y²: dL/dy = 2y, then (∂y/∂x)ᵀ·dL/dy, equals differentiating z in one step",
               r.two, r.one, rtol=rtol, atol=atol),
        close_check("chain_closed_form", "z = y² in one step equals 4·x_i·Σ_k x_k²", r.one, h.chain_closed, rtol=rtol, atol=atol),
        Check(
            name="wrong_seed_caught",
            claim=f"the seed ones_like(x) (shape [{n}]) for y (shape [{n}, {n}]) is refused, naming both shapes",
            status=status_of(status_of(r.wrong_seed_error) and f"shape of [{n}] and target[0] has a shape of [{n}, {n}]" in r.wrong_seed_error),
            detail=f"plain tape.gradient: {r.tf_wrong}" if r.wrong_seed_error else f"no error for shapes {shapes_named}",
        ),
        Check(
            name="broadcast_seed_caught",
            claim=f"for y = sin(x) the seed of shape [{n}, 1] is refused instead of being broadcast",
            status=status_of(r.broadcast_error),
            detail=(
                f"plain tape.gradient returned shape {shape_str(r.b_shape)} for a [{n}] source"
                if r.b_shape is not None else "plain tape.gradient raised"
            ),
        ),
    ]  # fmt: skip


def torch_run(xn: FloatArray, use_torch: bool | None) -> tuple[Any, str]:
    """(the PyTorch run or None, its status line)."""
    if use_torch is False:
        return None, "skipped (use_torch=False)"
    from natgrad_diag.torch_bridge import torch_outer

    try:
        run = torch_outer(xn)
    except MissingExtraError:
        if use_torch:
            raise
        return None, "torch is not installed (pip install torch==2.13.0 to run it)"
    return run, f"torch {run.torch_version}"


def torch_checks(t: Any, r: TensorFlowRun, h: ByHand, *, rtol: float, atol: float) -> list[Check]:
    return [
        close_check("torch_ones_seed_agrees", "torch.autograd.grad(y, x, grad_outputs=ones_like(y)) equals TensorFlow's",
               t.gradient_ones_seed, r.g_ones, rtol=rtol, atol=atol),
        close_check("torch_jacobian_agrees", "torch.autograd.functional.jacobian equals tape.jacobian",
               t.jacobian, h.J, rtol=rtol, atol=atol),
        close_check("torch_chain_agrees", "torch's two-step and one-step chain z = y² equal TensorFlow's",
               np.concatenate([t.chain_two_step, t.chain_one_step, np.ravel(t.dL_dy)]),
               np.concatenate([r.two, r.one, np.ravel(r.dL_dy)]), rtol=rtol, atol=atol),
        Check(
            name="torch_rejects_wrong_seed",
            claim="PyTorch refuses grad_outputs=ones_like(x) too, with its own shape message",
            status=status_of("Mismatch in shape" in t.wrong_seed_error),
            detail=f"torch: {first_line(t.wrong_seed_error) or '(no error)'}",
        ),
    ]  # fmt: skip
