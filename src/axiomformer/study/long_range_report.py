"""The long-range suite's report body: per (task, model, length) every reported seed's test accuracy with its exact
binomial interval over the test items, the steps it trained, and the zero-shot accuracy of the same seed trained at the
shortest length only; the longest length every seed solves; a figure.

"Solved" is a claim about one trained model on a finite test set, so it is made only where the Clopper-Pearson 95 %
interval of that run's test accuracy lies above the threshold (its lower bound clears it). A length is solved by a
model when every reported seed solves it; the table shows how many do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, Any

from axiomformer.study.config import CONTROLS, StudyConfig
from axiomformer.study.record import RunRecord
from axiomformer.study.render import Heading, Image, Paragraph, Table

if TYPE_CHECKING:
    from axiomformer.study.report import StudyData
    from axiomformer.study.statistics import Interval

CI_METHOD = "clopper-pearson"
"""How the interval of one run's test accuracy is computed: exact binomial over its scored test items."""


def exact_interval(accuracy: float | None, n: int | None, level: float = 0.95) -> tuple[float, float] | None:
    """Clopper-Pearson interval of a proportion ``accuracy`` observed on ``n`` items (``scipy.stats.binomtest``);
    ``None`` when ``n`` is unknown or zero or the accuracy is not finite."""
    if accuracy is None or not n or not math.isfinite(accuracy):
        return None
    from scipy.stats import binomtest

    k = round(accuracy * n)
    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def n_test(row: RunRecord) -> int | None:
    """Scored test items behind a stored row's accuracy (``None`` for a store written before it was recorded)."""
    value = row.outcome.n_test
    return int(value) if value else None


@dataclass
class SeedResult:
    """One reported run at one length: test accuracy, its exact interval, steps trained, whether it solves."""

    seed: int
    accuracy: float | None
    n_test: int | None
    ci: tuple[float, float] | None
    steps: int
    converged: bool
    diverged: bool
    solved: bool

    @classmethod
    def of(cls, row: RunRecord, threshold: float) -> SeedResult:
        outcome = row.outcome
        acc = row.accuracy if row.accuracy is not None and math.isfinite(row.accuracy) else None
        n = n_test(row)
        ci = exact_interval(acc, n)
        diverged = outcome.stop_reason == "nonfinite" or acc is None
        return cls(
            seed=row.seed,
            accuracy=acc,
            n_test=n,
            ci=ci,
            steps=int(row.steps or 0),
            converged=bool(outcome.converged),  # a store's outcome always has the key; None (unknown) reads as not
            diverged=diverged,
            solved=ci is not None and ci[0] >= threshold and not diverged,
        )

    def text(self) -> str:
        if self.accuracy is None:
            return f"s{self.seed} diverged"
        ci = "" if self.ci is None else f" [{self.ci[0]:.3f}, {self.ci[1]:.3f}]"
        return f"s{self.seed} {self.accuracy:.3f}{ci}" + (" (diverged)" if self.diverged else "")


def seed_results(rows: list[RunRecord], label: str, task: str, n: int, threshold: float) -> list[SeedResult]:
    """The runs of ``label`` on ``task`` at length ``n`` among ``rows``, by seed."""
    picked = [r for r in rows if (r.label, r.task, r.seq_len) == (label, task, n)]
    return [SeedResult.of(r, threshold) for r in sorted(picked, key=lambda r: r.seed)]


def _pack(results: list[SeedResult]) -> list[dict[str, Any]]:
    """The JSON of each seed's result (:func:`runs_json`)."""
    return [
        {
            "seed": r.seed,
            "accuracy": r.accuracy,
            "n_test": r.n_test,
            "ci_low": None if r.ci is None else r.ci[0],
            "ci_high": None if r.ci is None else r.ci[1],
            "steps": r.steps,
            "converged": r.converged,
            "diverged": r.diverged,
            "solved": r.solved,
        }
        for r in results
    ]


