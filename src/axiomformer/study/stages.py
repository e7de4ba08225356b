"""A study in stages: which runs can be planned only once earlier ones are stored.

A *stage* is a function ``stage(stored) -> list[Run]`` of the results stored so far (``stored``: run key -> row, as
``ResultsStore.runs`` gives it; ``None`` for a stage that needs nothing). The runner calls the stages in order and
trains, after each, whatever the store lacks, so an interrupted study resumes at the stage it was in and a stage's
plan is a pure function of the store. Two protocols:

* **learning-rate selection** (default): stage 1 trains every cell once per learning rate of ``budget.lr_grid`` at
  ``selection_seed``; stage 2 trains the reported seeds at each cell's chosen rate (a seed equal to the selection seed
  has the same key as its selection run and is not retrained).
* **curriculum** (``curriculum = true``): the same two stages at each task's shortest length; then, length by length
  in increasing order, every (model, task, seed) trains at the next length starting from its own weights at the
  previous one (``init_from``), at the rate chosen at the shortest length.

The choice itself (:func:`choose_lr`) is also what the report uses to tell reported runs from selection-only ones.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Optional

from axiomformer.study.config import StudyConfig
from axiomformer.study.sweep import Cell, CountFn, Run, cells, make_run

Stored = Optional[dict[str, dict[str, Any]]]
Stage = Callable[[Stored], list[Run]]


def selection_score(row: dict[str, Any]) -> tuple[float, float]:
    """Higher is better: (validation accuracy, -validation loss) of a stored run."""
    out = row.get("outcome") or {}
    acc = out.get("val_accuracy")
    loss = out.get("val_loss")
    return (acc if acc is not None else -1.0, -(loss if loss is not None else float("inf")))


def choose_lr(candidates: list[tuple[float | None, dict[str, Any] | None]]) -> float | None | str:
    """The learning rate whose selection run scores best (:func:`selection_score`); the first in grid order wins a
    tie. ``candidates``: ``(lr, stored row or None)`` in grid order. Returns ``"missing"`` when no run is stored."""
    best, chosen = None, "missing"
    for lr, row in candidates:
        if row is None:
            continue
        score = selection_score(row)
        if best is None or score > best:
            best, chosen = score, lr
    return chosen


def _selection(config: StudyConfig, cell: Cell, *, save_state: bool = False) -> list[Run]:
    return [make_run(config, cell, config.selection_seed, lr, save_state=save_state) for lr in cell.budget["lr_grid"]]


def _chosen(config: StudyConfig, cell: Cell, stored: dict[str, dict[str, Any]]) -> float | None | str:
    return choose_lr([(r.train_config.get("lr"), stored.get(r.key)) for r in _selection(config, cell)])


def selection_stages(config: StudyConfig, all_cells: list[Cell]) -> list[Stage]:
    """Stage 1: every cell at every learning rate of its grid (selection seed). Stage 2: the reported seeds at the
    chosen rate (a cell whose selection runs all failed is left out)."""
    def select(stored: Stored) -> list[Run]:
        return [run for cell in all_cells for run in _selection(config, cell)]

    def report(stored: Stored) -> list[Run]:
        out = []
        for cell in all_cells:
            lr = _chosen(config, cell, stored or {})
            if lr != "missing":
                out += [make_run(config, cell, seed, lr) for seed in range(config.seeds)]
        return out

    return [select, report]


def curriculum_stages(config: StudyConfig, all_cells: list[Cell]) -> list[Stage]:
    """Selection and reported seeds at each task's shortest length, then one stage per longer length, each run
    warm-started from the same (model, task, seed) at the previous length."""
    by_task: dict[str, list[Cell]] = defaultdict(list)
    for cell in all_cells:
        by_task[cell.task].append(cell)
    lengths = {task: sorted({c.seq_len for c in cs}) for task, cs in by_task.items()}
    first = [c for c in all_cells if c.seq_len == lengths[c.task][0]]
    chosen: dict[tuple[str, str], float | None] = {}
    last: dict[tuple[str, str, int], Run] = {}   # (label, task, seed) -> the run at the previous length

    def select(stored: Stored) -> list[Run]:
        return [run for cell in first for run in _selection(config, cell, save_state=True)]

    def report(stored: Stored) -> list[Run]:
        out = []
        for cell in first:
            lr = _chosen(config, cell, stored or {})
            if lr == "missing":
                continue
            chosen[(cell.model.label, cell.task)] = lr
            for seed in range(config.seeds):
                run = make_run(config, cell, seed, lr, save_state=True)
                last[(cell.model.label, cell.task, seed)] = run
                out.append(run)
        return out

    def at_length(index: int) -> Stage:
        def stage(stored: Stored) -> list[Run]:
            out = []
            for cell in all_cells:
                if len(lengths[cell.task]) <= index or cell.seq_len != lengths[cell.task][index]:
                    continue
                for seed in range(config.seeds):
                    previous = last.get((cell.model.label, cell.task, seed))
                    if previous is None or (stored or {}).get(previous.key) is None:
                        continue  # the chain broke (a failed run): nothing to warm-start from
                    run = make_run(config, cell, seed, chosen[(cell.model.label, cell.task)],
                                   init_from=previous.state_path, save_state=True)
                    last[(cell.model.label, cell.task, seed)] = run
                    out.append(run)
            return out
        return stage

    longest = max(len(v) for v in lengths.values())
    return [select, report, *(at_length(i) for i in range(1, longest))]


def stages_for(config: StudyConfig, *, count: CountFn | None = None) -> list[Stage]:
    """The stages of ``config`` (curriculum or plain selection).

    Raises:
        ValueError: parameter matching fails (see ``sweep.match_widths``).
    """
    all_cells = cells(config, count=count)
    return (curriculum_stages if config.curriculum else selection_stages)(config, all_cells)


def plan(config: StudyConfig, *, count: CountFn | None = None) -> list[Run]:
    """The first stage of the study: every run that needs no earlier result (lr selection at the selection seed;
    with a single learning rate, every seed), in a deterministic order (task, length, model, lr).

    Raises:
        ValueError: parameter matching fails (see ``sweep.match_widths``).
    """
    return stages_for(config, count=count)[0](None)


def plan_all(config: StudyConfig, stored: dict[str, dict[str, Any]]) -> list[Run]:
    """Every run the stages plan given ``stored`` (run key -> row), duplicates merged, in stage order."""
    out: dict[str, Run] = {}
    for index, stage in enumerate(stages_for(config)):
        for run in stage(None if index == 0 else stored):
            out.setdefault(run.key, run)
    return list(out.values())


def reported_rows(config: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                                dict[tuple, float | None]]:
    """The rows a report counts, and the chosen learning rate per (label, task, length).

    A row is reported when its seed is among ``0 .. seeds-1`` and its learning rate is the one chosen for its cell:
    by the selection seed's validation score at that length, or, with a curriculum, at the task's shortest length.
    Works from the stored rows and the stored config alone (no replanning).
    """
    seeds = int(config.get("seeds", 1))
    selection_seed = int(config.get("selection_seed", 0))
    curriculum = bool(config.get("curriculum", False))
    shortest: dict[str, int] = {}
    for r in rows:
        shortest[r["task"]] = min(shortest.get(r["task"], r["seq_len"]), r["seq_len"])
    groups: dict[tuple, list[tuple[float | None, dict]]] = defaultdict(list)
    for r in rows:
        tc = r.get("train_config") or {}
        if r["seed"] == selection_seed and not tc.get("init_from"):
            groups[(r["label"], r["task"], r["seq_len"])].append((tc.get("lr"), r))
    chosen_at = {k: choose_lr(sorted(v, key=lambda item: (item[0] is None, item[0] or 0.0)))
                 for k, v in groups.items()}
    lrs: dict[tuple, float | None] = {}
    out = []
    for r in rows:
        ident = (r["label"], r["task"], r["seq_len"])
        source = (r["label"], r["task"], shortest[r["task"]]) if curriculum else ident
        lr = chosen_at.get(source, "missing")
        if lr == "missing" or r["seed"] >= seeds or (r.get("train_config") or {}).get("lr") != lr:
            continue
        lrs[ident] = lr
        out.append(r)
    return out, lrs
