"""Look-ahead verdicts and the γ search: check_natgrad's ``step_health`` and suggestion against GPflow's own optimizer.

The oracle is ``gpflow.optimizers.NaturalGradient(γ).minimize`` run up to k times on a ``gpflow.utilities.deepcopy`` of
the model, the loss read after each step, with the rule the package states: a step fails when it raises, leaves a
non-finite loss or q(u), or raises the loss by more than √ε·max(|loss|, 1) (what one evaluation resolves). A claim
"γ fails at step j" is checked by running the optimizer j times.

The model: the StudentT demo SVGP with M = 8, N = 30, seed 1 (natgrad_diag.demo.make_model), from a loss of 121.66.
With k = 5 GPflow's optimizer trains at every γ ≤ 0.3 (γ = 0.3 lowest, 7.98 after 5 steps), γ = 1 lowers the loss
at step 1 (86.39) and fails at step 2, γ = 3 and γ = 10 fail at step 1.
"""

from __future__ import annotations

import gc
import json
import weakref

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from _user_models import same_bits, variables_of

from natgrad_diag import _compile, assert_natgrad, check_natgrad
from natgrad_diag.checks.health import GAMMA_GRID
from natgrad_diag.demo import make_model
from natgrad_diag.exceptions import InputError

K = 5

# Tolerance of ours against GPflow's losses after k steps. Each step of ours equals GPflow's to rounding, ε·κ(S)
# relative (closed_form.py's bound; the report's `reproduction` check measures it: 0 to 4e-10 absolute here); a
# difference δ in q(u) reaches the next step amplified by at most the step map's derivative, of the order of κ(S_new)
# (≈ 32 in the report), so after k = 5 steps q(u) differs by ≲ ε·κ(S)·32⁵ ≈ 2e-16·3·3e7 ≈ 2e-8 relative at worst;
# measured agreement is about 1e-15, and 1e-7 relative leaves a factor 5 over the worst case.
RTOL = 1e-7


_SCRATCH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → {id(data): (data, copy, its loss)}


def _oracle(model, data, gamma: float, k: int, xi=None) -> tuple[list[float], int | None]:
    """GPflow's NaturalGradient(gamma).minimize up to k times on a deep copy set to the model's values: the loss after
    each step (the failing step's own loss included when it rose), and the first failing step (None if all k held).
    The copy and its compiled training loss are made once per (model, data) and reset for each call."""
    entries = _SCRATCH.setdefault(model, {})
    if id(data) not in entries:  # the entry keeps data alive, so its id is not reused; the model is held weakly
        copy_ = gpflow.utilities.deepcopy(model)
        loss = tf.function(lambda: copy_.training_loss(data) if data is not None else copy_.training_loss(), autograph=False)
        entries[id(data)] = (data, copy_, loss)
    _, copy_, loss = entries[id(data)]
    for src, dst in zip(model.variables, copy_.variables):
        dst.assign(src)
    opt = gpflow.optimizers.NaturalGradient(gamma, xi_transform=xi or gpflow.optimizers.XiNat())
    before, losses = float(loss().numpy()), []
    for j in range(1, k + 1):
        try:
            opt.minimize(loss, [(copy_.q_mu, copy_.q_sqrt)])
        except tf.errors.InvalidArgumentError:  # GPflow refuses to assign a NaN q(u)
            return losses, j
        value, q_sqrt = float(loss().numpy()), copy_.q_sqrt.numpy()
        if not np.isfinite(value) or not np.isfinite(q_sqrt).all() or (np.diagonal(q_sqrt, axis1=1, axis2=2) <= 0).any():
            return losses, j
        losses.append(value)
        if value > before + np.sqrt(np.finfo(np.float64).eps) * max(abs(before), 1.0):
            return losses, j
        before = value
    return losses, None


def _best(oracle: dict[float, tuple[list[float], int | None]], gammas) -> float:
    """The stated rule on the oracle's numbers: lowest loss after k steps among the γ that held, ties to the smaller."""
    held = {g: oracle[g][0][-1] for g in gammas if oracle[g][1] is None}
    low = min(held.values())
    return min(g for g, v in held.items() if v <= low + np.sqrt(np.finfo(np.float64).eps) * max(abs(low), 1.0))