def runs_json(d: StudyData, *, solved: float) -> dict[str, Any]:
    """The ``long_range`` block of ``report --json``: per (model, task, length) every reported seed's test accuracy
    with its Clopper-Pearson interval, ``n_test``, the steps it trained and whether it solves the length, the same for
    its zero-shot run (trained at the shortest length only), the longest length every seed solves and the learning
    rate chosen per arm (:func:`learning_rates`); and the
    suite's verdicts in place of the main study's (``verdicts``: the solve-rate comparisons, ``"family":
    "long_range"``, ``family_size`` the Bonferroni family; ``answer`` and ``control_answer`` are None: the suite's
    question is its solve-rate table) and ``aa_control`` (:func:`aa_control`)."""
    tasks = _task_lengths(d)
    cells = []
    for m in d.models:
        for task, lengths in tasks.items():
            zero = zero_shot_label(m.label, lengths[0])
            for n in lengths:
                runs = _pack(seed_results(d.rows, m.label, task, n, solved))
                shot = _pack(seed_results(d.all_rows, zero, task, n, solved)) if n != lengths[0] else []
                if runs or shot:
                    cells.append(
                        {
                            "model": m.label,
                            "task": task,
                            "seq_len": n,
                            "runs": runs,
                            "zero_shot": shot,
                            "seeds_solving": sum(r["solved"] for r in runs),
                        }
                    )
    longest = {m.label: {t: longest_solved(d, m.label, t, ls, solved) for t, ls in tasks.items()} for m in d.models}
    solve_rate = solve_rate_comparisons(d, solved, d.config.solve_margin)
    return {
        # The suite's own rule (a task decides when every standard seed solves its shortest length; solve rates by
        # Newcombe) is the only verdict set: the main study's accuracy verdicts and answer are not this suite's.
        "verdicts": [{**c, "family": "long_range", "family_size": c["family"]} for c in solve_rate],
        "answer": None,
        "control_answer": None,
        "aa_control": aa_control(d, solved, d.config.solve_margin),
        "long_range": {
            "solved": solved,
            "ci_method": CI_METHOD,
            "ci_level": 0.95,
            "cells": cells,
            "longest_solved": longest,
            "validity": task_validity(d, solved),
            "learning_rates": learning_rates(d),
            "solve_rate": solve_rate,
        },
    }


def learning_rates(d: StudyData) -> list[dict[str, Any]]:
    """``long_range.learning_rates`` of ``report --json``: per (model, task) at the task's shortest length, the mean
    validation accuracy of the selection runs at each rate of the grid, the rate chosen (``stages.choose_lr``) and
    ``at_grid_edge``: the chosen rate is the smallest or largest of the grid. The curriculum chooses from the grid
    as given (``StudyConfig.lr_widen`` is 0 under ``curriculum``): a widened rate at the shortest length would change
    every later run of the arm, so a rate at an edge is stated, not widened."""
    from axiomformer.study.stages import choose_lr, selection_groups

    shortest = {task: lengths[0] for task, lengths in _task_lengths(d).items()}
    out = []
    for (label, task, n), group in selection_groups(d.config, d.all_rows).items():
        if shortest.get(task) != n:
            continue
        tried = {
            lr: fmean(accs) if accs else None
            for lr, rows in group
            for accs in [[r.outcome.val_accuracy for r in rows if r.outcome.val_accuracy is not None]]
        }
        chosen = choose_lr(group)
        rates = [lr for lr in tried if lr is not None]
        out.append(
            {
                "model": label,
                "task": task,
                "seq_len": n,
                "tried": [{"lr": lr, "val_accuracy": acc} for lr, acc in tried.items()],
                "chosen_lr": None if chosen == "missing" else chosen,
                "at_grid_edge": len(rates) > 1 and chosen in (min(rates), max(rates)),
            }
        )
    return out


def _lr_table(d: StudyData) -> Table | Paragraph:
    found = learning_rates(d)
    if not found:
        return Paragraph("No selection runs stored yet.")
    table = Table(["model", "task", "tried: mean validation accuracy", "chosen", "at grid edge"])
    for e in found:
        tried = ", ".join(
            f"{t['lr']:g}: " + ("—" if t["val_accuracy"] is None else f"{t['val_accuracy']:.3f}") for t in e["tried"]
        )
        chosen = "—" if e["chosen_lr"] is None else f"{e['chosen_lr']:g}"
        table.rows.append(
            [e["model"], f"{e['task']}@{e['seq_len']}", tried, chosen, "yes" if e["at_grid_edge"] else ""]
        )
    table.note = (
        f"Selection seeds {', '.join(map(str, d.config.selection_seeds))} (never reported), at each task's shortest "
        "length. The curriculum chooses from the grid as given and does not widen it: a widened rate at the shortest "
        "length would change every later run of the arm. Chosen: the best mean validation accuracy, a tie broken by the "
        "lower mean validation loss (`stages.choose_lr`). `at grid edge`: the chosen rate is the smallest or largest "
        "of the grid, so the arm's best rate may lie beyond it."
    )
    return table


