"""A study in stages: which runs can be planned only once earlier ones are stored.

A *stage* is a function ``stage(stored) -> list[Run]`` of the results stored so far (``stored``: run key -> the
:class:`~axiomformer.study.record.RunRecord` that ``ResultsStore.runs`` gives back; ``None`` for a stage that needs
nothing). The runner calls the stages in order and trains, after each, whatever the store lacks, so an interrupted
study resumes at the stage it was in and a stage's plan is a pure function of the store. Two protocols:

* **learning-rate selection** (default): stage 1 trains every cell once per learning rate of ``budget.lr_grid`` at
  each of the ``selection_seeds``; up to ``lr_widen`` stages then extend the grid one step beyond its edge for each
  cell whose best rate is at the edge (beyond both edges where every rate ties on validation accuracy,
  :func:`tried_lrs`); the last stage trains the reported seeds (disjoint from the selection seeds) at
  each cell's chosen rate.
* **curriculum** (``curriculum = true``): the same two stages at each task's shortest length; then, length by length
  in increasing order, every (model, task, seed) trains at the next length starting from its own weights at the
  previous one (``init_from``), at the rate chosen at the shortest length.

The choice itself (:func:`choose_lr`) is also what the report uses to tell reported runs from selection-only ones.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Literal

from axiomformer.study.config import StudyConfig
from axiomformer.study.record import RunRecord
from axiomformer.study.sweep import AA_LABEL, Cell, CountFn, Run, cells, make_run

Stored = dict[str, RunRecord] | None
Stage = Callable[[Stored], list[Run]]
Chosen = float | None | Literal["missing"]
"""A cell's chosen learning rate: a rate, ``None`` (the trainer's default), or ``"missing"`` (no run stored yet)."""


def selection_score(row: RunRecord) -> tuple[float, float]:
    """Higher is better: (validation accuracy, -validation loss) of a stored run."""
    acc = row.outcome.val_accuracy
    loss = row.outcome.val_loss
    return (acc if acc is not None else -1.0, -(loss if loss is not None else float("inf")))


def _mean_score(rows: list[RunRecord]) -> tuple[float, float]:
    scores = [selection_score(r) for r in rows]
    return (sum(a for a, _ in scores) / len(scores), sum(b for _, b in scores) / len(scores))


def choose_lr(candidates: list[tuple[float | None, Any]]) -> Chosen:
    """The learning rate whose selection runs score best on average over the selection seeds
    (:func:`selection_score`); the first in grid order wins a tie. ``candidates``: ``(lr, stored rows)`` in grid order,
    the rows as a list (one per selection seed stored), one row, or ``None``. Returns ``"missing"`` when no run is
    stored."""
    best: tuple[float, float] | None = None
    chosen: Chosen = "missing"
    for lr, rows in candidates:
        rows = [r for r in (rows if isinstance(rows, list) else [rows]) if r is not None]
        if not rows:
            continue
        score = _mean_score(rows)
        if best is None or score > best:
            best, chosen = score, lr
    return chosen


def _ratio(grid: list[float | None]) -> float:
    """The grid's geometric step (sqrt(10) for a one-value grid): how far a widened rate lies beyond the edge."""
    values = sorted(lr for lr in grid if lr is not None)
    return values[1] / values[0] if len(values) > 1 and values[0] > 0 else 10**0.5


def tried_lrs(config: StudyConfig, cell: Cell, stored: dict[str, RunRecord], widenings: int) -> list:
    """The learning rates of ``cell`` after ``widenings`` rounds of widening: start from the grid; each round, when
    the best rate so far (on the stored selection runs) is the smallest or the largest tried, add the next one beyond
    it (one grid step further). When no rate separates from the others (every tried rate at exactly the same mean
    validation accuracy, the choice made by validation loss alone: e.g. all at a constant chance prediction), add one
    beyond each edge, since the loss of a model stuck at chance does not say which way a working rate lies. The test
    is exact equality: rates that all solve at 1.000 widen both ways too (runs, no harm), while stuck runs whose
    accuracies differ in a digit widen one way, by the loss. A one-value grid (or the trainer default, ``None``) is
    never widened."""
    lrs = list(cell.budget["lr_grid"])
    if None in lrs or len(lrs) < 2:
        return lrs
    step = _ratio(lrs)
    for _ in range(widenings):
        best = _chosen_among(config, cell, stored, lrs)
        if best == "missing" or best is None:  # None: never in a grid of two or more rates
            break
        if _undecided(config, cell, stored, lrs):
            lrs = [min(lrs) / step, *lrs, max(lrs) * step]
        elif best == min(lrs):
            lrs = [best / step, *lrs]
        elif best == max(lrs):
            lrs = [*lrs, best * step]
        else:
            break
    return lrs


