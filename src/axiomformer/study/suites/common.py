"""What the open-question suites (positions, rho, scale, gumbel) share: the base they are declared on
(:class:`OpenQuestion`, registered by :func:`register_question`), arms with model options, their stages, the
reported rows grouped by arm, intervals over seeds, paired differences, and small matplotlib figures.

An *arm* is a :class:`axiomformer.study.sweep.ModelChoice` whose ``options`` carry the ``TrainConfig`` fields the
suite varies besides the spec (``causal``, ``mlp_ratio``, ``heads``, ``eval_lengths``, ``probes``, ...). A suite lists
its arms per task; :func:`arm_stages` turns them into the main machinery's cells and stages (learning-rate selection
on the validation split at the selection seed, then the reported seeds at each arm's chosen rate), so every arm gets
the same budget and the same lr grid.

Statistics: the main study's (``axiomformer.study.statistics``, through ``contrasts.contrast_verdicts``): per arm
the mean over seeds with its 95 % Student-t interval; per comparison of two arms, by its task's metric, the paired
difference over their shared seeds with its paired-t interval (``accuracy``) or the difference of solve rates with
its Newcombe interval (``solve_rate``), at the Bonferroni level of its family (each of the suite's ``families`` is
corrected on its own). One symmetric rule (``statistics.decide``): ``free`` inside ±margin, ``forced`` / ``better``
when the interval excludes 0 below / above, else ``inconclusive`` with the difference the seeds would detect.
Comparisons on a task that does not discriminate get no verdict (``no_verdict``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from axiomformer.study.config import StudyConfig, TaskSettings
from axiomformer.study.contrasts import Contrast
from axiomformer.study.record import RunRecord
from axiomformer.study.registry import Suite, register
from axiomformer.study.statistics import fmt_signed
from axiomformer.study.sweep import ModelChoice

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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


CONTROL_OPTIONS = ("causal", "mlp_ratio")
"""The reference arm's options the validity controls take (``models.controls``: the same blocks, another mixer)."""


def footing_arms(config: StudyConfig, arms: list[ModelChoice], reference: str) -> list[ModelChoice]:
    """``arms`` plus the main study's footing (``config.controls``, ``config.aa_control``): the validity controls
    (``no_mixing``, ``uniform_mixing``), which differ from the ``reference`` arm only in the mixer (they take its
    ``causal`` and ``mlp_ratio`` where it sets them, and its input encoding where it has none: bidirectional,
    attention-only or position-free blocks), and the A/A control (the ``reference`` arm again with another
    initialization stream, label ``standard (A/A)``)."""
    from axiomformer.study.sweep import AA_LABEL

    ref = next((a for a in arms if a.label == reference), None)
    if ref is None and (config.controls or config.aa_control):
        raise ValueError(f"no reference arm {reference!r} among {[a.label for a in arms]}")
    shared = tuple((k, v) for k, v in (() if ref is None else ref.options) if k in CONTROL_OPTIONS)
    out = list(arms)
    position = "none" if ref is not None and ref.input_position == "none" else "auto"
    out += [ModelChoice(label=c, kind=c, input_position=position, options=shared) for c in config.controls]
    if config.aa_control and ref is not None:
        out.append(ModelChoice(AA_LABEL, ref.kind, ref.spec, ref.input_position, (*ref.options, ("init_stream", 1))))
    return out


def arm_stages(arms: ArmsFn, reference: str = "standard") -> Callable[[StudyConfig], list]:
    """The ``stages`` of a suite whose models are ``arms`` (with :func:`footing_arms`): the main suite's
    learning-rate selection stages over the cells (arm, task, length), the A/A control at the ``reference`` arm's
    chosen rate, the ``lr_check`` stage for every other arm, every cell at the config's model width (no parameter
    matching: the arms differ in what they are asked to show, and the report lists each arm's parameter count)."""

    def stages(config: StudyConfig) -> list:
        from axiomformer.study.stages import selection_stages
        from axiomformer.study.sweep import task_cells

        found = task_cells(config, lambda task, seq_len: footing_arms(config, arms(config, task, seq_len), reference))
        return selection_stages(config, found, reference)

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
    """The training budget an open-question suite starts from: the main study's (``suites.main.BUDGET``: batch 32 on
    the trainer's fast path, evaluation every 50 steps on 16 validation batches, 32 test batches, no patience, stop
    once validation accuracy reaches 0.99) at 1000 steps and learning rates 3e-3 and 1e-2; with ``changes``."""
    from axiomformer.study.suites.main import BUDGET

    return dict(BUDGET) | {"steps": 1000, "lr_grid": [3e-3, 1e-2]} | changes


