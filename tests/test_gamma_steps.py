"""γ by the loss after k steps: check_natgrad(..., gamma_steps=k) against GPflow's own optimizer.

The oracle is ``gpflow.optimizers.NaturalGradient(γ).minimize`` run k times on a ``gpflow.utilities.deepcopy`` of the
model, the loss read after each step (None from the first step that raises or leaves a non-finite loss).

The model: the StudentT demo SVGP with M = 8, N = 30, seed 1 (natgrad_diag.demo.make_model). Found by running the
oracle for k = 1 and k = 5 over 18 demo models (Bernoulli, StudentT, Poisson; M = 5, 8; seeds 0-2): 4 had a different
best γ after 5 steps than after one, and this is the one where the long step is the cause: γ = 0.5 has the lowest
loss after one step (69.03, against 70.43 for γ = 0.2, from 121.66), but its second step raises the loss (89.87) and
its third gives NaN (GPflow refuses to assign it); γ = 1 gives NaN at step 2. After 3 steps γ = 0.2 is best (23.11).
(In the other three the best γ after 5 steps is the larger one: small steps pay off less over several steps.)
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
from natgrad_diag.demo import make_model
from natgrad_diag.exceptions import InputError
from natgrad_diag.checks.health import GAMMA_GRID

K = 3

# Tolerance of ours against GPflow's losses after k steps. Each step of ours equals GPflow's to rounding, ε·κ(S)
# relative (closed_form.py's bound; the report's `reproduction` check measures it: 0 to 4e-10 absolute here); a
# difference δ in q(u) reaches the next step amplified by at most the step map's derivative, of the order of κ(S_new)
# (≈ 32 in the report), so after k = 3 steps q(u) differs by ≲ ε·κ(S)·32³ ≈ 2e-16·3·3e4 ≈ 2e-11 relative, and the loss,
# whose gradient is ≈ 10 against values ≥ 20, by the same order. 1e-9 relative leaves a factor 50 over that bound;
# the measured agreement is about 1e-15.
RTOL = 1e-9


def _oracle(model, data, gamma: float, k: int, xi=None) -> tuple[list[float], int | None]:
    """GPflow's NaturalGradient(gamma).minimize run k times eagerly on a fresh deep copy: the loss after each step, and
    the first step that raised, left a NaN in q(u) or a q_sqrt diagonal entry ≤ 0 (None if none did)."""
    copy_ = gpflow.utilities.deepcopy(model)
    opt = gpflow.optimizers.NaturalGradient(gamma, xi_transform=xi or gpflow.optimizers.XiNat())

    def loss():
        return copy_.training_loss(data) if data is not None else copy_.training_loss()

    losses: list[float] = []
    for j in range(1, k + 1):
        try:
            opt.minimize(loss, [(copy_.q_mu, copy_.q_sqrt)])
        except tf.errors.InvalidArgumentError:  # GPflow refuses to assign a NaN q(u)
            return losses, j
        value, q_sqrt = float(loss().numpy()), copy_.q_sqrt.numpy()
        if not np.isfinite(value) or not np.isfinite(q_sqrt).all() or (np.diagonal(q_sqrt, axis1=1, axis2=2) <= 0).any():
            return losses, j
        losses.append(value)
    return losses, None


def _best(losses: dict[float, float | None], before: float) -> float | None:
    """The oracle's rule: the lowest loss among healthy trials that lower it; ties (within 1e-12 relative) to the smaller γ."""
    usable = {g: v for g, v in losses.items() if v is not None and v < before}
    if not usable:
        return None
    low = min(usable.values())
    return min(g for g, v in usable.items() if v <= low + 1e-12 * abs(low))


@pytest.fixture(scope="module")
def studentt():
    demo = make_model("svgp", "studentt", num_inducing=8, num_data=30, seed=1)
    return demo.model, demo.data


@pytest.fixture(scope="module")
def oracle(studentt):
    """γ → (losses after steps 1..k, failed step or None), by GPflow's optimizer (about 30 eager steps, 3-5 s)."""
    model, data = studentt
    return {g: _oracle(model, data, g, K) for g in GAMMA_GRID}


@pytest.fixture(scope="module")
def report_1(studentt):
    model, data = studentt
    return check_natgrad(model, data, gamma=1.0, mode="full", progress=False)


@pytest.fixture(scope="module")
def report_k(studentt):
    model, data = studentt
    before = variables_of(model)
    report = check_natgrad(model, data, gamma=1.0, mode="full", gamma_steps=K, progress=False)
    assert same_bits(before, variables_of(model))
    return report


