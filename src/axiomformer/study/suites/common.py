"""What the open-question suites (positions, rho, scale, gumbel) share: the base they are declared on
(:class:`OpenQuestion`, registered by :func:`register_question`), arms with model options, their stages, the
reported rows grouped by arm, intervals over seeds, paired differences, and small matplotlib figures.

An *arm* is a :class:`axiomformer.study.sweep.ModelChoice` whose ``options`` carry the ``TrainConfig`` fields the
suite varies besides the spec (``causal``, ``mlp_ratio``, ``heads``, ``eval_lengths``, ``probes``, ...). A suite lists
its arms per task; :func:`arm_stages` turns them into the main machinery's cells and stages (learning-rate selection
on the validation split at the selection seed, then the reported seeds at each arm's chosen rate), so every arm gets
the same budget and the same lr grid.

Statistics: the main study's (``axiomformer.study.statistics``): per arm the mean over seeds with its 95 % Student-t
interval; per comparison of two arms the paired difference over their shared seeds (same data order and test
batches) with its paired-t interval, Bonferroni-corrected over every comparison of the paragraph
(``statistics.paired_family``). A difference is claimed only when that interval excludes 0, equivalence only when it
lies inside ±margin; otherwise the conclusion says "not yet known" with what a decision would take.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from axiomformer.study.config import StudyConfig, TaskSettings
from axiomformer.study.contrasts import Contrast
from axiomformer.study.record import RunRecord
from axiomformer.study.registry import Suite, register
from axiomformer.study.statistics import fmt_signed
from axiomformer.study.sweep import Cell, ModelChoice, cell_budget

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from axiomformer.study.render import Table
    from axiomformer.study.report import StudyData
    from axiomformer.study.statistics import Verdict

ArmsFn = Callable[[StudyConfig, TaskSettings, int], list[ModelChoice]]
"""``arms(config, task_settings, seq_len) -> the arms trained on that task and length``."""


def arm(label: str, spec: str = "standard", **options: Any) -> ModelChoice:
    """A Transformer arm: ``spec`` (a relax string) plus ``TrainConfig`` fields (lists become tuples)."""
    frozen = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))
    return ModelChoice(
        label=label,
        kind="transformer",
        spec=spec,
        input_position=str(options.get("input_position", "auto")),
        options=tuple((k, v) for k, v in frozen if k != "input_position"),
    )


def arm_stages(arms: ArmsFn) -> Callable[[StudyConfig], list]:
    """The ``stages`` of a suite whose models are ``arms``: the main suite's learning-rate selection stages over the
    cells (arm, task, length), every cell at the config's model width (no parameter matching: the arms differ in
    what they are asked to show, and the report lists each arm's parameter count)."""

    def stages(config: StudyConfig) -> list:
        from axiomformer.study.stages import selection_stages

        cells = []
        for task in config.tasks:
            for seq_len in task.seq_lens:
                budget = cell_budget(config, task, seq_len)
                for choice in arms(config, task, seq_len):
                    cells.append(
                        Cell(
                            model=choice,
                            task=task.name,
                            seq_len=seq_len,
                            options=dict(task.options),
                            width=config.model.dim,
                            budget=budget,
                        )
                    )
        return selection_stages(config, cells)

    return stages