def design_tasks(d: StudyData, solved: float) -> list[dict[str, Any]]:
    """``design.tasks`` of the long-range suite: the battery's entry per task and length (ceiling, controls, the
    standard model's accuracy, budget; ``battery.task_validity``) with ``discriminates`` and ``why`` from the rule the
    suite's verdicts follow (:func:`task_validity`: per task, at its shortest length), and ``at_length``: the
    battery's own per-length answer. Where the two differ at a longer length, ``why`` says so: there the standard
    Transformer is no better than uniform mixing, and a solve-rate comparison asks which model still solves."""
    from axiomformer.study.battery import task_validity as battery_validity
    from axiomformer.study.summary import cell_stats

    decided = {v["task"]: v for v in task_validity(d, solved)}
    shortest = {task: lengths[0] for task, lengths in _task_lengths(d).items()}
    out = []
    for entry in battery_validity(d, cell_stats(d)):
        task, length = entry["task"].rsplit("@", 1)
        own = decided.get(task)
        if own is None:
            out.append(entry)
            continue
        why = f"{own['why']} (the suite's rule, at {shortest[task]} tokens)"
        if own["decides"] and not entry["discriminates"] and int(length) != shortest[task]:
            why += (
                f"; at {length} tokens by the battery's rule it does not ({entry['why']}): the solve rates there ask "
                "which model still solves where the Transformer does not, not what scores add"
            )
        out.append(entry | {"discriminates": own["decides"], "why": why, "at_length": entry["discriminates"]})
    return out


def is_footing(label: str, kind: str) -> bool:
    """Whether a model is part of the footing (a validity control or the A/A arm), not an arm the suite asks about:
    it gets no zero-shot run and no solve-rate verdict."""
    from axiomformer.study.sweep import AA_LABEL

    return label == AA_LABEL or kind in CONTROLS


def _solve_rate_difference(
    runs: list[SeedResult], reference: list[SeedResult], level: float, margin: float
) -> tuple[int, int, Interval, str]:
    """``(solved, reference solved, Newcombe interval of the difference at level, verdict by the symmetric rule)``."""
    from axiomformer.study.statistics import decide, newcombe_difference

    s_a, s_b = sum(r.solved for r in runs), sum(r.solved for r in reference)
    ci = newcombe_difference(s_a, len(runs), s_b, len(reference), level)
    return s_a, s_b, ci, decide(ci.low, ci.high, margin)


def aa_control(d: StudyData, solved: float, margin: float) -> dict[str, Any] | None:
    """The A/A control by the suite's own metric: the standard model with another initialization stream against the
    standard model, solve rate at every length where both ran (Newcombe, Bonferroni over these lengths, the same
    symmetric rule as the verdicts). ``verdict``: ``forced`` or ``better`` when any length's is (``broken``: the
    comparison finds a difference between a model and itself), else ``free`` when every one is, else
    ``inconclusive``; ``None`` without A/A runs."""
    from axiomformer.study.statistics import ALPHA
    from axiomformer.study.summary import aa_overall
    from axiomformer.study.sweep import AA_LABEL

    pending = []
    for task, lengths in _task_lengths(d).items():
        for n in lengths:
            aa = seed_results(d.rows, AA_LABEL, task, n, solved)
            reference = seed_results(d.rows, "standard", task, n, solved)
            if aa and reference:
                pending.append((task, n, aa, reference))
    if not pending:
        return None
    level = 1 - ALPHA / len(pending)
    tasks: list[dict[str, Any]] = []
    for task, n, aa, reference in pending:
        s_a, s_b, ci, verdict = _solve_rate_difference(aa, reference, level, margin)
        tasks.append(
            {
                "task": f"{task}@{n}",
                "seq_len": n,
                "metric": "solve_rate",
                "solved": s_a,
                "seeds": len(aa),
                "standard_solved": s_b,
                "standard_seeds": len(reference),
                "diff": ci.estimate,
                "ci_low": ci.low,
                "ci_high": ci.high,
                "level": level,
                "verdict": verdict,
                "family": "aa_control",
            }
        )
    overall = aa_overall({t["verdict"] for t in tasks})
    return {
        "model": f"{AA_LABEL} vs standard",
        "verdict": overall,
        "broken": overall in ("forced", "better"),
        "tasks": tasks,
    }


