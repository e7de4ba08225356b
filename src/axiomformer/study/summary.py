"""The answer of a study from its reported runs: per-cell statistics, paired comparisons and verdicts.

This is what ``axiomformer report DIR --json`` prints::

    {"design": {"selection_seeds": [...], "reported_seeds": [...], "alpha": 0.05, "correction": "bonferroni",
                "margin": 0.02, "power": 0.8, "min_seeds": int, "pilot": bool, "pilot_reason": str | null,
                "primary_task": "task@length" | null, "primary": [model labels], "secondary": [model labels]},
     "cells": [{"model", "task", "seq_len", "mean", "ci_low", "ci_high", "ci_method", "n_seeds", "n_test", "lr",
                "lr_at_grid_edge", "converged", "seeds"}],
     "comparisons": [{"model", "task", "seq_len", "family", "diff", "ci_low", "ci_high", "ci_method", "ci_level",
                      "p_adjusted", "significant", "n_pairs"}],
     "verdicts": [the verdict objects of ``axiomformer.study.statistics``, each with its "family", primary first]}

``task`` is the ``task@length`` label the report's tables use (``mqar@64``). ``n_test``: scored test items per run
(the same items for every arm and seed). A cell is *converged* when every reported run of it converged
(``TrainResult.converged``); a comparison is converged when both its cells are. Families (:func:`main_families`): the comparisons of
the config's ``primary`` models on every task that discriminates form the primary family, those on tasks that do
not the ``control_task`` family (reported apart, never the answer), the other models' the secondary family; each is
corrected on its own. Every verdict is ``pilot`` when the config says ``pilot`` (the
quick preset), when a comparison has fewer reported seeds than the preset's ``min_seeds``, or when the store was
written by a previous version (its selection seed was also a reported seed); ``design.pilot_reason`` says which.

An open-question suite (``Suite.comparisons``) names its own families (``Suite.families``; positions: ``primary`` and
``extrapolation``); its ``design`` has the same validity block (``tasks``, from ``Suite.validity``) and its JSON an
``aa_control`` and a ``no_verdict`` list (``Suite.extra_json``, ``study.suites.common``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from axiomformer.study.record import ModelRecord, RunRecord
from axiomformer.study.statistics import CORRECTION, POWER, PairedItem, Verdict, cell_interval
from axiomformer.study.sweep import assumption_of

if TYPE_CHECKING:
    from axiomformer.study.report import StudyData

REFERENCE = "standard"


@dataclass(frozen=True)
class CellStat:
    model: str
    task: str
    seq_len: int
    mean: float
    ci_low: float | None
    ci_high: float | None
    ci_method: str
    n_seeds: int
    n_test: int | None
    lr: float | None
    lr_at_grid_edge: bool
    converged: bool
    seeds: list[int]


@functools.lru_cache(maxsize=256)
def _n_test(key: str) -> int | None:
    from axiomformer.tasks import make_task
    from axiomformer.tasks.base import IGNORE
    from axiomformer.train import TrainConfig

    tc = json.loads(key)
    try:
        config = TrainConfig(**{k: v for k, v in tc.items() if k != "init_from"})
        task = make_task(config.task, seq_len=config.seq_len, **config.task_options)
        return sum(
            int((task.batch(config.batch_size, seed=i, split="test")[1] != IGNORE).sum())
            for i in range(config.test_batches or config.eval_batches)
        )
    except (ValueError, TypeError, KeyError, RuntimeError):
        return None


def n_test_items(row: RunRecord) -> int | None:
    """Scored test items of a stored run: its own record when it has one, else recounted from its training config
    (the test set is a pure function of task, options, batch size and ``test_batches`` or ``eval_batches``); ``None``
    if it cannot be."""
    stored = row.outcome.n_test
    if stored is not None:
        return int(stored)
    return _n_test(json.dumps(row.train_config, sort_keys=True))


def _by_cell(d: StudyData) -> dict[tuple[str, str, int], dict[int, RunRecord]]:
    return _by_rows(d.rows)


def _converged(runs: dict[int, RunRecord]) -> bool:
    """Every run of a cell converged (``battery.run_converged``: solved early, or its loss no longer falling)."""
    from axiomformer.study.battery import run_converged

    return all(run_converged(r) for r in runs.values())


def _labels(d: StudyData) -> list[str]:
    """The sweep's models, then any other label of the reported rows (a suite's arms), in first-seen order."""
    return list(dict.fromkeys([m.label for m in d.models] + [r.label for r in d.rows]))


def cell_stats(d: StudyData) -> list[CellStat]:
    """Mean test accuracy per (model, task, length) with a valid 95 % interval (``statistics.cell_interval``)."""
    cells = _by_cell(d)
    out = []
    for task, seq_len in d.tasks:
        for label in _labels(d):
            runs = cells.get((label, task, seq_len))
            if not runs:
                continue
            seeds = sorted(runs)
            n_test = n_test_items(runs[seeds[0]])
            ci = cell_interval([runs[s].accuracy for s in seeds], n_test)
            ident = (label, task, seq_len)
            out.append(
                CellStat(
                    label,
                    f"{task}@{seq_len}",
                    seq_len,
                    ci.estimate,
                    ci.low,
                    ci.high,
                    ci.method,
                    len(seeds),
                    n_test,
                    d.lrs.get(ident),
                    ident in d.lr_edges,
                    _converged(runs),
                    seeds,
                )
            )
    return out


def _pilot_reason(d: StudyData) -> str | None:
    """Why the store claims nothing (every verdict ``pilot``), or ``None`` when it decides."""
    cfg = d.config
    seeds = cfg.seeds
    if "selection_seed" in d.config_migrations and any(s < seeds for s in cfg.selection_seeds):
        return (
            "store written by a previous version: its selection seed was also a reported seed; rerun the "
            "study for verdicts"
        )
    if cfg.pilot:
        return "a pilot run (quick preset): it claims nothing"
    if seeds < cfg.min_seeds:
        return f"{seeds} reported seeds, fewer than the preset's minimum of {cfg.min_seeds}"
    finished = max((len(runs) for runs in _by_cell(d).values()), default=0)
    if d.all_rows and finished < cfg.min_seeds:
        return (
            f"a partial store: {finished} of {seeds} reported seeds finished, fewer than the preset's "
            f"minimum of {cfg.min_seeds}; rerun the same command with the same --out to resume"
        )
    return None


def design(d: StudyData) -> dict[str, Any]:
    """The ``design`` block: seeds, level, correction, margin, the families, and whether (and why) this is a pilot."""
    cfg = d.config
    seeds, selection, reason = cfg.seeds, cfg.selection_seeds, _pilot_reason(d)
    contrasts = suite_contrasts(d)
    margins = {"accuracy": cfg.margin, "solve_rate": cfg.solve_margin}
    base = {
        "selection_seeds": selection,
        "reported_seeds": list(range(seeds)),
        "alpha": cfg.alpha,
        "correction": CORRECTION,
        "margin": margins["accuracy"],
        "margins": margins,
        "solve_threshold": cfg.solve_threshold,
        "power": POWER,
        "min_seeds": cfg.min_seeds,
        "pilot": reason is not None,
        "pilot_reason": reason,
    }
    from axiomformer.study.battery import BUDGET_RATIO, DISCRIMINATION_GAP, task_validity

    footing = {
        "verdict_rule": VERDICT_RULE,
        "discrimination_gap": DISCRIMINATION_GAP,
        "budget_ratio_goal": BUDGET_RATIO,
    }
    if contrasts is not None:
        own = _suite_design(d, contrasts)
        return base | own | (footing if "tasks" in own else {})

    own_validity = _suite_validity(d)
    tasks = own_validity if own_validity is not None else task_validity(d, cell_stats(d))
    found = main_families(d)
    good = [t["task"] for t in tasks if t["discriminates"]]
    return base | {
        "primary_task": good[0] if good else None,
        "primary_tasks": good,
        "primary": sorted({m for m, _, f in found if f == "primary"}, key=_model_order(d)),
        "secondary": sorted({m for m, _, f in found if f == "secondary"}, key=_model_order(d)),
        "families": {
            "primary": "the config's primary relaxations on every task that discriminates (the answer)",
            "control_task": "the same relaxations on tasks that do not discriminate: reported apart, never the answer",
            "secondary": "every other relaxation, on every task",
        },
        **footing,
        "tasks": tasks,
    }


VERDICT_RULE = (
    "free if the interval lies inside (-margin, +margin); otherwise forced if it lies below 0, better if "
    "above 0, else inconclusive; convergence is reported beside the verdict and never changes it"
)


def _suite_design(d: StudyData, contrasts: list) -> dict[str, Any]:
    """The ``design`` keys of a suite with its own comparisons: its primary task and labels, its families, and (where
    the suite has one) its task validity block as ``tasks``."""
    from axiomformer.study.registry import get_suite

    suite = get_suite(d.suite)
    primary_names = [c.model for c in contrasts if c.family == "primary"]
    secondary_names = [c.model for c in contrasts if c.family != "primary"]
    out: dict[str, Any] = {
        "primary_task": f"{d.tasks[0][0]}@{d.tasks[0][1]}" if d.tasks else None,
        "primary": sorted(set(primary_names), key=_model_order(d)),
        "secondary": sorted(set(secondary_names), key=_model_order(d)),
    }
    if suite.validity is None:
        return out
    tasks = suite.validity(d)
    good = [t["task"] for t in tasks if t["discriminates"]]
    return out | {
        "primary_task": good[0] if good else None,
        "primary_tasks": good,
        "families": list(suite.families),
        "tasks": tasks,
    }


def suite_contrasts(d: StudyData) -> list | None:
    """The contrasts of the store's suite (``Suite.comparisons``), or ``None`` for a suite that compares every model
    with the standard one (the main suite) or is not registered."""
    from axiomformer.study.registry import get_suite

    try:
        suite = get_suite(d.suite)
    except ValueError:
        return None
    return None if suite.comparisons is None else list(suite.comparisons(d))


def _suite_validity(d: StudyData) -> list[dict[str, Any]] | None:
    """``design.tasks`` of a suite without comparisons that states its own validity rule (``Suite.validity``, e.g. the
    long-range suite's solve rule), or ``None`` (the battery's rule: the main suite, an unregistered one)."""
    from axiomformer.study.registry import get_suite

    try:
        suite = get_suite(d.suite)
    except ValueError:
        return None
    return None if suite.validity is None else suite.validity(d)


def _model_order(d: StudyData) -> Callable[[str], int]:
    order = {label: i for i, label in enumerate(_labels(d))}
    return lambda label: order.get(label, len(order))


def _pairs(d: StudyData) -> list[tuple[str, tuple[str, int]]]:
    """Every (model, (task, length)) with runs of both the model and the standard model, in report order."""
    cells = _by_cell(d)
    return [
        (m.label, t)
        for t in d.tasks
        if cells.get((REFERENCE, *t))
        for m in d.models
        if m.label != REFERENCE and cells.get((m.label, *t))
    ]


FAMILIES = ("primary", "control_task", "secondary")
"""The main suite's families, each corrected on its own: ``primary`` (the config's ``primary`` models on every task
that discriminates), ``control_task`` (the same models on tasks that do not: reported apart, never the answer) and
``secondary`` (every other relaxation)."""


def main_families(d: StudyData) -> list[tuple[str, tuple[str, int], str]]:
    """``(model, (task, length), family)`` for every comparison with the standard model, in report order. The
    validity controls and the A/A control are not comparisons of an assumption (see :func:`aa_control`)."""
    from axiomformer.study.battery import CONTROL_LABELS, discriminating, task_validity
    from axiomformer.study.sweep import AA_LABEL

    labels = {m.label: m for m in d.models}
    wanted = _wanted(d)
    good = discriminating(task_validity(d, cell_stats(d)))
    out = []
    for label, task in _pairs(d):
        if label in CONTROL_LABELS or label == AA_LABEL:
            continue
        is_primary = not wanted or label in wanted or _relax_text(labels[label]) in wanted
        family = "secondary" if not is_primary else "primary" if f"{task[0]}@{task[1]}" in good else "control_task"
        out.append((label, task, family))
    return out


def _wanted(d: StudyData) -> set[str]:
    """The config's ``primary`` labels that name a model of this study."""
    known = {m.label for m in d.models} | {_relax_text(m) for m in d.models}
    return {p.replace(" ", "") for p in d.config.primary} & known


