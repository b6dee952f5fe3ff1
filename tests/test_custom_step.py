"""The ``custom_step`` check: a user's own natural-gradient optimizer against GPflow's step, and the mistake it names.

Mistakes are injected into an independent copy of GPflow's update written here (``gpflow_like``), so the step under
test never shares code with the package's candidate steps; GPflow's own ``NaturalGradient`` on the scratch copy is
the reference, and a correct implementation (GPflow's subclass, natgrad_diag.NaturalGradient, a closed form written
here in numpy) must pass.
"""

from __future__ import annotations

import re
import warnings

import gpflow
import numpy as np
import pytest
import tensorflow as tf

import natgrad_diag as nd
from natgrad_diag.demo import make_model
from natgrad_diag.exceptions import InputError, NatGradCheckError

#: The mistakes injected into ``gpflow_like`` (``unconstrained`` needs a transform that is not identity-like).
MISTAKES = ("default_seed", "varsqrt_path", "varsqrt_seed", "natural_coordinates", "gamma_twice", "gamma_missing", "ascent", "wrong_xi", "transposed")

#: γ ≠ 1, so that γ², 1 and γ are three different steps; small enough that ascent keeps S positive definite.
GAMMA = 0.3


def gpflow_like(mistake: str = ""):
    """GPflow's ``_natgrad_apply_gradients``, written out with public names only, with ``mistake`` injected."""
    import tensorflow as tf
    from gpflow.optimizers import XiNat, XiSqrtMeanVar
    from gpflow.optimizers.natgrad import (
        expectation_to_meanvarsqrt, meanvarsqrt_to_expectation, meanvarsqrt_to_natural, natural_to_meanvarsqrt,
    )  # fmt: skip

    def update(self, q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform=None):
        xi = xi_transform or self.xi_transform
        if mistake == "wrong_xi":
            xi = XiSqrtMeanVar() if isinstance(xi, XiNat) else XiNat()
        gamma = {"gamma_twice": self.gamma * self.gamma, "gamma_missing": 1.0, "ascent": -self.gamma}.get(mistake, self.gamma)

        def constrained(g, p):
            return g if mistake == "unconstrained" or p.transform is None else p.transform.forward(g)

        dL_dmean, dL_dvarsqrt = constrained(q_mu_grad, q_mu), constrained(q_sqrt_grad, q_sqrt)
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch([q_mu.unconstrained_variable, q_sqrt.unconstrained_variable])
            if mistake == "natural_coordinates":  # the gradient in θ, taken for the natural gradient
                eta1, eta2 = meanvarsqrt_to_natural(q_mu, q_sqrt)
                mean, varsqrt = natural_to_meanvarsqrt(eta1, eta2)
            else:
                eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt)
                mean, varsqrt = expectation_to_meanvarsqrt(eta1, eta2)
            if not isinstance(xi, XiNat):
                nat1, nat2 = meanvarsqrt_to_natural(q_mu, q_sqrt)
                x1, x2 = xi.naturals_to_xi(nat1, nat2)
                dummy = tf.ones_like(x1), tf.ones_like(x2)
                with tf.GradientTape(watch_accessed_variables=False) as forward:
                    forward.watch(dummy)
                    dummy_grads = tape.gradient([x1, x2], [nat1, nat2], output_gradients=dummy)
        if mistake == "default_seed":  # the question's code
            dtheta_deta1, dtheta_deta2 = tape.gradient([mean, varsqrt], [eta1, eta2])
            d1, d2 = dtheta_deta1 * dL_dmean, dtheta_deta2 * dL_dvarsqrt
        elif mistake == "varsqrt_path":
            d1, d2 = dL_dmean, tape.gradient(varsqrt, eta2, output_gradients=dL_dvarsqrt)
        elif mistake == "varsqrt_seed":
            d1, d2 = tape.gradient([mean, varsqrt], [eta1, eta2], output_gradients=[dL_dmean, tf.zeros_like(dL_dvarsqrt)])
        else:
            d1, d2 = tape.gradient([mean, varsqrt], [eta1, eta2], output_gradients=[dL_dmean, dL_dvarsqrt])
        n1, n2 = (d1, d2) if isinstance(xi, XiNat) else forward.gradient(dummy_grads, dummy, output_gradients=[d1, d2])
        xi1, xi2 = xi.meanvarsqrt_to_xi(q_mu, q_sqrt)
        new_mu, new_sqrt = xi.xi_to_meanvarsqrt(xi1 - gamma * n1, xi2 - gamma * n2)
        q_mu.assign(new_mu)
        q_sqrt.assign(tf.linalg.matrix_transpose(new_sqrt) if mistake == "transposed" else new_sqrt)

    return update