def longest_solved(d: StudyData, label: str, task: str, lengths: list[int], solved: float) -> int | None:
    """The longest length at which every reported seed of ``label`` solves ``task`` (the lower bound of its exact
    95 % interval >= ``solved``), and at least one seed ran there (``None``: no such length)."""
    seeds = d.config.seeds
    best = None
    for n in lengths:
        results = seed_results(d.rows, label, task, n, solved)
        if len(results) >= seeds and all(r.solved for r in results):
            best = n
    return best


def latch_accuracy(d: StudyData, task: str) -> float | None:
    """What a latch (constant memory: the last marked value seen) scores on ``task`` as the store configured it
    (``NeedleTask.latch_accuracy``); ``None`` for a task without one."""
    from axiomformer.tasks import make_task

    settings = next((t for t in d.config.tasks if t.name == task), None)
    if settings is None:
        return None
    built = make_task(task, seq_len=min(settings.seq_lens), **dict(settings.options))
    value = getattr(built, "latch_accuracy", None)
    return None if value is None or not math.isfinite(value) else float(value)


def _ceiling(d: StudyData, task: str, n: int) -> float | None:
    found = ((d.sections.get("ceilings") or {}).get("payload") or {}).get(f"{task}@{n}") or {}
    value = found.get("ceiling")
    return None if value is None else float(value)


def _decides(
    d: StudyData,
    ceilings: dict[int, float | None],
    runs: list[SeedResult],
    solving: int,
    shortest: int,
    latch: float | None,
    solved: float,
) -> tuple[bool, str]:
    """Whether a task decides anything, and why (:func:`task_validity`)."""
    if any(c is None for c in ceilings.values()):
        return False, "no ceiling in this store: the task cannot show what it decides"
    if any(c < solved for c in ceilings.values() if c is not None):
        return False, f"the ceiling lies below the solved line {solved}"
    if solving < len(runs):
        return False, (
            f"the standard Transformer solves {shortest} tokens in {solving} of {len(runs)} seeds run (of "
            f"{d.config.seeds}): the task is not learned in the budget, so its longer lengths say nothing about length"
        )
    if len(runs) < d.config.seeds:
        return False, f"{len(runs)} of {d.config.seeds} standard seeds have run at {shortest}"
    return True, f"the standard Transformer solves {shortest} tokens in every seed" + (
        f"; a latch scores {latch:.3f}" if latch is not None else ""
    )


def _solving(results: list[SeedResult]) -> dict[str, Any] | None:
    """Seeds solving and the mean accuracy of a validity control's runs at one length (``None``: not run)."""
    if not results:
        return None
    return {"solving": sum(r.solved for r in results), "seeds": len(results), "accuracy": _mean(results)}


def _budget(d: StudyData, task: str, lengths: list[int], solved: float) -> dict[str, dict[str, int | float | None]]:
    """Per length: the steps, the standard model's median steps to solve and their ratio (:func:`task_validity`)."""
    from axiomformer.study.battery import median_steps_to_solve, steps_to_solve

    budget: dict[str, dict[str, int | float | None]] = {}
    for n in lengths:
        standard = [r for r in d.rows if (r.label, r.task, r.seq_len) == ("standard", task, n)]
        median = median_steps_to_solve([steps_to_solve(r, solved) for r in standard])
        steps = max((int(r.train_config.get("steps") or 0) for r in standard), default=None)
        budget[str(n)] = {
            "steps": steps,
            "standard_median_steps_to_solve": median,
            "budget_ratio": None if not median or steps is None else steps / median,
        }
    return budget