def _undecided(config: StudyConfig, cell: Cell, stored: dict[str, RunRecord], lrs: list) -> bool:
    """Whether every rate of ``lrs`` has all its selection runs stored at one and the same mean validation accuracy."""
    accuracies = set()
    for lr in lrs:
        rows = [stored.get(r.key) for r in _selection(config, cell, [lr])]
        if any(r is None for r in rows):
            return False
        accuracies.add(_mean_score([r for r in rows if r is not None])[0])
    return len(accuracies) == 1


def _selection(config: StudyConfig, cell: Cell, lrs: list | None = None, *, save_state: bool = False) -> list[Run]:
    return [
        make_run(config, cell, seed, lr, save_state=save_state)
        for lr in (cell.budget["lr_grid"] if lrs is None else lrs)
        for seed in config.selection_seeds
    ]


def _chosen_among(config: StudyConfig, cell: Cell, stored: dict[str, RunRecord], lrs: list) -> Chosen:
    runs = _selection(config, cell, lrs)
    by_lr: dict[Any, list] = {}
    for r in runs:
        by_lr.setdefault(r.train_config.get("lr"), []).append(stored.get(r.key))
    return choose_lr(list(by_lr.items()))


def _chosen(config: StudyConfig, cell: Cell, stored: dict[str, RunRecord]) -> Chosen:
    return _chosen_among(config, cell, stored, tried_lrs(config, cell, stored, config.lr_widen))


def ranked_lrs(candidates: list[tuple[float | None, Any]]) -> list[float | None]:
    """The rates of ``candidates`` (as :func:`choose_lr` reads them) from best to worst by mean selection score;
    ties keep grid order. Rates with no stored run are left out."""
    scored = []
    for index, (lr, rows) in enumerate(candidates):
        rows = [r for r in (rows if isinstance(rows, list) else [rows]) if r is not None]
        if rows:
            score = _mean_score(rows)
            scored.append(((-score[0], -score[1], index), lr))
    return [lr for _, lr in sorted(scored, key=lambda item: item[0])]


def _second_best(config: StudyConfig, cell: Cell, stored: dict[str, RunRecord]) -> Chosen:
    lrs = tried_lrs(config, cell, stored, config.lr_widen)
    by_lr: dict[Any, list] = {}
    for r in _selection(config, cell, lrs):
        by_lr.setdefault(r.train_config.get("lr"), []).append(stored.get(r.key))
    ranked = ranked_lrs(list(by_lr.items()))
    return ranked[1] if len(ranked) > 1 else "missing"


def is_aa(cell: Cell) -> bool:
    """Whether ``cell`` is the A/A control (it trains at the standard model's chosen rate, with no selection)."""
    return cell.model.label == AA_LABEL


def checked(cell: Cell, reference: str = "standard") -> bool:
    """Whether ``cell`` is a relaxed arm whose comparisons ``lr_check`` recomputes at its second-best rate: every
    model but the reference one (``standard``, or a suite's reference arm), its A/A copy and the validity controls."""
    from axiomformer.study.config import CONTROLS

    return cell.model.label != reference and not is_aa(cell) and cell.model.kind not in CONTROLS


