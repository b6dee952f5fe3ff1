"""The report of the natural-gradient checks: NatGradReport, the γ trials, and what each stage adds to it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from natgrad_diag.report.base import Report
from natgrad_diag.report.records import STATUSES, Check, Section, Table, format_number, to_jsonable
from natgrad_diag.typing import Array

__all__ = ["GammaTrial", "HealthResult", "NatGradReport", "Outcome"]


@dataclass(frozen=True)
class GammaTrial:
    """One step length γ tried for the suggestion: were its k = ``steps`` steps from the current q(u) ``healthy`` (q(u)
    valid, the loss finite), the ``loss`` after them (None when one failed), the ``reason`` ("lowers the loss", or why a
    step failed: "step 2 of 5: Cholesky failed"), the ``losses`` after each step taken (up to the failing one) and the
    ``failed_step`` (1-based; None when all k held)."""

    gamma: float
    healthy: bool
    loss: float | None
    reason: str = ""
    steps: int = 1
    losses: tuple[float, ...] = ()
    failed_step: int | None = None


@dataclass(frozen=True)
class HealthResult:
    """What the ``step_health`` stage found beside its check: the report's ``loss_after``, ``suggested_gamma``,
    ``gamma_trials`` and ``step_error`` (see :class:`NatGradReport`), and where no γ trains, the other ξ's
    (name, γ, loss after k steps) when one trains with it (:func:`~natgrad_diag.checks.health.other_xi`)."""

    loss_after: float | None
    suggested: float | None
    trials: tuple[GammaTrial, ...]
    step_error: str
    other: tuple[str, float, float] | None = None


@dataclass(frozen=True)
class Outcome:
    """What one stage of the checks adds to the report: its checks, the checks it skipped (name, why), numbers,
    warnings, and for the step-health stage the report's step fields. ``+`` joins outcomes in order.
    """

    checks: tuple[Check, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    numbers: tuple[tuple[str, float], ...] = ()
    warnings: tuple[str, ...] = ()
    health: HealthResult | None = None

    def __add__(self, other: Outcome) -> Outcome:
        joined = {f: getattr(self, f) + getattr(other, f) for f in ("checks", "skipped", "numbers", "warnings")}
        return Outcome(**joined, health=other.health or self.health)


@dataclass(frozen=True)
class NatGradReport(Report):
    """The natural-gradient checks on one model, one step length and one ξ transform.

    Attributes:
        model_name, likelihood, xi_transform: class names ("SVGP", "VGP", ...; "Gaussian", ...; "XiNat", ...).
        num_inducing, num_latent, num_data: M (N for a VGP), L, and N of the data used (None if unknown).
        dtype, gamma, mode: "float64" or "float32"; the step length checked; "full" (explicit Jacobians, grid
            search) or "fast" (matrix-free, compiled). whiten: SVGP's (True for a VGP; None in the var_list form).
        loss_before, loss_after: the training loss now and after the step (None if the step failed).
        suggested_gamma: the γ of the grid tried whose healthy step has the lowest loss after it, among those that
            lower the loss; ties to the smaller γ (None if none did or none was searched).
        step_error, gamma_trials: why the step failed ("" if it did not); the γ tried, each by the loss after
            :attr:`gamma_steps` steps.
        skipped: (check name, reason) for checks that do not apply or were skipped in fast mode.
        warnings: texts of the warnings issued (also sent through ``warnings.warn``).
        numbers, checks: (name, value) pairs of further numbers (jitter share, cond(F), ...); the named checks.
        new_q_mu, new_q_sqrt, dL_deta1, dL_deta2: [M, L], [L, M, M], [M, L], [L, M, M]: the step natgrad-diag
            computed and its ∂L/∂η (None if unavailable); not in ``to_dict()``.
        causes: why checks failed or were inconclusive (:class:`natgrad_diag.checks.causes.Cause` records, one of
            a documented set, each with evidence and fix); the reports show them first.
        pairs: the var_list form (``check_natgrad(loss_fn, var_list=...)``): one report per (q_mu, q_sqrt) pair;
            :attr:`checks` are then every pair's, named "pair i: name", and the sections are the pairs'.
    """

    model_name: str
    likelihood: str
    num_inducing: int
    num_latent: int
    num_data: int | None
    dtype: str
    whiten: bool | None
    xi_transform: str
    gamma: float
    mode: str
    loss_before: float | None
    loss_after: float | None
    suggested_gamma: float | None
    step_error: str
    gamma_trials: tuple[GammaTrial, ...]
    skipped: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...]
    numbers: tuple[tuple[str, float], ...]
    checks: tuple[Check, ...]
    new_q_mu: Array | None = field(default=None, repr=False, compare=False)
    new_q_sqrt: Array | None = field(default=None, repr=False, compare=False)
    dL_deta1: Array | None = field(default=None, repr=False, compare=False)
    dL_deta2: Array | None = field(default=None, repr=False, compare=False)
    causes: tuple[Any, ...] = ()
    pairs: tuple[NatGradReport, ...] = ()

    @classmethod
    def of_pairs(cls, reports: tuple[NatGradReport, ...], mode: str, joint: Check | None = None, suggested: float | None = None) -> NatGradReport:
        """The var_list form's report: ``reports[i]`` is pair i's; its checks, named "pair i: name", then ``joint``
        (``joint_step_health``: the pairs stepped together); ``suggested``: the γ they hold together, or the one pair's."""
        first = reports[0]
        return cls(
            model_name="var_list", likelihood="loss_fn", num_inducing=first.num_inducing, num_latent=first.num_latent,
            num_data=None, dtype=first.dtype, whiten=None, xi_transform=first.xi_transform, gamma=first.gamma, mode=mode,
            loss_before=first.loss_before, loss_after=None, suggested_gamma=suggested, step_error="", gamma_trials=(), skipped=(),
            warnings=(), numbers=(), pairs=reports,
            checks=tuple(dataclasses.replace(c, name=f"pair {i}: {c.name}") for i, r in enumerate(reports) for c in r.checks) + ((joint,) if joint else ()),
        )  # fmt: skip

    def pair_suggestions(self) -> list[float | None]:
        """The suggested γ of each pair in the var_list form, none above the γ the pairs hold together (when they fail
        together); ``[suggested_gamma]`` for a model."""
        if not self.pairs:
            return [self.suggested_gamma]
        cap = self.suggested_gamma
        return [s if cap is None or s is None else min(s, cap) for s in (r.suggested_gamma for r in self.pairs)]

    @property
    def title(self) -> str:  # type: ignore[override]
        if self.pairs:
            return f"Natural-gradient checks on {len(self.pairs)} (q_mu, q_sqrt) pair(s) of a var_list"
        return (
            f"Natural-gradient checks: {self.model_name} ({self.likelihood}), M = {self.num_inducing}, "
            f"L = {self.num_latent}, {self.dtype}, {self.xi_transform}, gamma = {self.gamma:g}, {self.mode} mode"
        )

    @property
    def gamma_steps(self) -> int:
        """k, each γ tried measured by the loss after k steps: the :attr:`gamma_trials`' ``steps`` (1 if none)."""
        return max((t.steps for t in self.gamma_trials), default=1)

    @property
    def gamma_losses(self) -> dict[float, float | None]:
        """γ → the loss after k steps with it (k = :attr:`gamma_steps`, 1 by default), for every γ tried (None where
        one of the steps failed or was unhealthy)."""
        return {t.gamma: (t.loss if t.healthy else None) for t in self.gamma_trials}

    def check(self, name: str) -> Check:
        """The check called ``name``; raises KeyError listing the names if there is none."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check named {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def sections(self) -> tuple[Section, ...]:
        """The answer first (the verdict's causes and fixes, the suggested γ), then the γ trials with their picture,
        the checks (failed first) and, further down, the model, the numbers, what was not checked, the warnings."""
        if self.pairs:
            joint = tuple(c for c in self.checks if c.name == "joint_step_health")
            return ((Section("All pairs together", "", (), joint),) if joint else ()) + tuple(
                Section(f"{r.model_name}: {s.heading}", s.text, s.tables, s.checks, tuple(f"{n}-{i}" for n in s.figures))
                for i, r in enumerate(self.pairs) for s in r.sections()
            )  # fmt: skip
        info = Table(("", "value"), (
            ("model", f"{self.model_name}, {self.likelihood} likelihood" + ("" if self.whiten is None else f", whiten={self.whiten}")),
            ("M, L, N", f"{self.num_inducing}, {self.num_latent}, {'-' if self.num_data is None else self.num_data}"),
            ("dtype", self.dtype), ("xi_transform, gamma", f"{self.xi_transform}, {self.gamma:g}"), ("mode", self.mode),
            ("loss before step", format_number(self.loss_before, 10)),
            ("loss after step", format_number(self.loss_after, 10) if self.step_error == "" else "step failed"),
            ("suggested gamma", "-" if self.suggested_gamma is None else f"{self.suggested_gamma:g}"),
        ))  # fmt: skip
        nums = Table(columns=("number", "value"), rows=tuple((k, format_number(v, 6)) for k, v in self.numbers))
        worst_first = tuple(sorted(self.checks, key=lambda c: -STATUSES.index(c.status)))
        candidates = (
            (self.gamma_trials, self._gamma_section()),
            (True, Section("Checks", "", (), worst_first, ("checks",))), (True, Section("Model and step", "", (info,))),
            (self.numbers, Section("Further numbers", "", (nums,))),
            (self.skipped, Section("Not checked", "\n".join(f"- {name}: {why}" for name, why in self.skipped))),
            (self.warnings, Section("Warnings", "\n".join(f"- {w}" for w in self.warnings))),
        )  # fmt: skip
        return tuple(section for present, section in candidates if present)

    @property
    def lead(self) -> str:
        """What every form of the report shows first, under the verdict: each failed or inconclusive check with why,
        the causes with their fixes, the step's error, the suggested γ; in the var_list form one line per pair."""
        if self.pairs:
            together = [f"- {c.mark} {c.name}: {c.detail}" for c in self.checks if c.name == "joint_step_health" and not c.passed]
            return "\n".join([f"- pair {i} ({r.model_name}): {r.status.upper()}. {r.lead}".replace("\n", " ").rstrip()
                              for i, r in enumerate(self.pairs)] + together)  # fmt: skip
        bad = [c for status in ("fail", "warn") for c in self.checks if c.status == status]
        explained = {name for cause in self.causes for name in cause.checks}
        lines = [f"- {c.mark} {c.name}: {c.detail or c.claim}" for c in bad if c.name not in explained]
        marks = {c.name: c.mark for c in bad}  # each cause with the checks it explains, its evidence and fix
        lines += ["- " + " ".join(f"{marks.get(n, 'PASS')} {n}" for n in cause.checks) + f": {cause}" for cause in self.causes]
        if self.step_error and not any(self.step_error.split(": ", 1)[-1] in line for line in lines):  # said in a cause
            lines.append(f"- The step with gamma = {self.gamma:g} failed: {self.step_error}")
        lines.append("")
        k, n = self.gamma_steps, len(self.gamma_trials)
        after = f"the lowest loss after {k} step{'s' if k > 1 else ''} of the {n} gamma tried"
        if self.suggested_gamma is not None and n > 1:
            same = " (the gamma checked)" if self.suggested_gamma == self.gamma else f" (gamma = {self.gamma:g} checked)"
            lines.append(f"Suggested gamma: {self.suggested_gamma:g}{same}: {after}.")
        elif self.suggested_gamma is not None:
            lines.append(f"Suggested gamma: {self.suggested_gamma:g}.")
        elif n:
            lines.append(f"No gamma tried trains: none of the {n} stays healthy for {k} step(s) and lowers the loss.")
        return "\n".join(lines).strip("\n")

    def figures(self) -> tuple[Any, ...]:
        """The pictures (:meth:`Report.figures`); in the var_list form each pair's, named ``<name>-<pair index>``."""
        if self.pairs:
            return tuple(dataclasses.replace(p, name=f"{p.name}-{i}") for i, r in enumerate(self.pairs) for p in r.figures())
        return super().figures()

    def _gamma_section(self) -> Section:
        """The γ trials' table, largest γ first (the suggestion and the γ checked marked), and their picture."""
        k = self.gamma_steps
        after = f"loss after {k} step{'s' if k > 1 else ''}"

        def role(t: GammaTrial) -> str:
            marks = ["checked"] * (t.gamma == self.gamma) + ["suggested"] * (t.gamma == self.suggested_gamma)
            return f"{t.gamma:g}" + (f" ({', '.join(marks)})" if marks else "")

        rows = tuple(
            (role(t), "yes" if t.healthy else "no" if t.failed_step is None else f"no: step {t.failed_step}",
             format_number(t.loss, 10), t.reason)
            for t in sorted(self.gamma_trials, key=lambda t: -t.gamma)
        )  # fmt: skip
        trials = Table(("gamma", "healthy", after, "note"), rows,
                       f"Largest first; the suggestion has the lowest {after}")  # fmt: skip
        note = "" if k == 1 else (f"Each gamma is measured by the loss after {k} natural-gradient steps with it "
                                  "from the current q(u), hyperparameters held fixed; a trial fails if any step does.")
        return Section(f"Step lengths tried ({after})", note, (trials,), None, ("gamma",))

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if self.pairs:
            return dict(d, pairs=[r.to_dict() for r in self.pairs])
        d.update(
            model=self.model_name, likelihood=self.likelihood, M=self.num_inducing, L=self.num_latent, N=self.num_data,
            dtype=self.dtype, whiten=self.whiten, xi_transform=self.xi_transform, gamma=self.gamma, mode=self.mode,
            loss_before=self.loss_before, loss_after=self.loss_after, suggested_gamma=self.suggested_gamma,
            gamma_steps=self.gamma_steps, gamma_losses={f"{g:g}": loss for g, loss in self.gamma_losses.items()},
            step_error=self.step_error, skipped=[dict(check=n, reason=r) for n, r in self.skipped],
            gamma_trials=[dataclasses.asdict(t) for t in self.gamma_trials],
            warnings=list(self.warnings), numbers=dict(self.numbers), causes=[c.to_dict() for c in self.causes],
        )  # fmt: skip
        return dict(to_jsonable(d))