def _model(kind: str, L: int):
    size = {"num_data": 4} if kind == "vgp" else {"num_inducing": 4, "num_data": 6}  # a VGP's M is its N
    model, data = make_model(kind, "gaussian", **size, num_latent=L)
    return model, (data if kind == "svgp" else None)


def _xi(name: str):
    from gpflow.optimizers import XiNat, XiSqrtMeanVar

    return XiNat() if name == "nat" else XiSqrtMeanVar()


def _values(model) -> list[bytes]:
    return [v.numpy().tobytes() for v in model.variables]


@pytest.mark.parametrize("xi", ["nat", "meanvar"])
@pytest.mark.parametrize("L", [1, pytest.param(2, marks=pytest.mark.slow)])  # two latent GPs: every mistake again, with -m slow
@pytest.mark.parametrize("kind", ["svgp", pytest.param("vgp", marks=pytest.mark.slow)])  # every mistake on a VGP: -m slow
@pytest.mark.parametrize("mistake", MISTAKES)
def test_custom_step__names_the_injected_mistake(mistake, kind, L, xi):
    model, data = _model(kind, L)
    before = _values(model)
    with pytest.raises(NatGradCheckError) as info:
        nd.testing.assert_natgrad_step_matches_gpflow(model, data, gamma=GAMMA, xi_transform=_xi(xi), optimizer=gpflow_like(mistake))
    assert f"the mistake '{mistake}'" in str(info.value)
    assert _values(model) == before


def _eta_gradients_numpy(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform):
    """∂L/∂η in numpy (Murray 2016: ∂L/∂S = ½C⁻ᵀ(P + Pᵀ)C⁻¹, P = Φ(CᵀG); ∂L/∂η₁ = ∂L/∂m − 2·∂L/∂S·m): the question's
    function written correctly, returned for the check to complete GPflow's step."""
    m, C = q_mu.numpy(), q_sqrt.numpy()
    G = np.asarray(q_sqrt.transform.forward(q_sqrt_grad))
    d1, d2 = np.array(q_mu_grad, copy=True), np.zeros_like(C)
    for l in range(C.shape[0]):
        P = np.tril(C[l].T @ G[l])
        P[np.diag_indices_from(P)] *= 0.5
        Ci = np.linalg.inv(C[l])
        d2[l] = 0.5 * Ci.T @ (P + P.T) @ Ci
        d1[:, l] -= 2.0 * d2[l] @ m[:, l]
    return d1, d2


def _correct_optimizers():
    import gpflow

    class Subclass(gpflow.optimizers.NaturalGradient):
        def _natgrad_apply_gradients(self, *args, **kwargs):
            return super()._natgrad_apply_gradients(*args, **kwargs)

    return {
        "gpflow_subclass": lambda g, xi: Subclass(g, xi),
        "natgrad_diag": lambda g, xi: nd.NaturalGradient(g, xi),
        "gpflow_like": lambda g, xi: gpflow_like(),
        "numpy_eta_gradients": lambda g, xi: _eta_gradients_numpy,
    }