# ---------------------------------------------------------------------------------------------------- statistics
def interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % t interval of ``statistics.t_interval``; NaN where there is none."""
    from axiomformer.study.statistics import t_interval

    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not values:
        return float("nan"), float("nan"), float("nan")
    out = t_interval(values)
    return (
        out.estimate,
        (float("nan") if out.low is None else out.low),
        (float("nan") if out.high is None else out.high),
    )


def fmt_interval(values: list[float], digits: int = 3) -> str:
    """``0.812 [0.790, 0.834] (n=3)``, or the single value with ``(n=1)``, or an em dash."""
    mean, low, high = interval(values)
    if math.isnan(mean):
        return "—"
    n = len([v for v in values if v is not None])
    if math.isnan(low):
        return f"{mean:.{digits}f} (n={n})"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}] (n={n})"


# ---------------------------------------------------------------------------------------------------- presets
def suite_budget(**changes: Any) -> dict[str, Any]:
    """The training budget an open-question suite starts from (1000 steps of batch 32, evaluation every 50 steps on
    4 batches, patience 5, learning rates 3e-3 and 1e-2), with ``changes``."""
    base = {
        "steps": 1000,
        "batch_size": 32,
        "warmup": 20,
        "eval_every": 50,
        "eval_batches": 4,
        "patience": 5,
        "target_accuracy": None,
        "lr_grid": [3e-3, 1e-2],
    }
    return base | changes


def quick_budget(budget: dict[str, Any], steps: int) -> dict[str, Any]:
    """A quick preset's ``budget``: ``steps`` steps at one learning rate, no early stopping (a pilot claims
    nothing, it shows that the suite runs)."""
    return budget | {"steps": steps, "lr_grid": [3e-3], "patience": None, "target_accuracy": None}


def preset_base(tasks: list[dict[str, Any]], model: dict[str, Any], variants: tuple[str, ...] = ("standard",)) -> dict:
    """What every open-question suite's presets share: its arms come from its own stages (no sweep baselines, no
    audit/derive/flow sections, widths not matched), selection seed 1000 (never reported), at least 5 reported seeds
    for a decision, and a learning-rate grid that is not widened."""
    return {
        "variants": list(variants),
        "baselines": [],
        "model": {**model, "match_params": False},
        "sections": {"audit": False, "derive": False, "flow": False},
        "tasks": tasks,
        "selection_seeds": [1000, 1001],
        "min_seeds": 5,
        "lr_widen": 0,
    }


# ---------------------------------------------------------------------------------------------------- rows
class Rows:
    """The reported rows of a suite (``StudyData.rows``) by (label, task, seq_len), then by seed."""

    def __init__(self, rows: Iterable[RunRecord]):
        self.rows = list(rows)
        self.by: dict[tuple[str, str, int], dict[int, RunRecord]] = defaultdict(dict)
        for r in self.rows:
            self.by[(r.label, r.task, r.seq_len)][r.seed] = r
        self.labels = list(dict.fromkeys(r.label for r in self.rows))
        self.tasks = list(dict.fromkeys((r.task, r.seq_len) for r in self.rows))

    def seeds(self, label: str, task: str, seq_len: int) -> dict[int, RunRecord]:
        return self.by.get((label, task, seq_len), {})

    def metric(self, label: str, task: str, seq_len: int, fn: Callable[[RunRecord], Any]) -> dict[int, float]:
        """seed -> fn(row), skipping rows where fn gives None."""
        out = {}
        for seed, row in self.seeds(label, task, seq_len).items():
            value = fn(row)
            if value is not None:
                out[seed] = float(value)
        return out

    def accuracy(self, label: str, task: str, seq_len: int) -> dict[int, float]:
        return self.metric(label, task, seq_len, lambda r: r.accuracy)

    def first(self, label: str, task: str, seq_len: int) -> RunRecord | None:
        seeds = self.seeds(label, task, seq_len)
        return seeds[min(seeds)] if seeds else None


def extra(row: RunRecord, phase: str) -> dict[str, Any]:
    """``TrainResult.extra[phase]`` of a stored row (``{}`` when absent)."""
    return row.outcome.extra.get(phase) or {}


def budget_note(config: StudyConfig) -> str:
    """What budget and protocol the report's numbers come from."""
    budget = config.budget
    grid: list[float] | list[float | None] = budget.lr_grid or [budget.lr]
    return (
        f"Budget: at most {budget.steps} steps, batch {budget.batch_size}, AdamW with warmup "
        f"{budget.warmup} and cosine decay; learning rate chosen per arm and task from {grid} on the "
        f"validation split at selection seeds {config.selection_seeds} (never "
        f"reported); early stopping on validation (patience "
        f"{budget.patience}); accuracy on the held-out test split; {config.seeds} seed(s) per arm. "
        f"Model: {config.model.layers} layer(s), width {config.model.dim}."
    )


def closing_blocks(d: StudyData) -> list:
    """The main report's failed-runs and provenance sections (budget, versions, commits, hosts, wall time)."""
    from axiomformer.study.report import failures_block, provenance_block

    return [*failures_block(d), *provenance_block(d)]


