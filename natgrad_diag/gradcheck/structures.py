"""Input structures of a gradient check: inference for GPflow's maps, coordinates, directions, hints."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from natgrad_diag._validate import input_error, shape_str
from natgrad_diag.autodiff.blocks import label
from natgrad_diag.exceptions import NO_DERIVATIVE, ShapeMismatchError
from natgrad_diag.tolerance import rounding_bound
from natgrad_diag.typing import Array

__all__ = ["GPFLOW_MAPS", "STRUCTURES", "coord_label", "coordinates", "gpflow_map_name", "hint",
           "random_direction", "resolve_structures"]  # fmt: skip

#: The input structures :func:`check_gradients` understands.
STRUCTURES = ("general", "symmetric", "lower_triangular")


# GPflow's conversion maps: (input names, output names, input structures).
GPFLOW_MAPS = {
    "expectation_to_meanvarsqrt": (("eta1", "eta2"), ("mean", "varsqrt"), ("general", "symmetric")),
    "meanvarsqrt_to_expectation": (("mean", "varsqrt"), ("eta1", "eta2"), ("general", "lower_triangular")),
    "natural_to_meanvarsqrt": (("nat1", "nat2"), ("mean", "varsqrt"), ("general", "symmetric")),
    "meanvarsqrt_to_natural": (("mean", "varsqrt"), ("nat1", "nat2"), ("general", "lower_triangular")),
    "natural_to_expectation": (("nat1", "nat2"), ("eta1", "eta2"), ("general", "symmetric")),
    "expectation_to_natural": (("eta1", "eta2"), ("nat1", "nat2"), ("general", "symmetric")),
}


def gpflow_map_name(fn: Any) -> str | None:
    name: str | None = getattr(fn, "__name__", None)
    return name if name in GPFLOW_MAPS and getattr(fn, "__module__", "") == "gpflow.optimizers.natgrad" else None


def resolve_structures(structure: Any, fn: Any, names: tuple[str, ...], arrays: list[Array]) -> tuple[str, ...]:
    """One structure per input from ``structure`` (as :func:`check_gradients` takes it; a dict overrides the inferred
    ones: :data:`GPFLOW_MAPS`' for GPflow's maps, else general), checked against the inputs' shapes."""
    n, gp_map = len(arrays), gpflow_map_name(fn)
    inferred = GPFLOW_MAPS[gp_map][2] if gp_map is not None and n == 2 else ("general",) * n
    if structure is None:
        result = inferred
    elif isinstance(structure, str):
        result = (structure,) * n
    elif isinstance(structure, Mapping):
        if unknown := [k for k in structure if k not in names]:
            raise input_error(f"structure names unknown input(s) {unknown}.", "structure",
                              f"keys among the input names {names}", list(structure),
                              "key the dict by input name, e.g. structure={'eta2': 'symmetric'}.")
        result = tuple(structure.get(name, inferred[k]) for k, name in enumerate(names))
    elif isinstance(structure, (list, tuple)):
        if len(structure) != n:
            raise input_error(f"structure has {len(structure)} entries for {n} input(s).", "structure",
                              f"{n} structures, one per input", list(structure),
                              "pass one structure per input, a single string for all, or a dict by input name.")
        result = tuple(structure)
    else:
        raise input_error("structure must be a string, a sequence or a dict.", "structure",
                          f"one of {STRUCTURES}, a list or a dict", type(structure).__name__,
                          "pass e.g. structure='symmetric' or structure={'eta2': 'symmetric'}.")
    for name, a, st in zip(names, arrays, result):
        if st not in STRUCTURES:
            raise input_error(f"unknown structure {st!r} for input {name}.", "structure",
                              " or ".join(repr(s) for s in STRUCTURES), repr(st),
                              "use 'symmetric' for η₂ or θ₂, 'lower_triangular' for a q_sqrt, else 'general'.")
        if st != "general" and (a.ndim < 2 or a.shape[-1] != a.shape[-2]):
            raise input_error(f"structure {st!r} needs square matrices in the last two axes of {name}.",
                              f"structure for {name}", "[..., M, M]", shape_str(a.shape),
                              f"use structure 'general' for {name}, or pass the matrix input it was meant for.",
                              kind=ShapeMismatchError)
        # off a symmetric point only g_ab + g_ba is compared, so a wrong gradient passes: refuse beyond the
        # rounding of an M-term product such as A·Aᵀ (Higham 2002, §3.1)
        asym = float(np.max(np.abs(a - np.swapaxes(a, -1, -2)))) if st == "symmetric" else 0.0
        if asym and asym > rounding_bound(a.dtype, condition=a.shape[-1], scale=float(np.max(np.abs(a)))):
            raise input_error(f"structure 'symmetric' was given for {name}, which is not symmetric.",
                              f"structure for {name}", "X = Xᵀ (to rounding)", f"max |X − Xᵀ| = {asym:.3g}",
                              f"pass a symmetric point, e.g. (X + Xᵀ)/2, or use structure 'general' for {name}.")
    return result