def task_validity(d: StudyData, solved: float) -> list[dict[str, Any]]:
    """Whether each task can decide anything, per task: its chance, what a latch scores, its ceiling at every length
    (the study's ``ceilings`` section), how many standard seeds solve the shortest length, and ``decides``: the
    standard Transformer solves the shortest length in every reported seed and the ceiling reaches the solved line at
    every length. ``budget`` per length: the steps, the standard model's median steps to reach ``solved`` on
    validation (``battery.median_steps_to_solve``) and their ratio (the main study asks for >= ``BUDGET_RATIO``).
    ``controls``: per validity control (``no_mixing``, ``uniform_mixing``) and length, its seeds solving and mean
    accuracy; a task whose uniform-mixing control solves the shortest length in every seed does not decide (it does
    not need scores). ``tests`` says what a decided task measures: ``recall`` when a latch cannot reach the solved line
    (it must bind keys to values), ``retention`` when a latch solves it (it must only keep one item)."""
    out = []
    for task, lengths in _task_lengths(d).items():
        shortest = lengths[0]
        latch = latch_accuracy(d, task)
        ceilings = {n: _ceiling(d, task, n) for n in lengths}
        runs = seed_results(d.rows, "standard", task, shortest, solved)
        solving = sum(r.solved for r in runs)
        chance = next((r.task_config.get("chance") for r in d.rows if r.task == task), None)
        tests = "retention" if latch is not None and latch >= solved else "recall"
        decides, why = _decides(d, ceilings, runs, solving, shortest, latch, solved)
        controls = {
            name: {str(n): _solving(seed_results(d.rows, name, task, n, solved)) for n in lengths} for name in CONTROLS
        }
        uniform = controls["uniform_mixing"][str(shortest)]
        if decides and uniform is not None and uniform["solving"] == uniform["seeds"]:
            decides, why = (
                False,
                (
                    f"the uniform-mixing control (no scores) solves {shortest} tokens in every seed too: the task does "
                    "not need scores there"
                ),
            )
        budget = _budget(d, task, lengths, solved)
        out.append(
            {
                "task": task,
                "chance": chance,
                "latch": latch,
                "budget": budget,
                "ceiling": {str(n): c for n, c in ceilings.items()},
                "controls": controls,
                "standard_solving_shortest": solving,
                "standard_seeds_shortest": len(runs),
                "decides": decides,
                "tests": tests,
                "why": why,
            }
        )
    return out


def solve_rate_comparisons(d: StudyData, solved: float, margin: float) -> list[dict[str, Any]]:
    """Each other model (and each zero-shot arm) against the standard Transformer at every longer length of a task
    that decides (:func:`task_validity`), by solve rate: a seed solves when its exact interval's lower bound is >=
    ``solved``. The Newcombe interval of the difference (model minus standard) at the Bonferroni level over the
    family (every comparison listed), the verdict by ``statistics.decide`` with ``margin``. A task that does not
    decide gives no comparison."""
    from axiomformer.study.statistics import ALPHA

    deciding = {v["task"] for v in task_validity(d, solved) if v["decides"]}
    pending = []
    for task, lengths in _task_lengths(d).items():
        if task not in deciding:
            continue
        for n in lengths[1:]:
            reference = seed_results(d.rows, "standard", task, n, solved)
            if not reference:
                continue
            asked = [m for m in d.models if not is_footing(m.label, m.kind)]
            arms = [(m.label, seed_results(d.rows, m.label, task, n, solved)) for m in asked if m.label != "standard"]
            for m in asked:
                label = zero_shot_label(m.label, lengths[0])
                arms.append((label, seed_results(d.all_rows, label, task, n, solved)))
            pending += [(task, n, label, runs, reference) for label, runs in arms if runs]
    family = max(1, len(pending))
    level = 1 - ALPHA / family
    out = []
    for task, n, label, runs, reference in pending:
        s_a, s_b, ci, verdict = _solve_rate_difference(runs, reference, level, margin)
        out.append(
            {
                "task": task,
                "seq_len": n,
                "model": label,
                "solved": s_a,
                "seeds": len(runs),
                "standard_solved": s_b,
                "standard_seeds": len(reference),
                "difference": ci.estimate,
                "ci_low": ci.low,
                "ci_high": ci.high,
                "level": level,
                "family": family,
                "margin": margin,
                "verdict": verdict,
            }
        )
    return out


ZERO_SHOT = "{label} (trained at {length} only)"
"""The label of a model's zero-shot runs: its weights trained at the task's shortest length only, tested as they are
at each longer length (no training there)."""


def zero_shot_label(label: str, length: int) -> str:
    """``lstm (trained at 64 only)``: the label of ``label``'s zero-shot runs."""
    return ZERO_SHOT.format(label=label, length=length)


def _task_lengths(d: StudyData) -> dict[str, list[int]]:
    tasks: dict[str, list[int]] = {}
    for settings in d.config.tasks:  # every configured length, run yet or not
        tasks.setdefault(settings.name, []).extend(settings.seq_lens)
    for task, n in d.tasks:
        tasks.setdefault(task, []).append(n)
    return {t: sorted(set(ns)) for t, ns in tasks.items()}


def _mean(results: list[SeedResult]) -> float | None:
    values = [r.accuracy for r in results if r.accuracy is not None]
    return sum(values) / len(values) if values else None