def test_gamma_losses__after_k_steps_equal_gpflows_optimizer_run_k_times(report_k, oracle):
    assert report_k.gamma_steps == K
    assert [t.gamma for t in report_k.gamma_trials] == list(GAMMA_GRID)
    for g, (losses, failed) in oracle.items():
        ours = report_k.gamma_losses[g]
        if failed is None:
            assert ours == pytest.approx(losses[-1], rel=RTOL), g
        else:
            trial = next(t for t in report_k.gamma_trials if t.gamma == g)
            assert ours is None and not trial.healthy, g
            assert trial.reason.startswith(f"step {failed} of {K}: "), (g, trial.reason)
    assert {g for g, (_, failed) in oracle.items() if failed} == {1.0, 0.5}  # the case is what the docstring says


def test_gamma_losses__a_step_failing_midway_names_the_step(report_k, oracle):
    trials = {t.gamma: t for t in report_k.gamma_trials}
    assert oracle[1.0][1] == 2 and oracle[0.5][1] == 3  # GPflow's optimizer fails there too
    assert trials[1.0].reason == "step 2 of 3: 44 NaN/Inf value(s) in the new q_mu or q_sqrt"  # all 8 + 36 entries
    assert trials[0.5].reason.startswith("step 3 of 3: ") and "NaN/Inf" in trials[0.5].reason
    assert report_k.to_dict()["gamma_losses"]["0.5"] is None


def test_suggested_gamma__is_the_lowest_loss_after_k_steps(report_k, oracle):
    after_k = {g: (None if failed else losses[-1]) for g, (losses, failed) in oracle.items()}
    assert report_k.suggested_gamma == _best(after_k, report_k.loss_before) == 0.2


def test_best_gamma__after_one_step_differs_from_after_k_steps(report_1, report_k, oracle):
    """γ = 0.5 wins after one step (GPflow's numbers) and fails at step 3; after 3 steps γ = 0.2 wins."""
    after_1 = {g: (losses[0] if losses else None) for g, (losses, _) in oracle.items()}
    assert _best(after_1, report_1.loss_before) == report_1.suggested_gamma == 0.5
    assert report_k.suggested_gamma == 0.2
    assert after_1[0.5] < after_1[0.2] < report_1.loss_before  # one step: 0.5 lowers the loss most


def test_gamma_steps_1__equals_todays_numbers(studentt, report_1, oracle):
    """k = 1 is the loss after one step (GPflow's), the same report as without the argument, and today's γ table."""
    from natgrad_diag.report.records import Section, Table, format_number

    model, data = studentt
    report = check_natgrad(model, data, gamma=1.0, mode="full", progress=False, gamma_steps=1)
    assert report.gamma_steps == 1 and all(t.steps == 1 for t in report.gamma_trials)
    assert report.gamma_losses == report_1.gamma_losses and str(report) == str(report_1)
    for g, (losses, _) in oracle.items():
        assert report.gamma_losses[g] == pytest.approx(losses[0], rel=RTOL), g  # every first step of the grid is healthy
    def marked(g: float) -> str:
        marks = ["checked"] * (g == report.gamma) + ["suggested"] * (g == report.suggested_gamma)
        return f"{g:g}" + (f" ({', '.join(marks)})" if marks else "")

    today = Section("Step lengths tried (loss after 1 step)", "", (Table(
        columns=("gamma", "healthy", "loss after 1 step", "note"),
        rows=tuple((marked(t.gamma), "yes" if t.healthy else "no", format_number(t.loss, 10), t.reason)
                   for t in sorted(report.gamma_trials, key=lambda t: -t.gamma)),
        title="Largest first; the suggestion has the lowest loss after 1 step",
    ),), None, ("gamma",))  # fmt: skip
    assert [sec for sec in report.sections() if sec.heading.startswith("Step lengths tried")] == [today]
    assert "gamma_steps" in report.to_dict() and report.to_dict()["gamma_steps"] == 1


def test_fast_mode__measures_gammas_own_step_over_k_steps(studentt, oracle):
    """Fast mode keeps γ only when its k steps lower the loss; here γ = 1 fails at step 2, so the grid below is searched."""
    model, data = studentt
    before = variables_of(model)
    report = check_natgrad(model, data, gamma=1.0, mode="fast", gamma_steps=K, progress=False)
    assert same_bits(before, variables_of(model))
    assert [t.gamma for t in report.gamma_trials] == list(GAMMA_GRID)  # γ's own, then the grid below it
    assert report.gamma_trials[0].reason.startswith("step 2 of 3: ")
    for g, (losses, failed) in oracle.items():
        assert (report.gamma_losses[g] is None) == (failed is not None), g
        if failed is None:
            assert report.gamma_losses[g] == pytest.approx(losses[-1], rel=RTOL), g
    assert report.suggested_gamma == 0.2
    assert check_natgrad(model, data, gamma=1.0, mode="fast", progress=False).suggested_gamma == 1.0  # k = 1 keeps γ


