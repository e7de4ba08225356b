"""The verdicts of a study from its reported runs: per-cell statistics and paired comparisons with the standard model.

This is what ``axiomformer report DIR --json`` prints::

    {"cells": [{"model", "task", "seq_len", "mean", "ci_low", "ci_high", "n_seeds", "lr", "converged", "seeds"}],
     "comparisons": [{"model", "task", "seq_len", "diff", "ci_low", "ci_high", "p", "p_holm", "significant",
                      "n_pairs"}]}

``task`` is the ``task@length`` label the report's tables use (``needle@64``). A cell is *converged* when every
reported run of it converged (``TrainResult.converged``: not still improving on validation when its steps ran out).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from axiomformer.study.statistics import Comparison, compare, mean_interval

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
    n_seeds: int
    lr: float | None
    converged: bool
    seeds: list[int]


def _by_cell(d: "StudyData") -> dict[tuple[str, str, int], dict[int, dict[str, Any]]]:
    out: dict[tuple[str, str, int], dict[int, dict[str, Any]]] = {}
    for r in d.rows:
        out.setdefault((r["label"], r["task"], r["seq_len"]), {})[r["seed"]] = r
    return out


def cell_stats(d: "StudyData") -> list[CellStat]:
    """Mean test accuracy and its 95 % bootstrap interval per (model, task, length), in report order."""
    cells = _by_cell(d)
    out = []
    for task, seq_len in d.tasks:
        for m in d.models:
            runs = cells.get((m["label"], task, seq_len))
            if not runs:
                continue
            seeds = sorted(runs)
            values = [runs[s]["accuracy"] for s in seeds]
            mean, low, high = mean_interval(values)
            converged = all((runs[s].get("outcome") or {}).get("converged", True) for s in seeds)
            out.append(CellStat(m["label"], f"{task}@{seq_len}", seq_len, mean, low, high, len(values),
                                d.lrs.get((m["label"], task, seq_len)), converged, seeds))
    return out


def comparisons(d: "StudyData") -> list[tuple[Comparison, int]]:
    """Every model but the standard one against it, per task, paired by seed, Holm-corrected over the table.

    Returns ``(comparison, seq_len)`` pairs; empty when the study has no standard model.
    """
    cells = _by_cell(d)
    pairs: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    lengths: dict[tuple[str, str], int] = {}
    for task, seq_len in d.tasks:
        reference = cells.get((REFERENCE, task, seq_len))
        if not reference:
            continue
        for m in d.models:
            runs = cells.get((m["label"], task, seq_len))
            if m["label"] == REFERENCE or not runs:
                continue
            seeds = sorted(set(runs) & set(reference))
            key = (m["label"], f"{task}@{seq_len}")
            pairs[key] = ([runs[s]["accuracy"] for s in seeds], [reference[s]["accuracy"] for s in seeds])
            lengths[key] = seq_len
    return [(c, lengths[(c.model, c.task)]) for c in compare(pairs)]


def to_json(d: "StudyData") -> dict[str, list[dict[str, Any]]]:
    """The ``--json`` document (see the module docstring)."""
    cells = [asdict(c) for c in cell_stats(d)]
    comps = [{"model": c.model, "task": c.task, "seq_len": n, "diff": c.diff, "ci_low": c.ci_low,
              "ci_high": c.ci_high, "p": c.p, "p_holm": c.p_holm, "significant": c.significant,
              "n_pairs": c.n_pairs} for c, n in comparisons(d)]
    return {"cells": cells, "comparisons": comps}


__all__ = ["CellStat", "REFERENCE", "cell_stats", "comparisons", "to_json"]