def _relax_text(model: ModelRecord) -> str:
    return model.label if model.kind == "transformer" else model.kind


def run_value(row: RunRecord, metric: str = "accuracy") -> float:
    """A run's value for a comparison: its test accuracy; ``nan`` for a diverged run (left out of an accuracy
    comparison, counted as not solved in a solve-rate one)."""
    from axiomformer.study.battery import diverged

    return float("nan") if diverged(row) or row.accuracy is None else float(row.accuracy)


def _compare(
    d: StudyData, item: PairedItem, metric: str, family_size: int, info: dict[str, Any], pilot: bool
) -> Verdict:
    from axiomformer.study.contrasts import compare_item

    return compare_item(item, metric, family_size, info, pilot)


def _item(d: StudyData, label: str, task: tuple[str, int], cells: dict, metric: str) -> PairedItem | None:
    runs, reference = cells.get((label, *task)), cells.get((REFERENCE, *task))
    if not runs or not reference:
        return None
    seeds = sorted(set(runs) & set(reference))
    return PairedItem(
        assumption_of(label, d.kind.get(label, "transformer")),
        label,
        f"{task[0]}@{task[1]}",
        [run_value(runs[s], metric) for s in seeds],
        [run_value(reference[s], metric) for s in seeds],
        _converged(runs) and _converged(reference),
        n_test_items(reference[seeds[0]]) if seeds else None,
    )


