"""The seeded demo models: deterministic, the shapes and dtypes asked for, well-conditioned q(u), clear errors."""

from __future__ import annotations

import gpflow
import numpy as np
import pytest

from natgrad_diag.demo import LIKELIHOODS, dtype_context, make_data, make_model
from natgrad_diag.exceptions import InputError


@pytest.mark.parametrize("likelihood", LIKELIHOODS)
def test_make_data__is_seeded_and_matches_the_likelihood(likelihood):
    X, Y = make_data(num_data=40, num_latent=2, likelihood=likelihood, seed=4)
    X2, Y2 = make_data(num_data=40, num_latent=2, likelihood=likelihood, seed=4)
    assert np.array_equal(X, X2) and np.array_equal(Y, Y2)
    assert X.shape == (40, 1) and Y.shape == (40, 2) and X.dtype == Y.dtype == np.float64
    assert not np.array_equal(Y, make_data(num_data=40, num_latent=2, likelihood=likelihood, seed=5)[1])
    if likelihood == "bernoulli":
        assert set(np.unique(Y)) == {0.0, 1.0}
    if likelihood == "poisson":
        assert (Y >= 0).all() and np.array_equal(Y, np.round(Y))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", ["svgp", "vgp"])
def test_make_model__shapes_dtype_and_determinism(name, dtype):
    size = {"num_inducing": 7} if name == "svgp" else {}  # a VGP's q(u) is over its N = 12 data points
    model, data = make_model(name, "gaussian", **size, num_latent=3, num_data=12, dtype=dtype, seed=1)
    again, _ = make_model(name, "gaussian", **size, num_latent=3, num_data=12, dtype=dtype, seed=1)
    M = 7 if name == "svgp" else 12
    assert model.q_mu.shape == (M, 3) and model.q_sqrt.shape == (3, M, M)
    assert model.q_mu.dtype == np.dtype(dtype) and data[0].dtype == np.dtype(dtype)
    for a, b in zip(model.variables, again.variables):
        assert np.array_equal(a.numpy(), b.numpy())
    sq = model.q_sqrt.numpy().astype(np.float64)
    assert np.array_equal(sq, np.tril(sq)) and (np.diagonal(sq, axis1=1, axis2=2) > 0).all()
    with dtype_context(dtype):
        loss = model.training_loss(data) if name == "svgp" else model.training_loss()
    assert loss.dtype == np.dtype(dtype)


def test_make_model__q_sqrt_is_well_conditioned_at_large_m():
    model, _ = make_model("svgp", "gaussian", num_inducing=300, num_data=10)
    Ls = model.q_sqrt.numpy()[0]
    assert np.linalg.cond(Ls @ Ls.T) < 50


def test_make_model__whiten_and_q_diag_are_passed_to_gpflow():
    model, _ = make_model("svgp", "bernoulli", whiten=False, q_diag=True, num_inducing=4)
    assert isinstance(model, gpflow.models.SVGP) and not model.whiten
    assert model.q_sqrt.shape == (4, 1)
    default = make_model("svgp", num_data=12).model  # svgp_options' defaults: M = 10, whitened
    assert (default.inducing_variable.Z.shape[0], default.whiten) == (10, True)


def test_dtype_context__restores_gpflows_default_float():
    before = gpflow.config.default_float()
    with dtype_context("float32"):
        assert gpflow.config.default_float() == np.float32
    assert gpflow.config.default_float() == before


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"model": "gpr"}, "model must be one of svgp, vgp"),
        ({"likelihood": "laplace"}, "likelihood must be one of"),
        ({"num_inducing": 0}, "num_inducing must be a positive integer"),
        ({"num_latent": 1.5}, "num_latent must be a positive integer"),
        ({"dtype": "float16"}, "dtype must be float64 or float32"),
        ({"model": "VGP", "num_inducing": 4}, r"a VGP has no inducing points(.|\n)*Argument: num_inducing\n(.|\n)*Got: +num_inducing=4\n"),
        ({"model": "vgp", "whiten": False}, r"Argument: whiten\n +Expected: neither with model=vgp\n +Got: +whiten=False\n"),
    ],
)
def test_make_model__bad_arguments_are_named(kwargs, match):
    with pytest.raises(InputError, match=match):
        make_model(**kwargs)
