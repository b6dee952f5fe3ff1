"""The explicit Jacobian of a function of several tensors, in blocks, with labels and contractions.

For outputs y_i (flattened as ``tf.nest.flatten`` does) and inputs x_j, block (i, j) is
∂y_i/∂x_j with shape ``y_i.shape + x_j.shape``. The dense matrix stacks the flattened blocks:
rows are output elements, columns are input elements. Then

    vjp(v)  = Jᵀ·v,   (Jᵀ·v)_j = Σ_i Σ_a v_i[a] ∂y_i[a]/∂x_j          (what output_gradients computes)
    jvp(u)  = J·u,    (J·u)_i  = Σ_j Σ_b ∂y_i/∂x_j[b] u_j[b]
    summed_gradient() = Jᵀ·1                                          (what a seed of ones computes)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validate import shape_str
from .exceptions import InputError, MemoryLimitError, ShapeMismatchError

__all__ = ["BlockJacobian", "DEFAULT_MAX_BYTES", "element_labels", "jacobian", "jacobian_nbytes"]

#: Default limit for a dense Jacobian: 2 GiB.
DEFAULT_MAX_BYTES = 2 * 1024**3


def element_labels(name: str, shape: Sequence[int]) -> list[str]:
    """``["x[0,0]", "x[0,1]", ...]`` in row-major order; ``["x"]`` for a scalar."""
    if len(shape) == 0:
        return [name]
    return [f"{name}[{','.join(map(str, idx))}]" for idx in np.ndindex(*shape)]


def jacobian_nbytes(output_shapes: Sequence[Sequence[int]], input_shapes: Sequence[Sequence[int]], itemsize: int) -> int:
    """Bytes of the dense Jacobian: (Σ output sizes) · (Σ input sizes) · itemsize."""
    rows = sum(int(np.prod(s)) for s in output_shapes)
    cols = sum(int(np.prod(s)) for s in input_shapes)
    return rows * cols * itemsize


def _gib(n: int) -> str:
    return f"{n / 1024**3:.3g} GiB" if n >= 1024**3 else f"{n / 1024**2:.3g} MiB"


def check_memory(nbytes: int, max_bytes: int, what: str) -> None:
    """Refuse, before allocating, a dense Jacobian larger than ``max_bytes``."""
    if nbytes > max_bytes:
        raise MemoryLimitError(
            f"the dense Jacobian for {what} would need {_gib(nbytes)}, over the limit of {_gib(max_bytes)}.",
            context=[("Estimated size", f"{nbytes} bytes ({_gib(nbytes)})"), ("Limit (max_bytes)", f"{max_bytes} bytes")],
            remedy="use mode='fast' (matrix-free, no dense Jacobian), or raise max_bytes if you have the memory.",
        )


@dataclass(frozen=True)
class BlockJacobian:
    """The Jacobian of ``outputs`` with respect to ``inputs``, as a grid of blocks.

    Attributes:
        blocks: ``blocks[i][j]`` = ∂output_i/∂input_j, shape ``output_shapes[i] + input_shapes[j]``.
        output_names, input_names: names used in the labels, e.g. ``("mean", "varsqrt")``.
        output_shapes, input_shapes: the shapes of the outputs and inputs.
    """

    blocks: tuple[tuple[np.ndarray, ...], ...]
    output_names: tuple[str, ...]
    input_names: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    input_shapes: tuple[tuple[int, ...], ...]

    @property
    def dtype(self) -> np.dtype:
        return self.blocks[0][0].dtype

    def block(self, i: int, j: int) -> np.ndarray:
        """∂output_i/∂input_j, shape ``output_shapes[i] + input_shapes[j]``."""
        return self.blocks[i][j]

    @functools.cached_property
    def matrix(self) -> np.ndarray:
        """[Σ output sizes, Σ input sizes], rows = flattened outputs, columns = flattened inputs."""
        rows = []
        for i, oshape in enumerate(self.output_shapes):
            n_out = int(np.prod(oshape))
            rows.append(np.concatenate([self.blocks[i][j].reshape(n_out, -1) for j in range(len(self.input_shapes))], axis=1))
        return np.concatenate(rows, axis=0)

    @functools.cached_property
    def row_labels(self) -> tuple[str, ...]:
        """``("mean[0,0]", ..., "varsqrt[0,4,4]")``."""
        return tuple(lab for n, s in zip(self.output_names, self.output_shapes) for lab in element_labels(n, s))

    @functools.cached_property
    def col_labels(self) -> tuple[str, ...]:
        """``("eta1[0,0]", ..., "eta2[0,4,4]")``."""
        return tuple(lab for n, s in zip(self.input_names, self.input_shapes) for lab in element_labels(n, s))

    def _check(self, vectors: Any, shapes: tuple[tuple[int, ...], ...], argument: str, side: str) -> list[np.ndarray]:
        if isinstance(vectors, np.ndarray) or not isinstance(vectors, (list, tuple)):
            vectors = [vectors]
        if len(vectors) != len(shapes):
            raise ShapeMismatchError(
                f"{argument} needs one array per {side}.",
                context=[("Argument", argument), ("Expected", f"{len(shapes)} array(s): " + ", ".join(map(shape_str, shapes))), ("Actual", f"{len(vectors)} array(s)")],
                remedy=f"pass a list with one array per {side}, in order.",
            )
        out = []
        for k, (v, s) in enumerate(zip(vectors, shapes)):
            a = np.asarray(v, dtype=self.dtype)
            if a.shape != tuple(s):
                raise ShapeMismatchError(
                    f"{argument}[{k}] has a shape of {shape_str(a.shape)} and {side} {k} has a shape of {shape_str(s)}.",
                    context=[("Argument", f"{argument}[{k}]"), ("Expected", shape_str(s)), ("Actual", shape_str(a.shape))],
                    remedy=f"pass an array of exactly the shape of {side} {k} (no broadcasting).",
                )
            out.append(a)
        return out

    def vjp(self, cotangents: Any) -> tuple[np.ndarray, ...]:
        """Jᵀ·v by explicit contraction; one cotangent per output, one result per input."""
        vs = self._check(cotangents, self.output_shapes, "cotangents", "output")
        result = []
        for j, ishape in enumerate(self.input_shapes):
            acc = np.zeros(ishape, dtype=self.dtype)
            for i, v in enumerate(vs):
                acc = acc + np.tensordot(v, self.blocks[i][j], axes=v.ndim)
            result.append(acc)
        return tuple(result)

    def jvp(self, tangents: Any) -> tuple[np.ndarray, ...]:
        """J·u by explicit contraction; one tangent per input, one result per output."""
        us = self._check(tangents, self.input_shapes, "tangents", "input")
        result = []
        for i, oshape in enumerate(self.output_shapes):
            acc = np.zeros(oshape, dtype=self.dtype)
            for j, u in enumerate(us):
                b = self.blocks[i][j]
                acc = acc + np.tensordot(b, u, axes=(list(range(len(oshape), b.ndim)), list(range(u.ndim))))
            result.append(acc)
        return tuple(result)

    def summed_gradient(self) -> tuple[np.ndarray, ...]:
        """Jᵀ·1: the gradient of the sum of every output element (TensorFlow's default seed)."""
        return self.vjp([np.ones(s, dtype=self.dtype) for s in self.output_shapes])

    def is_diagonal(self, *, atol: float = 0.0) -> bool:
        """True when J is square and every off-diagonal entry is within ``atol`` of zero."""
        m = self.matrix
        if m.shape[0] != m.shape[1]:
            return False
        off = m - np.diag(np.diag(m))
        return bool(np.max(np.abs(off), initial=0.0) <= atol)

    def row(self, label: str) -> np.ndarray:
        """One row of the dense matrix, by its label (``"varsqrt[0,4,0]"``)."""
        try:
            return self.matrix[self.row_labels.index(label)]
        except ValueError:
            raise InputError(
                f"no output element is labelled {label!r}.",
                context=[("Argument", "label"), ("Expected", f"one of {self.row_labels[0]!r} ... {self.row_labels[-1]!r}"), ("Got", label)],
                remedy="use a label from .row_labels.",
            ) from None

    def __str__(self) -> str:
        lines = [f"BlockJacobian {self.matrix.shape[0]} × {self.matrix.shape[1]} ({self.dtype})"]
        for i, (on, os_) in enumerate(zip(self.output_names, self.output_shapes)):
            for j, (inn, is_) in enumerate(zip(self.input_names, self.input_shapes)):
                b = self.blocks[i][j]
                lines.append(f"  ∂{on}{shape_str(os_)}/∂{inn}{shape_str(is_)}: max |entry| {np.max(np.abs(b), initial=0.0):.4g}")
        return "\n".join(lines)


def _names(given: Sequence[str] | None, count: int, prefix: str, argument: str) -> tuple[str, ...]:
    if given is None:
        return tuple(f"{prefix}{k}" for k in range(count))
    given = tuple(given)
    if len(given) != count:
        raise InputError(
            f"{argument} must name each of the {count} {prefix == 'x' and 'inputs' or 'outputs'}.",
            context=[("Argument", argument), ("Expected", f"{count} names"), ("Got", f"{len(given)}: {given}")],
            remedy=f"pass {count} names, or leave {argument}=None.",
        )
    return given


def jacobian(
    fn: Callable[..., Any],
    inputs: Sequence[Any] | Mapping[str, Any],
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> BlockJacobian:
    """The explicit Jacobian of ``fn(*inputs)`` with ``tape.jacobian``; unconnected blocks are zeros.

    Args:
        fn: a function of the inputs returning a tensor or a nest of tensors (tuple, list, dict).
        inputs: the points to differentiate at, a sequence (or a dict: its keys name the inputs).
        input_names, output_names: names for the labels (default ``x0, x1, ...`` and ``y0, y1, ...``,
            or the keys of dicts).
        max_bytes: refuse, before any Jacobian is allocated, when the dense Jacobian would be larger.

    Returns:
        A :class:`BlockJacobian`.

    Raises:
        MemoryLimitError: the dense Jacobian would exceed ``max_bytes``.

    Example:
        >>> import tensorflow as tf
        >>> J = jacobian(lambda x: x[:, None] * x[None, :], [tf.constant([1., 2., 3., 4.], tf.float64)])
        >>> J.block(0, 0).shape
        (4, 4, 4)
    """
    import tensorflow as tf

    if isinstance(inputs, Mapping):
        input_names = tuple(inputs.keys()) if input_names is None else input_names
        inputs = list(inputs.values())
    elif not isinstance(inputs, (list, tuple)):
        inputs = [inputs]
    xs = [tf.convert_to_tensor(x) for x in inputs]
    in_names = _names(input_names, len(xs), "x", "input_names")

    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch(xs)
        outputs = fn(*xs)
    if isinstance(outputs, Mapping) and output_names is None:
        output_names = tuple(sorted(outputs.keys()))
    ys = [tf.convert_to_tensor(y) for y in tf.nest.flatten(outputs)]
    out_names = _names(output_names, len(ys), "y", "output_names")
    out_shapes = tuple(tuple(y.shape.as_list()) for y in ys)
    in_shapes = tuple(tuple(x.shape.as_list()) for x in xs)
    check_memory(jacobian_nbytes(out_shapes, in_shapes, ys[0].dtype.size), max_bytes, f"{len(ys)} output(s) and {len(xs)} input(s)")

    blocks = tuple(
        tuple(
            tape.jacobian(y, x, unconnected_gradients=tf.UnconnectedGradients.ZERO).numpy()
            for x in xs
        )
        for y in ys
    )
    del tape
    return BlockJacobian(blocks, out_names, in_names, out_shapes, in_shapes)


def natgrad_map_jacobian(eta1: Any, eta2: Any, *, max_bytes: int = DEFAULT_MAX_BYTES) -> BlockJacobian:
    """J = ∂(mean, varsqrt)/∂(eta1, eta2) of GPflow's ``expectation_to_meanvarsqrt`` at (η₁, η₂).

    eta1 is [M, L], eta2 is [L, M, M]; the blocks are labelled mean, varsqrt / eta1, eta2.
    """
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    return jacobian(
        lambda e1, e2: expectation_to_meanvarsqrt(e1, e2),
        [eta1, eta2],
        input_names=("eta1", "eta2"),
        output_names=("mean", "varsqrt"),
        max_bytes=max_bytes,
    )
