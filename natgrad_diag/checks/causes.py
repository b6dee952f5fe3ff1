"""Why a natural-gradient check failed or was inconclusive: one of a small documented set of causes (:data:`CAUSES`),
each with its evidence and fix. ``ill_conditioning`` is GPflow #767's case (q_sqrt = 1e-3·I gives θ₂ = −½·10⁶·I, and
one step cancels most of its digits); ``jitter`` is named when λmin(Kuu + jitter·I) is within 10× of the jitter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from natgrad_diag.checks.bounds import Conditioning
from natgrad_diag.checks.conjugate import walk_failed
from natgrad_diag.report.records import Check, format_number
from natgrad_diag.tolerance import eps

__all__ = ["CAUSES", "FIX", "ILL_CONDITIONED", "Cause", "diagnose"]

#: The causes a report can name, with their one-line titles.
CAUSES = {
    "wrong_gradient": "wrong gradient: the step or the gradients that feed it disagree with an independent oracle",
    "ill_conditioning": "ill-conditioning: κ(S), κ(F) or κ(Kuu) is too large for the dtype",
    "jitter": "jitter: the jitter dominates Kuu's smallest eigenvalue",
    "step_too_long": "step too long: the step breaks q(u) or raises the loss, at once or in the steps after it",
    "float32_precision": "float32 precision: float64 would resolve this",
    "gpflow_precision": "GPflow's step loses precision here: its route through the expectation parameters amplifies rounding",
    "minibatch": "minibatch: the conjugate optimum is the batch's, not the full data's",
    "wrong_step": "wrong step: your optimizer's step is not GPflow's natural-gradient step",
    "blind_point": "blind point: here GPflow's step equals known mistakes' steps, so yours cannot be told from them",
}

#: Separates a ``custom_step`` check's evidence from its fix in the check's detail.
FIX = " To fix: "

#: ε·κ above this loses more than half the digits of the dtype's step: an ill-conditioned problem.
ILL_CONDITIONED = 1e-8

@dataclass(frozen=True)
class Cause:
    """One cause of a failed or inconclusive check: its ``name`` (one of :data:`CAUSES`), the ``checks`` it explains,
    the ``evidence`` (the numbers that point to it) and the ``fix``."""

    name: str
    checks: tuple[str, ...]
    evidence: str
    fix: str

    @property
    def title(self) -> str:
        return CAUSES[self.name]

    def __str__(self) -> str:
        return f"{self.title} ({', '.join(self.checks)}). Evidence: {self.evidence} Fix: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "checks": list(self.checks), "evidence": self.evidence, "fix": self.fix}


def _worst_kappa(cond: Conditioning) -> tuple[str, float]:
    pairs = [("κ(F)", cond.kappa_F), ("κ_η·κ(S_new)·cancellation", cond.step_condition), ("κ(S)", cond.kappa_S)]
    if cond.kappa_Kuu is not None:
        pairs.append(("κ(Kuu)", cond.kappa_Kuu))
    return max(pairs, key=lambda p: p[1])


def _conditioning_causes(bad: list[Check], cond: Conditioning, dtype: str, jitter: float) -> list[Cause]:
    """ill_conditioning or float32_precision (and jitter) for the checks that the conditioning explains."""
    name, k = _worst_kappa(cond)
    names = tuple(c.name for c in bad)
    if dtype != "float64" and eps("float64") * k < ILL_CONDITIONED:
        out = [Cause("float32_precision", names, f"{name} = {format_number(k)}: ε·κ = {format_number(eps(dtype) * k)} in {dtype}, {format_number(eps('float64') * k)} in float64.", "use float64 (gpflow.config.set_default_float(np.float64)).")]
    else:
        out = [Cause(
            "ill_conditioning", names,
            f"{name} = {format_number(k)} (ε·κ = {format_number(eps(dtype) * k)}); κ(S) = {format_number(cond.kappa_S)}, "
            f"the step cancels {format_number(cond.cancellation)}× of θ₂ (GPflow #767).",
            "start from a better-conditioned q(u) (q_sqrt = I, GPflow's default) or take first steps with γ < 1; "
            "use float64 with a larger jitter if κ(Kuu) is the large one.",
        )]  # fmt: skip
    if cond.min_eig_Kuu is not None and cond.min_eig_Kuu < 10 * jitter:
        out.append(Cause(
            "jitter", names, f"λmin(Kuu + jitter·I) = {format_number(cond.min_eig_Kuu)} with jitter = {format_number(jitter)}: κ(Kuu) = {format_number(cond.kappa_Kuu)} is set by the jitter.",
            "remove duplicate or near-duplicate inducing points, or raise gpflow.config's jitter (and compare against the objective with it).",
        ))  # fmt: skip
    return out


def _gpflow_precision(bad: list[Check], cond: Conditioning | None, dtype: str) -> Cause | None:
    """``gpflow_precision`` when the reproduction check failed or was inconclusive where GPflow's route is
    ill-conditioned (ε·κ_η·κ(S_new)·cancellation > :data:`ILL_CONDITIONED`) and the closed form's is not
    (ε·max(κ(S), κ(S_new)) below it): then GPflow's step, not the model, is what is off."""
    if not bad or cond is None:
        return None
    route, closed = cond.step_condition, max(cond.kappa_S, cond.kappa_S_new or 0.0)
    if eps(dtype) * route <= ILL_CONDITIONED or eps(dtype) * closed > ILL_CONDITIONED:
        return None
    return Cause(
        "gpflow_precision", tuple(c.name for c in bad),
        f"GPflow's route has condition κ_η·κ(S_new)·cancellation = {format_number(route)} (ε·κ = {format_number(eps(dtype) * route)}), "
        f"natgrad-diag's closed form max(κ(S), κ(S_new)) = {format_number(closed)}; {bad[0].detail.split(';')[0]}.",
        "use natgrad_diag.NaturalGradient (GPflow's API, the closed-form step, which keeps its digits here), or start from "
        "a better-conditioned q(u) (q_sqrt = I, GPflow's default).",
    )  # fmt: skip