def _figure(d: StudyData, tasks: dict[str, list[int]], solved: float, path: Path) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * len(tasks), 4.2), layout="constrained")
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    colors = [f"C{i}" for i in range(10)]
    for ax, (task, lengths) in zip(axes, tasks.items()):
        chance = next((r.task_config.get("chance") for r in d.rows if r.task == task), None)
        spread = max(1, len(d.models) - 1)
        for i, m in enumerate(d.models):
            shift = 1.0 + 0.06 * (i - spread / 2)  # a small horizontal offset per model, so equal points stay visible
            color = colors[i % len(colors)]
            name = m.label if m.label != "standard" else "Transformer (standard)"
            xs, means = [], []
            for n in lengths:
                results = seed_results(d.rows, m.label, task, n, solved)
                for r in results:
                    if r.accuracy is not None:
                        ax.plot([n * shift], [r.accuracy], marker=".", color=color, alpha=0.5, linestyle="none")
                if _mean(results) is not None:
                    xs.append(n * shift)
                    means.append(_mean(results))
            if xs:
                ax.plot(xs, means, marker="o", color=color, label=f"{name} (curriculum, mean)")
            zero = zero_shot_label(m.label, lengths[0])
            zx, zy = [], []
            for n in lengths[1:]:
                mean = _mean(seed_results(d.all_rows, zero, task, n, solved))
                if mean is not None:
                    zx.append(n * shift)
                    zy.append(mean)
            if zx:
                ax.plot(zx, zy, marker="x", color=color, linestyle=":", label=f"{name} (trained at {lengths[0]} only)")
        if chance is not None:
            ax.axhline(chance, color="grey", linewidth=0.8, linestyle=":", label="chance")
        ax.axhline(solved, color="black", linewidth=0.6, linestyle="--", label=f"solved line {solved}")
        ax.set_xscale("log")
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(task)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _protocol(d: StudyData, solved: float) -> Paragraph:
    cfg = d.config
    seeds = cfg.seeds
    selection = cfg.selection_seeds
    overlap = any(s < seeds for s in selection)
    return Paragraph(
        f"Protocol: curriculum over lengths — each (model, task) picks its learning rate from "
        f"{cfg.budget.lr_grid} on the validation split at the shortest length (selection seed(s) "
        f"{', '.join(map(str, selection))}, "
        + ("also reported" if overlap else "never reported")
        + "), then trains length by "
        "length from its own weights at the previous length; reported seeds: "
        + ", ".join(str(s) for s in range(seeds))
        + ". Every model gets the same steps, batch and evaluations at "
        "every length; early stopping on validation (target accuracy or patience), so the steps a run actually "
        "trained are listed per seed. Test accuracy on a held-out split (no sequence shared with training or "
        "validation) at the best validation checkpoint, with its exact binomial (Clopper-Pearson) 95 % interval over "
        f"the scored test items. A run *solves* a length when that interval's lower bound is >= {solved}; a model "
        "solves a length when every reported seed does. Zero-shot: the same seed's weights trained at the shortest "
        "length only, tested at the longer length without training there."
    )


def _budget_table(cfg: StudyConfig) -> Table:
    budgets = Table(
        [
            "task",
            "length",
            "steps (at most)",
            "batch",
            "warmup",
            "eval every",
            "val batches",
            "test batches",
            "patience",
        ]
    )
    for task in cfg.tasks:
        for n in task.seq_lens:
            at_length = task.length_budgets.get(str(n))
            b = {
                **cfg.budget.model_dump(),
                **{k: v for k, v in task.budget.model_dump().items() if v is not None},
                **{k: v for k, v in (at_length.model_dump() if at_length else {}).items() if v is not None},
            }
            b.setdefault("test_batches", b.get("eval_batches"))
            if b.get("test_batches") is None:
                b["test_batches"] = b.get("eval_batches")
            budgets.rows.append(
                [
                    task.name,
                    str(n),
                    *(
                        str(b.get(k, "—"))
                        for k in (
                            "steps",
                            "batch_size",
                            "warmup",
                            "eval_every",
                            "eval_batches",
                            "test_batches",
                            "patience",
                        )
                    ),
                ]
            )
    budgets.note = (
        "The budget at each length, the same for every model; the test set holds test batches x batch sequences."
    )
    return budgets


