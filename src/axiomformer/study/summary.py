"""The answer of a study from its reported runs: per-cell statistics, paired comparisons and verdicts.

This is what ``axiomformer report DIR --json`` prints::

    {"design": {"selection_seeds": [...], "reported_seeds": [...], "alpha": 0.05, "correction": "bonferroni",
                "margin": 0.02, "power": 0.8, "min_seeds": 10, "pilot": bool, "pilot_reason": str | null,
                "primary_task": "task@length" | null, "primary": [model labels], "secondary": [model labels]},
     "cells": [{"model", "task", "seq_len", "mean", "ci_low", "ci_high", "ci_method", "n_seeds", "n_test", "lr",
                "lr_at_grid_edge", "converged", "seeds"}],
     "comparisons": [{"model", "task", "seq_len", "family", "diff", "ci_low", "ci_high", "ci_method", "ci_level",
                      "p_adjusted", "significant", "n_pairs"}],
     "verdicts": [the verdict objects of ``axiomformer.study.statistics``, primary family first]}

``task`` is the ``task@length`` label the report's tables use (``mqar@64``). ``n_test``: scored test items per run
(the same items for every arm and seed). A cell is *converged* when every reported run of it converged
(``TrainResult.converged``); a comparison is converged when both its cells are. Families: the comparisons of the
config's ``primary`` models on the first task form the primary family; the rest the secondary family; each is
corrected on its own (``statistics.paired_family``). Every verdict is ``pilot`` when the config says ``pilot`` (the
quick preset), when a comparison has fewer reported seeds than the preset's ``min_seeds``, or when the store was
written by a previous version (its selection seed was also a reported seed); ``design.pilot_reason`` says which.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from axiomformer.study.statistics import (
    ALPHA,
    CORRECTION,
    MARGIN,
    POWER,
    PairedItem,
    Verdict,
    cell_interval,
    one_comparison,
)
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


def n_test_items(row: dict[str, Any]) -> int | None:
    """Scored test items of a stored run: its own record when it has one, else recounted from its training config
    (the test set is a pure function of task, options, batch size and ``test_batches`` or ``eval_batches``); ``None``
    if it cannot be."""
    stored = (row.get("outcome") or {}).get("n_test")
    if stored is not None:
        return int(stored)
    return _n_test(json.dumps(row.get("train_config") or {}, sort_keys=True))


def _by_cell(d: StudyData) -> dict[tuple[str, str, int], dict[int, dict[str, Any]]]:
    out: dict[tuple[str, str, int], dict[int, dict[str, Any]]] = {}
    for r in d.rows:
        out.setdefault((r["label"], r["task"], r["seq_len"]), {})[r["seed"]] = r
    return out


def _converged(runs: dict[int, dict[str, Any]]) -> bool:
    return all((r.get("outcome") or {}).get("converged", True) for r in runs.values())


def _labels(d: StudyData) -> list[str]:
    """The sweep's models, then any other label of the reported rows (a suite's arms), in first-seen order."""
    return list(dict.fromkeys([m["label"] for m in d.models] + [r["label"] for r in d.rows]))


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
            ci = cell_interval([runs[s]["accuracy"] for s in seeds], n_test)
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


def design(d: StudyData) -> dict[str, Any]:
    """The ``design`` block: seeds, level, correction, margin, the families, and whether (and why) this is a pilot."""
    cfg = d.config
    seeds = int(cfg.get("seeds", 1))
    from axiomformer.study.stages import selection_seeds_of

    selection = selection_seeds_of(cfg)
    reason = None
    if "selection_seeds" not in cfg and any(s < seeds for s in selection):
        reason = (
            "store written by a previous version: its selection seed was also a reported seed; rerun the "
            "study for verdicts"
        )
    elif cfg.get("pilot"):
        reason = "a pilot run (quick preset): it claims nothing"
    elif seeds < int(cfg.get("min_seeds", 10)):
        reason = f"{seeds} reported seeds, fewer than the preset's minimum of {cfg.get('min_seeds', 10)}"
    else:
        finished = max((len(runs) for runs in _by_cell(d).values()), default=0)
        if d.rows and finished < int(cfg.get("min_seeds", 10)):
            reason = (
                f"a partial store: {finished} of {seeds} reported seeds finished, fewer than the preset's "
                f"minimum of {cfg.get('min_seeds', 10)}; rerun the same command with the same --out to resume"
            )
    contrasts = suite_contrasts(d)
    if contrasts is None:
        primary, secondary = families(d)
        primary_names, secondary_names = [m for m, _ in primary], [m for m, _ in secondary]
    else:
        primary_names = [c.model for c in contrasts if c.family == "primary"]
        secondary_names = [c.model for c in contrasts if c.family != "primary"]
    return {
        "selection_seeds": selection,
        "reported_seeds": list(range(seeds)),
        "alpha": float(cfg.get("alpha", ALPHA)),
        "correction": CORRECTION,
        "margin": float(cfg.get("margin", MARGIN)),
        "power": POWER,
        "min_seeds": int(cfg.get("min_seeds", 10)),
        "pilot": reason is not None,
        "pilot_reason": reason,
        "primary_task": f"{d.tasks[0][0]}@{d.tasks[0][1]}" if d.tasks and (_wanted(d) or contrasts) else None,
        "primary": sorted(set(primary_names), key=_model_order(d)),
        "secondary": sorted(set(secondary_names), key=_model_order(d)),
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


def _model_order(d: StudyData):
    order = {label: i for i, label in enumerate(_labels(d))}
    return lambda label: order.get(label, len(order))


def _pairs(d: StudyData) -> list[tuple[str, tuple[str, int]]]:
    """Every (model, (task, length)) with runs of both the model and the standard model, in report order."""
    cells = _by_cell(d)
    return [
        (m["label"], t)
        for t in d.tasks
        if cells.get((REFERENCE, *t))
        for m in d.models
        if m["label"] != REFERENCE and cells.get((m["label"], *t))
    ]


def families(d: StudyData) -> tuple[list, list]:
    """(primary, secondary) lists of (model, (task, length)): primary = the config's ``primary`` models on the first
    task (every comparison when ``primary`` is empty)."""
    labels = {m["label"]: m for m in d.models}
    wanted = _wanted(d)
    primary_labels = {
        label for label in labels if not wanted or label in wanted or _relax_text(labels[label]) in wanted
    }
    pairs = _pairs(d)
    first = d.tasks[0] if d.tasks else None
    primary = [p for p in pairs if p[0] in primary_labels and (not wanted or p[1] == first)]
    return primary, [p for p in pairs if p not in primary]


def _wanted(d: StudyData) -> set[str]:
    """The config's ``primary`` labels that name a model of this study."""
    known = {m["label"] for m in d.models} | {_relax_text(m) for m in d.models}
    return {p.replace(" ", "") for p in d.config.get("primary") or []} & known