@pytest.mark.parametrize("xi", ["nat", "meanvar"])
@pytest.mark.parametrize("name", list(_correct_optimizers()))
def test_custom_step__correct_implementations_pass(name, xi):
    model, data = _model("svgp", 2)
    check = nd.testing.assert_natgrad_step_matches_gpflow(model, data, gamma=GAMMA, xi_transform=_xi(xi), optimizer=_correct_optimizers()[name](GAMMA, _xi(xi)))
    # the bound is the reproduction check's: 1e-10 in float64 plus GPflow's rounding
    assert check.passed and check.max_abs_error <= check.tolerance < 1e-8, str(check)


def test_custom_step__a_point_that_hides_the_mistake_warns_instead_of_passing():
    """On a fresh SVGP (q_mu = 0, q_sqrt = I, GPflow's defaults) ∂varsqrt/∂η₁ = 0, so the question's default-seed step
    is GPflow's step there: the check must not pass it. After one step of GPflow's own optimizer (the oracle) it fails."""
    model, data = make_model("svgp", "bernoulli", num_inducing=5, num_data=20)
    model.q_mu.assign(np.zeros_like(model.q_mu.numpy()))
    model.q_sqrt.assign(np.eye(5)[None])
    check = nd.check_natgrad(model, data, optimizer=gpflow_like("default_seed"), gamma=0.5, gamma_steps=1,
                             gamma_search=False, progress=False).check("custom_step")
    assert check.status == "warn" and "default_seed" in check.detail and "after a few training steps" in check.detail
    correct = nd.check_natgrad(model, data, optimizer=gpflow_like(), gamma=0.5, gamma_steps=1, gamma_search=False, progress=False)
    assert correct.check("custom_step").status == "warn"  # a correct step is not told apart either: same verdict
    names = [c.name for c in correct.causes]  # named as a point that cannot tell, not as a wrong step
    assert "blind_point" in names and "wrong_step" not in names, names
    gpflow.optimizers.NaturalGradient(0.5).minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])
    after = nd.check_natgrad(model, data, optimizer=gpflow_like("default_seed"), gamma=0.5, gamma_steps=1,
                             gamma_search=False, progress=False).check("custom_step")
    assert after.status == "fail" and "default_seed" in after.detail


@pytest.mark.parametrize("num_inducing, transform", [(1, "triangular"), (4, "none")])
def test_custom_step__a_mistake_no_point_can_show_does_not_warn_forever(num_inducing, transform):
    """At M = 1 a transpose is the identity, and with no transform on q_mu, q_sqrt the unconstrained gradients are the
    constrained ones: those "mistakes" are GPflow's step at every point, so after training GPflow's own optimizer
    (the oracle) passes, while a real mistake still fails."""
    model, data = make_model("svgp", "bernoulli", num_inducing=num_inducing, num_data=20)
    if transform == "none":
        model.q_sqrt = gpflow.Parameter(model.q_sqrt.numpy())
    for _ in range(3):
        gpflow.optimizers.NaturalGradient(GAMMA).minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])
    kw = dict(gamma=GAMMA, gamma_steps=1, gamma_search=False, progress=False)
    check = nd.check_natgrad(model, data, optimizer=gpflow.optimizers.NaturalGradient(GAMMA), **kw).check("custom_step")
    assert check.status == "pass", str(check)
    assert nd.check_natgrad(model, data, optimizer=gpflow_like("gamma_twice"), **kw).check("custom_step").status == "fail"


def test_assert_step_matches_gpflow__an_inconclusive_bound_is_not_a_difference():
    """At λmin(S) = 1e-7 the bound's κ(S) term makes the check "warn"; GPflow's own optimizer compared with itself
    (error 0: the oracle) must not raise "differ", and check_natgrad's verdict there is not a failure either."""
    model, data = make_model("svgp", "bernoulli", num_inducing=6, num_data=30)
    U = np.linalg.svd(np.random.default_rng(3).normal(size=(6, 6)))[0]
    model.q_sqrt.assign(np.linalg.cholesky(U @ np.diag([1, 0.5, 0.3, 0.1, 1e-3, 1e-7]) @ U.T)[None])
    check = nd.testing.assert_natgrad_step_matches_gpflow(model, data, gamma=0.5, optimizer=gpflow.optimizers.NaturalGradient(0.5))
    assert check.status == "warn" and check.max_abs_error == 0.0, str(check)


