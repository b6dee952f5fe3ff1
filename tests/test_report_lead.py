"""The natural-gradient report leads with the answer, its γ table and picture show the trials, and a training
monitor's timeline is written with its picture.

Oracles: the GammaTrial, Check, NatGradRecord and GuardRecord objects built here (the numbers the picture and the
tables must show), matplotlib's own line data read back from the figure, Python's html.parser, and for one real
report GPflow's own NaturalGradient run on a copy of the model.
"""

from __future__ import annotations

import base64
import dataclasses

import numpy as np
import pytest

from natgrad_diag import to_terminal, write_report
from natgrad_diag.checks.causes import Cause
from natgrad_diag.checks.report import GammaTrial, NatGradReport
from natgrad_diag import pictures as plots
from natgrad_diag.report.html import to_html_fragment
from natgrad_diag.report.records import Check, format_number
from natgrad_diag.report.timeline import TrainingTimeline, timeline_html, timeline_of
from natgrad_diag.training.records import GuardRecord, NatGradRecord
from tests.test_render import PNG_SIGNATURE, _Parsed

CAUSE = "γ = 5 fails at step 2: Cholesky of S not positive definite; γ = 1 trains"
TRIALS = (
    GammaTrial(5.0, False, None, "step 2 of 5: Cholesky failed", 5, (30.0,), 2),
    GammaTrial(10.0, False, None, "step 1 of 5: NaN", 5, (), 1),
    GammaTrial(1.0, True, 20.5, "lowers the loss", 5, (30.0, 25.0, 22.0, 21.0, 20.5)),
    GammaTrial(0.1, True, 35.25, "lowers the loss", 5, (39.0, 38.0, 37.0, 36.0, 35.25)),
    GammaTrial(0.01, True, 39.5, "lowers the loss", 5),  # losses not filled: rendered all the same
)


def _report(*, failing: bool = True, **changes) -> NatGradReport:
    checks = (
        Check("reproduction", "GPflow's step equals natgrad-diag's", True, 0.0, 1e-10, detail="q_mu: 0, q_sqrt: 0"),
        Check("step_health", "the step with gamma = 5 keeps q(u) valid over 5 steps", not failing, detail=CAUSE if failing else "loss 40 → 20"),
        Check("loss_gradient", "gradients equal central differences", True, 1e-9, 1e-5),
    )  # fmt: skip
    fields = dict(
        model_name="SVGP", likelihood="Bernoulli", num_inducing=8, num_latent=1, num_data=30, dtype="float64",
        whiten=True, xi_transform="XiNat", gamma=5.0 if failing else 1.0, mode="full", loss_before=40.0,
        loss_after=None if failing else 30.0, suggested_gamma=1.0, step_error="", gamma_trials=TRIALS, skipped=(),
        warnings=(), numbers=(("cond(F)", 4.0),), checks=checks,
    )  # fmt: skip
    fields.update(changes)
    return NatGradReport(**fields)


def test_str__first_lines_are_the_verdict_and_the_failing_checks_cause():
    lines = str(_report()).splitlines()
    head = " ".join(" ".join(lines[:8]).split())
    assert lines[3] == "Verdict: 1 of 3 check(s) FAILED."
    assert f"FAIL step_health: {CAUSE}" in head and "Suggested gamma: 1 (gamma = 5 checked)" in head
    text = str(_report())
    assert text.index("Step lengths tried") < text.index("Checks") < text.index("Model and step")
    assert text.index("FAIL   step_health") < text.index("PASS   reproduction")  # failed checks first


def test_str__a_cause_is_shown_once_with_its_fix():
    cause = Cause("step_too_long", ("step_health",), "with gamma = 5 the step produced NaN.", "use gamma = 1.")
    report = _report(causes=(cause,))
    head = " ".join(str(report).split("Step lengths tried")[0].split())
    assert f"FAIL step_health: {' '.join(str(cause).split())}" in head and CAUSE not in head


def test_str__a_pass_leads_with_the_suggested_gamma():
    lines = str(_report(failing=False)).splitlines()
    assert lines[3] == "Verdict: all checks hold."
    assert " ".join(lines[4:6]).startswith("Suggested gamma: 1 (the gamma checked): the lowest loss after 5 steps of the 5 gamma")