def coordinates(shape: tuple[int, ...], structure: str) -> list[tuple[tuple[int, ...], ...]]:
    """The perturbations of one input: tuples of multi-indices set to 1 (E_ab, or E_ab + E_ba).

    ``"general"`` and ``"lower_triangular"``: d = E_ab, one entry at a time, compared with g_ab (above the diagonal of
    a lower-triangular input the finite difference is zero when ``fn`` reads only the lower triangle, and labels mark
    those entries). ``"symmetric"``: d = E_ab + E_ba (a > b) or E_aa, compared with g_ab + g_ba (or g_aa): a function
    that reads one triangle (``tf.linalg.cholesky``) has a symmetrised gradient, so one-entry differences would give
    2·g_ab below the diagonal and 0 above it, a false mismatch.

    Examples:
        >>> coordinates((2, 2), "symmetric")
        [((0, 0),), ((1, 0), (0, 1)), ((1, 1),)]
        >>> len(coordinates((2, 2), "general"))
        4
    """
    if structure != "symmetric":
        return [(idx,) for idx in np.ndindex(*shape)]
    return [(idx,) if idx[-2] == idx[-1] else (idx, (*idx[:-2], idx[-1], idx[-2]))
            for idx in np.ndindex(*shape) if idx[-2] >= idx[-1]]  # fmt: skip


def coord_label(name: str, coord: tuple[tuple[int, ...], ...], structure: str) -> str:
    above = structure == "lower_triangular" and coord[0][-1] > coord[0][-2]
    return "+".join(label(name, idx) for idx in coord) + (" (above diagonal)" if above else "")


def random_direction(rng: np.random.Generator, shape: tuple[int, ...], structure: str, dtype: Any, part: str = "lower") -> Array:
    d = rng.standard_normal(shape)
    if structure == "symmetric":
        d = 0.5 * (d + np.swapaxes(d, -1, -2))
    elif structure == "lower_triangular":
        d = np.tril(d) if part == "lower" else np.triu(d, 1)
    return (d / np.linalg.norm(d)).astype(dtype)  # inputs are non-empty; an upper part is drawn only above 1x1


def hint(structure: str, name: str, value: Array, analytical: float = 0.0, *, connected: bool = True) -> str:
    """Why a check may fail: reverse mode's ``analytical`` value is NaN or Inf, or 0 for the whole block
    (``connected`` false), or a general check of a structured value, and which structure to use."""
    if not np.isfinite(analytical):
        return (f"reverse mode gives {analytical} here, where fn is finite on both sides: {NO_DERIVATIVE}. Check at "
                "another point, or give fn a finite gradient there (tf.math.divide_no_nan, tf.custom_gradient).")
    if not connected:
        return (f"reverse mode gives 0 for the whole block while fn changes with {name}: no gradient path from {name} "
                "(tape.gradient gives None: a NumPy round-trip, tf.stop_gradient, or a custom gradient returning None).")
    if structure != "general" or value.ndim < 2 or value.shape[-1] != value.shape[-2] or value.shape[-1] < 2:
        return ""
    scale = float(np.max(np.abs(value), initial=0.0))
    if not np.allclose(value, np.swapaxes(value, -1, -2), rtol=0.0, atol=1e-12 * max(scale, 1.0)):
        return ""
    return (
        f"input {name} looks symmetric ({name} = {name}ᵀ). If fn reads one triangle of it (tf.linalg.cholesky "
        f"does), TensorFlow's gradient is symmetrised and one-entry differences cannot match it: check with "
        f"structure='symmetric' (or structure={{'{name}': 'symmetric'}})."
    )
