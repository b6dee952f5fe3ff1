"""``natgrad-diag check``: build a seeded demo model and run the natural-gradient checks on it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from natgrad_diag._validate import input_error

if TYPE_CHECKING:
    from natgrad_diag.checks.report import NatGradReport

__all__ = ["check_natgrad_cli", "gamma_steps_arg"]


def gamma_steps_arg(text: str) -> int:
    """The argparse type of ``--gamma-steps K``: an integer from 1 to 1000, refused otherwise (exit code 2).

    Examples:
        >>> gamma_steps_arg("5")
        5
        >>> gamma_steps_arg("0")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected an integer from 1 to 1000 (steps per gamma tried), got '0'
    """
    from natgrad_diag.checks.api import MAX_GAMMA_STEPS

    expected = f"expected an integer from 1 to {MAX_GAMMA_STEPS} (steps per gamma tried), got {text!r}"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(expected) from None
    if not 1 <= value <= MAX_GAMMA_STEPS:
        raise argparse.ArgumentTypeError(expected)
    return value


def check_natgrad_cli(
    *, model: str = "svgp", likelihood: str = "gaussian", num_inducing: int = 10, num_latent: int = 1,
    num_data: int = 50, xi: str = "nat", gamma: float = 1.0, dtype: str = "float64", whiten: bool = True,
    mode: str = "auto", seed: int = 0, gamma_steps: int = 5,
) -> NatGradReport:  # fmt: skip
    """``natgrad-diag check``: build a seeded demo model (:func:`natgrad_diag.demo.make_model`) and check it.

    ``gamma_steps`` (``--gamma-steps K``): γ is judged, and each γ of the search measured, by K steps.
    """
    from gpflow.optimizers import XiNat, XiSqrtMeanVar

    from natgrad_diag.demo import make_model
    from natgrad_diag.checks.api import check_natgrad

    if xi not in ("nat", "meanvar"):
        raise input_error("xi must be 'nat' or 'meanvar'.", "--xi", "nat | meanvar", repr(xi),
                          "pass --xi nat (GPflow's default) or --xi meanvar.")
    demo = make_model(
        model, likelihood, num_inducing=num_inducing, num_latent=num_latent, num_data=num_data,
        whiten=whiten, dtype=dtype, seed=seed,
    )  # fmt: skip
    data = demo.data if demo.name == "svgp" else None
    xi_transform = XiNat() if xi == "nat" else XiSqrtMeanVar()
    return check_natgrad(demo.model, data, gamma=gamma, xi_transform=xi_transform, mode=mode, gamma_steps=gamma_steps)