def _family_verdicts(d: StudyData, pairs: list, info: dict[str, Any]) -> list[tuple[Verdict, int]]:
    """One family: each comparison at the family's Bonferroni level, and (where the store has them) recomputed with
    the relaxed arm's runs at its second-best learning rate: ``lr_sensitive`` when that changes the verdict."""
    from axiomformer.study.battery import metric_of

    cells, second = _by_cell(d), _by_rows(d.second_rows)
    out = []
    for label, (task, seq_len) in pairs:
        metric = metric_of(d, task, seq_len)
        item = _item(d, label, (task, seq_len), cells, metric)
        if item is None:
            continue
        pilot = bool(info["pilot"]) or len(item.values) < info["min_seeds"]
        verdict = _compare(d, item, metric, max(1, len(pairs)), info, pilot)
        check = _item(
            d, label, (task, seq_len), {**cells, (label, task, seq_len): second.get((label, task, seq_len))}, metric
        )
        sensitive = None
        if check is not None and second.get((label, task, seq_len)) and not pilot:
            sensitive = _compare(d, check, metric, max(1, len(pairs)), info, pilot).verdict != verdict.verdict
        out.append((dataclasses.replace(verdict, lr_sensitive=sensitive), seq_len))
    return out


def _by_rows(rows: list[RunRecord]) -> dict[tuple[str, str, int], dict[int, RunRecord]]:
    out: dict[tuple[str, str, int], dict[int, RunRecord]] = {}
    for r in rows:
        out.setdefault((r.label, r.task, r.seq_len), {})[r.seed] = r
    return out


