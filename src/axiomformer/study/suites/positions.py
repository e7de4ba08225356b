"""The positions suite: is a position scheme forced, and, separately, does it extrapolate in length?

The derivation starts from a permutation-invariant sum (A0), yet Transformers re-inject order. The position question
is asked *at the training length*: causal Transformers with each position scheme against the same model without
any position signal (NoPE, ``position=none``: no input encoding either, only the causal mask tells order), on tasks
whose targets need order: ``copy`` (reproduce a sequence), ``induction`` (the token after an earlier trigger among
distractors), ``selective_copy`` (the data tokens scattered among noise, in order) and ``sort_causal`` (a stated
control, below). Schemes: the standard model's sinusoidal input encoding
(``standard``), a learned table (``position=learned``), ``rope`` and ``alibi`` (``axiomformer.axes.position``).
Each comparison is NoPE minus the scheme (the relaxed arm first, as in the main study): ``forced`` = dropping the
scheme costs accuracy (or solve rate), ``free`` = it does not, within the margin. Family ``primary``.

Length extrapolation is a second, separately named question, "does it extrapolate?", its own family
(``extrapolation``): each trained model is tested unchanged at 2L and 4L (``TrainConfig.eval_lengths``), and its mean
accuracy there is compared with its own accuracy at L, paired within the run. It is asked only of a scheme that
learns the task at L (mean test accuracy at L at least the solve threshold): a model that never learned the task
has nothing to extrapolate. A bidirectional scheme (an arm with ``causal=False``; none in these presets, which are
causal) enters the primary family only where it learns the task at the training length.

Sort is asked in a causal layout, ``sort_causal`` (read the row, then write it sorted; ``sort`` itself scores the
t-th smallest token at position t, which a causal model cannot reach). Each of its targets is a function of the
row's multiset and of how many tokens have been written, both of which a bag of the prefix holds: in the committed
battery pilot (``benchmarks/results/study-pilot/pilot.md``, rounds r3-r4) uniform mixing with no scores solves it as
well as the standard model (0.995 against 0.996 at 16 tokens and 8 symbols, 0.991 against 0.993 at 32 tokens and 16).
It is trained as a stated control, so that the report says it does not discriminate rather than leave sort out
**(our choice)**. It runs at 32 tokens and 16 symbols: 16 data tokens have C(31, 16), about 3e8, multisets, so a test
row seldom shares its multiset (and so its answer) with a training row; at 16 tokens and 8 symbols there are only
C(15, 8) = 6,435. Learned positions beyond the training length **(our choice)**:
the table has a row for every position up to the longest test length; rows past L never get a gradient, so at test
time they hold their initialization shrunk by AdamW's decoupled weight decay.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from axiomformer.study.contrasts import Contrast
from axiomformer.study.suites import common

if TYPE_CHECKING:
    from collections.abc import Callable

    from axiomformer.study.config import StudyConfig, TaskSettings
    from axiomformer.study.record import RunRecord
    from axiomformer.study.report import StudyData
    from axiomformer.study.sweep import ModelChoice

NOPE = "position=none"
SCHEMES = ("standard", "position=learned", "position=rope", "position=alibi")
"""The position schemes of the default preset: ``standard`` is the standard model (Vaswani's sinusoidal encoding
added to the token embeddings); the others add their signal inside attention and have no input encoding."""
FULL_SCHEMES = (*SCHEMES, "position=sinusoidal")
FACTORS = (2, 4)
"""Test lengths as multiples of the training length (the extrapolation family)."""
FAMILIES = ("primary", "extrapolation")
"""The verdict families of this suite, each Bonferroni-corrected on its own: ``primary`` (with vs without each
scheme at the training length) and ``extrapolation`` ("does it extrapolate?")."""


def _arm(label: str, lengths: list[int], causal: bool = True) -> ModelChoice:
    options: dict[str, Any] = {"eval_lengths": lengths} | ({} if causal else {"causal": False})
    if label == "standard":
        return common.arm(label, "standard", **options)
    return common.arm(label, label, input_position="none", **options)


def arms(config: StudyConfig, task: TaskSettings, seq_len: int) -> list[ModelChoice]:
    """NoPE and every scheme of the config's ``variants`` (``position=...`` strings; ``standard`` always), each
    evaluated at the training length and at :data:`FACTORS` times it."""
    lengths = [f * seq_len for f in FACTORS]
    schemes = ["standard", *[v for v in config.variants if v.startswith("position=") and v != NOPE]]
    return [_arm(label, lengths) for label in [*schemes, NOPE]]


_BUDGET = common.suite_budget()
_TASKS = [
    {"name": "copy", "seq_lens": [16], "options": {"vocab": 8}, "metric": "accuracy", "budget": {"steps": 1000}},
    {
        "name": "induction",
        "seq_lens": [32],
        "options": {"vocab": 16},
        "metric": "solve_rate",
        "budget": {"steps": 1200},
    },
    {
        "name": "selective_copy",
        "seq_lens": [32],
        "options": {"vocab": 16, "num_tokens": 8},
        "metric": "accuracy",
        "budget": {"steps": 4000},
    },
    {"name": "sort_causal", "seq_lens": [32], "options": {"num_symbols": 16}, "budget": {"steps": 1000}},
]
_BASE = common.preset_base(_TASKS, {"dim": 32, "layers": 2, "heads": 2}, ("standard", *SCHEMES[1:]))
DEFAULT = _BASE | {"name": "positions suite (default preset)", "budget": _BUDGET}
"""Tasks that need order, at budgets from the committed pilot ``benchmarks/results/study-pilot/`` (seeds 2000-2001):
the standard model solved copy@16 at 200 steps, induction@32 at 400, selective_copy@32 with 8 data tokens of 16
symbols in a context of 24 positions (16 of them noise) at 800 and 1,000 (round r6) and sort_causal@32 at 300 (r4),
so 1,000, 1,200, 4,000 and 1,000 steps are at least 3 times past the plateau (the stored runs' ``budget_ratio`` checks
it again). Uniform mixing in the pilot (2,000 steps on copy and induction, 4,000 on selective copy): 0.87, 0.14 and
0.78 against the standard model's 0.998, 0.996 and 0.991 on the first three
(discriminating), 0.991 against 0.993 on sort (not: a stated control). The pilot's earlier selective copy (4 tokens of
8 symbols) did not discriminate at 4,000 steps (uniform mixing 0.989 against 0.989, round r5). Width 32, 2 layers, 2
heads, 8 reported seeds."""
QUICK = common.quick_preset(_BASE, "positions suite (quick preset)", _BUDGET, 200) | {
    "tasks": [t | {"budget": {}} for t in _TASKS[:2]]
}
FULL = _BASE | {
    "name": "positions suite (full preset)",
    "seeds": 12,
    "variants": ["standard", *FULL_SCHEMES[1:]],
    "tasks": _TASKS,
    "budget": _BUDGET,
}


def _length_metric(length: int) -> Callable[[RunRecord], Any]:
    return lambda r: (common.extra(r, "end").get("length_accuracy") or {}).get(str(length), {}).get("accuracy")


def _at(rows: common.Rows, label: str, task: str, seq_len: int, length: int) -> dict[int, float]:
    if length == seq_len:
        return rows.accuracy(label, task, seq_len)
    return rows.metric(label, task, seq_len, _length_metric(length))


def _extrapolated(rows: common.Rows, label: str, task: str, seq_len: int) -> dict[int, float]:
    """seed -> mean accuracy at :data:`FACTORS` times L (the same weights, no training there); a seed missing a length
    drops."""
    per = [common.seed_values(rows, label, task, seq_len, _length_metric(f * seq_len)) for f in FACTORS]
    seeds = set.intersection(*(set(p) for p in per)) if per else set()
    return {s: sum(p[s] for p in per) / len(per) for s in sorted(seeds)}


def _bidirectional(rows: common.Rows, label: str, task: str, seq_len: int) -> bool:
    first = rows.first(label, task, seq_len)
    return first is not None and first.train_config.get("causal") is False


def primary(d: StudyData, rows: common.Rows, threshold: float) -> list[Contrast]:
    """Per task and scheme: NoPE minus the scheme at the training length (the task's metric), family ``primary``. A
    bidirectional scheme enters only where it learns the task at L (:func:`common.learns`)."""
    out = []
    for task, n in common.config_tasks(d):
        for label in [x for x in rows.labels if x == "standard" or x.startswith("position=")]:
            if label == NOPE or (
                _bidirectional(rows, label, task, n) and not common.learns(rows, label, task, n, threshold)
            ):
                continue
            out.append(common.paired(rows, "is a position signal forced?", NOPE, label, task, n, "primary"))
    return [c for c in out if c is not None]


def extrapolation(d: StudyData, rows: common.Rows, threshold: float) -> list[Contrast]:
    """Per task and scheme that learns the task at L: its mean accuracy at 2L and 4L minus its own at L, family
    ``extrapolation`` (accuracy: the question is how much it keeps)."""
    lengths = "-".join(f"{f}L" for f in FACTORS)
    out = []
    for task, n in common.config_tasks(d):
        for label in [x for x in rows.labels if x == "standard" or x.startswith("position=")]:
            if not rows.seeds(label, task, n) or not common.learns(rows, label, task, n, threshold):
                continue
            out.append(
                Contrast(
                    "does it extrapolate?",
                    f"{label} at {lengths}",
                    f"{label} at L",
                    f"{task}@{n} at {lengths}",
                    n,
                    "extrapolation",
                    _extrapolated(rows, label, task, n),
                    common.seed_values(rows, label, task, n, common.accuracy_of),
                    common.converged(rows, (label, task, n)),
                    metric="accuracy",
                )
            )
    return out


def comparisons(d: StudyData) -> list[Contrast]:
    """:func:`primary`, then :func:`extrapolation`."""
    rows = common.Rows(d.rows)
    threshold = d.config.solve_threshold
    return primary(d, rows, threshold) + extrapolation(d, rows, threshold)


def _measured(d: StudyData) -> str:
    return (
        "Causal Transformers, one per position scheme, and NoPE (`position=none`: no position signal anywhere; only "
        "the causal mask tells order), trained at length L and tested at L (the primary family) and, unchanged, at "
        f"{', '.join(f'{f}L' for f in FACTORS)} (the extrapolation family: the same weights, no step of training at "
        "the test lengths). Accuracy over every scored position of the test split; mean and 95 % interval over "
        "seeds. "
    )


def _body(d: StudyData, rows: common.Rows, figures_dir: Path) -> list:
    from axiomformer.study.render import Heading, Image, Table

    blocks: list = [Heading("Accuracy against test length", 2)]
    keys = common.config_tasks(d)
    fig, axes = common.new_figure(max(1, len(keys)), width=4.2)
    for ax, (task, seq_len) in zip(axes, keys):
        title = f"{task}@{seq_len}"
        lengths = [seq_len] + [f * seq_len for f in FACTORS]
        table = Table(
            ["arm", *[f"L={n}" + (" (train)" if n == seq_len else "") for n in lengths], "params"],
            note=f"Task {title}; chance {_chance(rows, task, seq_len):.3f}.",
        )
        for label in rows.labels:
            first = rows.first(label, task, seq_len)
            if first is None or not (label == "standard" or label.startswith("position=")):
                continue
            values = [list(_at(rows, label, task, seq_len, n).values()) for n in lengths]
            table.rows.append([label, *[common.fmt_interval(v) for v in values], str(first.params)])
            common.errorbar(ax, lengths, values, label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("test length (trained at the first)")
        ax.set_ylabel("test accuracy")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
        blocks += [Heading(title, 3), table]
    path = common.save(fig, figures_dir, "positions_accuracy_vs_length")
    blocks.append(Image(f"figures/{path.name}", "accuracy against test length per position scheme, per task"))
    return blocks


def _chance(rows: common.Rows, task: str, seq_len: int) -> float:
    for r in rows.rows:
        if r.task == task and r.seq_len == seq_len:
            return float(r.task_config.get("chance") or 0.0)
    return 0.0


SUITE = common.register_module(
    globals(),
    name="positions",
    summary="is a position signal forced at the training length (with vs without each scheme), and does it extrapolate?",
    question=(
        "is a position signal forced? Primary: at the training length, NoPE (no position signal) minus each "
        "scheme on tasks that need order (forced = dropping the scheme costs). A second question, its own family "
        "(`extrapolation`): does a scheme that learns the task at L extrapolate — its accuracy at 2L and 4L minus "
        "its own at L, the same weights?"
    ),
    families=FAMILIES,
)
