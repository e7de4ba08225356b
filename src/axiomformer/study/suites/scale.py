"""The scale suite: does the 1/sqrt(d) of A5 matter in training, and does it matter more as head_dim grows?

The source's argument: for q, k with unit-variance entries Var(q.k) = d, so without the scale the softmax logits
grow with head_dim and the attention saturates (nearly one-hot rows, small gradients). So the question is per
head_dim: head_dim in {8, 16, 64} at one model width (``model.dim`` 64: 8, 4 and 1 heads, so every arm has the same
parameter count up to the learned scale's one number per head) **(our choice of matching)**, scale = ``inv_sqrt_d``
against ``none`` (``learned``, per head and initialized at 1/sqrt(d), in the full preset), on a task and budget where
the standard model solves: ``induction`` at 32 tokens, vocabulary 16, 1,200 steps, from the committed pilot
``benchmarks/results/pilots-33/`` (the standard model solved at 1, 4 and 8 heads). Induction is solve-or-stuck, so the
verdict is on the solve rate (the main study's metric for it), one per head_dim, Bonferroni over the head_dims.
Per arm also: the attention entropy at initialization of the last query row (it sees all n keys) next to its closed
form (``axiomformer.probes.entropy_closed_form``: log n - sigma^2/2 while sigma^2 < 2 log n), the training-loss
curves and the final test accuracy. Whether the scale matters more as head_dim grows is read from the per-head_dim
differences (``report --json``'s ``trend``), stated, not tested as one more verdict.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from axiomformer.study.suites import common

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from axiomformer.study.config import StudyConfig, TaskSettings
    from axiomformer.study.contrasts import Contrast
    from axiomformer.study.record import RunRecord
    from axiomformer.study.render import Table
    from axiomformer.study.report import StudyData
    from axiomformer.study.sweep import ModelChoice

HEAD_DIMS = (8, 16, 64)
SCALES = ("inv_sqrt_d", "none", "learned")
REFERENCE_HEAD_DIM = 16
"""The validity controls and the A/A control are measured against the head_dim-16 standard arm (4 heads at width 64)
**(our choice)**."""


def _label(head_dim: int, scale: str) -> str:
    return f"d={head_dim} scale={scale}"


REFERENCE = _label(REFERENCE_HEAD_DIM, "inv_sqrt_d")


def scales_of(config: StudyConfig) -> list[str]:
    """``inv_sqrt_d`` and every ``scale=...`` among the config's ``variants`` (e.g. ``["standard", "scale=none"]``)."""
    wanted = [v.split("=", 1)[1] for v in config.variants if v.replace(" ", "").startswith("scale=")]
    return ["inv_sqrt_d", *[s for s in SCALES if s in wanted and s != "inv_sqrt_d"]]