def test_gamma_table__rows_are_the_trials_largest_first_with_the_marks():
    section = next(s for s in _report().sections() if s.heading.startswith("Step lengths tried"))
    (table,) = section.tables
    assert table.columns == ("gamma", "healthy", "loss after 5 steps", "note") and section.figures == ("gamma",)
    want = sorted(TRIALS, key=lambda t: -t.gamma)
    assert [float(r[0].split()[0]) for r in table.rows] == [t.gamma for t in want]
    assert [r[1] for r in table.rows] == ["no: step 1", "no: step 2", "yes", "yes", "yes"]
    assert [None if r[2] == "-" else float(r[2]) for r in table.rows] == [t.loss for t in want]
    assert [r[3] for r in table.rows] == [t.reason for t in want]
    assert table.rows[1][0] == "5 (checked)" and table.rows[2][0] == "1 (suggested)"


def _lines(fig):
    return {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}


def test_to_dict__keeps_each_trials_losses_and_failed_step():
    import json

    trials = json.loads(json.dumps(_report().to_dict()))["gamma_trials"]
    assert [(t["gamma"], t["losses"], t["failed_step"]) for t in trials] == [(t.gamma, list(t.losses), t.failed_step) for t in TRIALS]


def test_gamma_picture__plots_the_trials_losses_and_marks_the_failed_and_the_suggestion():
    pytest.importorskip("matplotlib")
    fig = plots.plot_gamma_losses(_report())
    (ax,) = fig.axes
    lines = _lines(fig)
    healthy = sorted((t for t in TRIALS if t.healthy), key=lambda t: t.gamma)
    np.testing.assert_array_equal(lines["loss after 5 steps"].get_xdata(), [t.gamma for t in healthy])
    np.testing.assert_array_equal(lines["loss after 5 steps"].get_ydata(), [t.loss for t in healthy])
    np.testing.assert_array_equal(lines["failed (at step j)"].get_xdata(), [5.0, 10.0])
    assert lines["failed (at step j)"].get_transform() != ax.transData  # at the top edge, whatever the losses
    assert {t.get_text() for t in ax.texts} == {"step 1", "step 2"}
    np.testing.assert_array_equal(lines["suggested gamma = 1"].get_xydata(), [[1.0, 20.5]])
    np.testing.assert_array_equal(lines["gamma checked = 5"].get_xdata(), [5.0, 5.0])
    np.testing.assert_array_equal(lines["loss before any step"].get_ydata(), [40.0, 40.0])
    assert ax.get_xscale() == "log"


def test_pictures__the_gamma_picture_with_the_table_the_error_bars_only_when_they_inform():
    pytest.importorskip("matplotlib")
    assert plots.picture_kinds(_report()) == ("gamma",)  # every check passes: no bars
    off = dataclasses.replace(_report(), checks=(*_report().checks, Check("fisher_identity", "F⁻¹∇θL = ∇ηL", False, 1e-3, 1e-8)))
    assert plots.picture_kinds(off) == ("gamma", "checks")
    assert plots.picture_kinds(_report(gamma_trials=())) == ()


def test_html_and_markdown__lead_then_table_and_picture_then_checks(tmp_path):
    pytest.importorskip("matplotlib")
    report = _report()
    fragment = report._repr_html_()
    parsed = _Parsed(fragment)
    assert parsed.errors == [] and parsed.stack == []
    assert fragment.index(CAUSE) < fragment.index("<h2>Step lengths tried") < fragment.index('id="figure-gamma"')
    assert fragment.index('id="figure-gamma"') < fragment.index("<h2>Checks</h2>") < fragment.index("<h2>Model and step")
    assert len(parsed.images) == 1 and base64.b64decode(parsed.images[0]["src"].split(",", 1)[1]).startswith(PNG_SIGNATURE)
    written = write_report(report, tmp_path / "r.md")
    md = written.path.read_text()
    assert [p.name for p in written.images] == ["r-gamma.png"]
    assert md.index("FAIL step\\_health") < md.index("## Step lengths tried") < md.index("(r-gamma.png)") < md.index("## Checks")


