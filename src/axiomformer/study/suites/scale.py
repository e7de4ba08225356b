"""The scale suite: does the 1/sqrt(d) of A5 matter in training?

The source's argument: for q, k with unit-variance entries Var(q.k) = d, so without the scale the softmax logits
grow with head_dim and the attention saturates (nearly one-hot rows, small gradients). This suite measures it:
head_dim in {8, 16, 64} at one model width (``model.dim``, 64: 8, 4 and 1 heads, so every arm has the same
parameter count up to the learned scale's one number per head) **(our choice of matching)**, and
scale = ``inv_sqrt_d``, ``none`` and ``learned`` (per head, initialized at 1/sqrt(d)). Per arm: the attention entropy
at initialization of the last query row (it sees all n keys) next to its closed form
(``axiomformer.probes.entropy_closed_form``: log n - sigma^2/2 while sigma^2 < 2 log n, sigma^2 the measured
variance of that row's scaled scores), the training-loss curves and the final test accuracy on MQAR.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from axiomformer.study.suites.common import (
    OpenQuestion,
    Rows,
    arm,
    config_tasks,
    errorbar,
    extra,
    fmt_interval,
    new_figure,
    paired,
    preset_base,
    quick_budget,
    register_question,
    save,
    suite_budget,
)

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
MLP_RATIO = 2
"""MLP hidden width = 2 x width in this suite, so the blocks stay cheap on a CPU **(our choice)**."""


def _label(head_dim: int, scale: str) -> str:
    return f"d={head_dim} scale={scale}"


def scales_of(config: StudyConfig) -> list[str]:
    """``inv_sqrt_d`` and every ``scale=...`` among the config's ``variants`` (e.g. ``["standard", "scale=none"]``)."""
    wanted = [v.split("=", 1)[1] for v in config.variants if v.replace(" ", "").startswith("scale=")]
    return ["inv_sqrt_d", *[s for s in SCALES if s in wanted and s != "inv_sqrt_d"]]


def arms(config: StudyConfig, task: TaskSettings, seq_len: int) -> list[ModelChoice]:
    dim = config.model.dim
    out = []
    for head_dim in HEAD_DIMS:
        if dim % head_dim:
            raise ValueError(f"the scale suite needs model.dim divisible by every head_dim {HEAD_DIMS}, got {dim}")
        for scale in scales_of(config):
            spec = "standard" if scale == "inv_sqrt_d" else f"scale={scale}"
            out.append(
                arm(_label(head_dim, scale), spec, heads=dim // head_dim, probes=["init_entropy"], mlp_ratio=MLP_RATIO)
            )
    return out


_BUDGET = suite_budget(steps=600)
_MQAR = {"vocab": 32, "num_pairs": 4}
"""16 keys, 4 pairs at 32 tokens: off the ceiling at this budget (pilot at width 128: 0.45 test accuracy after 600
steps at head_dim 32, 0.28 at head_dim 128; docs/open_questions.md). At 16 tokens with 16 tokens of vocabulary (one pair) 16 of
18 quick runs reached 1.000, so no cost could show."""
_TASKS = [{"name": "mqar", "seq_lens": [32], "options": _MQAR}]
_BASE = preset_base(_TASKS, {"dim": 64, "layers": 1, "heads": 1}, ("standard", "scale=none"))
DEFAULT = _BASE | {"name": "scale suite (default preset)", "seeds": 5, "budget": _BUDGET}
"""head_dim 8, 16, 64 at width 64 (8, 4, 1 heads) x scale inv_sqrt_d, none (the learned scale is in the full preset):
6 arms, 5 reported seeds, 600 steps (the pilot's budget), about 4 CPU-minutes."""
QUICK = _BASE | {"name": "scale suite (quick preset)", "seeds": 2, "budget": quick_budget(_BUDGET, 200)}
FULL = _BASE | {
    "name": "scale suite (full preset)",
    "seeds": 10,
    "budget": _BUDGET | {"steps": 3000},
    "variants": ["standard", "scale=none", "scale=learned"],
    "lr_widen": 2,
    "tasks": [{"name": "mqar", "seq_lens": [64], "options": {"vocab": 32, "num_pairs": 8}}],
    "model": {"dim": 64, "layers": 2, "heads": 1, "match_params": False},
}


def _entropy(row: RunRecord, key: str) -> float | None:
    layers = extra(row, "init").get("init_entropy") or []
    values = [layer.get(key) for layer in layers if layer.get(key) is not None]
    values = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
    return sum(values) / len(values) if values else None


def comparisons(d: StudyData) -> list[Contrast]:
    """Per task and head_dim: scale = none (primary) and learned (secondary) against inv_sqrt_d, test accuracy."""
    rows = Rows(d.rows)
    found = [
        paired(
            rows,
            f"does dropping 1/sqrt(d) cost accuracy? (scale={scale})",
            _label(head_dim, scale),
            _label(head_dim, "inv_sqrt_d"),
            task,
            n,
            "primary" if scale == "none" else "secondary",
        )
        for task, n in config_tasks(d)
        for head_dim in HEAD_DIMS
        for scale in SCALES[1:]
    ]
    return [c for c in found if c is not None]


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
        f"Causal Transformers of width {d.config.model.dim} with head_dim in {list(HEAD_DIMS)} "
        "(heads = width / head_dim, so the arms have the same parameters) and scale = 1/sqrt(d) (`inv_sqrt_d`), 1 "
        "(`none`) or learned per head (initialized at 1/sqrt(d)). At initialization: the entropy (nats) of the last "
        "query row's attention weights (n keys; maximum log n), averaged over layers, heads and a validation batch, "
        "with sigma^2, the variance of that row's scaled scores, and the closed form log n - sigma^2/2 of n iid "
        "Gaussian scores (valid while sigma^2 < 2 log n; beyond it, the frozen phase of the random-energy model, "
        "the entropy stays O(1) and no closed form is printed). Then training-loss curves and test accuracy, mean and "
        "95 % t interval over seeds. "
    )