def verdicts(d: StudyData) -> list[tuple[Verdict, int, str]]:
    """``(verdict, seq_len, family)`` for every comparison, family by family (:data:`FAMILIES`, or a suite's own)."""
    info = design(d)
    contrasts = suite_contrasts(d)
    if contrasts is not None:
        from axiomformer.study.contrasts import contrast_verdicts
        from axiomformer.study.registry import get_suite

        return contrast_verdicts(info, contrasts, get_suite(d.suite).families)
    found = main_families(d)
    out = []
    for family in FAMILIES:
        pairs = [(m, t) for m, t, f in found if f == family]
        out += [(v, n, family) for v, n in _family_verdicts(d, pairs, info)]
    return out


def aa_control(d: StudyData) -> dict[str, Any] | None:
    """The A/A null control: the standard model against itself with another initialization stream, per task, as
    one family (Bonferroni over its tasks). ``verdict``: ``forced`` or ``better`` if any task's is (the design is
    broken: ``broken`` true), else ``free`` if every task's is, else ``inconclusive``. ``None`` without A/A runs."""
    from axiomformer.study.sweep import AA_LABEL

    if not any(r.label == AA_LABEL for r in d.rows):
        return None
    info = design(d)
    tasks = [t for t in d.tasks if _by_cell(d).get((AA_LABEL, *t))]
    found = [v for v, _ in _family_verdicts(d, [(AA_LABEL, t) for t in tasks], info)]
    return aa_summary(f"{AA_LABEL} vs {REFERENCE}", found)


