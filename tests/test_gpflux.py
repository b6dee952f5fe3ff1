"""GPflux deep GPs: check_natgrad on GPLayer pairs against GPflow's NaturalGradient, the guard, the Keras callback."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

gpflux = pytest.importorskip("gpflux")

import gpflow
import tensorflow as tf
from _user_models import same_bits
from gpflow.keras import tf_keras
from gpflow.optimizers import NaturalGradient

from natgrad_diag.checks.health import GAMMA_GRID
from natgrad_diag import InputError, NatGradMonitor, check_natgrad


def _deep_gp(layers: int, num_data: int = 20, num_inducing: int = 4):
    """A DeepGP of ``layers`` GPLayers (q_mu [M, 1], q_sqrt [1, M, M]) and a Gaussian likelihood layer."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-2.0, 2.0, (num_data, 1))
    Y = np.sin(2.0 * X) + 0.1 * rng.normal(size=X.shape)
    Z = np.linspace(-2.0, 2.0, num_inducing)[:, None]
    f_layers = []
    for i in range(layers):
        kernel = gpflow.kernels.SharedIndependent(gpflow.kernels.SquaredExponential(), output_dim=1)
        inducing = gpflow.inducing_variables.SharedIndependentInducingVariables(
            gpflow.inducing_variables.InducingPoints(Z.copy())
        )
        mean = gpflow.mean_functions.Identity() if i < layers - 1 else gpflow.mean_functions.Zero()
        f_layers.append(
            gpflux.layers.GPLayer(kernel, inducing, num_data=num_data, num_latent_gps=1, mean_function=mean)
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # GPflux's own TrackableLayer deprecation
        likelihood = gpflux.layers.LikelihoodLayer(gpflow.likelihoods.Gaussian(0.1))
    model = gpflux.models.DeepGP(f_layers, likelihood, default_model_class=gpflux.optimization.NatGradModel)
    return model, (tf.constant(X), tf.constant(Y))


def _seeded_loss(model, data):
    """−ELBO with the hidden layers' samples fixed (GPLayer samples f between layers): the same value at every call."""

    def loss():
        tf.random.set_seed(1)
        return -model.elbo(data)

    return loss


@pytest.mark.slow  # 6 s; the guard and the Keras callback test GPflux in the default run
@pytest.mark.parametrize("layers", [1, 2], ids=["one-layer", "two-layer"])
def test_gpflux__deep_gp_step_matches_natural_gradient(layers):
    model, data = _deep_gp(layers)
    loss = _seeded_loss(model, data)
    pairs = [(layer.q_mu, layer.q_sqrt) for layer in model.f_layers]
    assert [tuple(q.shape) for p in pairs for q in p] == [(4, 1), (1, 4, 4)] * layers
    loss()  # Keras builds the layers' variables at the first call
    # every parameter is bit-identical afterwards; the Keras metrics GPLayer updates at each loss call (KL's running
    # mean) are the loss's own side effect, which any call of the loss has
    before = [v.numpy().copy() for v in model.trainable_variables]
    report = check_natgrad(loss, var_list=pairs, gamma=0.5, mode="fast")
    assert same_bits(before, [v.numpy() for v in model.trainable_variables])
    assert len(report.pairs) == layers and all(r.passed for r in report.pairs)  # each layer's step, the others fixed
    # two layers stepped together, as NaturalGradient.minimize(loss, pairs) steps them, break at γ = 0.5 (the oracle
    # below: GPflow's own third step raises) and hold at the γ suggested for them together
    assert report.passed == (layers == 1) and (layers == 1 or report.suggested_gamma == 0.1)
    for r in report.pairs:  # every layer, the hidden one included, gets its own suggestion from trials that held
        assert r.suggested_gamma is not None and next(t for t in r.gamma_trials if t.gamma == r.suggested_gamma).healthy
    NaturalGradient(0.5).minimize(loss, pairs)  # the oracle, on the model itself (the check left it unchanged)
    for r, layer in zip(report.pairs, model.f_layers):
        np.testing.assert_allclose(r.new_q_mu, layer.q_mu.numpy(), rtol=0, atol=1e-10)
        np.testing.assert_allclose(r.new_q_sqrt, layer.q_sqrt.numpy(), rtol=0, atol=1e-10)
    if layers == 2:
        with pytest.raises(tf.errors.InvalidArgumentError):  # GPflow's steps 2 to 5 together: one raises
            for _ in range(4):
                NaturalGradient(0.5).minimize(loss, pairs)


@pytest.mark.slow  # the default run's margin; CI's slow stage runs it
def test_gpflux__check_natgrad_takes_a_deep_gp_itself():
    # a researcher passes the DeepGP as they pass an SVGP: its GPLayers' pairs are checked with −ELBO as the loss,
    # named as the model holds them; the oracle is GPflow's own NaturalGradient on the model afterwards
    model, data = _deep_gp(1)
    layer = model.f_layers[0]
    model.elbo(data)  # Keras builds the layers' variables at the first call
    before = [v.numpy().copy() for v in model.trainable_variables]
    report = check_natgrad(model, data, gamma=0.5, mode="fast", progress=False)
    assert same_bits(before, [v.numpy() for v in model.trainable_variables])
    assert report.passed and [(r.num_inducing, r.num_latent) for r in report.pairs] == [(4, 1)]
    assert "pair 0 (model.f_layers[0].q_mu, model.f_layers[0].q_sqrt): PASS" in str(report)
    NaturalGradient(0.5).minimize(lambda: -model.elbo(data), [(layer.q_mu, layer.q_sqrt)])
    np.testing.assert_allclose(report.pairs[0].new_q_mu, layer.q_mu.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(report.pairs[0].new_q_sqrt, layer.q_sqrt.numpy(), rtol=0, atol=1e-10)
    with pytest.raises(InputError, match=r"DeepGP's ELBO needs the data(.|\n)*Argument: data(.|\n)*Got:      None"):
        check_natgrad(model)

def test_gpflux__guard_rolls_back_a_deep_gp_layer():
    model, data = _deep_gp(1)
    monitor = NatGradMonitor(model, data, gamma=1.0, on_failure="rollback")
    assert [p[0] for p in monitor.variational_pairs()] == ["model.f_layers[0].q_mu"]
    layer = model.f_layers[0]
    saved = [layer.q_mu.unconstrained_variable.numpy().copy(), layer.q_sqrt.unconstrained_variable.numpy().copy()]
    natgrad = NaturalGradient(tf.Variable(1.0, dtype=tf.float64))
    with monitor.guard(0, natgrad):
        layer.q_sqrt.assign(-layer.q_sqrt.numpy())  # S is the same; GPflow's XiNat step takes q_sqrt for chol(S)
    (r,) = monitor.guard_records
    assert r.rolled_back and "model.f_layers[0].q_sqrt has a non-positive diagonal entry" in r.cause
    assert same_bits(saved, [layer.q_mu.unconstrained_variable.numpy(), layer.q_sqrt.unconstrained_variable.numpy()])
    gamma = float(natgrad.gamma.numpy())  # the search's γ on the restored layer, below the one that failed
    assert gamma < 1.0 and gamma in GAMMA_GRID and monitor.gamma == gamma


def test_gpflux__keras_callback_guards_natgradmodel_fit():
    from natgrad_diag.keras import NatGradCallback

    dgp, data = _deep_gp(1)
    monitor = NatGradMonitor(dgp, data, gamma=0.1)
    keras_model = dgp.as_training_model()
    keras_model.natgrad_layers = True
    keras_model.compile([NaturalGradient(tf.Variable(0.1, dtype=tf.float64)), tf_keras.optimizers.Adam(0.01)])
    X, Y = (d.numpy() for d in data)
    start = monitor.loss_value(data)
    keras_model.fit(
        {"inputs": X, "targets": Y}, batch_size=20, epochs=3, verbose=0, callbacks=[NatGradCallback(monitor)]
    )
    assert [r.step for r in monitor.guard_records] == [0, 1, 2]
    assert all(r.status == "ok" and r.moved_by_other == () for r in monitor.guard_records)
    assert monitor.guard_records[0].loss_before == start and monitor.guard_records[-1].loss_after < start


def _outliers_in_fit(N: int = 120):
    """(data, the guarding monitor, the Keras model, its NaturalGradient) of a one-layer DeepGP on N points, six of
    them outliers, compiled for NatGradModel's fit with Keras γ = 2N (γ = 2 on −ELBO, which overshoots) and Adam's rate
    0 (q(u) alone moves)."""
    dgp, data = _deep_gp(1, num_data=N, num_inducing=8)
    Y = data[1].numpy().copy()
    Y[:6] += 10.0
    data = (data[0], tf.constant(Y))
    monitor = NatGradMonitor(dgp, data, gamma=2.0, on_failure="rollback", loss_increase=0.3)
    keras_model = dgp.as_training_model()
    keras_model.natgrad_layers = True
    natgrad = NaturalGradient(tf.Variable(2.0 * N, dtype=tf.float64))
    keras_model.compile([natgrad, tf_keras.optimizers.Adam(0.0)])
    return data, monitor, keras_model, natgrad


def test_gpflux__keras_gamma_is_n_times_the_gamma_on_minus_elbo_and_a_rollback_sets_it_so():
    """fit's loss is −ELBO/N, so Keras γ = 2N is GPflow's step with γ = 2 on −ELBO: it overshoots (Y has outliers), the
    guard rolls back and sets the γ its search measured on −ELBO, times N. It set the −ELBO γ itself (N times too small:
    training crawled). Oracle: GPflow's NaturalGradient on −ELBO, from the same start."""
    from natgrad_diag.keras import NatGradCallback

    N = 120
    data, monitor, keras_model, natgrad = _outliers_in_fit(N)
    keras_model.fit({"inputs": data[0].numpy(), "targets": data[1].numpy()}, batch_size=N, epochs=4, verbose=0, shuffle=False,
                    callbacks=[NatGradCallback(monitor)])  # fmt: skip
    records = monitor.guard_records
    assert records[0].gamma_before == 2.0 and any(r.rolled_back for r in records), [str(r) for r in records]
    gamma = records[-1].gamma_after
    assert gamma < 2.0 and float(natgrad.gamma.numpy()) == pytest.approx(N * gamma, rel=1e-12)
    start = _deep_gp(1, num_data=N, num_inducing=8)[0]  # the same start, built again (deepcopy shares Keras' variables)
    layer = start.f_layers[0]
    oracle = [float(-start.elbo(data))]
    for _ in range(4):
        NaturalGradient(gamma).minimize(lambda: -start.elbo(data), [(layer.q_mu, layer.q_sqrt)])
        oracle.append(float(-start.elbo(data)))
    assert oracle[-1] < oracle[0] and records[-1].loss_after < 1.01 * oracle[-1]


@pytest.mark.slow  # 7 s; test_guard's held-schedule test runs the guard's side by default
def test_gpflux__a_keras_schedule_above_the_gamma_the_guard_set_is_held_in_fit():
    """A Keras callback sets γ = 2N before every batch (a schedule at its ceiling). After the rollback of the batch
    that overshoots, the guard holds the γ it set (below 2 on −ELBO), and the callback writes it to the optimizer
    before fit's step, so the batches after it pass at that γ; without the write, 2N came back at every batch.
    Oracle: GPflow's NaturalGradient on −ELBO from the same start, at 2 until the failure and then at the held γ."""
    from natgrad_diag.keras import NatGradCallback

    N = 120
    data, monitor, keras_model, natgrad = _outliers_in_fit(N)

    class Ceiling(tf_keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            natgrad.gamma.assign(2.0 * N)

    with pytest.warns(UserWarning, match="set optimizer.gamma = 2 before training step .*, above the γ = "):
        keras_model.fit({"inputs": data[0].numpy(), "targets": data[1].numpy()}, batch_size=N, epochs=5, verbose=0, shuffle=False,
                        callbacks=[Ceiling(), NatGradCallback(monitor)])  # fmt: skip
    records = monitor.guard_records
    failed = [i for i, r in enumerate(records) if not r.passed]
    assert len(failed) == 1 and records[failed[0]].rolled_back, [str(r) for r in records]
    held = records[failed[0]].gamma_after
    assert held < 2.0 and all(r.gamma_before == held for r in records[failed[0] + 1:])
    assert float(natgrad.gamma.numpy()) == pytest.approx(N * held, rel=1e-12)
    start = _deep_gp(1, num_data=N, num_inducing=8)[0]  # the same start, built again (deepcopy shares Keras' variables)
    layer = start.f_layers[0]
    for gamma in [2.0] * failed[0] + [held] * (len(records) - failed[0] - 1):
        NaturalGradient(gamma).minimize(lambda: -start.elbo(data), [(layer.q_mu, layer.q_sqrt)])
    assert records[-1].loss_after == pytest.approx(float(-start.elbo(data)), rel=1e-9)


@pytest.mark.slow  # 7 s, as the schedule test above
def test_gpflux__a_keras_schedule_listed_after_the_callback_is_the_gamma_judged_and_named():
    """The same schedule listed after NatGradCallback sets γ = 2N after the guard read γ, so fit's step ran at 2N while
    the records named the γ read before (after the first rollback, the γ the guard set), and nothing said why every
    batch failed. The guard now reads γ again when the batch ends: each record names 2, the γ GPflow's step used,
    and one warning names the fix (list the schedule before NatGradCallback)."""
    from natgrad_diag.keras import NatGradCallback

    N = 120
    data, monitor, keras_model, natgrad = _outliers_in_fit(N)

    class Ceiling(tf_keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            natgrad.gamma.assign(2.0 * N)

    natgrad.gamma.assign(0.5 * N)  # the guard reads γ = 0.5 on −ELBO; the schedule then sets 2
    with pytest.warns(UserWarning, match=r"changed inside the guarded block at training step 0 \(0.5 → 2\)(.|\n)*before NatGradCallback"):
        keras_model.fit({"inputs": data[0].numpy(), "targets": data[1].numpy()}, batch_size=N, epochs=3, verbose=0, shuffle=False,
                        callbacks=[NatGradCallback(monitor), Ceiling()])  # fmt: skip
    records = monitor.guard_records
    assert [(r.gamma_before, r.status, r.rolled_back) for r in records] == [(2.0, "ok", False)] + [(2.0, "failed", True)] * 2
    start = _deep_gp(1, num_data=N, num_inducing=8)[0]  # oracle: GPflow's steps at γ = 2 on −ELBO, from the same start
    layer = start.f_layers[0]
    losses = [float(-start.elbo(data))]
    for _ in range(2):
        NaturalGradient(2.0).minimize(lambda: -start.elbo(data), [(layer.q_mu, layer.q_sqrt)])
        losses.append(float(-start.elbo(data)))
    # rel 1e-7: fit takes γN·∇(−ELBO/N), which rounds apart from γ·∇(−ELBO) (4e-9 here, through the step's Choleskys)
    assert records[0].loss_after == pytest.approx(losses[1], rel=1e-7) and losses[2] > losses[1] + 0.3 * abs(losses[1])


def test_keras_module__import_is_light():
    code = "import sys, natgrad_diag.keras; print('tensorflow' in sys.modules, 'gpflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


@pytest.mark.slow
def test_gpflux__monitor_checks_a_two_layer_deep_gp_every_step():
    model, data = _deep_gp(2)
    loss = _seeded_loss(model, data)
    loss()
    monitor = NatGradMonitor(model, data, gamma=0.5, loss_fn=loss)
    before = [v.numpy().copy() for v in model.trainable_variables]
    monitor(0)
    assert same_bits(before, [v.numpy() for v in model.trainable_variables])
    (r,) = monitor.records
    assert r.reproduction_passed and r.reproduction_error <= 1e-10
    assert r.loss == float(loss().numpy()) and r.loss_after is None  # two pairs: no single loss after
    # each layer's steps hold with the other fixed, but together (as GPflow's minimize steps them) they break at γ = 0.5
    # and hold at 0.1: the record fails on joint_step_health alone and suggests 0.1, not the pairs' own suggestions
    assert not r.passed and not r.step_healthy and r.suggested_gamma == 0.1
    assert r.detail.startswith("joint_step_health: gamma = 0.5 fails together at step 3 of 5") and "pair" not in r.detail
    losses = [float(loss().numpy())]  # the oracle: GPflow's own five steps together at the suggested γ train
    for _ in range(5):
        NaturalGradient(r.suggested_gamma).minimize(loss, [(layer.q_mu, layer.q_sqrt) for layer in model.f_layers])
        losses.append(float(loss().numpy()))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 50.0, losses
    with pytest.raises(tf.errors.InvalidArgumentError):  # and at the checked γ they break
        for _ in range(5):
            NaturalGradient(0.5).minimize(loss, [(layer.q_mu, layer.q_sqrt) for layer in model.f_layers])