@pytest.fixture(scope="module")
def studentt():
    demo = make_model("svgp", "studentt", num_inducing=8, num_data=30, seed=1)
    return demo.model, tuple(tf.constant(d) for d in demo.data)


@pytest.fixture(scope="module")
def oracle(studentt):
    """γ of the grid → (losses after each step, failed step or None), by GPflow's optimizer (about 30 eager steps)."""
    model, data = studentt
    return {g: _oracle(model, data, g, K) for g in GAMMA_GRID}


@pytest.fixture(scope="module")
def report_k(studentt):
    model, data = studentt
    before = variables_of(model)
    report = check_natgrad(model, data, gamma=1.0, mode="full", progress=False)
    assert same_bits(before, variables_of(model))
    return report


def test_the_case__is_what_the_module_docstring_says(oracle):
    assert {g for g, (_, failed) in oracle.items() if failed} == {1.0, 3.0, 10.0}
    assert oracle[1.0][1] == 2 and oracle[3.0][1] == oracle[10.0][1] == 1
    assert _best(oracle, GAMMA_GRID) == 0.3


def test_verdict__gamma_that_fails_at_step_2_fails_the_check_naming_the_step(report_k, oracle):
    """γ = 1 lowers the loss on its first step (the one-step verdict passed it) and fails at step 2, as GPflow's
    optimizer run twice does; the cause names the step and the γ that trains."""
    assert report_k.gamma_steps == K == 5  # the default
    assert not report_k.passed
    check = report_k.check("step_health")
    assert check.status == "fail"
    assert check.detail.startswith("gamma = 1 fails at step 2: ") and "gamma = 0.3 trains" in check.detail
    own = report_k.gamma_trials[[t.gamma for t in report_k.gamma_trials].index(1.0)]
    assert own.failed_step == oracle[1.0][1] == 2 and not own.healthy and own.loss is None
    assert own.losses == pytest.approx(oracle[1.0][0], rel=RTOL)  # the step it did take


@pytest.mark.parametrize("mode", [pytest.param("full", marks=pytest.mark.slow), "fast"])
def test_verdict__a_gamma_that_trains_passes_with_gpflows_losses_at_every_step(studentt, oracle, mode):
    model, data = studentt
    report = check_natgrad(model, data, gamma=0.1, mode=mode, progress=False, gamma_search=False)
    assert report.passed and report.check("step_health").passed
    (own,) = report.gamma_trials
    assert own.healthy and own.failed_step is None and own.losses == pytest.approx(oracle[0.1][0], rel=RTOL)


def test_trials__every_measured_gamma_has_gpflows_losses_and_failing_step(report_k, oracle):
    assert len(report_k.gamma_trials) == 3  # γ = 1, 0.3, 0.1 (test_search__brackets_the_best_gamma_and_stops_there)
    for t in report_k.gamma_trials:
        losses, failed = oracle[t.gamma]
        assert t.failed_step == failed and t.healthy == (failed is None), t
        assert t.losses == pytest.approx(losses, rel=RTOL), t
        assert t.loss == (None if failed else pytest.approx(losses[-1], rel=RTOL))


def test_search__brackets_the_best_gamma_and_stops_there(report_k, oracle):
    """The suggestion is the stated rule's best among the trials, and a local minimum of the oracle on the grid: the
    next γ above fails or is worse, the next below is worse. γ = 1 failed, so the search went down and stopped
    at the first γ worse than the best (0.1)."""
    measured = [t.gamma for t in report_k.gamma_trials]
    assert measured == [1.0, 0.3, 0.1]  # largest first; 3 and 10 are never tried from a failing γ
    assert report_k.suggested_gamma == _best(oracle, measured) == 0.3 == _best(oracle, GAMMA_GRID)


def test_search__can_say_larger(studentt, oracle):
    """From γ = 0.001 the search walks up the grid while the loss after k steps falls, to 0.3 (1 fails)."""
    model, data = studentt
    report = check_natgrad(model, data, gamma=0.001, mode="fast", progress=False)
    assert report.passed and report.suggested_gamma == 0.3 == _best(oracle, GAMMA_GRID)
    assert [t.gamma for t in report.gamma_trials] == sorted(GAMMA_GRID[2:], reverse=True)  # 1 down to 0.001
    assert "Suggested: gamma = 0.3 trains" in report.check("step_health").detail


