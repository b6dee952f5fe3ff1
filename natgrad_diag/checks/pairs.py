"""The (q_mu, q_sqrt) pairs a natural-gradient step moves: found on a model (GPflow, GPflux) or given as a var_list."""

from __future__ import annotations

from typing import Any

from natgrad_diag.exceptions import UnsupportedModelError

__all__ = ["Pair", "variational_pairs"]

#: (name of q_mu, q_mu [M, L], name of q_sqrt, q_sqrt [L, M, M]); the names are Python expressions for the user.
Pair = tuple[str, Any, str, Any]


def _is_parameter(p: Any) -> bool:
    import gpflow

    return isinstance(p, gpflow.Parameter)


def variational_pairs(model: Any = None, var_list: Any = None) -> list[Pair]:
    """Every (q_mu, q_sqrt) pair of ``var_list`` (as ``NaturalGradient.minimize`` takes it) or of ``model``.

    A model with ``q_mu`` and ``q_sqrt`` (SVGP, VGP) has one pair, ``model.q_mu`` and ``model.q_sqrt``; a GPflux
    ``DeepGP`` has one per ``GPLayer`` in ``model.f_layers``, ``model.f_layers[i].q_mu`` and ``.q_sqrt``.

    Raises:
        UnsupportedModelError: no pair found, or a pair that is not two gpflow.Parameter objects.
    """
    if var_list is not None:
        pairs = []
        for i, item in enumerate(var_list):
            if (
                not isinstance(item, (tuple, list))
                or len(item) not in (2, 3)
                or not all(_is_parameter(p) for p in item[:2])
            ):
                raise UnsupportedModelError(
                    "var_list must hold (q_mu, q_sqrt) pairs of gpflow.Parameter, as NaturalGradient.minimize takes them.",
                    context=[
                        ("Argument", f"var_list[{i}]"),
                        ("Expected", "(q_mu [M, L], q_sqrt [L, M, M]) or (q_mu, q_sqrt, xi_transform)"),
                        ("Got", type(item).__name__),
                    ],
                    remedy="pass var_list=[(layer.q_mu, layer.q_sqrt), ...].",
                )
            pairs.append((f"var_list[{i}][0]", item[0], f"var_list[{i}][1]", item[1]))
        return pairs
    if _is_parameter(getattr(model, "q_mu", None)) and _is_parameter(getattr(model, "q_sqrt", None)):
        return [("model.q_mu", model.q_mu, "model.q_sqrt", model.q_sqrt)]
    layers = getattr(model, "f_layers", None) or ()
    pairs = [
        (f"model.f_layers[{i}].q_mu", layer.q_mu, f"model.f_layers[{i}].q_sqrt", layer.q_sqrt)
        for i, layer in enumerate(layers)
        if _is_parameter(getattr(layer, "q_mu", None)) and _is_parameter(getattr(layer, "q_sqrt", None))
    ]
    if not pairs:
        raise UnsupportedModelError(
            "found no variational q(u) = N(q_mu, q_sqrt q_sqrtᵀ) to take natural-gradient steps on.",
            context=[
                ("Argument", "model"),
                ("Expected", "a GPflow SVGP/VGP or a GPflux DeepGP with GPLayers"),
                ("Got", type(model).__name__),
            ],
            remedy="pass var_list=[(q_mu, q_sqrt), ...] with the pairs your NaturalGradient.minimize call takes.",
        )
    return pairs