def _relax_text(model: dict[str, Any]) -> str:
    return model["label"] if model["kind"] == "transformer" else model["kind"]


def _family_verdicts(d: StudyData, pairs: list, info: dict[str, Any]) -> list[tuple[Verdict, int]]:
    cells = _by_cell(d)
    out = []
    kinds = {m["label"]: m["kind"] for m in d.models}
    for label, (task, seq_len) in pairs:
        runs, reference = cells[(label, task, seq_len)], cells[(REFERENCE, task, seq_len)]
        seeds = sorted(set(runs) & set(reference))
        item = PairedItem(
            assumption_of(label, kinds.get(label, "transformer")),
            label,
            f"{task}@{seq_len}",
            [runs[s]["accuracy"] for s in seeds],
            [reference[s]["accuracy"] for s in seeds],
            _converged(runs) and _converged(reference),
        )
        pilot = info["pilot"] or len(seeds) < info["min_seeds"]
        out.append(
            (
                one_comparison(
                    item,
                    family_size=max(1, len(pairs)),
                    alpha=info["alpha"],
                    margin=info["margin"],
                    power=POWER,
                    pilot=pilot,
                ),
                seq_len,
            )
        )
    return out


def verdicts(d: StudyData) -> list[tuple[Verdict, int, str]]:
    """``(verdict, seq_len, family)`` for every comparison: the primary family first, then the secondary one."""
    info = design(d)
    contrasts = suite_contrasts(d)
    if contrasts is not None:
        from axiomformer.study.contrasts import contrast_verdicts

        return contrast_verdicts(info, contrasts)
    primary, secondary = families(d)
    return [(v, n, "primary") for v, n in _family_verdicts(d, primary, info)] + [
        (v, n, "secondary") for v, n in _family_verdicts(d, secondary, info)
    ]


def comparisons(d: StudyData) -> list[tuple[Verdict, int, str]]:
    """The same as :func:`verdicts` (kept under this name for the report's tables and the suites)."""
    return verdicts(d)


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
        }
        for v, n, family in found
    ]
    out = {
        "design": info,
        "cells": [asdict(c) for c in cell_stats(d)],
        "comparisons": comps,
        "verdicts": [v.to_dict() for v, _, _ in found],
    }
    from axiomformer.study.registry import get_suite

    try:
        extra = get_suite(d.suite).extra_json
    except ValueError:
        extra = None
    return out | ({k: v for k, v in extra(d).items() if k not in out} if extra is not None else {})


__all__ = [
    "REFERENCE",
    "CellStat",
    "cell_stats",
    "comparisons",
    "design",
    "families",
    "n_test_items",
    "suite_contrasts",
    "to_json",
    "verdicts",
]