@pytest.fixture(scope="module")
def gaussian():
    demo = make_model("svgp", "gaussian", num_inducing=8, num_data=30, seed=1)
    model, data = demo.model, tuple(tf.constant(d) for d in demo.data)
    return model, data, {g: _oracle(model, data, g, K) for g in GAMMA_GRID}


@pytest.mark.parametrize("gamma", [*(pytest.param(g, marks=pytest.mark.slow) for g in (0.001, 0.07, 0.3, 1.0, 2.5)), 10.0])
def test_search__a_gaussian_likelihood_gets_gamma_1_from_any_start(gaussian, gamma):
    """γ = 1 is the exact optimum of a conjugate model (one XiNat step reaches the collapsed bound); by GPflow's
    optimizer it has the lowest loss after k steps of the grid, and the search finds it from any γ, on or off it."""
    model, data, oracle = gaussian
    assert _best(oracle, GAMMA_GRID) == 1.0
    report = check_natgrad(model, data, gamma=gamma, mode="fast", progress=False)
    assert report.suggested_gamma == 1.0
    # 2.5 and 10 overshoot: S leaves the positive-definite cone at step 1, as GPflow's k steps at that γ show
    failed = (oracle[gamma] if gamma in oracle else _oracle(model, data, gamma, K))[1]
    assert (failed is None) == (gamma <= 1.0)
    assert report.passed == (failed is None)


def test_gamma_steps_1__judges_the_first_step_and_looks_ahead_where_lambda_says_unstable(studentt, oracle):
    # γ = 1's first step lowers the loss; it is the second that fails (the oracle). One step alone passed γ = 1; where
    # it leads λ = 14 > 2/γ, so the check takes 4 steps of it and finds that failure.
    model, data = studentt
    report = check_natgrad(model, data, gamma=1.0, mode="full", gamma_steps=1, progress=False)
    assert all(t.steps == 1 for t in report.gamma_trials)
    own = next(t for t in report.gamma_trials if t.gamma == 1.0)
    assert oracle[1.0][1] == 2 and not report.passed and own.failed_step is None
    assert own.reason.startswith("unstable: the step held, but 4 steps did not (step 2 of 4: ")
    assert not own.healthy and own.losses == pytest.approx(oracle[1.0][0][:1], rel=RTOL)


@pytest.mark.slow  # ~6 s; by default full (report_k) and fast (test_verdict__...[fast]) trials are each checked against GPflow's
def test_fast_and_full__give_the_same_verdict_and_trials(studentt, report_k):
    model, data = studentt
    fast = check_natgrad(model, data, gamma=1.0, mode="fast", progress=False)
    assert fast.passed == report_k.passed and fast.suggested_gamma == report_k.suggested_gamma
    assert [(t.gamma, t.failed_step) for t in fast.gamma_trials] == [(t.gamma, t.failed_step) for t in report_k.gamma_trials]


def test_report__json_has_the_trials(report_k):
    d = json.loads(json.dumps(report_k.to_dict()))
    assert d["gamma_steps"] == K and d["suggested_gamma"] == 0.3 and d["gamma_losses"]["1"] is None


@pytest.mark.slow
def test_trainable_q_u__is_a_note_not_a_status(studentt):
    model, data = studentt
    assert model.q_mu.trainable
    report = check_natgrad(model, data, gamma=0.1, mode="fast", progress=False, gamma_search=False)
    note = next(w for w in report.warnings if "trainable" in w)
    assert "gpflow.set_trainable(model.q_mu, False); gpflow.set_trainable(model.q_sqrt, False)" in note
    frozen = gpflow.utilities.deepcopy(model)
    gpflow.set_trainable(frozen.q_mu, False)
    gpflow.set_trainable(frozen.q_sqrt, False)
    again = check_natgrad(frozen, data, gamma=0.1, mode="fast", progress=False, gamma_search=False)
    assert not any("trainable" in w for w in again.warnings)
    assert [c.status for c in again.checks] == [c.status for c in report.checks]


