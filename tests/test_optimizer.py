"""natgrad_diag.NaturalGradient against GPflow's own NaturalGradient: 20 training steps on SVGP and VGP, and the fallback.

Tolerance: the policy's float64 "exact" one (|ours − GPflow's| ≤ 1e-12 + 1e-10·max|GPflow's|) at every step.
The q(u) of these models are well conditioned (κ(S) < 10³), so the ε·κ(S) rounding of GPflow's path
(see tests/test_closed_form.py) is ~10⁻¹³, and the steps contract, so differences do not grow.

Step lengths: XiNat at γ = 0.1 and 1.0. GPflow's own XiSqrtMeanVar step diverges on these models at
γ ≥ 0.03 (NaN within 20 steps: its natural gradient in (m, L_S) coordinates is S·∂L/∂m, large for
N/σ² = 500), so XiSqrtMeanVar runs at γ = 0.001 and 0.01.
"""

from __future__ import annotations

import doctest
import logging

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import XiNat, XiSqrtMeanVar, XiTransform
from gpflow.optimizers.natgrad import meanvarsqrt_to_natural, natural_to_meanvarsqrt

import natgrad_diag
from natgrad_diag import tolerance
from natgrad_diag.step import optimizer as optimizer_module
from natgrad_diag.step.backend import step_backend
from natgrad_diag.step.optimizer import NaturalGradient

STEPS = 20
GAMMAS = {"XiNat": (0.1, 1.0), "XiSqrtMeanVar": (0.001, 0.01)}
XIS = {"XiNat": XiNat, "XiSqrtMeanVar": XiSqrtMeanVar}
CASES = [(model, xi) for model in ("SVGP", "VGP") for xi in ("XiNat", "XiSqrtMeanVar")]
IDS = [f"{m}-{x}" for m, x in CASES]