# ---------------------------------------------------------------------------------------------------- figures
def new_figure(ncols: int = 1, width: float = 5.0, height: float = 3.6) -> tuple[Figure, list[Axes]]:
    """A ``matplotlib.figure.Figure`` with ``ncols`` axes (no pyplot state, no backend switch)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def finite_prefix(curve: list) -> list[float]:
    """A stored loss curve up to its first missing or non-finite value (a diverged run stops at a NaN loss, which
    the store keeps as None)."""
    out = []
    for value in curve:
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            break
        out.append(value)
    return out


def save(fig: Figure, folder: Path, name: str) -> Path:
    """Write ``fig`` as ``folder/name.png``. Axes on a log scale with nothing positive to show (every run of a panel
    diverged or is missing) fall back to a linear scale instead of failing the report."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    try:
        fig.savefig(path, dpi=110)
    except ValueError as err:
        if "log-scaled" not in str(err):
            raise
        for ax in fig.axes:
            ax.set_xscale("linear")
            ax.set_yscale("linear")
        fig.savefig(path, dpi=110)
    return path


def errorbar(ax: Axes, xs: Sequence[float], values: list[list[float]], label: str, **style: Any) -> None:
    """Means with their t interval as error bars (no bar where the interval is undefined)."""
    means, lows, highs = [], [], []
    for v in values:
        mean, low, high = interval(v)
        means.append(mean)
        lows.append(0.0 if math.isnan(low) else mean - low)
        highs.append(0.0 if math.isnan(high) else high - mean)
    ax.errorbar(xs, means, yerr=[lows, highs], label=label, capsize=3, marker="o", **style)


# ---------------------------------------------------------------------------------------------------- verdicts
def verdict_sentence(v: Verdict, margin: float) -> str:
    """One sentence per verdict of a contrast (``a vs b``: the difference is a - b), generated from its interval."""
    a, _, b = v.model.partition(" vs ")
    ci = (
        "no interval (fewer than two paired seeds)"
        if v.ci_low is None or v.ci_high is None
        else f"{fmt_signed(v.diff)} [{fmt_signed(v.ci_low)}, {fmt_signed(v.ci_high)}]"
    )
    where = f"{v.task}: {a} against {b}"
    if v.verdict == "forced":
        return f"{where}: lower, difference {ci}, the whole interval below 0."
    if v.verdict == "better":
        return f"{where}: higher, difference {ci}, the whole interval above 0."
    if v.verdict == "free":
        return f"{where}: equivalent within ±{margin:g}, difference {ci}."
    if v.verdict == "pilot":
        return f"{where}: pilot, claims nothing ({ci})."
    need = "more than 10,000" if v.seeds_needed is None else f"about {v.seeds_needed}"
    mde = "" if v.mde is None else f"; detects {v.mde:.3f} at 80 % power with {v.n_seeds} seeds"
    why = (
        "a side did not converge"
        if (v.ci_low is not None and v.ci_high is not None and -margin < v.ci_low and v.ci_high < margin)
        else "the interval includes 0 and reaches beyond the margin"
    )
    return f"{where}: not yet known, difference {ci} ({why}{mde}; a decision needs {need} seeds)."


def _verdict_table(found: list[tuple[Verdict, int, str]], family: str) -> Table:
    from axiomformer.study.render import Table

    table = Table(
        [
            "question",
            "comparison (a vs b)",
            "task, where",
            "verdict",
            "a - b [interval]",
            "seeds",
            "converged",
            "what a decision would take",
        ]
    )
    for v, _, fam in found:
        if fam != family:
            continue
        ci = (
            "—"
            if v.ci_low is None or v.ci_high is None
            else f"{fmt_signed(v.diff)} [{fmt_signed(v.ci_low)}, {fmt_signed(v.ci_high)}]"
        )
        need = (
            f"decided with {v.n_seeds} seeds"
            if v.verdict in ("forced", "better", "free")
            else (
                "—"
                if v.verdict == "pilot"
                else f"mde {'—' if v.mde is None else f'{v.mde:.3f}'}; "
                f"{'> 10,000' if v.seeds_needed is None else v.seeds_needed} seeds"
            )
        )
        table.rows.append(
            [v.assumption, v.model, v.task, v.verdict, ci, str(v.n_seeds), "yes" if v.converged else "no", need]
        )
    return table