def test_check_natgrad__names_the_questions_mistake_and_keeps_model_and_optimizer():
    import gpflow
    import tensorflow as tf

    model, data = _model("svgp", 1)
    opt = gpflow.optimizers.NaturalGradient(tf.Variable(GAMMA, dtype=tf.float64), _xi("meanvar"))
    before, keys = _values(model), set(vars(opt))
    report = nd.check_natgrad(model, data, optimizer=lambda *a: gpflow_like("default_seed")(opt, *a), gamma=GAMMA,
                              xi_transform=_xi("meanvar"), gamma_steps=1, gamma_search=False, progress=False)
    check = report.check("custom_step")
    assert check.status == "fail" and "the mistake 'default_seed'" in check.detail and "explain_output_gradients" in check.detail
    cause = next(c for c in report.causes if c.name == "wrong_step")
    assert "output_gradients=[dL_dmean, dL_dvarsqrt]" in cause.fix and "'default_seed'" in cause.evidence
    assert report.check("reproduction").passed  # natgrad-diag's own step is still GPflow's
    assert _values(model) == before and set(vars(opt)) == keys
    plain = nd.check_natgrad(model, data, gamma_steps=1, gamma_search=False, progress=False)
    assert "custom_step" not in [c.name for c in plain.checks]


class _Stateful:
    """A user's optimizer with state: a γ variable it decays, a step counter, a history list and a slot."""

    def __init__(self, mistake=""):
        import gpflow
        import tensorflow as tf

        self.gamma, self.xi_transform = tf.Variable(GAMMA, dtype=tf.float64), gpflow.optimizers.XiNat()
        self.steps, self.history, self.mistake = 0, [], mistake
        self.inner = gpflow.optimizers.NaturalGradient(self.gamma, self.xi_transform)

    def minimize(self, loss_fn, var_list):
        import gpflow

        if self.mistake:
            fn = gpflow_like(self.mistake)
            for q_mu, q_sqrt in var_list:
                import tensorflow as tf

                with tf.GradientTape(watch_accessed_variables=False) as tape:
                    tape.watch([q_mu.unconstrained_variable, q_sqrt.unconstrained_variable])
                    loss = loss_fn()
                g = tape.gradient(loss, [q_mu.unconstrained_variable, q_sqrt.unconstrained_variable])
                fn(self, *g, q_mu, q_sqrt, self.xi_transform)
        else:
            self.inner.minimize(loss_fn, var_list)
        self.steps += 1
        self.history.append(float(self.gamma.numpy()))
        self.slot = gpflow.Parameter(1.0)
        self.gamma.assign(self.gamma * 0.5)


@pytest.mark.parametrize("mode", [pytest.param("full", marks=pytest.mark.slow), "fast"])  # full: ~3 s more
def test_check_natgrad__stateful_optimizer_is_bit_identical_afterwards(mode):
    model, data = _model("vgp", 1)
    opt = _Stateful()
    gamma_bits, attrs, history = opt.gamma.numpy().tobytes(), dict(vars(opt)), opt.history
    report = nd.check_natgrad(model, data, optimizer=opt, mode=mode, gamma_steps=1, gamma_search=False, progress=False)
    assert report.check("custom_step").passed and report.gamma == GAMMA, str(report.check("custom_step"))
    assert opt.gamma.numpy().tobytes() == gamma_bits and vars(opt) == attrs and opt.history is history and history == []


def test_check_natgrad__var_list_form_names_the_mistake():
    model, data = _model("svgp", 2)
    report = nd.check_natgrad(model.training_loss_closure(data, compile=False), var_list=[(model.q_mu, model.q_sqrt)],
                              optimizer=_Stateful("gamma_twice"), gamma_steps=1, gamma_search=False)
    assert not report.passed and "the mistake 'gamma_twice'" in report.check("pair 0: custom_step").detail