def selection_stages(config: StudyConfig, all_cells: list[Cell], reference: str = "standard") -> list[Stage]:
    """Stage 1: every cell at every learning rate of its grid (selection seeds). Then up to ``lr_widen`` stages that
    extend the grid of each cell whose best rate is at an edge, or of one whose rates all tie (:func:`tried_lrs`).
    Last: the reported seeds at the chosen rate (a cell whose selection runs all failed is left out); the A/A control
    trains at the rate chosen for the ``reference`` model of its task. Then, with ``lr_check``, every :func:`checked`
    cell at its second-best rate."""

    selected = [cell for cell in all_cells if not is_aa(cell)]
    standard = {(c.task, c.seq_len): c for c in all_cells if c.model.label == reference}

    def select(stored: Stored) -> list[Run]:
        return [run for cell in selected for run in _selection(config, cell)]

    def widen(rounds: int) -> Stage:
        def stage(stored: Stored) -> list[Run]:
            return [
                run
                for cell in selected
                for run in _selection(config, cell, tried_lrs(config, cell, stored or {}, rounds))
            ]

        return stage

    def lr_of(cell: Cell, stored: dict[str, RunRecord]) -> Chosen:
        reference = standard.get((cell.task, cell.seq_len)) if is_aa(cell) else cell
        return "missing" if reference is None else _chosen(config, reference, stored)

    def report(stored: Stored) -> list[Run]:
        # seed-major: an interrupted study holds the same seeds for every cell, so its comparisons stay paired
        chosen = [(cell, lr_of(cell, stored or {})) for cell in all_cells]
        return [
            make_run(config, cell, seed, lr) for seed in range(config.seeds) for cell, lr in chosen if lr != "missing"
        ]

    def check(stored: Stored) -> list[Run]:
        second = [(cell, _second_best(config, cell, stored or {})) for cell in selected if checked(cell, reference)]
        return [
            make_run(config, cell, seed, lr) for seed in range(config.seeds) for cell, lr in second if lr != "missing"
        ]

    return [select, *(widen(k) for k in range(1, config.lr_widen + 1)), report, *([check] if config.lr_check else [])]


def curriculum_stages(config: StudyConfig, all_cells: list[Cell]) -> list[Stage]:
    """Selection and reported seeds at each task's shortest length, then one stage per longer length, each run
    warm-started from the same (model, task, seed) at the previous length. The A/A control has no selection runs:
    it trains at the rate chosen for the standard model."""
    by_task: dict[str, list[Cell]] = defaultdict(list)
    for cell in all_cells:
        by_task[cell.task].append(cell)
    lengths = {task: sorted({c.seq_len for c in cs}) for task, cs in by_task.items()}
    first = [c for c in all_cells if c.seq_len == lengths[c.task][0]]
    chosen: dict[tuple[str, str], float | None] = {}
    last: dict[tuple[str, str, int], Run] = {}  # (label, task, seed) -> the run at the previous length

    standard = {c.task: c for c in first if c.model.label == "standard"}

    def select(stored: Stored) -> list[Run]:
        return [run for cell in first if not is_aa(cell) for run in _selection(config, cell, save_state=True)]

    def report(stored: Stored) -> list[Run]:
        out = []
        for cell in first:
            # the A/A control trains at the rate chosen for the standard model it copies (no selection of its own)
            source = standard.get(cell.task) if is_aa(cell) else cell
            if source is None:
                continue
            lr = _chosen_among(config, source, stored or {}, list(source.budget["lr_grid"]))
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
                    run = make_run(
                        config,
                        cell,
                        seed,
                        chosen[(cell.model.label, cell.task)],
                        init_from=previous.state_path,
                        save_state=True,
                    )
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


def plan_all(config: StudyConfig, stored: dict[str, RunRecord]) -> list[Run]:
    """Every run the stages plan given ``stored`` (run key -> row), duplicates merged, in stage order."""
    out: dict[str, Run] = {}
    for index, stage in enumerate(stages_for(config)):
        for run in stage(None if index == 0 else stored):
            out.setdefault(run.key, run)
    return list(out.values())


