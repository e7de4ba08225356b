"""What a suite compares (one arm against another, paired by seed) and the verdicts, under the main study's rules.

The main suite compares every model with the standard one (``study.summary``). The open-question suites ask other
questions — NoPE against each position scheme at the training length, a scheme's accuracy beyond its training
length against its own accuracy at it, scale = 1 against 1/sqrt(d) at one head_dim — so each suite lists its
:class:`Contrast` objects (``OpenQuestion.comparisons``), and this module turns them into the same verdict objects
(``statistics.Verdict``) with the same rules: per family (a suite names its own, e.g. ``primary`` and
``extrapolation``) a paired t interval on accuracy or a Newcombe interval on solve rates, Bonferroni over the
family (``compare_item``), ``forced`` / ``better`` / ``free`` / ``inconclusive``, and ``pilot`` whenever the design
says pilot or a contrast has fewer paired seeds than ``min_seeds``. ``axiomformer report DIR --json`` prints them
under ``verdicts`` exactly as for the main suite; the suite's report prints the same objects.

Verdict fields for a contrast: ``assumption`` is the question, ``model`` names both sides (``"a vs b"``; the
difference is a - b), ``task`` the task and where it is measured (``"copy@16 at 2L-4L"``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, replace
from typing import Any

from axiomformer.study.statistics import PairedItem, Verdict, VerdictRule, one_comparison, solve_rate_comparison

FAMILIES = ("primary", "secondary")


@dataclass(frozen=True)
class Contrast:
    """One comparison: ``a - b`` over the seeds both have (seed -> value; non-finite values, e.g. a diverged run,
    leave that seed out).

    Attributes:
        question: what it answers (the verdict's ``assumption``).
        a_label, b_label: the two sides (the verdict's ``model`` is ``"a_label vs b_label"``).
        task: task and where it is measured (the verdict's ``task``).
        seq_len: the training length.
        family: ``"primary"`` or ``"secondary"``; each family is corrected on its own.
        a, b: seed -> value.
        converged: both sides converged (reported beside the verdict, never deciding it).
        metric: ``"accuracy"`` (paired t) or ``"solve_rate"`` (a run solves when its value reaches the study's
            ``solve_threshold``; Newcombe interval); ``None``: the task's metric (``TaskSettings.metric``), filled in
            by the suite base.
        a_second, b_second: seed -> value of side a (b) retrained at its second-best learning rate (``lr_check``);
            when either is given, the verdict's ``lr_sensitive`` says whether moving either side to that rate (the
            other at its chosen one) changes the verdict.
    """

    question: str
    a_label: str
    b_label: str
    task: str
    seq_len: int
    family: str
    a: dict[int, float] = field(default_factory=dict)
    b: dict[int, float] = field(default_factory=dict)
    converged: bool = True
    metric: str | None = None
    a_second: dict[int, float] | None = None
    b_second: dict[int, float] | None = None

    @property
    def model(self) -> str:
        return f"{self.a_label} vs {self.b_label}"

    def paired(self) -> tuple[list[float], list[float]]:
        """The values of both sides over the seeds where both are finite, in seed order."""
        seeds = sorted(s for s in set(self.a) & set(self.b) if _finite(self.a[s]) and _finite(self.b[s]))
        return [float(self.a[s]) for s in seeds], [float(self.b[s]) for s in seeds]


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(float(value))


def compare_item(item: PairedItem, metric: str | None, family_size: int, info: dict[str, Any], pilot: bool) -> Verdict:
    """One paired comparison's verdict at its family's Bonferroni level (``family_size``), by ``metric``: the paired
    test accuracy (``statistics.one_comparison``, margin ``info["margins"]["accuracy"]``) or the solve rate
    (``statistics.solve_rate_comparison``, Newcombe, margin ``info["margins"]["solve_rate"]``); ``info``: the report's
    ``design`` block. The main study's comparisons and the suites' contrasts both go through it."""
    if metric == "solve_rate":
        rule = VerdictRule(alpha=info["alpha"], margin=info["margins"]["solve_rate"], pilot=pilot)
        return solve_rate_comparison(item, threshold=info["solve_threshold"], family_size=family_size, rule=rule)
    margin = info["margins"]["accuracy"] if "margins" in info else info["margin"]
    rule = VerdictRule(alpha=info["alpha"], margin=margin, pilot=pilot)
    return one_comparison(item, family_size=family_size, rule=rule)


def _verdict(info: dict[str, Any], c: Contrast, a: list[float], b: list[float], size: int, pilot: bool) -> Verdict:
    return compare_item(PairedItem(c.question, c.model, c.task, a, b, c.converged), c.metric, size, info, pilot)


def _lr_sensitive(info: dict[str, Any], c: Contrast, verdict: Verdict, size: int) -> bool | None:
    """Whether retraining either side at its second-best learning rate (the other side at its chosen rate) changes
    the verdict (``None``: neither side has such runs, or too few seeds to decide)."""
    if (not c.a_second and not c.b_second) or verdict.verdict == "pilot":
        return None
    found = []
    for a_values, b_values in ((c.a_second, c.b), (c.a, c.b_second)):
        if not a_values or not b_values:
            continue
        again = replace(c, a=a_values, b=b_values, a_second=None, b_second=None)
        a, b = again.paired()
        if len(a) >= int(info["min_seeds"]):
            found.append(_verdict(info, again, a, b, size, False).verdict != verdict.verdict)
    return any(found) if found else None


def contrast_verdicts(
    info: dict[str, Any], contrasts: list[Contrast], families: tuple[str, ...] = FAMILIES
) -> list[tuple[Verdict, int, str]]:
    """``(verdict, seq_len, family)`` per contrast, family by family in ``families`` order; ``info`` is the report's
    ``design`` block (alpha, margins, solve threshold, min_seeds, pilot). A contrast with ``a_second`` also gets
    ``lr_sensitive``.

    Raises:
        ValueError: a contrast whose family is not one of ``families``.
    """
    for c in contrasts:
        if c.family not in families:
            raise ValueError(f"unknown family {c.family!r} of {c.model}; choose one of: {', '.join(families)}")
    out = []
    for family in families:
        members = [c for c in contrasts if c.family == family]
        size = max(1, len(members))
        for c in members:
            a, b = c.paired()
            pilot = bool(info["pilot"]) or len(a) < int(info["min_seeds"])
            verdict = _verdict(info, c, a, b, size, pilot)
            verdict = dataclasses.replace(verdict, lr_sensitive=_lr_sensitive(info, c, verdict, size))
            out.append((verdict, c.seq_len, family))
    return out


__all__ = ["FAMILIES", "Contrast", "compare_item", "contrast_verdicts"]