@pytest.mark.slow
def test_var_list__each_pair_gets_its_own_suggestion(studentt, gaussian, oracle):
    """Two pairs under one loss (the sum of two independent models' losses): each pair's search is its model's."""
    (m1, d1), (m2, d2, oracle2) = studentt, gaussian
    before = variables_of(m1) + variables_of(m2)
    report = check_natgrad(lambda: m1.training_loss(d1) + m2.training_loss(d2), var_list=[(m1.q_mu, m1.q_sqrt), (m2.q_mu, m2.q_sqrt)],
                           gamma=0.1, mode="fast")  # fmt: skip
    assert [r.suggested_gamma for r in report.pairs] == [_best(oracle, GAMMA_GRID), _best(oracle2, GAMMA_GRID)] == [0.3, 1.0]
    assert same_bits(before, variables_of(m1) + variables_of(m2))


@pytest.mark.slow  # ~6 s; by default test_natgrad_check's test_fast_mode__second_call_... asserts a second call traces nothing
def test_tracing__once_per_model_not_per_gamma_nor_per_call():
    """Fast mode's k steps run in one compiled while_loop per step kind (GPflow's for γ, natgrad-diag's for the
    search): traced once each per model, not per γ, k or call."""
    demo = make_model("svgp", "studentt", num_inducing=4, num_data=10, seed=2)  # new variables: a new compiled run
    before = _compile.trace_count("gamma_steps")
    first = check_natgrad(demo.model, demo.data, gamma=5.0, mode="fast", gamma_steps=2, progress=False)
    assert first.gamma_trials[0].failed_step == 1 and len(first.gamma_trials) > 2
    assert _compile.trace_count("gamma_steps") == before + 1  # γ = 5's first step failed: only the search's loop ran
    again = check_natgrad(demo.model, demo.data, gamma=0.03, mode="fast", gamma_steps=4, progress=False)  # other γ, k
    assert len(again.gamma_trials) > 2 and again.gamma_steps == 4
    assert _compile.trace_count("gamma_steps") == before + 2  # GPflow's own loop for γ, once
    check_natgrad(demo.model, demo.data, gamma=0.3, mode="fast", gamma_steps=3, progress=False)
    assert _compile.trace_count("gamma_steps") == before + 2


class _CountingSVGP(gpflow.models.SVGP):
    """An SVGP that counts how often its ``training_loss`` runs as Python: once per eager call, once per trace."""

    calls = 0

    def training_loss(self, *args, **kwargs):
        type(self).calls += 1
        return super().training_loss(*args, **kwargs)


def test_full_mode__steps_eagerly_and_takes_the_losses_from_one_compiled_function():
    """Full mode takes each trial step eagerly (no compiled k-step loop), and the losses and gradients on its scratch
    copy come from one function traced once per check. The model's training_loss then runs as Python at most 6 times
    however many steps are taken: the gradient at q(u), one trace of the losses, one of ∇ηL (the stability estimate)
    and 3 eager losses of the noise test (a deterministic loss: one at q(u), two where the step lands). Evaluated
    eagerly, each of the 13 steps of this search and each probe would be another (25 in all)."""
    m, data = make_model("svgp", "studentt", num_inducing=4, num_data=10, seed=4)
    model = _CountingSVGP(m.kernel, m.likelihood, m.inducing_variable, mean_function=m.mean_function, whiten=m.whiten,
                          q_mu=m.q_mu.numpy(), q_sqrt=m.q_sqrt.numpy(), num_data=10)
    before, _CountingSVGP.calls = _compile.trace_count("gamma_steps") + _compile.trace_count("gamma_steps_replay"), 0
    report = check_natgrad(model, data, gamma=0.001, mode="full", gamma_steps=2, progress=False)
    assert report.passed and sum(len(t.losses) for t in report.gamma_trials) >= 13
    assert report.gamma_losses[report.suggested_gamma] == pytest.approx(_oracle(m, data, report.suggested_gamma, 2)[0][-1], rel=RTOL)
    assert _compile.trace_count("gamma_steps") + _compile.trace_count("gamma_steps_replay") == before
    assert 3 <= _CountingSVGP.calls <= 6


