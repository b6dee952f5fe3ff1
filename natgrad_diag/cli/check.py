"""``natgrad-diag check``: build a seeded demo model and run the natural-gradient checks on it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from natgrad_diag._validate import input_error
from natgrad_diag.checks.api import check_natgrad
from natgrad_diag.checks.report import NatGradReport
from natgrad_diag.demo import check_model_work, make_model, svgp_options
from natgrad_diag.exceptions import error_line

__all__ = ["check_natgrad_cli", "load_optimizer"]


def load_optimizer(spec: str, gamma: float, xi_transform: Any) -> Any:
    """``--optimizer module:NAME`` or ``path.py:NAME``: NAME from the module; a class is built as
    ``NAME(gamma, xi_transform=xi_transform)``, anything else (an instance, an update function) is used as it is.

    Raises:
        InputError: no ``:``, a module or file that cannot be loaded, no such NAME, or a class that cannot be built.
    """
    where, _, name = spec.rpartition(":")
    expected = "module:NAME or path/to/file.py:NAME, e.g. my_package.natgrad:MyNaturalGradient"
    try:
        if not where or not name:
            raise ValueError("no ':' between the module and the name")
        if where.endswith(".py"):
            found = importlib.util.spec_from_file_location(Path(where).stem, where)
            if found is None or found.loader is None or not Path(where).is_file():
                raise FileNotFoundError(f"no file {where}")
            module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        obj = getattr(module, name)
        return obj(gamma, xi_transform=xi_transform) if isinstance(obj, type) else obj
    except Exception as e:  # the user's module: anything it raises is bad input here
        raise input_error(f"could not load the optimizer ({error_line(e, with_type=True)}).", "--optimizer", expected, repr(spec),
                          "name an importable module (or an existing .py file) and a class in it taking (gamma, xi_transform=...).") from e


def check_natgrad_cli(
    *, model: str = "svgp", likelihood: str = "gaussian", num_inducing: int | None = None, num_latent: int = 1,
    num_data: int = 50, xi: str = "nat", gamma: float = 1.0, dtype: str = "float64", whiten: bool | None = None,
    mode: str = "auto", seed: int = 0, gamma_steps: int = 5, optimizer: str | None = None, max_minutes: float = 0.0,
) -> NatGradReport:  # fmt: skip
    """``natgrad-diag check`` (docs/cli.md): check a seeded demo model (:func:`natgrad_diag.demo.make_model`);
    ``optimizer`` is loaded by :func:`load_optimizer`, ``max_minutes=0`` (the default here, 2 on the command line)
    sets no limit."""
    from gpflow.optimizers import XiNat, XiSqrtMeanVar

    if xi not in ("nat", "meanvar"):
        raise input_error("xi must be 'nat' or 'meanvar'.", "--xi", "nat | meanvar", repr(xi),
                          "pass --xi nat (GPflow's default) or --xi meanvar.")
    M = svgp_options(model, num_inducing, whiten)[0]  # refuses them with a VGP, before the estimate
    check_model_work(model, M=M, N=num_data, L=num_latent, gamma_steps=gamma_steps, max_minutes=max_minutes)
    demo = make_model(model, likelihood, num_inducing=num_inducing, num_latent=num_latent, num_data=num_data,
                      whiten=whiten, dtype=dtype, seed=seed)  # fmt: skip
    data = demo.data if demo.name == "svgp" else None
    xi_transform = XiNat() if xi == "nat" else XiSqrtMeanVar()
    opt = load_optimizer(optimizer, gamma, xi_transform) if optimizer is not None else None
    return check_natgrad(demo.model, data, gamma=gamma, xi_transform=xi_transform, mode=mode, gamma_steps=gamma_steps, optimizer=opt)