def quick_budget(budget: dict[str, Any], steps: int) -> dict[str, Any]:
    """A quick preset's ``budget``: ``steps`` steps at two learning rates (so that ``lr_check`` runs), 4 evaluation and
    test batches (a pilot claims nothing, it shows that the suite runs)."""
    return budget | {"steps": steps, "eval_batches": 4, "test_batches": 4}


SEEDS = 8
"""Reported seeds of every suite's default preset: the main study's power analysis (``docs/study.md``, "Seeds"):
with a paired accuracy difference's spread of about 0.01 and Bonferroni over a family, 8 is the fewest at which an
interval can fall inside ±0.02. A run with fewer is a pilot and claims nothing (``min_seeds``)."""


LR_WIDEN = 2
"""How many rounds a default or full preset's cell whose best rate is at an edge of the two-point grid (3e-3, 1e-2)
gets one more rate one step beyond it, both ways where every rate ties (``StudyConfig.lr_widen``,
``study.stages.tried_lrs``): with the grid alone, most cells of the earlier default runs chose an edge, and scale=none
at head_dim 64 (logits 8 times larger, at chance at both rates) never tried a rate below 3e-3. A quick preset does not
widen (a pilot claims nothing)."""


def preset_base(tasks: list[dict[str, Any]], model: dict[str, Any], variants: tuple[str, ...] = ("standard",)) -> dict:
    """What every open-question suite's presets share, the main study's footing: its arms come from its own stages
    (no sweep baselines, no audit/derive/flow sections, widths not matched), selection seeds 1000 and 1001 (never
    reported), :data:`SEEDS` reported seeds and as many for a decision, the validity controls, the A/A control, the
    learning-rate check at each arm's second-best rate, the main study's margins and solve threshold, and a
    learning-rate grid widened up to twice one step beyond an edge (:data:`LR_WIDEN`)."""
    return {
        "variants": list(variants),
        "baselines": [],
        "model": {**model, "match_params": False},
        "sections": {"audit": False, "derive": False, "flow": False},
        "tasks": tasks,
        "selection_seeds": [1000, 1001],
        "seeds": SEEDS,
        "min_seeds": SEEDS,
        "controls": ["no_mixing", "uniform_mixing"],
        "aa_control": True,
        "lr_check": True,
        "margin": 0.02,
        "solve_margin": 0.25,
        "solve_threshold": 0.9,
        "lr_widen": LR_WIDEN,
    }