@pytest.mark.slow  # ~3 s; test_compile's test_for_model__a_deleted_model_frees_its_entries runs by default
def test_compiled_trials__do_not_keep_the_model_alive():
    from natgrad_diag.checks.api import natgrad_tolerances
    from natgrad_diag.checks.evaluator import Context, evaluator

    demo = make_model("svgp", "studentt", num_inducing=4, num_data=10, seed=3)
    model = demo.model
    data = tuple(tf.constant(d) for d in demo.data)
    with tf.GradientTape() as tape:
        loss = model.training_loss(data)
    g_mu, g_sq = tape.gradient(loss, [model.q_mu.unconstrained_variable, model.q_sqrt.unconstrained_variable])
    ctx = Context(model=model, data=data, xi=gpflow.optimizers.XiNat(), gamma=0.1, tol=natgrad_tolerances(np.float64), np_dtype=np.float64, M=4, L=1)
    losses, why, failed = evaluator(ctx, compiled=True).trial(g_mu.numpy(), g_sq.numpy(), 0.1, 2, lambda mu, sq: (True, ""), float(loss), (1e-12, 1e-12))
    assert why == "" and failed is None and losses == pytest.approx(_oracle(model, data, 0.1, 2)[0], rel=RTOL)
    assert _compile.model_entries(model) == 1
    ref = weakref.ref(model)
    del model, demo, tape, ctx
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        pytest.param(0, "gamma_steps must be an integer from 1 to 1000.", id="zero"),
        pytest.param(-2, "gamma_steps must be an integer from 1 to 1000.", id="negative"),
        pytest.param(True, "(a bool is not a step count)", id="bool"),
        pytest.param(2.0, "gamma_steps must be an integer from 1 to 1000.", id="float"),
        pytest.param("3", "gamma_steps must be an integer from 1 to 1000.", id="string"),
        pytest.param(None, "gamma_steps must be an integer from 1 to 1000.", id="none"),
        pytest.param(1001, "more than 1000 is a training run, not a check", id="absurd"),
    ],
)
def test_gamma_steps__bad_values_are_refused_naming_the_argument(studentt, value, says):
    model, data = studentt
    with pytest.raises(InputError) as e:
        check_natgrad(model, data, gamma_steps=value, progress=False)
    text = str(e.value)
    assert says in text and "Argument: gamma_steps" in text and f"Got:      {value!r}" in text and "To fix: pass gamma_steps=5" in text
    with pytest.raises(InputError, match="gamma_steps"):
        assert_natgrad(model, data, gamma_steps=value)


def test_gamma_search__must_be_a_bool(studentt):
    model, data = studentt
    with pytest.raises(InputError, match="gamma_search must be True or False"):
        check_natgrad(model, data, gamma_search="yes", progress=False)


def test_gamma_steps__numpy_ints_are_accepted():
    from natgrad_diag.checks.api import validate_gamma_steps

    assert validate_gamma_steps(np.int64(4)) == 4