def test_report__says_k_in_the_table_title_and_json(report_k):
    text = str(report_k)
    assert "Step lengths tried (loss after 3 steps)" in text
    assert "Each gamma is measured by the loss after 3 natural-gradient steps" in text
    assert "Suggested gamma: 0.2 (the lowest loss after 3 steps)." in report_k.check("step_health").detail.replace("\n", " ")
    d = json.loads(json.dumps(report_k.to_dict()))
    assert d["gamma_steps"] == 3 and d["suggested_gamma"] == 0.2 and d["gamma_losses"]["1"] is None


@pytest.mark.parametrize(
    ("kind", "build", "xi"),
    [
        pytest.param("svgp", lambda: make_model("svgp", "studentt", num_inducing=8, num_data=30, seed=1), "meanvar", id="svgp-closed-form-sqrtmeanvar"),
        pytest.param("vgp", lambda: make_model("vgp", "studentt", num_data=10, seed=0), "subclass", id="vgp-natgrad_tensors"),
    ],
)
def test_gamma_losses__other_xi_and_models_equal_gpflows_optimizer(kind, build, xi):
    """XiSqrtMeanVar (closed form; q_sqrt leaves the cone at step 1 for γ ≥ 0.2) and an XiNat subclass (natgrad_tensors)."""
    from natgrad_diag.step.backend import step_backend

    class MyXiNat(gpflow.optimizers.XiNat):
        """Not GPflow's exact class: the closed form does not apply, natgrad_tensors takes the step."""

    demo = build()
    model, data = demo.model, (demo.data if kind == "svgp" else None)
    xi_t = gpflow.optimizers.XiSqrtMeanVar() if xi == "meanvar" else MyXiNat()
    report = check_natgrad(model, data, gamma=0.1, mode="full", xi_transform=xi_t, gamma_steps=2, progress=False)
    assert step_backend(xi_t, model.q_sqrt.transform).xi == ("sqrtmeanvar" if xi == "meanvar" else None)  # the k steps' maths
    tf_data = None if data is None else tuple(tf.constant(d) for d in data)
    oracle = {g: _oracle(model, tf_data, g, 2, xi_t) for g in (1.0, 0.5, 0.2, 0.05)}
    for g, (losses, failed) in oracle.items():
        trial = next(t for t in report.gamma_trials if t.gamma == g)
        if failed is None:
            assert trial.loss == pytest.approx(losses[-1], rel=RTOL), g
        else:
            assert trial.loss is None and trial.reason.startswith(f"step {failed} of 2: "), (g, trial.reason)
    if xi == "meanvar":
        assert oracle[0.5][1] == 1 and "non-positive diagonal entry" in next(t for t in report.gamma_trials if t.gamma == 0.5).reason


def test_tracing__once_per_model_not_per_gamma_nor_per_call():
    """Fast mode's k steps run in one compiled while_loop: traced once per model, not per γ, k or call."""
    demo = make_model("svgp", "studentt", num_inducing=4, num_data=10, seed=2)  # new variables: a new compiled run
    before = _compile.trace_count("gamma_steps")
    first = check_natgrad(demo.model, demo.data, gamma=5.0, mode="fast", gamma_steps=2, progress=False)  # γ = 5 fails
    assert [t.gamma for t in first.gamma_trials] == [5.0, *GAMMA_GRID]  # γ's own, then every γ of the grid below it
    assert _compile.trace_count("gamma_steps") == before + 1
    again = check_natgrad(demo.model, demo.data, gamma=3.0, mode="fast", gamma_steps=4, progress=False)  # other γ, k
    assert [t.gamma for t in again.gamma_trials] == [3.0, *GAMMA_GRID] and again.gamma_steps == 4
    assert _compile.trace_count("gamma_steps") == before + 1


def test_full_mode__takes_the_k_steps_eagerly():
    demo = make_model("svgp", "studentt", num_inducing=4, num_data=10, seed=4)
    before = _compile.trace_count("gamma_steps") + _compile.trace_count("gamma_steps_replay")
    report = check_natgrad(demo.model, demo.data, gamma=1.0, mode="full", gamma_steps=2, progress=False)
    assert [t.gamma for t in report.gamma_trials] == list(GAMMA_GRID)
    assert _compile.trace_count("gamma_steps") + _compile.trace_count("gamma_steps_replay") == before


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
    value, why = evaluator(ctx, compiled=True).trial(g_mu.numpy(), g_sq.numpy(), 0.1, 2, lambda mu, sq: (True, ""))
    assert why == "" and value == pytest.approx(_oracle(model, data, 0.1, 2)[0][-1], rel=RTOL)
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
    assert says in text and "Argument: gamma_steps" in text and f"Got:      {value!r}" in text and "To fix: pass gamma_steps=1" in text
    with pytest.raises(InputError, match="gamma_steps"):
        assert_natgrad(model, data, gamma_steps=value)