def _task_table(d: StudyData, task: str, lengths: list[int], solved: float) -> Table:
    from axiomformer.study.sweep import AA_LABEL

    seeds = d.config.seeds
    table = Table(
        [
            "model",
            "length",
            "test accuracy per seed [95 % CP]",
            "seeds solving",
            "steps trained per seed",
            f"zero-shot (trained at {lengths[0]} only) [95 % CP]",
            "n_test",
        ]
    )
    for m in d.models:
        zero = zero_shot_label(m.label, lengths[0])
        for n in lengths:
            results = seed_results(d.rows, m.label, task, n, solved)
            zs = seed_results(d.all_rows, zero, task, n, solved) if n != lengths[0] else []
            if not results and not zs:
                if not (m.label == AA_LABEL and n != lengths[0]):  # the A/A arm trains at the shortest length only
                    table.rows.append([m.label, str(n), "—", "—", "—", "—", "—"])
                continue
            steps = ", ".join(f"{r.steps}" + ("" if r.converged else "*") for r in results) or "—"
            ns = sorted({r.n_test for r in results + zs if r.n_test})
            table.rows.append(
                [
                    m.label,
                    str(n),
                    "; ".join(r.text() for r in results) or "—",
                    f"{sum(r.solved for r in results)}/{max(seeds, len(results))}",
                    steps,
                    ("; ".join(r.text() for r in zs) + f" ({sum(r.solved for r in zs)}/{len(zs)} solve)")
                    if zs
                    else ("(trained here)" if n == lengths[0] else "—"),
                    ", ".join(map(str, ns)) or "unknown",
                ]
            )
    chance = next((r.task_config.get("chance") for r in d.rows if r.task == task), None)
    table.note = (
        f"Per reported seed (s0, s1, ...): test accuracy at the best validation checkpoint and its "
        f"Clopper-Pearson 95 % interval over n_test scored test sequences. Seeds solving: runs whose lower "
        f"bound is >= {solved}. Steps trained: optimizer steps actually taken at that length (early "
        f"stopping may end a run before its budget; * = not converged: the run used its whole budget with its "
        f"best validation evaluation among its last `patience` ones, so more steps might still have raised it). "
        f"Zero-shot: the same seed trained at {lengths[0]} only"
        + (f"; chance {chance:.3f}" if chance is not None else "")
        + ". `—`: no zero-shot run (the controls have none; a model's: not run yet)."
    )
    return table


def _controls_text(controls: dict[str, dict[str, dict[str, Any] | None]]) -> str:
    """``64: 0/5 / 5/5, 10000: ...``: each length's no-mixing and uniform-mixing seeds solving (``—``: not run)."""

    def one(found: dict[str, Any] | None) -> str:
        return "—" if found is None else f"{found['solving']}/{found['seeds']}"

    lengths = list(next(iter(controls.values()), {}))
    return ", ".join(f"{n}: {one(controls['no_mixing'][n])} / {one(controls['uniform_mixing'][n])}" for n in lengths)


def _validity_table(d: StudyData, solved: float) -> Table:
    table = Table(
        [
            "task",
            "chance",
            "latch",
            "ceiling per length",
            "budget / standard's median steps to solve",
            "standard solves shortest",
            "no mixing / uniform mixing solve (per length)",
            "decides",
            "why",
        ]
    )
    for v in task_validity(d, solved):
        ceilings = ", ".join(f"{n}: {'—' if c is None else f'{c:.3f}'}" for n, c in v["ceiling"].items())

        def ratio(b: dict[str, Any]) -> str:
            if b["standard_median_steps_to_solve"] is None:
                return f"{b['steps']} / not solved"
            return f"{b['steps']} / {b['standard_median_steps_to_solve']} = {b['budget_ratio']:.1f}x"

        budgets = ", ".join(f"{n}: {ratio(b)}" for n, b in v["budget"].items() if b["steps"] is not None) or "—"
        table.rows.append(
            [
                v["task"],
                "—" if v["chance"] is None else f"{v['chance']:.3f}",
                "—" if v["latch"] is None else f"{v['latch']:.3f}",
                ceilings,
                budgets,
                f"{v['standard_solving_shortest']}/{v['standard_seeds_shortest']}",
                _controls_text(v["controls"]),
                f"yes ({v['tests']})" if v["decides"] else "no",
                v["why"],
            ]
        )
    table.note = (
        "Latch: the accuracy of a constant-memory reader that keeps the last marked value it saw (needle: one pair, "
        "so a latch solves it and the task tests retention; needle_kv: several pairs, one asked, so it tests recall). "
        "Ceiling: the best any causal model can reach on the study's own test items. A task decides when the "
        f"standard Transformer solves its shortest length in every seed (exact lower bound >= {solved}) and the "
        "ceiling reaches the solved line; budget: the steps at each length over the standard Transformer's median "
        f"steps to {solved} validation accuracy (the main study asks for >= 3x: the budget reaches past the plateau; "
        "at the longer length the run starts from its trained weights); a task that does not decide gives no verdict (its rows below are shown "
        "for the record). Controls (trained through the curriculum like the models): no token mixing, and uniform "
        "mixing (every visible token weighs the same: no scores); a task whose uniform-mixing control solves its "
        "shortest length in every seed does not decide. The latch is computed, not trained."
    )
    return table