def quick_preset(base: dict[str, Any], name: str, budget: dict[str, Any], steps: int) -> dict[str, Any]:
    """A suite's quick preset: ``base`` with 2 seeds (a pilot: every verdict ``pilot``) at ``steps`` steps."""
    return base | {
        "name": name,
        "seeds": 2,
        "min_seeds": 2,
        "pilot": True,
        "lr_widen": 0,
        "budget": quick_budget(budget, steps),
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
    """What budget and protocol the report's numbers come from (a task's own ``budget`` table shown per task)."""
    from axiomformer.study.sweep import cell_budget

    budget = config.budget
    grid: list[float] | list[float | None] = budget.lr_grid or [budget.lr]
    steps = ", ".join(f"{t.name}@{n} {cell_budget(config, t, n)['steps']}" for t in config.tasks for n in t.seq_lens)
    stop = (
        f"stop once validation accuracy reaches {budget.target_accuracy}"
        if budget.target_accuracy is not None
        else "no early stop on a target"
    )
    widened = (
        f" (widened one grid step beyond an edge up to {config.lr_widen} times: toward the best rate when it is at "
        "an edge, both ways when no rate separates)"
        if config.lr_widen and len(grid) > 1
        else ""
    )
    return (
        f"Budget: at most {steps} steps, batch {budget.batch_size}, AdamW with warmup "
        f"{budget.warmup} and cosine decay; learning rate chosen per arm and task from {grid}{widened} on the "
        f"validation split at selection seeds {config.selection_seeds} (never reported); {stop}; patience "
        f"{budget.patience}; accuracy on the held-out test split; {config.seeds} seed(s) per arm. "
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
    """One sentence per verdict of a contrast (``a vs b``: the difference is a - b), generated from its interval,
    with the learning-rate check where it changes the verdict."""
    text = _verdict_sentence(v, margin)
    return text + (
        " With either side at its second-best learning rate the verdict changes (lr-sensitive)."
        if v.lr_sensitive
        else ""
    )


def _verdict_sentence(v: Verdict, margin: float) -> str:
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
    why = "the interval includes 0 and reaches beyond the margin"  # inside the margin would be free
    return f"{where}: inconclusive, difference {ci} ({why}{mde}; a decision needs {need} seeds)."


def verdict_blocks(
    d: StudyData,
    figures_dir: Path,
    *,
    question: str,
    facts: list[str] | None = None,
    families: tuple[str, ...] = ("primary", "secondary"),
    withheld: int = 0,
) -> list:
    """The suite's answer, generated from its verdicts (``study.summary.verdicts``, the same objects as
    ``report --json``): the design line, a table per family, one sentence per verdict, a figure of the differences
    with their intervals and the ±margin band; ``facts``: what holds by construction (stated, not tested);
    ``withheld``: how many comparisons are stored but get no verdict (``no_verdict``)."""
    from axiomformer.study.answer import verdict_table
    from axiomformer.study.render import Heading, Image, Paragraph
    from axiomformer.study.summary import design, verdicts

    info = design(d)
    found = verdicts(d)
    seeds = info["reported_seeds"]
    lead = (
        f"Question: {question} Reported seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}), learning rates chosen on "
        f"selection seeds {info['selection_seeds']} (never reported); each family's intervals are paired t on "
        f"accuracy or Newcombe on the solve rate (a run solves at test accuracy >= {info['solve_threshold']:g}), "
        f"Bonferroni over the family (jointly >= {1 - info['alpha']:.0%}); one symmetric rule: free inside ±margin "
        f"({info['margins']['accuracy']:g} accuracy, {info['margins']['solve_rate']:g} solve rate), otherwise forced "
        f"(a - b below 0), better (above 0), inconclusive otherwise; convergence is reported beside the verdict, "
        f"never deciding it; comparisons on a task that does not discriminate get no verdict."
    )
    if info["pilot"]:
        lead += f" Every verdict is `pilot`: {info['pilot_reason']}."
    out: list = [Heading("The answer", 2), Paragraph(lead)]
    if facts:
        out += [Paragraph("By construction (stated, not tested): " + " ".join(facts))]
    if not found and withheld:
        return out + [Paragraph(f"No verdict: each of the {withheld} comparison(s) is held (see `No verdict` below).")]
    if not found:
        return out + [Paragraph("No comparisons: no paired runs stored.")]
    for family in families:
        members = [v for v, _, f in found if f == family]
        if not members:
            continue
        if family != "primary":
            out.append(Heading(f"Family `{family}` (its own Bonferroni correction)", 3))
        out += [verdict_table(found, family), Paragraph(" ".join(verdict_sentence(v, v.margin) for v in members))]
    path = draw_contrasts(found, info["margin"], figures_dir / "differences.png")
    out.append(
        Image(
            f"figures/{path.name}",
            "each comparison's difference a - b with its family-corrected interval and the ±margin band",
        )
    )
    return out


def footing_blocks(d: StudyData, extra: dict[str, Any]) -> list:
    """The main study's footing as the suite's report shows it: the task validity table (``design.tasks``), the A/A
    control, the learning-rate check, and the comparisons left without a verdict."""
    from axiomformer.study.render import Heading, Paragraph, Table
    from axiomformer.study.summary import design, verdicts

    info = design(d)
    table = Table(
        ["task", "chance", "ceiling", "no mixing", "uniform mixing", "reference", "discriminates", "budget ratio"],
        note="Reference: the suite's reference arm; budget ratio: steps over its median steps to solve "
        f"(goal >= {info.get('budget_ratio_goal')}; — where fewer than half of its runs solved).",
    )
    why = []
    for t in info.get("tasks") or []:
        controls = t["controls"]
        table.rows.append(
            [
                t["task"],
                _num(t["chance"]),
                _num(t["ceiling"]),
                _num(controls["no_mixing"]),
                _num(controls["uniform_mixing"]),
                _num(t["standard"]),
                "yes" if t["discriminates"] else "no",
                "—" if t["budget_ratio"] is None else f"{t['budget_ratio']:.1f}",
            ]
        )
        why.append(f"{t['task']}: {t['why']}.")
    out: list = [Heading("Does each task discriminate? (validity controls)", 2), table, Paragraph(" ".join(why))]
    aa = extra.get("aa_control")
    if aa is not None:
        parts = [f"{v['task']} {v['verdict']}" for v in aa["tasks"]]
        out.append(
            Paragraph(
                f"A/A control ({aa['model']}, another initialization stream, the reference's learning rate): "
                f"{aa['verdict']} ({'; '.join(parts)})"
                + (": the design is broken, the verdicts above are not to be trusted." if aa["broken"] else ".")
            )
        )
    checked = [v for v, _, _ in verdicts(d) if v.lr_sensitive is not None]
    sensitive = [f"{v.model} on {v.task}" for v in checked if v.lr_sensitive]
    out.append(
        Paragraph(
            f"Learning-rate check: {len(checked)} decided comparison(s) recomputed with each side that has runs at "
            f"its second-best rate moved there (the other side at its chosen rate); {len(sensitive)} change their "
            "verdict" + (f" ({'; '.join(sensitive)})." if sensitive else ".")
        )
    )
    silent = [c for c in extra.get("no_verdict") or [] if c.get("by", "task") == "task"]
    if silent:
        names = "; ".join(f"{c['model']} on {c['task']}" for c in silent)
        out.append(Paragraph(f"No verdict (the task does not discriminate, see above): {names}."))
    for c in [c for c in extra.get("no_verdict") or [] if c.get("by") == "control"]:
        out.append(
            Paragraph(f"No verdict for {c['model']} on {c['task']} (held by the suite's own control): {c['why']}.")
        )
    return out


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


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
        [f"{v.model} / {v.task}" + ("" if f == "primary" else f" ({f})") for v, _, f in found],
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


def learns(rows: Rows, label: str, task: str, seq_len: int, threshold: float) -> bool:
    """Whether arm ``label`` learns the task at its training length: its mean test accuracy over the reported seeds
    reaches ``threshold`` (the study's ``solve_threshold``)."""
    values = list(seed_values(rows, label, task, seq_len, accuracy_of).values())
    return bool(values) and sum(values) / len(values) >= threshold


def interval_bar(ax: Axes, x: float, values: list[float], width: float, **style: Any) -> None:
    """One bar at the mean of ``values`` with its t interval as the error bar (none where it is undefined)."""
    mean, low, high = interval(values)
    err = [[0 if low != low else mean - low], [0 if high != high else high - mean]]
    ax.bar(x, mean, width, yerr=err, capsize=3, **style)


# ---------------------------------------------------------------------------------------------------- the footing
def causal_suite(d: StudyData, reference: str) -> bool:
    """Whether the suite's ``reference`` arm is causal (a bidirectional suite's ceilings and controls differ)."""
    row = next((r for r in d.all_rows if r.label == reference), None)
    return row is None or row.train_config.get("causal", True) is not False


def row_ceiling(task: str, seq_len: int, options: dict[str, Any], batch_size: int, test_batches: int) -> dict:
    """The best accuracy a *bidirectional* model can reach on the test items: per distinct input row, the share of its
    scored targets equal to the most frequent target at that position among the test rows with that input (1 when
    the row determines its targets, as on every set and order task here). Exact, computed on the items themselves."""
    from collections import Counter

    from axiomformer.study.sections import task_test_items
    from axiomformer.tasks.base import IGNORE

    _, inputs, targets = task_test_items(task, seq_len, options, batch_size, test_batches)
    groups: dict[tuple, list] = defaultdict(list)
    for x, y in zip(inputs.tolist(), targets.tolist()):
        groups[tuple(x)].append(y)
    hit = total = 0
    for ys in groups.values():
        for column in zip(*ys):
            scored = [t for t in column if t != IGNORE]
            hit += Counter(scored).most_common(1)[0][1] if scored else 0
            total += len(scored)
    return {
        "ceiling": hit / total if total else None,
        "ceiling_method": "exact (bidirectional: the modal target per distinct input row)",
        "ceiling_error": 0.0,
        "note": "a bidirectional model sees the whole row",
    }


def validity(d: StudyData, reference: str) -> list[dict[str, Any]]:
    """The main study's task validity block (``battery.task_validity``) with ``reference`` as the standard model; a
    bidirectional suite's ceilings are :func:`row_ceiling` (the stored section's are a causal model's)."""
    from axiomformer.study.battery import task_validity
    from axiomformer.study.runner import ceiling_cells
    from axiomformer.study.summary import cell_stats

    ceilings = None
    if not causal_suite(d, reference):  # on the test items every run of the task is scored with
        ceilings = {
            f"{c['task']}@{c['seq_len']}": row_ceiling(
                c["task"], c["seq_len"], c["options"], c["batch_size"], c["test_batches"]
            )
            for c in ceiling_cells(d.config)
        }
    return task_validity(d, cell_stats(d), reference, ceilings)


def _setting(c: Contrast) -> str:
    """The ``task@length`` a contrast is measured on (its ``task`` up to the first space)."""
    return c.task.split(" ", 1)[0]


def with_footing(d: StudyData, found: list[Contrast], reference: str) -> tuple[list[Contrast], list[Contrast]]:
    """``(kept, dropped)``: the suite's contrasts on tasks that discriminate, each with its task's metric where it
    names none and, for a comparison of two arms at the training length, each side at its second-best learning rate
    where the store has it (``lr_check``: every arm but the reference, its A/A copy and the controls); and those on
    tasks that do not discriminate (they get no verdict)."""
    from axiomformer.study.battery import metric_of
    from axiomformer.study.summary import run_value

    good = {t["task"] for t in validity(d, reference) if t["discriminates"]}
    second = Rows(d.second_rows)
    kept, dropped = [], []
    for c in found:
        if _setting(c) not in good:
            dropped.append(c)
            continue
        task = c.task.split("@", 1)[0]
        metric = c.metric or metric_of(d, task, c.seq_len)
        at_l = c.task == f"{task}@{c.seq_len}"
        a_runs, b_runs = ((second.seeds(x, task, c.seq_len) if at_l else {}) for x in (c.a_label, c.b_label))
        a_second = {s: run_value(r, metric) for s, r in a_runs.items()} or None
        b_second = {s: run_value(r, metric) for s, r in b_runs.items()} or None
        kept.append(replace(c, metric=metric, a_second=a_second, b_second=b_second))
    return kept, dropped


def aa_entry(d: StudyData, reference: str) -> dict[str, Any] | None:
    """The ``aa_control`` entry of ``report --json``: the A/A arm against the ``reference`` arm on every task, one
    family (``summary.aa_summary``); ``None`` without A/A runs."""
    from axiomformer.study.contrasts import contrast_verdicts
    from axiomformer.study.summary import aa_summary, design
    from axiomformer.study.sweep import AA_LABEL

    rows = Rows(d.rows)
    found = [paired(rows, "A/A", AA_LABEL, reference, task, n, "primary") for task, n in config_tasks(d)]
    contrasts = [c for c in found if c is not None]
    if not contrasts:
        return None
    from axiomformer.study.battery import metric_of

    contrasts = [replace(c, metric=metric_of(d, c.task.split("@")[0], c.seq_len)) for c in contrasts]
    verdicts = [v for v, _, _ in contrast_verdicts(design(d), contrasts)]
    return aa_summary(f"{AA_LABEL} vs {reference}", verdicts)


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
        reference: the arm the validity block and the A/A control measure (``standard`` unless the suite names
            another: the scale suite's head_dim-16 standard arm).
        families: the suite's verdict families in report order (each corrected on its own).
        extra: ``(StudyData) -> dict``: more keys for ``report --json`` besides the footing's.
        gate: ``(StudyData, Contrast) -> reason or None``: a reason to give one comparison no verdict although its
            task discriminates (a control of its own reaches its arms); listed under ``no_verdict`` with the reason.
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
    reference: str = "standard"
    families: tuple[str, ...] = ("primary", "secondary")
    extra: Callable[[StudyData], dict[str, Any]] | None = None
    gate: Callable[[StudyData, Contrast], str | None] | None = None

    def contrasts(self, d: StudyData) -> list[Contrast]:
        """The suite's comparisons on the main study's footing (:func:`with_footing`): those on tasks that
        discriminate and that the suite's ``gate`` lets through, each by its task's metric and with its
        learning-rate check."""
        return [c for c in with_footing(d, self.comparisons(d), self.reference)[0] if self._held(d, c) is None]

    def _held(self, d: StudyData, c: Contrast) -> str | None:
        return None if self.gate is None else self.gate(d, c)

    def validity(self, d: StudyData) -> list[dict[str, Any]]:
        """``design.tasks``: :func:`validity` with the suite's reference arm."""
        return validity(d, self.reference)

    def extra_json(self, d: StudyData) -> dict[str, Any]:
        """``aa_control`` (:func:`aa_entry`) and ``no_verdict``: the comparisons left without a verdict (model, task,
        why, by): ``by`` is ``"task"`` where their task does not discriminate, ``"control"`` where the suite's
        ``gate`` holds them (a control of their own reaches their arms)."""
        why = {t["task"]: t["why"] for t in self.validity(d)}
        kept, dropped = with_footing(d, self.comparisons(d), self.reference)
        held = [(c, self._held(d, c)) for c in kept]
        return {
            "aa_control": aa_entry(d, self.reference),
            "no_verdict": [
                {"model": c.model, "task": c.task, "why": why.get(_setting(c)), "by": "task"} for c in dropped
            ]
            + [{"model": c.model, "task": c.task, "why": reason, "by": "control"} for c, reason in held if reason],
        } | ({} if self.extra is None else self.extra(d))

    def sections(self, d: StudyData, figures_dir: Path) -> list:
        """The report: the answer, the footing (task validity, A/A control, learning-rate check, comparisons without
        a verdict), what was measured, the suite's body, diverged runs, failures and provenance."""
        from axiomformer.study.render import Heading, Paragraph

        extra = self.extra_json(d)
        blocks = verdict_blocks(
            d,
            figures_dir,
            question=self.question,
            facts=self.facts,
            families=self.families,
            withheld=len(extra.get("no_verdict") or []),
        )
        blocks += footing_blocks(d, extra)
        blocks += [Heading("What was measured", 2), Paragraph(self.measured(d) + budget_note(d.config))]
        return blocks + self.body(d, Rows(d.rows), figures_dir) + diverged_blocks(d) + closing_blocks(d)


def register_module(namespace: dict[str, Any], **declared: Any) -> Suite:
    """Register the suite a module declares by convention: its presets ``QUICK``, ``DEFAULT`` and ``FULL``, its
    ``arms``, ``comparisons``, ``_measured`` and ``_body`` from ``namespace`` (the module's ``globals()``), the rest
    of :class:`OpenQuestion` from ``declared``."""
    return register_question(
        OpenQuestion(
            presets={"quick": namespace["QUICK"], "default": namespace["DEFAULT"], "full": namespace["FULL"]},
            arms=namespace["arms"],
            comparisons=namespace["comparisons"],
            measured=namespace["_measured"],
            body=namespace["_body"],
            **declared,
        )
    )


def register_question(question: OpenQuestion) -> Suite:
    """Register ``question`` as a study suite: its arms' stages, its comparisons and its report."""
    return register(
        Suite(
            name=question.name,
            summary=question.summary,
            presets=question.presets,
            sections=question.sections,
            stages=arm_stages(question.arms, question.reference),
            comparisons=question.contrasts,
            extra_json=question.extra_json,
            validity=question.validity,
            families=question.families,
        )
    )
