"""Input checks of a model's data: (X [N, D], Y [N, L]) that fit the model, in its dtype, finite (part of _validate's layer)."""

from __future__ import annotations

from typing import Any

import numpy as np

from natgrad_diag._validate import input_error, require_finite, require_float, require_same_dtype, shape_str
from natgrad_diag.exceptions import ShapeMismatchError
from natgrad_diag.typing import Array

__all__ = ["validate_data"]


def validate_data(model: Any, data: Any, name: str = "data") -> tuple[Array, Array]:
    """``(X [N, D], Y [N, L])`` that fit ``model``: D from its inducing points Z [M, D] (or its own data), L its
    latent GPs (Y may have one column for a multi-class likelihood), the model's dtype, finite values.

    Raises:
        InputError, ShapeMismatchError, DTypeMismatchError, NonFiniteError: naming ``data``'s X or Y.
    """
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise input_error(f"{name} must be a pair (X, Y).", name, "(X [N, D], Y [N, L])", type(data).__name__,
                          f"pass {name}=(X, Y), the data the model's loss is computed on.")  # fmt: skip
    X, Y = (np.asarray(getattr(v, "numpy", lambda v=v: v)()) for v in data)
    for part, a, dims in (("X", X, "[N, D]"), ("Y", Y, "[N, L]")):
        if a.ndim != 2:
            raise ShapeMismatchError(f"{name}'s {part} must be a matrix {dims}.", context=[
                ("Argument", f"{name}[{0 if part == 'X' else 1}] ({part})"), ("Expected", dims), ("Actual", shape_str(a.shape))],
                remedy=f"reshape {part} to {dims}, e.g. {part}[:, None] for one column.")  # fmt: skip
        if a.dtype.kind != "f":
            require_float(a, f"{name}[{0 if part == 'X' else 1}] ({part})")
    if X.shape[0] != Y.shape[0]:
        raise ShapeMismatchError(f"{name}'s X and Y must have the same number of rows N.", context=[
            ("Argument", name), ("Expected", "X [N, D] and Y [N, L] with one N"), ("Actual", f"X {shape_str(X.shape)}, Y {shape_str(Y.shape)}")],
            remedy="pass X and Y of the same data points.")  # fmt: skip
    Z = getattr(getattr(model, "inducing_variable", None), "Z", None)
    own = getattr(model, "data", None)
    D = int(Z.shape[-1]) if Z is not None else int(own[0].shape[-1]) if isinstance(own, tuple) else None
    if D is not None and X.shape[1] != D:
        raise ShapeMismatchError(f"{name}'s X has {X.shape[1]} input dimension(s) but the model has {D}.", context=[
            ("Argument", f"{name}[0] (X)"), ("Expected", f"[N, {D}] (D from the model's inducing points or data)"), ("Actual", shape_str(X.shape))],
            remedy="pass the X the model was built for (its inducing points Z [M, D] fix D).")  # fmt: skip
    L = getattr(model, "num_latent_gps", None)
    multi = any(k in type(getattr(model, "likelihood", None)).__name__ for k in ("MultiClass", "Softmax"))
    if L is not None and Y.shape[1] != int(L) and not (multi and Y.shape[1] == 1):
        raise ShapeMismatchError(f"{name}'s Y has {Y.shape[1]} column(s) but the model has L = {int(L)} latent GP(s).", context=[
            ("Argument", f"{name}[1] (Y)"), ("Expected", f"[N, {int(L)}]"), ("Actual", shape_str(Y.shape))],
            remedy="pass one Y column per latent GP (GPflow would broadcast the others silently).")  # fmt: skip
    q_mu = getattr(model, "q_mu", None)
    for k, a in enumerate((X, Y)):
        if q_mu is not None:
            require_same_dtype(a, q_mu, f"{name}[{k}] ({'XY'[k]})", "the model's q_mu")
        require_finite(a, f"{name}[{k}] ({'XY'[k]})")
    return X, Y