def arms(config: StudyConfig, task: TaskSettings, seq_len: int) -> list[ModelChoice]:
    dim = config.model.dim
    out = []
    for head_dim in HEAD_DIMS:
        if dim % head_dim:
            raise ValueError(f"the scale suite needs model.dim divisible by every head_dim, got {dim} and {head_dim}")
        for scale in scales_of(config):
            spec = "standard" if scale == "inv_sqrt_d" else f"scale={scale}"
            out.append(common.arm(_label(head_dim, scale), spec, heads=dim // head_dim, probes=["init_entropy"]))
    return out


_BUDGET = common.suite_budget(steps=1200)
_TASKS = [{"name": "induction", "seq_lens": [32], "options": {"vocab": 16}, "metric": "solve_rate"}]
_BASE = common.preset_base(_TASKS, {"dim": 64, "layers": 2, "heads": 4}, ("standard", "scale=none"))
DEFAULT = _BASE | {"name": "scale suite (default preset)", "budget": _BUDGET}
"""The pilot's task and budget (``benchmarks/results/pilots-33/scale.sh``: induction@32, vocabulary 16, width 64, 2
layers, 1,200 steps; the standard model solved at 1, 4 and 8 heads), head_dim 8, 16, 64 x scale inv_sqrt_d, none,
8 reported seeds, early stop once solved."""
QUICK = common.quick_preset(_BASE, "scale suite (quick preset)", _BUDGET, 200)
FULL = _BASE | {
    "name": "scale suite (full preset)",
    "seeds": 12,
    "budget": _BUDGET | {"steps": 3000},
    "variants": ["standard", "scale=none", "scale=learned"],
}


def _entropy(row: RunRecord, key: str) -> float | None:
    layers = common.extra(row, "init").get("init_entropy") or []
    values = [layer.get(key) for layer in layers if layer.get(key) is not None]
    values = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
    return sum(values) / len(values) if values else None


def question_of(head_dim: int, scale: str) -> str:
    """The verdict's question (its ``assumption``): one per head_dim, so the answer reads per head_dim."""
    if scale == "none":
        return f"is 1/sqrt(d) forced at head_dim {head_dim}?"
    return f"does a {scale} scale differ from 1/sqrt(d) at head_dim {head_dim}?"


def comparisons(d: StudyData) -> list[Contrast]:
    """Per task and head_dim: scale = none (primary) and learned (secondary) minus inv_sqrt_d, by the task's metric."""
    rows = common.Rows(d.rows)
    found = [
        common.paired(
            rows,
            question_of(head_dim, scale),
            _label(head_dim, scale),
            _label(head_dim, "inv_sqrt_d"),
            task,
            n,
            "primary" if scale == "none" else "secondary",
        )
        for task, n in common.config_tasks(d)
        for head_dim in HEAD_DIMS
        for scale in SCALES[1:]
    ]
    return [c for c in found if c is not None]


def trend(d: StudyData) -> dict[str, Any]:
    """``report --json``'s ``trend``: per head_dim the primary verdict (scale = none minus 1/sqrt(d)) and the cost of
    dropping the scale (minus the difference); ``grows``: whether that cost is non-decreasing in head_dim and larger at
    the largest head_dim than at the smallest, read from the verdicts' point estimates (``None`` with fewer than two
    head_dims or while every verdict is ``pilot``); stated, not a test of its own."""
    from axiomformer.study.summary import verdicts

    by_dim = {}
    for v, _, family in verdicts(d):
        if family == "primary" and v.assumption.startswith("is 1/sqrt(d) forced at head_dim "):
            head_dim = int(v.assumption.rsplit(" ", 1)[1].rstrip("?"))
            by_dim[head_dim] = v
    dims = sorted(by_dim)
    costs = [0.0 - by_dim[h].diff + 0.0 for h in dims]
    decided = len(dims) >= 2 and any(by_dim[h].verdict != "pilot" for h in dims)
    grows = all(a <= b for a, b in itertools.pairwise(costs)) and costs[-1] > costs[0] if decided else None
    return {
        "trend": {
            "metric": by_dim[dims[0]].metric if dims else None,
            "per_head_dim": [
                {
                    "head_dim": h,
                    "verdict": by_dim[h].verdict,
                    "cost": 0.0 - by_dim[h].diff + 0.0,
                    "ci": [by_dim[h].ci_low, by_dim[h].ci_high],
                }
                for h in dims
            ],
            "grows": grows,
        }
    }


def _mean_curve(curves: list[list]) -> list[float]:
    """Per step the mean of the finite losses (a diverged run's None / inf / NaN entries are left out), up to the
    shortest curve; empty when no step has a finite value."""
    length = min((len(c) for c in curves), default=0)
    out = []
    for step in range(length):
        values = [float(c[step]) for c in curves if c[step] is not None and math.isfinite(float(c[step]))]
        out.append(sum(values) / len(values) if values else float("nan"))
    return out if any(math.isfinite(v) for v in out) else []


def _measured(d: StudyData) -> str:
    return (
        f"Causal Transformers of width {d.config.model.dim}, {d.config.model.layers} layers, with head_dim in "
        f"{list(HEAD_DIMS)} (heads = width / head_dim, so the arms have the same parameters) and scale = 1/sqrt(d) "
        "(`inv_sqrt_d`) or 1 (`none`). At initialization: the entropy (nats) of the last query row's attention "
        "weights (n keys; maximum log n), averaged over layers, heads and a validation batch, with sigma^2, the "
        "variance of that row's scaled scores, and the closed form log n - sigma^2/2 of n iid Gaussian scores (valid "
        "while sigma^2 < 2 log n; beyond it the entropy stays O(1) and no closed form is printed). Then training-loss "
        "curves and test accuracy, mean and 95 % interval over seeds. "
    )


def _trend_sentence(d: StudyData) -> str:
    found = trend(d)["trend"]
    if not found["per_head_dim"]:
        return "No head_dim has a verdict yet."
    parts = ", ".join(f"{e['cost']:+.3f} at head_dim {e['head_dim']} ({e['verdict']})" for e in found["per_head_dim"])
    grows = {
        True: "it grows with head_dim",
        False: "it does not grow monotonically with head_dim",
        None: "no reading (pilot or fewer than two head_dims)",
    }[found["grows"]]
    return (
        f"Does 1/sqrt(d) matter more as head_dim grows? The cost of dropping it ({found['metric']}: 1/sqrt(d) minus "
        f"none) is {parts}: {grows} (read from the point estimates of the verdicts above, not a test of its own)."
    )


def _head_dim_panel(ax: Axes, table: Table, rows: common.Rows, task: str, n: int, head_dim: int) -> None:
    """One head_dim: a table row per scale (entropy at init, accuracy, params) and its mean training-loss curve."""
    for i, scale in enumerate(SCALES):  # arms not in this config have no rows and are skipped
        label = _label(head_dim, scale)
        seeds = rows.seeds(label, task, n)
        if not seeds:
            continue
        ent = list(rows.metric(label, task, n, lambda r: _entropy(r, "entropy")).values())
        var = list(rows.metric(label, task, n, lambda r: _entropy(r, "score_var")).values())
        closed = list(rows.metric(label, task, n, lambda r: _entropy(r, "closed_form")).values())
        table.rows.append(
            [
                label,
                common.fmt_interval(ent),
                common.fmt_interval(var, 2),
                common.fmt_interval(closed) if closed else "— (frozen phase)",
                f"{math.log(n):.3f}",
                common.fmt_interval(list(rows.accuracy(label, task, n).values())),
                str(next(iter(seeds.values())).params),
            ]
        )
        mean = _mean_curve([r.losses or [] for r in seeds.values()])
        if mean:
            ax.plot(range(1, len(mean) + 1), mean, label=scale, color=f"C{i}", lw=1)
    ax.set_title(f"head_dim {head_dim}: training loss", fontsize=9)
    ax.set_xlabel("step")
    ax.set_yscale("log")
    ax.legend(fontsize=7)


def _entropy_panel(ax: Axes, rows: common.Rows, task: str, n: int) -> None:
    for i, scale in enumerate(SCALES):  # arms not in this config have no rows and are skipped
        values = [
            list(rows.metric(_label(h, scale), task, n, lambda r: _entropy(r, "entropy")).values()) for h in HEAD_DIMS
        ]
        common.errorbar(ax, list(HEAD_DIMS), values, f"{scale} (measured)", color=f"C{i}")
    ax.axhline(math.log(n), color="gray", ls=":", lw=1, label="log n")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("head_dim")
    ax.set_ylabel("entropy at init (nats)")
    ax.set_title("attention entropy at initialization", fontsize=9)
    ax.legend(fontsize=7)


def _body(d: StudyData, rows: common.Rows, figures_dir: Path) -> list:
    from axiomformer.study.render import Heading, Image, Paragraph, Table

    blocks: list = [Heading("Does it matter more as head_dim grows?", 2), Paragraph(_trend_sentence(d))]
    for task, n in common.config_tasks(d):
        table = Table(
            ["arm", "entropy at init", "sigma^2 at init", "closed form", "log n", "test accuracy", "params"],
            note=f"Task {task}@{n}.",
        )
        fig, axes = common.new_figure(len(HEAD_DIMS) + 1, width=3.6)
        for k, head_dim in enumerate(HEAD_DIMS):
            _head_dim_panel(axes[k], table, rows, task, n, head_dim)
        _entropy_panel(axes[-1], rows, task, n)
        path = common.save(fig, figures_dir, f"scale_{task}_{n}")
        blocks += [
            Heading(f"{task}@{n}", 2),
            table,
            Image(f"figures/{path.name}", "training loss per head_dim and scale; entropy at initialization"),
        ]
    return blocks


SUITE = common.register_module(
    globals(),
    name="scale",
    summary="1/sqrt(d) in training: head_dim 8/16/64 x scale inv_sqrt_d/none (learned)",
    question=(
        "is the 1/sqrt(d) of A5 forced in training, per head_dim (8, 16, 64), on a task and budget where the "
        "standard model solves, and does it matter more as head_dim grows? (a - b: scale = none minus scale = "
        "1/sqrt(d), same head_dim; induction is solve-or-stuck, so by solve rate)"
    ),
    reference=REFERENCE,
    extra=trend,
)