@pytest.mark.slow
def test_cli__gamma_steps_flag(capsys):
    from natgrad_diag.cli.app import main

    argv = ["check", "--likelihood", "studentt", "--num-inducing", "8", "--num-data", "30", "--seed", "1", "--mode", "full"]
    assert main([*argv, "--gamma-steps", "3", "--json"]) == 1  # γ = 1 fails at step 2
    out = json.loads(capsys.readouterr().out)
    assert out["gamma_steps"] == 3 and out["suggested_gamma"] == 0.3 and out["gamma_losses"]["1"] is None
    assert main([*argv, "--gamma-steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "argument --gamma-steps: expected an integer from 1 to 1000 (steps per gamma tried), got '0'" in err
    assert main([*argv, "--gamma-steps", "2.5", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["exit_code"] == 2


class _CheckedSVGP(gpflow.models.SVGP):
    """An SVGP whose ELBO raises (tf.debugging.check_numerics) instead of returning NaN: an op that raises mid-run."""

    def elbo(self, data):
        return tf.debugging.check_numerics(super().elbo(data), "the ELBO is not finite")


@pytest.mark.slow
def test_trials__an_op_raising_midway_is_replayed_to_name_the_step(studentt, oracle):
    """When an op raises inside the compiled k steps (fast mode) they are replayed one by one; full mode takes them
    one by one eagerly. Either way the trial names the step GPflow's optimizer fails at."""
    model, data = studentt
    checked = _CheckedSVGP(
        model.kernel, model.likelihood, model.inducing_variable, num_data=model.num_data, whiten=model.whiten,
        q_mu=model.q_mu.numpy(), q_sqrt=model.q_sqrt.numpy(),
    )  # fmt: skip
    fast = check_natgrad(checked, data, gamma=1.0, mode="fast", progress=False)
    full = check_natgrad(checked, data, gamma=1.0, mode="full", progress=False)
    for report in (fast, full):
        trials = {t.gamma: t for t in report.gamma_trials}
        assert trials[1.0].failed_step == oracle[1.0][1] == 2, trials[1.0]
        assert trials[1.0].reason.startswith(f"step 2 of {K}: "), trials[1.0]
        for g in (0.3, 0.1):
            assert trials[g].loss == pytest.approx(oracle[g][0][-1], rel=RTOL), g


def _sklearn_svgp(name: str, likelihood):
    """GPflow's notebook recipe on scikit-learn's bundled data (first 120 rows, standardised), M = 10."""
    from sklearn import datasets

    X, y = (datasets.load_breast_cancer if name == "breast_cancer" else datasets.load_diabetes)(return_X_y=True)
    X = (X[:120] - X[:120].mean(0)) / X[:120].std(0)
    Y = (y[:120, None].astype(float) if name == "breast_cancer" else (y[:120, None] - y[:120].mean()) / y[:120].std())
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(lengthscales=np.sqrt(X.shape[1])), likelihood,
                               inducing_variable=X[:10].copy(), num_data=120)  # fmt: skip
    return model, (tf.constant(X), tf.constant(Y))


@pytest.mark.parametrize(
    ("name", "likelihood", "gamma"),
    [
        pytest.param("breast_cancer", gpflow.likelihoods.Bernoulli, 5.0, id="bernoulli-gamma-5", marks=pytest.mark.slow),  # 6 s
        pytest.param("diabetes", gpflow.likelihoods.StudentT, 3.0, id="studentt-gamma-3", marks=pytest.mark.slow),
        pytest.param("diabetes", gpflow.likelihoods.Gaussian, 2.5, id="gaussian-gamma-2.5", marks=pytest.mark.slow),
    ],
)
def test_real_data__a_gamma_that_crashes_training_fails_at_gpflows_failing_step(name, likelihood, gamma):
    """A γ that GPflow's optimizer cannot train with, on real data in fast mode (the default for M·L > 50 is fast;
    here M = 10, so the mode is asked): the check fails at the step where NaturalGradient(γ) run that many times
    fails, and the suggested γ trains for the look-ahead's k steps by GPflow's optimizer."""
    model, data = _sklearn_svgp(name, likelihood())
    report = check_natgrad(model, data, gamma=gamma, mode="fast", progress=False)
    assert not report.passed
    own = next(t for t in report.gamma_trials if t.gamma == gamma)
    losses, failed = _oracle(model, data, gamma, own.failed_step)
    assert failed == own.failed_step, (own, losses)
    assert report.check("step_health").detail.startswith(f"gamma = {gamma:g} fails at step {failed}")
    g = report.suggested_gamma
    assert g is not None and g < gamma and _oracle(model, data, g, K)[1] is None


@pytest.mark.slow
def test_suggestion__at_the_optimum_keeps_the_gamma_in_use_and_away_from_it_moves():
    """At the optimum every γ ties: the suggestion was one grid notch below the γ checked (1 → 0.3, 0.1 → 0.03), so a
    monitor's suggestion drifted down at every check. The oracle for the optimum: another GPflow NaturalGradient(1)
    step leaves the loss to rounding. Away from it (a fresh q(u)) γ = 1 is still suggested from γ = 0.1."""
    demo = make_model("svgp", "gaussian", num_inducing=8, num_data=60)
    model, data = demo.model, tuple(tf.constant(d) for d in demo.data)
    fresh = gpflow.utilities.deepcopy(model)
    opt = gpflow.optimizers.NaturalGradient(1.0)
    for _ in range(3):
        opt.minimize(lambda: model.training_loss(data), [(model.q_mu, model.q_sqrt)])
    before = float(model.training_loss(data))
    copy_ = gpflow.utilities.deepcopy(model)
    opt.minimize(lambda: copy_.training_loss(data), [(copy_.q_mu, copy_.q_sqrt)])
    assert abs(float(copy_.training_loss(data)) - before) <= 1e-8 * abs(before)
    for gamma in (1.0, 0.1):
        assert check_natgrad(model, data, gamma=gamma, mode="fast", progress=False).suggested_gamma == gamma
    assert check_natgrad(fresh, data, gamma=0.1, mode="fast", progress=False).suggested_gamma == 1.0