def selection_groups(config: StudyConfig, rows: list[RunRecord]) -> dict[tuple, list[tuple[Any, list]]]:
    """(label, task, length) -> ``[(lr, [selection rows])]`` in increasing lr order: what :func:`choose_lr` reads."""
    chosen_seeds = set(config.selection_seeds)
    groups: dict[tuple, dict[Any, list]] = defaultdict(dict)
    for r in rows:
        tc = r.train_config
        if r.seed in chosen_seeds and not tc.get("init_from"):
            groups[(r.label, r.task, r.seq_len)].setdefault(tc.get("lr"), []).append(r)
    return {k: sorted(v.items(), key=lambda item: (item[0] is None, item[0] or 0.0)) for k, v in groups.items()}


def lr_at_edge(config: StudyConfig, rows: list[RunRecord], lrs: dict[tuple, Any]) -> set[tuple]:
    """The cells whose chosen rate is the smallest or the largest of the rates tried (two or more): the optimum may
    lie outside the grid, even after widening ("lr at grid edge")."""
    out = set()
    for ident, group in selection_groups(config, rows).items():
        tried = [lr for lr, _ in group if lr is not None]
        if len(tried) > 1 and lrs.get(ident) in (min(tried), max(tried)):
            out.add(ident)
    return out


def reported_rows(config: StudyConfig, rows: list[RunRecord]) -> tuple[list[RunRecord], dict[tuple, float | None]]:
    """The rows a report counts, and the chosen learning rate per (label, task, length).

    A row is reported when its seed is among ``0 .. seeds-1`` and its learning rate is the one chosen for its cell:
    by the selection seeds' mean validation score at that length (over every rate tried, the widened ones included),
    or, with a curriculum, at the task's shortest length. Works from the stored rows and the stored config alone (no
    replanning); a store of the previous version (one ``selection_seed``, migrated by ``config.stored_config``) is
    read the same way.
    """
    seeds, curriculum = config.seeds, config.curriculum
    shortest: dict[str, int] = {}
    for r in rows:
        shortest[r.task] = min(shortest.get(r.task, r.seq_len), r.seq_len)
    chosen_at = {k: choose_lr(v) for k, v in selection_groups(config, rows).items()}
    copied = aa_sources(rows)
    lrs: dict[tuple, float | None] = {}
    out = []
    for r in rows:
        ident = (r.label, r.task, r.seq_len)
        label = copied.get((r.task, r.seq_len), "standard") if r.label == AA_LABEL else r.label
        source = (label, r.task, shortest[r.task]) if curriculum else (label, r.task, r.seq_len)
        lr = chosen_at.get(source, "missing")
        if lr == "missing" or r.seed >= seeds or r.train_config.get("lr") != lr:
            continue
        lrs[ident] = lr
        out.append(r)
    return out, lrs


def aa_sources(rows: list[RunRecord]) -> dict[tuple[str, int], str]:
    """The arm the A/A control copies, per (task, length): the label whose run at the same seed was trained with the
    A/A run's configuration but its initialization stream (a suite's reference arm need not be called
    ``standard``: the rho suite's is ``attn-only rho=mlp``). Settings without a match are left out."""

    def config_of(r: RunRecord) -> str:
        return json.dumps({k: v for k, v in r.train_config.items() if k != "init_stream"}, sort_keys=True)

    by_config = {(r.task, r.seq_len, config_of(r)): r.label for r in rows if r.label != AA_LABEL}
    out: dict[tuple[str, int], str] = {}
    for r in rows:
        if r.label == AA_LABEL and (label := by_config.get((r.task, r.seq_len, config_of(r)))) is not None:
            out[(r.task, r.seq_len)] = label
    return out


def second_best_rows(config: StudyConfig, rows: list[RunRecord]) -> tuple[list[RunRecord], dict[tuple, Any]]:
    """The ``lr_check`` rows: reported seeds of each cell at its second-best rate (by the selection seeds' mean
    validation score over every rate tried), and that rate per (label, task, length)."""
    seeds = config.seeds
    second = {k: ranked[1] for k, v in selection_groups(config, rows).items() if len(ranked := ranked_lrs(v)) > 1}
    out, lrs = [], {}
    for r in rows:
        ident = (r.label, r.task, r.seq_len)
        if ident in second and r.seed < seeds and r.train_config.get("lr") == second[ident]:
            lrs[ident] = second[ident]
            out.append(r)
    return out, lrs