@pytest.mark.slow
def test_verify_step__judges_the_step_just_taken_without_running_the_optimizer_again():
    import gpflow

    from natgrad_diag.checks.pairs import verify_step

    model, data = _model("svgp", 1)
    pairs = [(model.q_mu, model.q_sqrt)]
    before = [v.unconstrained_variable.numpy().copy() for v in pairs[0]]
    opt = gpflow.optimizers.NaturalGradient(GAMMA)
    oracle = gpflow.utilities.deepcopy(model)
    opt.minimize(oracle.training_loss_closure(data), [(oracle.q_mu, oracle.q_sqrt)])  # GPflow's own step, on a copy
    gpflow_like("gamma_twice")(opt, *_grads(model, data), model.q_mu, model.q_sqrt, None)
    after = _values(model)
    (check,) = verify_step(opt, model.training_loss_closure(data, compile=False), pairs, before)
    assert "the mistake 'gamma_twice'" in check.detail and _values(model) == after
    (model.q_mu.unconstrained_variable.assign(before[0]), model.q_sqrt.unconstrained_variable.assign(before[1]))
    opt.minimize(model.training_loss_closure(data), pairs)
    (check,) = verify_step(opt, model.training_loss_closure(data, compile=False), pairs, before)
    assert check.passed and np.array_equal(model.q_mu.numpy(), oracle.q_mu.numpy()), str(check)


def _grads(model, data):
    import tensorflow as tf

    variables = [model.q_mu.unconstrained_variable, model.q_sqrt.unconstrained_variable]
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(variables)
        loss = model.training_loss(data)
    return tape.gradient(loss, variables)


def test_custom_step__unconstrained_gradient_is_named_where_a_transform_makes_it_differ():
    """With GPflow's transforms the mistake is a shape error (q_sqrt's unconstrained gradient is [L, M(M+1)/2]); with
    q_mu = 2·v (a Scale bijector) and no transform on q_sqrt, it is a different step."""
    import gpflow
    import tensorflow_probability as tfp

    model, data = _model("svgp", 1)
    with pytest.raises(InputError, match="Matrix size-incompatible"):
        nd.testing.assert_natgrad_step_matches_gpflow(model, data, gamma=GAMMA, optimizer=gpflow_like("unconstrained"))
    model.q_mu = gpflow.Parameter(model.q_mu.numpy(), transform=tfp.bijectors.Scale(np.float64(2.0)))
    model.q_sqrt = gpflow.Parameter(model.q_sqrt.numpy())
    with pytest.raises(NatGradCheckError, match="the mistake 'unconstrained'"):
        nd.testing.assert_natgrad_step_matches_gpflow(model, data, gamma=GAMMA, optimizer=gpflow_like("unconstrained"))


class _Raises:
    gamma = 0.1

    def minimize(self, loss_fn, var_list):
        raise RuntimeError("my bug")


class _Greedy:
    def __init__(self, model):
        import gpflow

        self.model, self.inner = model, gpflow.optimizers.NaturalGradient(GAMMA)

    def minimize(self, loss_fn, var_list):
        self.inner.minimize(loss_fn, var_list)
        self.model.kernel.variance.assign(2.0)


def _nan_update(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform):
    q_mu.unconstrained_variable.assign(np.full(q_mu.shape, np.nan))


@pytest.mark.parametrize(
    "bad, error",
    [
        (object(), "minimize"),
        (_Raises, "instance"),
        (lambda a, b: None, "q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform"),
        (_Raises(), "RuntimeError: my bug"),
        (lambda g1, g2, m, s, xi: 3.0, "neither None nor"),
    ],
    ids=["no_minimize", "a_class", "wrong_signature", "raises", "returns_a_number"],
)
def test_custom_step__bad_optimizer_is_an_input_error_and_the_model_is_untouched(bad, error):
    model, data = _model("svgp", 1)
    before = _values(model)
    with pytest.raises(InputError, match=error.replace("(", r"\(")) as info:
        nd.check_natgrad(model, data, optimizer=bad, gamma_steps=1, gamma_search=False, progress=False)
    assert "Argument: optimizer" in str(info.value) and "To fix:" in str(info.value)
    assert _values(model) == before


