"""``natgrad-diag check``: build a seeded demo model and run the natural-gradient checks on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from natgrad_diag.exceptions import InputError

if TYPE_CHECKING:
    from natgrad_diag.natgrad.report import NatGradReport

__all__ = ["check_natgrad_cli"]


def check_natgrad_cli(
    *,
    model: str = "svgp",
    likelihood: str = "gaussian",
    num_inducing: int = 10,
    num_latent: int = 1,
    num_data: int = 50,
    xi: str = "nat",
    gamma: float = 1.0,
    dtype: str = "float64",
    whiten: bool = True,
    mode: str = "auto",
    seed: int = 0,
) -> NatGradReport:
    """``natgrad-diag check``: build a seeded demo model (:func:`natgrad_diag.demo.make_model`) and check it."""
    from gpflow.optimizers import XiNat, XiSqrtMeanVar

    from natgrad_diag.demo import make_model
    from natgrad_diag.natgrad.check import check_natgrad

    if xi not in ("nat", "meanvar"):
        raise InputError(
            "xi must be 'nat' or 'meanvar'.",
            context=[("Argument", "--xi"), ("Expected", "nat | meanvar"), ("Got", repr(xi))],
            remedy="pass --xi nat (GPflow's default) or --xi meanvar.",
        )
    demo = make_model(
        model, likelihood, num_inducing=num_inducing, num_latent=num_latent, num_data=num_data,
        whiten=whiten, dtype=dtype, seed=seed,
    )  # fmt: skip
    data = demo.data if demo.name == "svgp" else None
    return check_natgrad(demo.model, data, gamma=gamma, xi_transform=XiNat() if xi == "nat" else XiSqrtMeanVar(), mode=mode)