def diagnose(
    checks: tuple[Check, ...], cond: Conditioning | None, *, dtype: str, jitter: float, suggested_gamma: float | None,
    other_xi: tuple[str, float, float] | None = None, minibatch: str = "",
) -> tuple[Cause, ...]:  # fmt: skip
    """The causes of every check with status "fail" or "warn" (and ``minibatch`` when the data are a batch);
    ``other_xi``: where no γ trains, the other ξ's (name, γ, loss), which the fix then names.

    Rules, in order: a step-health failure, or k steps that fail or move away from the optimum, is ``step_too_long``; a warning, or a conjugate check's failure on an
    ill-conditioned problem (ε·κ > :data:`ILL_CONDITIONED`), is ``ill_conditioning`` (``float32_precision`` when
    float64 would resolve it; plus ``jitter`` when the jitter sets κ(Kuu)); every other failure is ``wrong_gradient``.
    """
    out: list[Cause] = []
    bad = [c for c in checks if c.status in ("fail", "warn")]
    # a failed convergence check counts when its steps failed or moved away from the optimum (not a wrong rate)
    diverged = [c for c in bad if walk_failed(c) or (c.name == "conjugate_convergence" and c.status == "fail" and "shrinks at every step" in c.claim)]
    if health := [c for c in bad if c.name in ("step_health", "finite_gradients") or c in diverged]:
        fix = f"use gamma = {suggested_gamma:g} (of the γ that held, the one with the lowest loss after the look-ahead steps)." if suggested_gamma is not None else (
            f"use xi_transform={other_xi[0]}() with gamma = {other_xi[1]:g}: no γ of the grid trains with this ξ, and GPflow's own steps with "
            f"{other_xi[0]} do from this q(u)." if other_xi else "use a smaller gamma.")  # fmt: skip
        health.sort(key=lambda c: c.name != "step_health")  # GPflow's own steps, with the failing one, first
        why = [(c.name, c.detail.split(";")[0].rstrip(". ")) for c in health]  # each failure as its check saw it
        evidence = "; ".join(f"{n}: {w}" if len(why) > 1 else w for n, w in why)
        out.append(Cause("step_too_long", tuple(c.name for c in health), evidence + ".", fix))
    mine = [c for c in bad if c.name == "custom_step"]
    for c in mine:
        evidence, _, fix = c.detail.partition(FIX)
        name = "wrong_step" if c.status == "fail" else "blind_point"
        out.append(Cause(name, (c.name,), evidence, fix or "compare your update with natgrad_diag.natgrad_trace(...)."))
    rest = [c for c in bad if c not in health and c not in mine]
    if (gp := _gpflow_precision([c for c in rest if c.name == "reproduction"], cond, dtype)) is not None:
        out.append(gp)
        rest = [c for c in rest if c.name != "reproduction"]
    ill = cond is not None and eps(dtype) * _worst_kappa(cond)[1] > ILL_CONDITIONED
    explained = [c for c in rest if c.status == "warn" or (ill and c.name.startswith("conjugate_"))]
    if explained and cond is not None:
        out += _conditioning_causes(explained, cond, dtype, jitter)
    if wrong := [c for c in rest if c not in explained or cond is None]:
        worst = wrong[0]
        nums = f" (error {format_number(worst.max_abs_error)} > bound {format_number(worst.tolerance)})" if worst.max_abs_error is not None else ""
        out.append(Cause(
            "wrong_gradient", tuple(c.name for c in wrong), f"{worst.name}{nums}: {worst.detail.split(';')[0]}.",
            "check the custom gradients (tf.custom_gradient) of the likelihood, kernel and mean function, and the transforms "
            "of q_mu and q_sqrt; the loss_gradient check names the worst direction.",
        ))  # fmt: skip
    if minibatch:
        out.append(Cause("minibatch", ("conjugate_optimality",), minibatch, "pass the full batch (X, Y) to check against the full data's optimum."))
    return tuple(out)