def _crashing_update(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform):
    raise RuntimeError("my bug")


def test_custom_step__a_crashing_update_function_is_named_by_the_call_it_got():
    """The function was called with GPflow's five arguments, never as a class's minimize(loss_fn, var_list)."""
    model, data = _model("svgp", 1)
    with pytest.raises(InputError) as info:
        nd.check_natgrad(model, data, optimizer=_crashing_update, gamma_steps=1, gamma_search=False, progress=False)
    message = str(info.value)
    assert message.splitlines()[0] == ("Invalid input. _crashing_update(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, "
                                       "xi_transform) raised RuntimeError: my bug")
    assert "minimize" not in message and "Argument: optimizer" in message and "To fix:" in message


@pytest.mark.parametrize("which", ["nan", "greedy"])
def test_custom_step__nan_or_other_variables_fail_with_the_cause(which):
    model, data = _model("svgp", 1)
    before = _values(model)
    opt = _nan_update if which == "nan" else _Greedy(model)
    with pytest.raises(NatGradCheckError, match="NaN" if which == "nan" else r"the model's \.kernel\.variance"):
        nd.testing.assert_natgrad_step_matches_gpflow(model, data, gamma=GAMMA, optimizer=opt)
    assert _values(model) == before


_CLI_MODULE = '''
import gpflow

class AscentNatGrad(gpflow.optimizers.NaturalGradient):
    """A step up the loss: GPflow's step with -gamma."""

    def minimize(self, loss_fn, var_list):
        gamma, self.gamma = self.gamma, -self.gamma
        try:
            super().minimize(loss_fn, var_list)
        finally:
            self.gamma = gamma

class NoMinimize:
    def __init__(self, gamma, xi_transform=None):
        pass

def crashes(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform):
    raise RuntimeError("my bug")
'''


@pytest.mark.parametrize(
    "spec, code, text",
    [
        ("{path}:AscentNatGrad", 1, "the mistake 'ascent'"),
        pytest.param("natgrad_diag:NaturalGradient", 0, "PASS custom_step", marks=pytest.mark.slow),
        ("{path}.missing.py:AscentNatGrad", 2, "could not load the optimizer"),
        ("no_such_module_here:X", 2, "could not load the optimizer"),
        ("{path}:NoMinimize", 2, "minimize(loss_fn, var_list)"),
        ("{path}:crashes", 2, "crashes(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform) raised RuntimeError"),
    ],
    ids=["wrong_step", "correct", "no_file", "no_module", "no_minimize", "crashing_function"],
)
def test_cli_check__optimizer_exit_codes(spec, code, text, tmp_path, capsys):
    from natgrad_diag.cli.app import main

    path = tmp_path / "my_natgrad.py"
    path.write_text(_CLI_MODULE, encoding="utf-8")
    argv = ["check", "--num-inducing", "4", "--num-data", "8", "--gamma", "0.5", "--gamma-steps", "1", "--plain", "--optimizer", spec.format(path=path)]
    assert main(argv) == code
    out = capsys.readouterr()
    assert text in " ".join((out.out + out.err).split()), out.out + out.err


class _SeedMistakeNatGrad(gpflow.optimizers.NaturalGradient):
    """The question's own optimizer: GPflow's update with the default seed's elementwise product."""

    def _natgrad_apply_gradients(self, q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform=None):
        gpflow_like("default_seed")(self, q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform)