def make_model(kind: str):
    """A small model with a Gaussian likelihood: SVGP (M = 10, N = 50) or VGP (N = 50); and its loss."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0.0, 5.0, (50, 1))
    Y = np.sin(2.0 * X) + 0.1 * rng.normal(size=X.shape)
    kernel, likelihood = gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(0.1)
    if kind == "SVGP":
        model = gpflow.models.SVGP(kernel, likelihood, inducing_variable=np.linspace(0.0, 5.0, 10)[:, None], num_data=50)
        return model, model.training_loss_closure((X, Y), compile=False)
    model = gpflow.models.VGP((X, Y), kernel, likelihood)
    return model, model.training_loss_closure(compile=False)


def trajectories(optimizer_class, kind: str, xi: str, gammas, *, compiled: bool):
    """({γ: [(q_mu, q_sqrt) after each of STEPS steps]}, the compiled step's graph operations or None).

    One model and one step (traced once, γ a variable) for all γ."""
    model, loss = make_model(kind)
    gamma = tf.Variable(gammas[0], dtype=tf.float64)
    opt = optimizer_class(gamma)
    xi_transform = XIS[xi]()

    def step():
        opt.minimize(loss, [(model.q_mu, model.q_sqrt, xi_transform)])

    if compiled:
        step = tf.function(step)
    start = (model.q_mu.numpy(), model.q_sqrt.numpy())
    out = {}
    for g in gammas:
        model.q_mu.assign(start[0])
        model.q_sqrt.assign(start[1])
        gamma.assign(g)
        out[g] = []
        for _ in range(STEPS):
            step()
            out[g].append((model.q_mu.numpy(), model.q_sqrt.numpy()))
    if compiled:
        assert step.experimental_get_tracing_count() == 1
    return out, (step.get_concrete_function().graph.get_operations() if compiled else None)


@pytest.fixture(scope="module")
def gpflow_runs():
    """GPflow's own optimizer, compiled, for every model, ξ and γ."""
    return {(kind, xi): trajectories(gpflow.optimizers.NaturalGradient, kind, xi, GAMMAS[xi], compiled=True) for kind, xi in CASES}


def assert_same_trajectory(got, want, what):
    assert len(got) == len(want) == STEPS
    for i, (g, w) in enumerate(zip(got, want)):
        for name, a, b in zip(("q_mu", "q_sqrt"), g, w):
            assert np.all(np.isfinite(b)), f"{what}: GPflow's own run is not finite at step {i + 1}"
            err, bound = float(np.abs(a - b).max()), tolerance.resolve("float64", "exact").bound(b)
            assert err <= bound, f"{what}, step {i + 1}, {name}: max|ours − GPflow's| = {err:.3e} > {bound:.3e}"


# GPflow's apply step has 3 Choleskys for XiNat (expectation_to_meanvarsqrt, natural_to_meanvarsqrt twice)
# and 3 for XiSqrtMeanVar (the same, in naturals_to_xi); the closed form has 1 and 0.
FEWER_CHOLESKYS = {"XiNat": 2, "XiSqrtMeanVar": 3}


@pytest.mark.parametrize("kind, xi", CASES, ids=IDS)
def test_natural_gradient__compiled_matches_gpflow_over_20_steps_and_runs_the_closed_form(gpflow_runs, kind, xi):
    ours, ours_ops = trajectories(NaturalGradient, kind, xi, GAMMAS[xi], compiled=True)
    theirs, theirs_ops = gpflow_runs[kind, xi]
    for g in GAMMAS[xi]:
        assert_same_trajectory(ours[g], theirs[g], f"{kind}, {xi}, γ={g}, tf.function")
    # not GPflow's path under another name: the closed form's ops are in the graph, two or three Choleskys fewer
    assert any("closed_form_step" in op.name for op in ours_ops)
    assert not any("closed_form_step" in op.name for op in theirs_ops)
    count = {name: sum(op.type == "Cholesky" for op in ops) for name, ops in (("ours", ours_ops), ("theirs", theirs_ops))}
    assert count["theirs"] - count["ours"] == FEWER_CHOLESKYS[xi], count


@pytest.mark.parametrize("kind, xi", [("SVGP", "XiNat"), ("VGP", "XiSqrtMeanVar")], ids=["SVGP-XiNat", "VGP-XiSqrtMeanVar"])
def test_natural_gradient__eager_matches_gpflow_over_20_steps(gpflow_runs, kind, xi):
    g = GAMMAS[xi][0]  # the smaller step: more steps before convergence
    ours, _ = trajectories(NaturalGradient, kind, xi, (g,), compiled=False)
    assert_same_trajectory(ours[g], gpflow_runs[kind, xi][0][g], f"{kind}, {xi}, γ={g}, eager")


# ------------------------------------------------------------------------------------------------
# the fallback to GPflow's step
# ------------------------------------------------------------------------------------------------


class XiNatByHand(XiTransform):
    """A user's own ξ transform (here XiNat written out): not one the closed form knows."""

    @staticmethod
    def meanvarsqrt_to_xi(mean, varsqrt):
        return meanvarsqrt_to_natural(mean, varsqrt)

    @staticmethod
    def xi_to_meanvarsqrt(xi1, xi2):
        return natural_to_meanvarsqrt(xi1, xi2)

    @staticmethod
    def naturals_to_xi(nat1, nat2):
        return nat1, nat2


class MyXiNat(XiNat):
    """A subclass of XiNat, which may override the maps: GPflow's path too."""


def _linear_problem(transform):
    rng = np.random.default_rng(5)
    q_mu = gpflow.Parameter(rng.normal(size=(4, 2)))
    q_sqrt = gpflow.Parameter(np.stack([np.eye(4), 2.0 * np.eye(4)]) + np.tril(0.1 * rng.normal(size=(2, 4, 4)), -1), transform=transform)
    g_mu, g_sqrt = tf.constant(rng.normal(size=(4, 2))), tf.constant(0.05 * rng.normal(size=(2, 4, 4)))
    return q_mu, q_sqrt, lambda: tf.reduce_sum(g_mu * q_mu) + tf.reduce_sum(g_sqrt * q_sqrt)


@pytest.mark.parametrize(
    "xi, transform",
    [(XiNatByHand(), "triangular"), (MyXiNat(), "triangular"), (XiNat(), None)],
    ids=["own-XiTransform", "XiNat-subclass", "q_sqrt-without-triangular-transform"],
)
def test_natural_gradient__falls_back_to_gpflows_step_bit_for_bit(xi, transform):
    results = []
    for optimizer_class in (NaturalGradient, gpflow.optimizers.NaturalGradient):
        q_mu, q_sqrt, loss = _linear_problem(gpflow.utilities.triangular() if transform else None)
        opt = optimizer_class(0.3, xi_transform=xi)
        for _ in range(3):
            opt.minimize(loss, [(q_mu, q_sqrt)])
        results.append((q_mu.numpy(), q_sqrt.numpy()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert step_backend(xi, q_sqrt.transform).code == "autodiff"


def test_natural_gradient__mixed_var_list_closed_form_and_fallback():
    results = []
    for optimizer_class in (NaturalGradient, gpflow.optimizers.NaturalGradient):
        a_mu, a_sqrt, loss_a = _linear_problem(gpflow.utilities.triangular())
        b_mu, b_sqrt, loss_b = _linear_problem(gpflow.utilities.triangular())
        opt = optimizer_class(0.2)

        def loss(loss_a=loss_a, loss_b=loss_b):
            return loss_a() + 2.0 * loss_b()

        for _ in range(2):
            opt.minimize(loss, [(a_mu, a_sqrt, XiSqrtMeanVar()), (b_mu, b_sqrt, XiNatByHand())])
        results.append([p.numpy() for p in (a_mu, a_sqrt, b_mu, b_sqrt)])
    for got, want in zip(results[0][:2], results[1][:2]):  # closed form: to rounding
        assert np.abs(got - want).max() <= tolerance.resolve("float64", "exact").bound(want)
    for got, want in zip(results[0][2:], results[1][2:]):  # fallback: GPflow's own code
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------------------------
# drop-in: constructor, export, docs
# ------------------------------------------------------------------------------------------------


def test_natural_gradient__is_a_drop_in_gpflow_natural_gradient():
    opt = natgrad_diag.NaturalGradient(0.5, XiSqrtMeanVar(), name="mine")
    assert natgrad_diag.NaturalGradient is NaturalGradient
    assert isinstance(opt, gpflow.optimizers.NaturalGradient)
    assert opt.gamma == 0.5 and isinstance(opt.xi_transform, XiSqrtMeanVar) and opt.natgrad_name == "mine"
    assert isinstance(NaturalGradient(0.1).xi_transform, XiNat)
    assert opt.get_config() == gpflow.optimizers.NaturalGradient(0.5, XiSqrtMeanVar(), name="mine").get_config()


def test_natural_gradient__traces_in_a_users_tf_function_without_an_autograph_warning():
    # A researcher's compiled training step printed "WARNING:tensorflow:AutoGraph could not transform <bound method
    # NaturalGradient.apply_natgrad> ... Please report this to the TensorFlow team" (a walrus AutoGraph cannot convert).
    model, loss = make_model("SVGP")
    opt, records = NaturalGradient(0.1), []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    tf.get_logger().addHandler(handler)
    try:
        tf.function(lambda: opt.minimize(loss, [(model.q_mu, model.q_sqrt)]))()
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [r.getMessage() for r in records if "AutoGraph" in r.getMessage()]


def test_optimizer__docstring_examples_run():
    result = doctest.testmod(optimizer_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5 and result.failed == 0
