"""The task battery: each task's evidence that it can answer, and the answer per assumption and task.

A task can tell the assumptions of attention apart only if it needs what attention does. Each task of a study carries
its own evidence (``report --json``'s ``design.tasks``, one entry per task and length)::

    {"task": "copy@16", "chance": float, "ceiling": float | null, "ceiling_method": str | null,
     "ceiling_error": float | null, "controls": {"no_mixing": acc | null, "uniform_mixing": acc | null},
     "standard": acc | null, "discriminates": bool, "why": str, "metric": "accuracy" | "solve_rate",
     "steps": int, "standard_median_steps_to_solve": int | null, "budget_ratio": float | null}

* ``ceiling``: the best accuracy any causal model can reach on the study's own test items (``Task.ceiling``,
  computed once by the study and stored as the ``ceilings`` section).
* ``controls``: mean test accuracy of the two validity controls (``axiomformer.models.controls``), trained like every
  arm (same budget, their own learning-rate selection and parameter match).
* ``discriminates``: the standard model's 95 % interval lies above the uniform-mixing control's by at least
  :data:`DISCRIMINATION_GAP`, and its mean does not exceed the ceiling (within the ceiling's Monte Carlo error);
  a task without a ceiling never discriminates. ``why`` says which condition decided.
* ``standard_median_steps_to_solve``: the median over the standard model's reported runs of the first evaluation
  step whose validation accuracy reached the study's ``solve_threshold``, a run that never did counting as beyond
  the budget (``None`` when that puts the median beyond it: fewer than half solved);
  ``budget_ratio``: ``steps`` over it (the budget reaches past the plateau when it is at least
  :data:`BUDGET_RATIO`).

Comparisons on a task that does not discriminate are their own family (``control_task``) and never part of the
``answer``.
"""

from __future__ import annotations

import math
import statistics as stats
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from axiomformer.study.config import TaskSettings
    from axiomformer.study.record import RunRecord
    from axiomformer.study.report import StudyData

DISCRIMINATION_GAP = 0.05
"""How far (accuracy) the standard model's interval must lie above the uniform-mixing control's interval."""


def separated(low: float, control_high: float) -> bool:
    """The gap rule, one place for every control that reads a task: an arm's interval (lower end ``low``) lies at
    least :data:`DISCRIMINATION_GAP` above its control's interval (upper end ``control_high``)."""
    return low - control_high >= DISCRIMINATION_GAP


BUDGET_RATIO = 3.0
"""A budget reaches past the plateau when it is at least this many times the standard model's median steps to
solve."""
CONTROL_LABELS = ("no_mixing", "uniform_mixing")


def task_settings(d: StudyData, task: str, seq_len: int) -> TaskSettings | None:
    """The stored config's table of ``task`` (the first whose name and lengths match; ``None`` when none)."""
    for entry in d.config.tasks:
        if entry.name == task and seq_len in entry.seq_lens:
            return entry
    return None


def metric_of(d: StudyData, task: str, seq_len: int) -> str:
    """``accuracy`` or ``solve_rate``: how the comparisons on this task are measured."""
    settings = task_settings(d, task, seq_len)
    return "accuracy" if settings is None else settings.metric


def steps_to_solve(row: RunRecord, threshold: float) -> int | None:
    """The first evaluation step whose validation accuracy reached ``threshold`` (``None``: never)."""
    for point in row.outcome.history:
        if point.get("accuracy") is not None and point["accuracy"] >= threshold:
            return int(point["step"])
    return None


def median_steps_to_solve(solve_steps: Sequence[int | None]) -> int | None:
    """The median of runs' steps to solve, a run that never solved (``None``) counting as beyond the budget: leaving
    it out would favour the budget (5 of 8 runs solving at 200-700 steps have the median 250 alone, 550 with the
    other 3). ``None`` when the median lies beyond the budget (fewer than half solved) or there is no run."""
    beyond = [math.inf if s is None else float(s) for s in solve_steps]
    middle = stats.median(beyond) if beyond else math.inf
    return None if math.isinf(middle) else int(middle)


def _budget_steps(d: StudyData, task: str, seq_len: int) -> int | None:
    runs = [r for r in d.rows if r.task == task and r.seq_len == seq_len]
    steps = [r.train_config.get("steps") for r in runs]
    return max((s for s in steps if s is not None), default=None)


def _ceiling(d: StudyData, name: str) -> dict[str, Any]:
    found = ((d.sections.get("ceilings") or {}).get("payload") or {}).get(name)
    if found is None:
        return {"ceiling": None, "ceiling_method": None, "ceiling_error": None, "note": "not computed in this store"}
    return found