@pytest.mark.parametrize("wrong", [True, False])
def test_guard_verify__catches_a_wrong_optimizer_in_a_training_loop(wrong):
    """``monitor.guard(step, opt, verify=True)`` judges each step against GPflow's from the snapshot: the question's
    optimizer fails at its first step with the mistake named (the guard's health and loss tests pass it: its step
    lowers the loss), GPflow's own optimizer passes every step."""
    model, (X, Y) = make_model("svgp", "bernoulli", num_inducing=5, num_data=20)
    data = (tf.constant(X), tf.constant(Y))
    gpflow.set_trainable(model.q_mu, False)
    gpflow.set_trainable(model.q_sqrt, False)
    opt = (_SeedMistakeNatGrad if wrong else gpflow.optimizers.NaturalGradient)(GAMMA)
    monitor = nd.NatGradMonitor(model, data, gamma=GAMMA)
    loss = model.training_loss_closure(data, compile=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            with monitor.guard(step, opt, verify=True):
                opt.minimize(loss, [(model.q_mu, model.q_sqrt)])
    records = monitor.guard_records
    assert [r.passed for r in records] == [not wrong] * 3
    assert all(b.loss_after < b.loss_before for b in records)  # the loss falls either way: only verify tells
    if wrong:
        assert "the step is not GPflow's natural-gradient step" in records[0].cause and "'default_seed'" in records[0].cause
        assert any("natural-gradient step at training step 0 failed" in str(w.message) for w in caught)
    with pytest.raises(InputError, match="verify must be True or False"):
        monitor.guard(0, opt, verify="yes")


@pytest.mark.slow  # the default run's margin; CI's slow stage runs it
def test_custom_step__the_xi_a_training_loop_passes_in_var_list_is_the_one_checked():
    # GPflow's NaturalGradient(γ) with XiSqrtMeanVar passed in var_list, as a training loop does: xi_transform names
    # that ξ and wins over the optimizer's own XiNat (it was silently replaced by it). The oracle: GPflow's own step
    # with the same triple on a copy of the model.
    from gpflow.optimizers import XiSqrtMeanVar

    model, data = make_model("svgp", "bernoulli", num_inducing=6, num_data=30, seed=2)
    opt, xi = gpflow.optimizers.NaturalGradient(0.3), XiSqrtMeanVar()
    r = nd.check_natgrad(model, data, optimizer=opt, xi_transform=xi, gamma_search=False, gamma_steps=1, progress=False)
    assert r.xi_transform == "XiSqrtMeanVar" and r.check("custom_step").status == "pass" and r.passed
    copy = gpflow.utilities.deepcopy(model)
    gpflow.optimizers.NaturalGradient(0.3).minimize(copy.training_loss_closure(data), [(copy.q_mu, copy.q_sqrt, XiSqrtMeanVar())])
    np.testing.assert_allclose(r.new_q_mu, copy.q_mu.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(r.new_q_sqrt, copy.q_sqrt.numpy(), rtol=0, atol=1e-10)


def test_custom_step__a_nan_step_names_candidate_mistakes_as_candidates():
    """A step that writes NaN matches no step. Where only the 'ascent' step fails too (γ = 0.3) it is the likely cause,
    said as such, with natgrad_trace as the fallback; where several fail (γ = 3: 'gamma_twice', 'ascent', ...) all are
    listed and none is named as the step. GPflow's own optimizer (the oracle) steps at the same point."""
    model, data = make_model("svgp", "bernoulli", num_inducing=6, num_data=40)

    def nan_step(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi=None):  # noqa: ANN001, ANN202
        q_mu.assign(q_mu * np.nan)

    def check(gamma):  # noqa: ANN001, ANN202
        return nd.check_natgrad(model, data, optimizer=nan_step, gamma=gamma, gamma_steps=1, gamma_search=False,
                                progress=False).check("custom_step")

    one, two = check(0.3), check(3.0)
    assert one.status == two.status == "fail"
    assert "as the mistake 'ascent' does here" in one.detail and "a NaN cannot confirm it" in one.detail
    assert "If that is not it, compare your update with natgrad_diag.natgrad_trace" in one.detail
    listed = re.search(r"Of the known mistakes, (.*?) fail here too", two.detail)  # 'natural_coordinates' fails too
    assert listed and {"'gamma_twice'", "'ascent'"} <= set(listed.group(1).split(", ")), two.detail
    assert "the mistake '" not in two.detail and "To fix: compare your update with natgrad_diag.natgrad_trace" in two.detail
    copy = gpflow.utilities.deepcopy(model)
    gpflow.optimizers.NaturalGradient(3.0).minimize(lambda: copy.training_loss(data), [(copy.q_mu, copy.q_sqrt)])
    assert np.all(np.isfinite(copy.q_mu.numpy()))


def test_custom_step__the_docs_table_lists_every_mistake_the_check_names():
    from pathlib import Path

    from natgrad_diag.checks.custom_step import MISTAKES as NAMED

    page = (Path(__file__).parents[1] / "docs" / "natgrad-checks.md").read_text(encoding="utf-8")
    rows = {name for line in page.splitlines() if line.startswith("| `") for name in re.findall(r"`(\w+)`", line.split("|")[1])}
    assert set(NAMED) <= rows and set(MISTAKES) <= set(NAMED), sorted(set(NAMED) - rows)


@pytest.mark.parametrize("mistake", ["ascent", "natural_coordinates"])
def test_custom_step__a_step_that_fails_where_gpflows_holds_is_named_at_a_smaller_gamma(mistake):
    """With L = 2 and XiNat at γ = 0.3 both mistakes' steps leave the cone (NaN) where GPflow's holds, so the NaN alone
    cannot tell them apart; the check takes the user's step again at γ/10, where it holds, and names the one it is
    there. The user's optimizer (a Python-number γ, set for the retry) and the model are as they were."""
    model, data = _model("svgp", 2)
    before = _values(model)
    opt = gpflow.optimizers.NaturalGradient(GAMMA)
    opt._natgrad_apply_gradients = lambda *args: gpflow_like(mistake)(opt, *args)
    copy_ = gpflow.utilities.deepcopy(model)
    with pytest.raises(tf.errors.InvalidArgumentError):  # the premise: the mistaken step fails at γ = 0.3 ...
        opt.minimize(lambda: copy_.training_loss(data), [(copy_.q_mu, copy_.q_sqrt)])
    copy_ = gpflow.utilities.deepcopy(model)  # ... and GPflow's own does not
    gpflow.optimizers.NaturalGradient(GAMMA).minimize(lambda: copy_.training_loss(data), [(copy_.q_mu, copy_.q_sqrt)])
    check = nd.check_natgrad(model, data, optimizer=opt, gamma_steps=1, gamma_search=False, progress=False).check("custom_step")
    assert check.status == "fail" and f"at gamma = 0.03, where it holds, it is the mistake '{mistake}'" in check.detail, check.detail
    assert opt.gamma == GAMMA and type(opt.gamma) is float and _values(model) == before


def test_custom_step__an_optimizer_whose_gamma_cannot_be_set_keeps_the_candidates():
    """The retry at a smaller γ sets the optimizer's ``gamma``; where that raises (a read-only γ) the check lists the
    mistakes that fail too, as for a step that fails at every γ, instead of raising the AttributeError."""
    model, data = _model("svgp", 2)

    class FixedGamma(gpflow.optimizers.NaturalGradient):
        gamma = property(lambda self: GAMMA, lambda self, value: None if value == GAMMA else self._refuse())

        def _refuse(self):
            raise AttributeError("this optimizer's gamma is fixed")

    opt = FixedGamma(GAMMA)
    opt._natgrad_apply_gradients = lambda *args: gpflow_like("natural_coordinates")(opt, *args)
    check = nd.check_natgrad(model, data, optimizer=opt, gamma_steps=1, gamma_search=False, progress=False).check("custom_step")
    assert check.status == "fail" and "'natural_coordinates'" in check.detail and "where it holds" not in check.detail, check.detail