def _head_dim_panel(ax: Axes, table: Table, rows: Rows, task: str, n: int, head_dim: int) -> None:
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
                fmt_interval(ent),
                fmt_interval(var, 2),
                fmt_interval(closed) if closed else "— (frozen phase)",
                f"{math.log(n):.3f}",
                fmt_interval(list(rows.accuracy(label, task, n).values())),
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


def _entropy_panel(ax: Axes, rows: Rows, task: str, n: int) -> None:
    for i, scale in enumerate(SCALES):  # arms not in this config have no rows and are skipped
        values = [
            list(rows.metric(_label(h, scale), task, n, lambda r: _entropy(r, "entropy")).values()) for h in HEAD_DIMS
        ]
        errorbar(ax, list(HEAD_DIMS), values, f"{scale} (measured)", color=f"C{i}")
    ax.axhline(math.log(n), color="gray", ls=":", lw=1, label="log n")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("head_dim")
    ax.set_ylabel("entropy at init (nats)")
    ax.set_title("attention entropy at initialization", fontsize=9)
    ax.legend(fontsize=7)


def _body(d: StudyData, rows: Rows, figures_dir: Path) -> list:
    from axiomformer.study.render import Heading, Image, Table

    blocks: list = []
    for task, n in config_tasks(d):
        table = Table(
            ["arm", "entropy at init", "sigma^2 at init", "closed form", "log n", "test accuracy", "params"],
            note=f"Task {task}@{n}.",
        )
        fig, axes = new_figure(len(HEAD_DIMS) + 1, width=3.6)
        for k, head_dim in enumerate(HEAD_DIMS):
            _head_dim_panel(axes[k], table, rows, task, n, head_dim)
        _entropy_panel(axes[-1], rows, task, n)
        path = save(fig, figures_dir, f"scale_{task}_{n}")
        blocks += [
            Heading(f"{task}@{n}", 2),
            table,
            Image(f"figures/{path.name}", "training loss per head_dim and scale; entropy at initialization"),
        ]
    return blocks


SUITE = register_question(
    OpenQuestion(
        name="scale",
        summary="1/sqrt(d) in training: head_dim 8/16/64 x scale inv_sqrt_d/none (learned)",
        presets={"quick": QUICK, "default": DEFAULT, "full": FULL},
        arms=arms,
        comparisons=comparisons,
        question=(
            "does dropping the 1/sqrt(d) of A5 cost test accuracy in training, at head_dim 8, 16 and 64, on a task off "
            "the ceiling? (a - b: scale = none minus scale = 1/sqrt(d), same head_dim)"
        ),
        measured=_measured,
        body=_body,
    )
)