def verdict_blocks(d: StudyData, figures_dir: Path, *, question: str, facts: list[str] | None = None) -> list:
    """The suite's answer, generated from its verdicts (``study.summary.verdicts``, the same objects as
    ``report --json``): the design line, a table per family, one sentence per verdict, a figure of the differences
    with their intervals and the ±margin band; ``facts``: what holds by construction (stated, not tested)."""
    from axiomformer.study.render import Heading, Image, Paragraph
    from axiomformer.study.summary import design, verdicts

    info = design(d)
    found = verdicts(d)
    seeds = info["reported_seeds"]
    lead = (
        f"Question: {question} Reported seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}), learning rates chosen on "
        f"selection seeds {info['selection_seeds']} (never reported); each family's intervals are paired t, "
        f"Bonferroni over the family (jointly >= {1 - info['alpha']:.0%}); one symmetric rule: free inside "
        f"±{info['margin']:g}, otherwise forced (a - b below 0), better (above 0), inconclusive otherwise; "
        f"convergence is reported beside the verdict, never deciding it."
    )
    if info["pilot"]:
        lead += f" Every verdict is `pilot`: {info['pilot_reason']}."
    out: list = [Heading("The answer", 2), Paragraph(lead)]
    if facts:
        out += [Paragraph("By construction (stated, not tested): " + " ".join(facts))]
    if not found:
        return out + [Paragraph("No comparisons: no paired runs stored.")]
    for family in ("primary", "secondary"):
        members = [v for v, _, f in found if f == family]
        if not members:
            continue
        if family == "secondary":
            out.append(Heading("Secondary comparisons (their own family)", 3))
        out += [
            _verdict_table(found, family),
            Paragraph(" ".join(verdict_sentence(v, info["margin"]) for v in members)),
        ]
    path = draw_contrasts(found, info["margin"], figures_dir / "differences.png")
    out.append(
        Image(
            f"figures/{path.name}",
            "each comparison's difference a - b with its family-corrected interval and the ±margin band",
        )
    )
    return out


def draw_contrasts(found: list, margin: float, path: Path) -> Path:
    """Every comparison's difference with its interval (none drawn where there is none), the ±``margin`` band,
    coloured by verdict; non-finite differences are left out, never drawn."""
    from matplotlib.patches import Patch

    from axiomformer.study.figures import COLORS

    fig, (ax,) = new_figure(1, width=8.0, height=0.34 * max(1, len(found)) + 1.8)
    ax.axvspan(-margin, margin, color="tab:green", alpha=0.12, linewidth=0)
    ax.axvline(0.0, color="black", linewidth=0.8)
    for y, (v, _, family) in enumerate(found):
        color = COLORS.get(v.verdict, "black")
        if v.ci_low is not None and math.isfinite(v.ci_low) and math.isfinite(v.ci_high):
            ax.plot([v.ci_low, v.ci_high], [y, y], color=color, linewidth=2.2, solid_capstyle="butt")
        if math.isfinite(v.diff):
            ax.plot([v.diff], [y], marker="o" if family == "primary" else "s", color=color, markersize=5)
    ax.set_yticks(
        range(len(found)),
        [f"{v.model} / {v.task}" + ("" if f == "primary" else " (secondary)") for v, _, f in found],
        fontsize=7,
    )
    ax.invert_yaxis()
    ax.set_xlabel(f"a - b (paired by seed; family-corrected interval; band: ±{margin:g})")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return save(fig, path.parent, path.stem)


def diverged_blocks(d: StudyData) -> list:
    """A note naming every stored run whose training loss became non-finite (``stop_reason == "nonfinite"``) or
    whose test accuracy is not a number: recorded as diverged, left out of every mean and comparison where its
    accuracy is not finite (a comparison pairs only seeds finite on both sides)."""
    from axiomformer.study.render import Heading, Paragraph

    bad = [r for r in d.all_rows if r.outcome.stop_reason == "nonfinite" or not _finite(r.accuracy)]
    if not bad:
        return []
    names = "; ".join(
        f"{r.label} {r.task}@{r.seq_len} seed {r.seed} lr {r.outcome.lr}"
        + ("" if _finite(r.accuracy) else " (no test accuracy)")
        for r in bad
    )
    return [
        Heading("Diverged runs", 3),
        Paragraph(
            f"{len(bad)} run(s) diverged (non-finite training loss; the tested weights are the best validation checkpoint "
            f"before it, and a run with no finite test accuracy is left out of every mean and comparison): {names}."
        ),
    ]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def seed_values(rows: Rows, label: str, task: str, seq_len: int, fn: Callable[[RunRecord], Any]) -> dict:
    """seed -> fn(row) over the finite values only (a diverged run's missing accuracy drops that seed)."""
    return {s: v for s, v in rows.metric(label, task, seq_len, fn).items() if math.isfinite(v)}