def _why(stat: Any, uniform: Any, ceiling: dict[str, Any]) -> tuple[bool, str]:
    if ceiling.get("ceiling") is None:
        return False, f"no ceiling ({ceiling.get('note')}): the task cannot show what it can decide"
    if stat is None or stat.ci_low is None:
        return False, "the standard model has no interval yet"
    if uniform is None or uniform.ci_high is None:
        return False, "the uniform-mixing control has not run: nothing shows that the task needs scores"
    top = float(ceiling["ceiling"]) + 3 * float(ceiling.get("ceiling_error") or 0.0) + 1e-9
    if stat.mean > top:
        return False, f"the standard model ({stat.mean:.3f}) lies above the ceiling ({ceiling['ceiling']:.3f}): check"
    gap = stat.ci_low - uniform.ci_high
    if not separated(stat.ci_low, uniform.ci_high):
        return False, (
            f"uniform mixing (no scores) reaches {uniform.mean:.3f} against the standard model's {stat.mean:.3f}: "
            f"the intervals are {gap:+.3f} apart, less than the gap {DISCRIMINATION_GAP:g}, so the task does not need "
            f"what attention's scores add"
        )
    return True, (
        f"the standard model ({stat.mean:.3f}) lies {gap:.3f} above uniform mixing ({uniform.mean:.3f}, interval to "
        f"interval) and within the ceiling ({ceiling['ceiling']:.3f}, {ceiling['ceiling_method']})"
    )


def task_validity(
    d: StudyData, cell_stats: list[Any], reference: str = "standard", ceilings: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """``design.tasks``: one entry per task and length of the store (see the module docstring); ``cell_stats``: the
    store's cell statistics (``summary.cell_stats``: ``model``, ``task``, ``mean``, ``ci_low``, ``ci_high``);
    ``reference``: the model that plays the standard one (an open-question suite's reference arm); ``ceilings``:
    ``task@length -> ceiling entry`` instead of the store's ``ceilings`` section (a bidirectional suite's)."""
    cells = {(c.model, c.task): c for c in cell_stats}
    threshold = d.config.solve_threshold
    out = []
    for task, seq_len in d.tasks:
        name = f"{task}@{seq_len}"
        ceiling = _ceiling(d, name) if ceilings is None else ceilings[name]
        stat, uniform = cells.get((reference, name)), cells.get(("uniform_mixing", name))
        discriminates, why = _why(stat, uniform, ceiling)
        standard_runs = [r for r in d.rows if r.label == reference and r.task == task and r.seq_len == seq_len]
        solve_steps = [steps_to_solve(r, threshold) for r in standard_runs]
        median = median_steps_to_solve(solve_steps)
        steps = _budget_steps(d, task, seq_len)
        chance = next((r.task_config.get("chance") for r in standard_runs), None)
        out.append(
            {
                "task": name,
                "chance": chance,
                "ceiling": ceiling.get("ceiling"),
                "ceiling_method": ceiling.get("ceiling_method"),
                "ceiling_error": ceiling.get("ceiling_error"),
                "controls": {c: (cells[(c, name)].mean if (c, name) in cells else None) for c in CONTROL_LABELS},
                "standard": None if stat is None else stat.mean,
                "discriminates": discriminates,
                "why": why,
                "metric": metric_of(d, task, seq_len),
                "steps": steps,
                "standard_median_steps_to_solve": median,
                "budget_ratio": None if median is None or steps is None or median == 0 else steps / median,
            }
        )
    return out


def discriminating(tasks: list[dict[str, Any]]) -> set[str]:
    """The ``task@length`` labels of the :func:`task_validity` entries that discriminate."""
    return {t["task"] for t in tasks if t["discriminates"]}


def loss_still_falling(losses: Sequence[float | None], *, tail: float = 0.25, drop: float = 0.01) -> bool:
    """Whether a training loss curve was still falling at its end: over the last ``tail`` of the steps (at least 20
    points), the least-squares slope is negative at p < 0.01 (scipy ``linregress``) and the fitted line drops by more
    than ``drop`` of the window's mean loss. Non-finite losses count as not falling (a diverged run)."""
    from scipy.stats import linregress

    window = [math.nan if x is None else float(x) for x in losses[-max(20, int(len(losses) * tail)) :]]
    if len(window) < 20 or not all(math.isfinite(x) for x in window):
        return False
    fit = linregress(range(len(window)), window)
    level = stats.fmean(window)
    return bool(fit.slope < 0 and fit.pvalue < 0.01 and -fit.slope * len(window) > drop * abs(level))


def run_converged(row: RunRecord) -> bool:
    """A run converged when it solved early (the target was reached) or its training loss was no longer falling when
    the budget ran out (:func:`loss_still_falling`)."""
    if row.outcome.stop_reason in ("target", "patience", "nonfinite"):
        return True
    return not loss_still_falling(row.losses or [])


def diverged(row: RunRecord) -> bool:
    """A run whose training loss became non-finite."""
    loss = row.loss
    return row.outcome.stop_reason == "nonfinite" or (loss is not None and not math.isfinite(float(loss)))


__all__ = [
    "BUDGET_RATIO",
    "CONTROL_LABELS",
    "DISCRIMINATION_GAP",
    "discriminating",
    "diverged",
    "loss_still_falling",
    "metric_of",
    "run_converged",
    "separated",
    "steps_to_solve",
    "task_settings",
    "task_validity",
]