def test_gamma_steps__numpy_ints_are_accepted(studentt):
    from natgrad_diag.checks.api import validate_gamma_steps

    assert validate_gamma_steps(np.int64(4)) == 4


def test_gamma_steps__var_list_form_measures_each_gamma_after_k_steps_as_gpflows_optimizer(studentt, oracle):
    # The var_list form (any loss, any (q_mu, q_sqrt) pair: GPflux layers use it) takes its k steps eagerly on the
    # pair itself, restored bit for bit; the oracle is GPflow's optimizer run k times on deep copies.
    model, data = studentt
    before = variables_of(model)
    r = check_natgrad(lambda: model.training_loss(data), var_list=[(model.q_mu, model.q_sqrt)], gamma=1.0, mode="full", gamma_steps=K)
    report = r.pairs[0]
    assert report.gamma_steps == K and set(report.gamma_losses) == set(GAMMA_GRID)
    for gamma, got in report.gamma_losses.items():
        want, failed_at = oracle[gamma]
        if failed_at is not None and failed_at <= K:
            trial = next(t for t in report.gamma_trials if t.gamma == gamma)
            assert got is None and trial.reason.startswith(f"step {failed_at} of {K}:"), (gamma, trial)
        else:
            assert got == pytest.approx(want[K - 1], rel=RTOL), gamma
    assert report.suggested_gamma == _best({g: (w[K - 1] if f is None else None) for g, (w, f) in oracle.items()}, report.loss_before)
    assert same_bits(before, variables_of(model))


def test_monitor__passes_gamma_steps_to_its_check(studentt):
    from natgrad_diag import NatGradMonitor

    model, data = studentt
    assert NatGradMonitor(model, data, gamma=1.0, gamma_steps=K).check(0).suggested_gamma == 0.2
    assert NatGradMonitor(model, data, gamma=1.0).check(0).suggested_gamma == 1.0
    with pytest.raises(InputError, match="Argument: gamma_steps"):
        NatGradMonitor(model, data, gamma_steps=0)


def test_cli__gamma_steps_flag(capsys):
    from natgrad_diag.cli.app import main

    argv = ["check", "--likelihood", "studentt", "--num-inducing", "8", "--num-data", "30", "--seed", "1", "--mode", "full"]
    assert main([*argv, "--gamma-steps", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gamma_steps"] == 3 and out["suggested_gamma"] == 0.2 and out["gamma_losses"]["1"] is None
    assert main([*argv, "--gamma-steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "argument --gamma-steps: expected an integer from 1 to 1000 (steps per gamma tried), got '0'" in err
    assert main([*argv, "--gamma-steps", "2.5", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["exit_code"] == 2


class _CheckedSVGP(gpflow.models.SVGP):
    """An SVGP whose ELBO raises (tf.debugging.check_numerics) instead of returning NaN: an op that raises mid-run."""

    def elbo(self, data):
        return tf.debugging.check_numerics(super().elbo(data), "the ELBO is not finite")


def test_gamma_losses__an_op_raising_midway_is_replayed_to_name_the_step(studentt, oracle):
    """When an op raises inside the compiled k steps (fast mode), they are replayed one by one; full mode takes them
    one by one eagerly. Either way the trial names the step, and GPflow's optimizer fails at the same step."""
    model, data = studentt
    checked = _CheckedSVGP(
        model.kernel, model.likelihood, model.inducing_variable, num_data=model.num_data, whiten=model.whiten,
        q_mu=model.q_mu.numpy(), q_sqrt=model.q_sqrt.numpy(),
    )  # fmt: skip
    replays = _compile.trace_count("gamma_steps_replay")
    fast = check_natgrad(checked, data, gamma=1.0, mode="fast", gamma_steps=K, progress=False)
    assert _compile.trace_count("gamma_steps_replay") == replays + 1  # the single step, compiled on first need
    full = check_natgrad(checked, data, gamma=1.0, mode="full", gamma_steps=K, progress=False)
    for report in (fast, full):
        trials = {t.gamma: t for t in report.gamma_trials}
        for g in (1.0, 0.5):
            failed = oracle[g][1]
            assert trials[g].reason.startswith(f"step {failed} of {K}: ") and "the ELBO is not finite" in trials[g].reason, trials[g]
        for g, (losses, failed) in oracle.items():
            if failed is None:
                assert trials[g].loss == pytest.approx(losses[-1], rel=RTOL), g