def aa_overall(kinds: set[str]) -> str:
    """The A/A control's overall verdict from its settings' verdicts: ``forced`` or ``better`` if any is (the design
    is broken), ``pilot`` when every one is, ``free`` when every one is, else ``inconclusive``."""
    for kind in ("forced", "better"):
        if kind in kinds:
            return kind
    return "pilot" if kinds == {"pilot"} else "free" if kinds == {"free"} else "inconclusive"


def aa_summary(model: str, found: list[Verdict]) -> dict[str, Any]:
    """The ``aa_control`` entry from the A/A verdicts of each task (one family): ``verdict``: ``forced`` or
    ``better`` if any task's is (the design is broken: ``broken`` true), else ``free`` if every task's is, else
    ``inconclusive`` (``pilot`` when every one is). Each task's entry carries ``"family": "aa_control"`` (its own
    family, never the answer)."""
    overall = aa_overall({v.verdict for v in found})
    return {
        "model": model,
        "verdict": overall,
        "broken": overall in ("forced", "better"),
        "tasks": [{**v.to_dict(), "lr_sensitive": None, "family": "aa_control"} for v in found],
    }


def answer(d: StudyData) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """``(answer, control_answer)``: ``{assumption: {task: verdict}}`` of the primary family (every task that
    discriminates) and of the control-task family (tasks that do not: reported apart, never the answer)."""
    out: dict[str, dict[str, str]] = {}
    control: dict[str, dict[str, str]] = {}
    for v, _, family in verdicts(d):
        if family in ("primary", "control_task"):
            (out if family == "primary" else control).setdefault(v.assumption, {})[v.task] = v.verdict
    return out, control


def comparisons(d: StudyData) -> list[tuple[Verdict, int, str]]:
    """The same as :func:`verdicts` (kept under this name for the report's tables and the suites)."""
    return verdicts(d)


def cpu_seconds(d: StudyData) -> float:
    """The CPU seconds of every finished run in the store (selection runs included)."""
    return float(sum(float(r.cpu_seconds or 0.0) for r in d.all_rows))


def to_json(d: StudyData) -> dict[str, Any]:
    """The ``--json`` document (see the module docstring)."""
    info = design(d)
    found = verdicts(d)
    comps = [
        {
            "model": v.model,
            "task": v.task,
            "seq_len": n,
            "family": family,
            "diff": v.diff,
            "ci_low": v.ci_low,
            "ci_high": v.ci_high,
            "ci_method": v.ci_method,
            "ci_level": v.ci_level,
            "p_adjusted": v.p_difference,
            "significant": v.p_difference < info["alpha"],
            "n_pairs": v.n_seeds,
            "metric": v.metric,
        }
        for v, n, family in found
    ]
    out: dict[str, Any] = {
        "design": info,
        "cells": [asdict(c) for c in cell_stats(d)],
        "comparisons": comps,
        "verdicts": [{**v.to_dict(), "family": family} for v, _, family in found],
        "cpu_seconds": cpu_seconds(d),
    }
    if suite_contrasts(d) is None:
        main_answer, control_answer = answer(d)
        out |= {"answer": main_answer, "control_answer": control_answer, "aa_control": aa_control(d)}
    from axiomformer.study.registry import get_suite

    try:
        extra = get_suite(d.suite).extra_json
    except ValueError:
        extra = None
    # A suite's own keys win: a suite with its own validity and verdict rule (long range) replaces the generic ones,
    # so that one store never carries two verdict sets.
    return out | (extra(d) if extra is not None else {})


__all__ = [
    "FAMILIES",
    "REFERENCE",
    "CellStat",
    "aa_control",
    "aa_overall",
    "aa_summary",
    "answer",
    "cell_stats",
    "comparisons",
    "cpu_seconds",
    "design",
    "main_families",
    "n_test_items",
    "run_value",
    "suite_contrasts",
    "to_json",
    "verdicts",
]