def converged(rows: Rows, *labels_task: tuple[str, str, int]) -> bool:
    """Whether every reported run of every (label, task, seq_len) converged (``battery.run_converged``)."""
    from axiomformer.study.battery import run_converged

    return all(run_converged(r) for key in labels_task for r in rows.seeds(*key).values())


# ---------------------------------------------------------------------------------------------------- the suite base
def config_tasks(d: StudyData) -> list[tuple[str, int]]:
    """(task, seq_len) of every task setting of the stored config, in config order (run yet or not)."""
    return [(t.name, n) for t in d.config.tasks for n in t.seq_lens]


def accuracy_of(row: RunRecord) -> float | None:
    """A run's test accuracy (the metric of most contrasts)."""
    return row.accuracy


def paired(
    rows: Rows, question: str, a: str, b: str, task: str, seq_len: int, family: str, metric: Callable = accuracy_of
) -> Contrast | None:
    """The contrast ``a - b`` of two arms on one task setting, by ``metric`` over their finite seeds (``None`` when
    either arm has no reported run there)."""
    if not rows.seeds(a, task, seq_len) or not rows.seeds(b, task, seq_len):
        return None
    return Contrast(
        question,
        a,
        b,
        f"{task}@{seq_len}",
        seq_len,
        family,
        seed_values(rows, a, task, seq_len, metric),
        seed_values(rows, b, task, seq_len, metric),
        converged(rows, (a, task, seq_len), (b, task, seq_len)),
    )


def interval_bar(ax: Axes, x: float, values: list[float], width: float, **style: Any) -> None:
    """One bar at the mean of ``values`` with its t interval as the error bar (none where it is undefined)."""
    mean, low, high = interval(values)
    err = [[0 if low != low else mean - low], [0 if high != high else high - mean]]
    ax.bar(x, mean, width, yerr=err, capsize=3, **style)


@dataclass(frozen=True)
class OpenQuestion:
    """An open-question suite, declared by what it asks; :func:`register_question` runs, stores and reports it.

    Attributes:
        name, summary, presets: as in :class:`axiomformer.study.registry.Suite`.
        arms: the arms per (config, task, seq_len) (:func:`arm_stages` trains them).
        comparisons: ``(StudyData) -> list of Contrast``: the questions, turned into the verdicts.
        question: the question the report's answer opens with (:func:`verdict_blocks`).
        measured: ``(StudyData) -> str``: what was measured, before the budget note (:func:`budget_note`).
        body: ``(StudyData, Rows, figures_dir) -> blocks``: the suite's own tables and figures.
        facts: what holds by construction (stated, not tested).
    """

    name: str
    summary: str
    presets: dict[str, dict[str, Any]]
    arms: ArmsFn
    comparisons: Callable[[StudyData], list[Contrast]]
    question: str
    measured: Callable[[StudyData], str]
    body: Callable[[StudyData, Rows, Path], list]
    facts: list[str] | None = None

    def sections(self, d: StudyData, figures_dir: Path) -> list:
        """The report: the answer, what was measured, the suite's body, diverged runs, failures and provenance."""
        from axiomformer.study.render import Heading, Paragraph

        blocks = verdict_blocks(d, figures_dir, question=self.question, facts=self.facts)
        blocks += [Heading("What was measured", 2), Paragraph(self.measured(d) + budget_note(d.config))]
        return blocks + self.body(d, Rows(d.rows), figures_dir) + diverged_blocks(d) + closing_blocks(d)


def register_question(question: OpenQuestion) -> Suite:
    """Register ``question`` as a study suite: its arms' stages, its comparisons and its report."""
    return register(
        Suite(
            name=question.name,
            summary=question.summary,
            presets=question.presets,
            sections=question.sections,
            stages=arm_stages(question.arms),
            comparisons=question.comparisons,
        )
    )