def test_var_list_form__each_pair_has_its_lead_line_table_and_picture():
    pytest.importorskip("matplotlib")
    pair = dataclasses.replace(_report(), model_name="q_mu, q_sqrt")
    both = NatGradReport.of_pairs((pair, _report(failing=False, model_name="q_mu, q_sqrt")), "fast")
    assert both.lead.splitlines()[0].startswith(f"- pair 0 (q_mu, q_sqrt): FAIL. - FAIL step_health: {CAUSE}")
    assert both.lead.splitlines()[1].startswith("- pair 1 (q_mu, q_sqrt): PASS. Suggested gamma: 1")
    assert [p.name for p in both.figures()] == ["gamma-0", "gamma-1"]
    assert to_html_fragment(both).count("<img") == 2 and "<h2>Checks</h2>" not in to_html_fragment(both)


def test_without_matplotlib__repr_html_has_the_tables_and_a_note(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    fragment = _report()._repr_html_()
    assert "matplotlib is not installed" in fragment and "<img" not in fragment and CAUSE in fragment


# ---- the training timeline ----

RECORDS = tuple(
    NatGradRecord(step=s, loss=100.0 / (s + 1), loss_after=90.0 / (s + 1), reproduction_error=1e-15,
                  reproduction_passed=True, step_healthy=s != 20, suggested_gamma=1.0 if s != 20 else 0.5,
                  passed=s != 20, detail="" if s != 20 else "step_health: γ = 1 fails at step 2")
    for s in range(0, 50, 10)
)  # fmt: skip
GUARDS = tuple(
    GuardRecord(step=s, status="failed" if s == 23 else "ok", rolled_back=s == 23, gamma_before=1.0 if s <= 23 else 0.5,
                gamma_after=1.0 if s < 23 else 0.5, cause="Cholesky failed" if s == 23 else "",
                loss_before=100.0 / (s + 1), loss_after=99.0 / (s + 1))
    for s in range(50)
)  # fmt: skip


class _Monitor:
    """What a NatGradMonitor offers a report: records, guard_records and gamma (duck typing)."""

    def __init__(self):
        self.records, self.guard_records, self.gamma = list(RECORDS), list(GUARDS), 0.5


def test_timeline_picture__plots_the_records_loss_gamma_failures_and_rollbacks():
    pytest.importorskip("matplotlib")
    fig = plots.plot_training_timeline(_Monitor())
    lines = _lines(fig)
    np.testing.assert_array_equal(lines["loss (periodic checks)"].get_xydata(), [[r.step, r.loss] for r in RECORDS])
    np.testing.assert_array_equal(lines["loss (guarded steps)"].get_xydata(), [[r.step, r.loss_before] for r in GUARDS])
    np.testing.assert_array_equal(lines["gamma used"].get_xydata(), [[r.step, r.gamma_before] for r in GUARDS])
    assert lines["gamma used"].get_drawstyle() == "steps-post" and fig.axes[1].get_yscale() == "log"
    np.testing.assert_array_equal(lines["check failed"].get_xdata(), [20])
    np.testing.assert_array_equal(lines["guarded step failed"].get_xdata(), [23])
    np.testing.assert_array_equal(lines["rollback"].get_xdata(), [23, 23])
    np.testing.assert_array_equal(lines["suggested gamma"].get_ydata(), [r.suggested_gamma for r in RECORDS])


def test_write_report__a_monitor_becomes_its_timeline_in_html_and_markdown(tmp_path):
    pytest.importorskip("matplotlib")
    html_file = write_report(_Monitor(), tmp_path / "train.html")
    parsed = _Parsed(html_file.path.read_text())
    assert parsed.errors == [] and len(parsed.images) == 1 and html_file.images == ()
    rows = [parsed.cells[i : i + 5] for i in range(parsed.cells.index("why") + 1, parsed.cells.index("why") + 11, 5)]
    assert [r[:2] for r in rows] == [["20", "check failed"], ["23", "rolled back"]]
    assert rows[0][4] == RECORDS[2].detail and rows[1][4] == "Cholesky failed" and rows[1][2] == "1 → 0.5"
    md = write_report(_Monitor(), tmp_path / "train.md")
    assert [p.name for p in md.images] == ["train-timeline.png"]
    assert md.images[0].read_bytes().startswith(PNG_SIGNATURE)
    text = str(TrainingTimeline(RECORDS, GUARDS, 0.5))
    assert text.splitlines()[2] == "Verdict: 2 of 2 check(s) FAILED."
    assert "- step 20: check failed: step_health: γ = 1 fails at step 2" in text.splitlines()[4:6]
    assert "gamma used: 1 (steps 0–23); 0.5 (steps 24–49)." in text


def test_timeline__of_a_real_monitor_and_its_html_fragment():
    """Duck typing against the real NatGradMonitor: its records and γ, without running a step."""
    pytest.importorskip("matplotlib")
    import gpflow

    from natgrad_diag import NatGradMonitor

    X = np.linspace(0.0, 1.0, 10)[:, None]
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(), X[:3].copy(), num_data=10)
    gpflow.set_trainable(model.q_mu, False)  # as docs/training.md sets them up: the monitor warns otherwise
    gpflow.set_trainable(model.q_sqrt, False)
    monitor = NatGradMonitor(model, (X, np.sin(X)), gamma=0.5)
    monitor.records.extend(RECORDS)
    fragment = timeline_html(monitor)
    assert 'id="figure-timeline"' in fragment and "Verdict: <span class=\"fail\">1 of 1 check(s) FAILED." in fragment
    assert "; gamma now 0.5." in fragment
    text = to_terminal(monitor, plain=True)  # what write_report writes of a monitor, the terminal shows too
    assert "Verdict: 1 of 1 check(s) FAILED." in text and "; gamma now 0.5." in text


