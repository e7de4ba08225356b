"""The positions suite: the tension between permutation invariance (A0) and order.

The derivation starts from a permutation-invariant sum, yet Transformers re-inject order. This suite trains
*bidirectional* encoders (no causal mask, which would itself break the symmetry) with each position choice —
``none`` (NoPE: no position signal at all, input encoding included), ``sinusoidal``, ``learned``, ``rope``, ``alibi``
(``axiomformer.axes.position``) — on

* a set task whose target does not depend on token order (``majority``: the most frequent symbol), and
* order tasks (``sort``, ``reverse``),

and tests each trained model, unchanged, at 1, 2, 4 and 8 times its training length (``TrainConfig.eval_lengths``).

Learned positions beyond the training length **(our choice)**: the table has a row for every position up to the
longest test length (``max_len`` = 8L); rows past L never get a gradient, so at test time they hold their
initialization N(0, 0.02^2) shrunk by AdamW's decoupled weight decay. That is what "no retraining" means for a
learned table; the measurement says what it costs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from axiomformer.study.contrasts import Contrast
from axiomformer.study.suites.common import (
    OpenQuestion,
    Rows,
    accuracy_of,
    arm,
    converged,
    errorbar,
    extra,
    fmt_interval,
    new_figure,
    preset_base,
    quick_budget,
    register_question,
    save,
    seed_values,
    suite_budget,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from axiomformer.study.config import StudyConfig, TaskSettings
    from axiomformer.study.record import RunRecord
    from axiomformer.study.report import StudyData
    from axiomformer.study.sweep import ModelChoice

POSITIONS = ("none", "sinusoidal", "learned", "rope", "alibi")
FACTORS = (2, 4, 8)
"""Test lengths as multiples of the training length."""


def arms(config: StudyConfig, task: TaskSettings, seq_len: int) -> list[ModelChoice]:
    lengths = [f * seq_len for f in FACTORS]
    return [
        arm(f"position={p}", f"position={p}", causal=False, input_position="none", eval_lengths=lengths)
        for p in POSITIONS
    ]


_BUDGET = suite_budget()
_TASKS = [
    {"name": "majority", "seq_lens": [8], "options": {"num_symbols": 8}},
    {"name": "sort", "seq_lens": [8], "options": {"num_symbols": 8}},
    {"name": "reverse", "seq_lens": [8], "options": {"num_symbols": 8}},
]
_BASE = preset_base(_TASKS, {"dim": 32, "layers": 2, "heads": 2})
DEFAULT = _BASE | {
    "name": "positions suite (default preset)",
    "seeds": 5,
    "budget": _BUDGET | {"steps": 500},
    "tasks": _TASKS[:2],
}
"""Sized by the pilot (docs/open_questions.md): at L = 8 every position choice but NoPE and bidirectional ALiBi
learns sort within 300 steps (0.87-0.97 test accuracy), so 500 steps with early stopping; the set task and one order
task (reverse is in the full preset), 5 reported seeds, about 4 CPU-minutes."""
QUICK = _BASE | {
    "name": "positions suite (quick preset)",
    "seeds": 2,
    "tasks": _TASKS[:2],
    "lr_widen": 0,
    "budget": quick_budget(_BUDGET, 300),
}
FULL = _BASE | {
    "name": "positions suite (full preset)",
    "seeds": 10,
    "lr_widen": 1,
    "tasks": [t | {"seq_lens": [8, 16]} for t in _TASKS],
    "budget": _BUDGET | {"steps": 3000},
}


def _at(rows: Rows, label: str, task: str, seq_len: int, length: int) -> dict[int, float]:
    if length == seq_len:
        return rows.accuracy(label, task, seq_len)
    return rows.metric(label, task, seq_len, _length_metric(length))


def _task_keys(d: StudyData) -> list[tuple[str, int, str]]:
    """(task, seq_len, title) per task setting of the config."""
    return [(t.name, n, f"{t.name}@{n}") for t in d.config.tasks for n in t.seq_lens]


ORDER_TASKS = ("sort", "reverse")
"""Tasks whose targets depend on positions: NoPE cannot do them by construction (see :data:`FACTS`)."""

FACTS = [
    "A bidirectional encoder with no position signal (NoPE: `position=none` and no input encoding) is "
    "permutation-equivariant: permuting its input permutes its outputs, so each output is a function of the token "
    "at that position and the multiset of all tokens. It cannot sort or reverse beyond what that allows (its "
    "accuracy there is shown, not tested); on a set task such as majority its output depends on the input only "
    "through the multiset, as the target does."
]


def _extrapolated(rows: Rows, label: str, task: str, seq_len: int) -> dict[int, float]:
    """seed -> mean accuracy at 2L, 4L and 8L (the same weights, no training there); seeds missing a length drop."""
    per = [seed_values(rows, label, task, seq_len, _length_metric(f * seq_len)) for f in FACTORS]
    seeds = set.intersection(*(set(p) for p in per)) if per else set()
    return {s: sum(p[s] for p in per) / len(per) for s in sorted(seeds)}


def _length_metric(length: int) -> Callable[[RunRecord], Any]:
    return lambda r: (extra(r, "end").get("length_accuracy") or {}).get(str(length), {}).get("accuracy")


def comparisons(d: StudyData) -> list[Contrast]:
    """Primary: per (position, task) its accuracy at 2L-8L minus its own accuracy at L (does it extrapolate?).
    Secondary: per task each position against RoPE at 2L-8L, and on the set task against NoPE. NoPE on the order
    tasks is left out (by construction, :data:`FACTS`)."""
    rows = Rows(d.rows)
    out: list[Contrast] = []
    for task, seq_len, title in _task_keys(d):
        where = f"{title} at 2L-8L"
        for p in POSITIONS:
            label = f"position={p}"
            if (p == "none" and task in ORDER_TASKS) or not rows.seeds(label, task, seq_len):
                continue
            ok = converged(rows, (label, task, seq_len))
            out.append(
                Contrast(
                    "length extrapolation",
                    f"{p} at 2L-8L",
                    f"{p} at L",
                    title,
                    seq_len,
                    "primary",
                    _extrapolated(rows, label, task, seq_len),
                    seed_values(rows, label, task, seq_len, accuracy_of),
                    ok,
                )
            )
        refs = ["rope"] + (["none"] if task not in ORDER_TASKS else [])
        for ref in refs:
            for p in POSITIONS:
                a, b = f"position={p}", f"position={ref}"
                if (
                    p == ref
                    or (ref == "none" and p == "rope")
                    or (p == "none" and task in ORDER_TASKS)
                    or not rows.seeds(a, task, seq_len)
                    or not rows.seeds(b, task, seq_len)
                ):
                    continue
                out.append(
                    Contrast(
                        f"against {ref}",
                        p,
                        ref,
                        where,
                        seq_len,
                        "secondary",
                        _extrapolated(rows, a, task, seq_len),
                        _extrapolated(rows, b, task, seq_len),
                        converged(rows, (a, task, seq_len), (b, task, seq_len)),
                    )
                )
    return out


def _measured(d: StudyData) -> str:
    return (
        "Bidirectional (non-causal) Transformer encoders, one per position choice (NoPE = `position=none`: no "
        "position signal anywhere), trained at length L and tested unchanged at L, 2L, 4L and 8L (the same weights; "
        "no step of training at the test lengths). Tasks: `majority` (the target is the most frequent symbol, a "
        "function of the multiset: permuting the input leaves it unchanged), `sort` and `reverse` (each position's "
        "target depends on positions). Accuracy over every scored position of the test split; "
        "mean and 95 % t interval over seeds. "
    )


def _body(d: StudyData, rows: Rows, figures_dir: Path) -> list:
    from axiomformer.study.render import Heading, Image, Table

    blocks: list = [Heading("Accuracy against test length", 2)]
    keys = _task_keys(d)
    fig, axes = new_figure(max(1, len(keys)), width=4.2)
    for ax, (task, seq_len, title) in zip(axes, keys):
        lengths = [seq_len] + [f * seq_len for f in FACTORS]
        table = Table(
            ["position", *[f"L={n}" + (" (train)" if n == seq_len else "") for n in lengths], "params"],
            note=f"Task {title}; chance {_chance(rows, task, seq_len):.3f}.",
        )
        for label in [f"position={p}" for p in POSITIONS]:
            first = rows.first(label, task, seq_len)
            if first is None:
                continue
            values = [list(_at(rows, label, task, seq_len, n).values()) for n in lengths]
            table.rows.append([label, *[fmt_interval(v) for v in values], str(first.params)])
            errorbar(ax, lengths, values, label.split("=")[1])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("test length (trained at the first)")
        ax.set_ylabel("test accuracy")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
        blocks += [Heading(title, 3), table]
    path = save(fig, figures_dir, "positions_accuracy_vs_length")
    blocks.append(Image(f"figures/{path.name}", "accuracy against test length per position choice, per task"))
    return blocks


def _chance(rows: Rows, task: str, seq_len: int) -> float:
    for r in rows.rows:
        if r.task == task and r.seq_len == seq_len:
            return float(r.task_config.get("chance") or 0.0)
    return 0.0


SUITE = register_question(
    OpenQuestion(
        name="positions",
        summary="bidirectional encoders: set vs order tasks, each position choice, length extrapolation to 2L, 4L, 8L",
        presets={"quick": QUICK, "default": DEFAULT, "full": FULL},
        arms=arms,
        comparisons=comparisons,
        question=(
            "does each position choice extrapolate in length — trained at L, tested unchanged at 2L, 4L and 8L — and how "
            "does it compare with RoPE (and, on the set task, with NoPE)? Primary: each choice's accuracy at 2L-8L (mean "
            "of the three) minus its own accuracy at L, paired within the run (forced = it loses accuracy beyond L, free "
            "= it holds within the margin)."
        ),
        measured=_measured,
        body=_body,
        facts=FACTS,
    )
)