def _aa_table(d: StudyData, solved: float) -> Table | Paragraph:
    found = aa_control(d, solved, d.config.solve_margin)
    if found is None:
        return Paragraph("No A/A runs in this store (the preset's `aa_control` is off or they have not run yet).")
    table = Table(["setting", "A/A seeds solving", "standard", "difference [CI]", "verdict"])
    for t in found["tasks"]:
        table.rows.append(
            [
                t["task"],
                f"{t['solved']}/{t['seeds']}",
                f"{t['standard_solved']}/{t['standard_seeds']}",
                f"{t['diff']:+.2f} [{t['ci_low']:+.2f}, {t['ci_high']:+.2f}]",
                t["verdict"],
            ]
        )
    table.note = (
        f"The standard Transformer against itself with another initialization stream (the null of the solve-rate "
        f"comparisons; overall: **{found['verdict']}**"
        + (", the comparison is broken" if found["broken"] else "")
        + "). Newcombe interval, Bonferroni over the settings listed, the same symmetric rule as the verdicts: a "
        "forced or better here would mean the comparison finds differences between a model and itself."
    )
    return table


def _solve_rate_table(d: StudyData, solved: float) -> Table:
    table = Table(["task", "length", "model", "seeds solving", "standard", "difference [CI]", "verdict"])
    found = solve_rate_comparisons(d, solved, d.config.solve_margin)
    for c in found:
        table.rows.append(
            [
                c["task"],
                str(c["seq_len"]),
                c["model"],
                f"{c['solved']}/{c['seeds']}",
                f"{c['standard_solved']}/{c['standard_seeds']}",
                f"{c['difference']:+.2f} [{c['ci_low']:+.2f}, {c['ci_high']:+.2f}]",
                c["verdict"],
            ]
        )
    level = found[0]["level"] if found else 0.95
    table.note = (
        "Solve rate (seeds whose exact lower bound is >= "
        f"{solved}) of each model minus the standard Transformer's, at each longer length of a task that decides; "
        f"Newcombe hybrid score interval at {level:.4g} (Bonferroni over the {len(found)} comparison(s) listed); "
        f"verdict by the main study's symmetric rule with margin ±{d.config.solve_margin:g}: free inside it, "
        "forced / better when the interval excludes 0, else inconclusive. Tasks that do not decide are left out."
    )
    return table


def sections(d: StudyData, figures_dir: Path, *, solved: float) -> list:
    """Protocol, budget per length, the longest solved length, per-task tables, the figure, failures, provenance."""
    from axiomformer.study import report

    tasks = _task_lengths(d)
    out: list = [_protocol(d, solved), Heading("Budget per length", 3), _budget_table(d.config)]
    out += [Heading("Learning rate per arm", 3), _lr_table(d)]
    summary = Table(["model", *(f"{t}: longest solved (every seed)" for t in tasks)])
    for m in d.models:
        summary.rows.append(
            [m.label, *(str(longest_solved(d, m.label, t, ls, solved) or "none") for t, ls in tasks.items())]
        )
    summary.note = (
        f"Longest length at which every reported seed's exact 95 % interval lies above {solved} (none: no length)."
    )
    out += [Heading("Task validity"), _validity_table(d, solved)]
    out += [Heading("Longest length solved"), summary]
    for task, lengths in tasks.items():
        out += [Heading(f"{task}: accuracy against length"), _task_table(d, task, lengths, solved)]
    out += [Heading("Solve rates against the standard Transformer"), _solve_rate_table(d, solved)]
    out += [Heading("A/A control"), _aa_table(d, solved)]
    if d.rows:
        path = _figure(d, tasks, solved, figures_dir / "long_range_accuracy_vs_length.png")
        out.append(
            Image(
                f"figures/{path.name}",
                "test accuracy against sequence length: each seed (dots), the mean "
                "over seeds (solid), the zero-shot mean (dotted, x)",
            )
        )
    return out + report.failures_block(d) + report.provenance_block(d)