@pytest.mark.parametrize("call, argument", [
    (lambda r: to_terminal(42), "report"), (lambda r: to_terminal(r, width="80"), "width"),
    (lambda r: to_terminal(r, width=0), "width"), (lambda r: to_terminal(r, plain="yes"), "plain"),
])  # fmt: skip
def test_to_terminal__what_it_cannot_show_is_an_input_error_naming_the_argument(call, argument):
    """An int, a width of 0 (which rendered an empty report) and a string flag were raw Python errors or quietly
    wrong."""
    from natgrad_diag.exceptions import InputError

    with pytest.raises(InputError, match=rf"Argument: +{argument}\n"):
        call(TrainingTimeline(tuple(RECORDS), (), 0.5))


@pytest.mark.slow
def test_timeline_lead__of_a_real_run_starts_at_the_loss_before_training_and_counts_the_rollback():
    """Step 0 lowers the loss and is checked (a check and a guard record at step 0); at step 1 γ = 10 leaves the cone
    and is rolled back. Oracles: the model's training loss before and after training, GPflow's own γ = 10 step on a
    copy (it raises), and q(u) after step 1 equal to q(u) before it."""
    import gpflow
    import tensorflow as tf

    from natgrad_diag import NatGradMonitor
    from natgrad_diag.demo import make_model

    m, (X, Y) = make_model("svgp", "bernoulli", num_inducing=8, num_data=30)
    data = (tf.constant(X), tf.constant(Y))
    gpflow.set_trainable(m.q_mu, False)
    gpflow.set_trainable(m.q_sqrt, False)
    start = float(m.training_loss(data))
    monitor = NatGradMonitor(m, data, gamma=1.0, on_failure="rollback", every=2)
    natgrad = gpflow.optimizers.NaturalGradient(tf.Variable(1.0, dtype=tf.float64))
    for step in range(4):
        if step == 1:  # γ raised to 10: GPflow's own step with it fails on a copy
            natgrad.gamma.assign(10.0)
            copy, q_before = gpflow.utilities.deepcopy(m), (m.q_mu.numpy(), m.q_sqrt.numpy())
            pair = [(copy.q_mu, copy.q_sqrt)]
            with pytest.raises(tf.errors.InvalidArgumentError):
                gpflow.optimizers.NaturalGradient(10.0).minimize(lambda: copy.training_loss(data), pair)
        with monitor.guard(step, natgrad):
            natgrad.minimize(lambda: m.training_loss(data), [(m.q_mu, m.q_sqrt)])
        if step == 1:
            assert all(np.array_equal(a, b.numpy()) for a, b in zip(q_before, (m.q_mu, m.q_sqrt)))  # rolled back
        monitor(step)
    end = float(m.training_loss(data))
    assert end < start and monitor.records[0].step == 0 and monitor.records[0].loss < start  # checked after step 0
    lead = timeline_of(monitor).lead.splitlines()
    assert lead[0] == (f"Loss {format_number(start, 8)} at step 0, {format_number(end, 8)} after step 3; "
                       f"gamma now {monitor.gamma:g}.")  # fmt: skip
    assert lead[1] == "Failed: 0 of 2 periodic checks, 1 of 4 guarded steps (1 rolled back); the loss ended lower."
    assert lead[2].startswith("- step 1: rolled back: ")
