"""Tests of natgrad_diag.cli.gradcheck: the demo points against GPflow's conversions, and the CLI's check."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import natgrad as ng

from natgrad_diag.cli import gradcheck as gradcheck_cli_module
from natgrad_diag.exceptions import InputError

# which point each of GPflow's maps takes
MAPS = {
    "expectation_to_meanvarsqrt": ("expectation",),
    "meanvarsqrt_to_expectation": ("meanvarsqrt",),
    "natural_to_meanvarsqrt": ("natural",),
    "meanvarsqrt_to_natural": ("meanvarsqrt",),
    "natural_to_expectation": ("natural",),
    "expectation_to_natural": ("expectation",),
}


@pytest.mark.parametrize("name", sorted(MAPS))
def test_gpflow_map_point__agrees_with_gpflow_conversions(name: str) -> None:
    M, L = 4, 2
    mv = gradcheck_cli_module.gpflow_map_point("meanvarsqrt_to_expectation", M, L, seed=5)
    point = gradcheck_cli_module.gpflow_map_point(name, M, L, seed=5)
    # GPflow's own conversions from (m, L_S) are the oracle for the numpy construction
    m, A = (tf.constant(a) for a in mv)
    want = {
        "meanvarsqrt": mv,
        "expectation": [t.numpy() for t in ng.meanvarsqrt_to_expectation(m, A)],
        "natural": [t.numpy() for t in ng.meanvarsqrt_to_natural(m, A)],
    }[MAPS[name][0]]
    for got, ref in zip(point, want):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    assert np.all(np.triu(mv[1], 1) == 0) and np.all(np.diagonal(mv[1], axis1=-2, axis2=-1) == 1.0)


def test_gradcheck_cli__passes_inferred_and_fails_general_on_eta2() -> None:
    ok = gradcheck_cli_module.gradcheck_cli(map="expectation_to_natural", num_inducing=3, num_latent=2, mode="fast", seed=1)
    assert ok.passed and ok.structures == ("general", "symmetric") and ok.seed == 1
    bad = gradcheck_cli_module.gradcheck_cli(map="expectation_to_meanvarsqrt", num_inducing=3, num_latent=1, structure="general")
    assert not bad.passed and "looks symmetric" in bad.row("varsqrt", "eta2").hint
    f32 = gradcheck_cli_module.gradcheck_cli(map="meanvarsqrt_to_expectation", num_inducing=3, num_latent=1, dtype="float32")
    assert f32.passed and f32.dtype == "float32" and f32.eps == 1e-3
    forced = gradcheck_cli_module.gradcheck_cli(map="natural_to_expectation", num_inducing=3, num_latent=1, structure="symmetric", mode="fast")
    assert forced.passed and forced.structures == ("general", "symmetric")
    with pytest.raises(InputError, match="unknown GPflow map 'cholesky'"):
        gradcheck_cli_module.gradcheck_cli(map="cholesky")
    with pytest.raises(InputError, match="num_inducing"):
        gradcheck_cli_module.gradcheck_cli(num_inducing=0)
