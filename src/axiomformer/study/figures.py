"""The main suite's PNG figures (``matplotlib.figure.Figure``: no pyplot state, no backend switch).

* accuracy against sequence length per task (mean test accuracy and its 95 % bootstrap interval per model);
* the assumption-impact figure: the paired difference to the standard model per (model, task) with its interval,
  drawn in colour only where the Holm-corrected paired test finds a difference, grey and marked "n.s." otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from axiomformer.study.sweep import assumption_of

if TYPE_CHECKING:
    from axiomformer.study.report import StudyData


def draw_figures(d: "StudyData", folder: Path) -> dict[str, Path]:
    """Draw every figure the data allows into ``folder``.

    Returns:
        ``{"length:<task>": path}`` for every task run at two or more lengths (a line over one length carries no
        information: one length is in the tables only), and
        ``{"impact": path}`` when there are models to compare with the standard one.
    """
    from axiomformer.study.summary import cell_stats, comparisons

    folder.mkdir(parents=True, exist_ok=True)
    stats = cell_stats(d)
    out: dict[str, Path] = {}
    for task in dict.fromkeys(t for t, _ in d.tasks):
        lengths = sorted(n for t, n in d.tasks if t == task)
        if len(lengths) > 1:
            out[f"length:{task}"] = _accuracy_vs_length(d, stats, task, lengths,
                                                        folder / f"{task}_accuracy_vs_length.png")
    comps = [c for c, _ in comparisons(d)]
    if comps:
        kinds = {m["label"]: m["kind"] for m in d.models}
        out["impact"] = _impact(comps, kinds, folder / "assumption_impact.png")
    return out


def _accuracy_vs_length(d: "StudyData", stats, task: str, lengths: list[int], path: Path) -> Path:
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    cmap = colormaps["tab20"]
    for i, m in enumerate(d.models):
        points = sorted((c.seq_len, c) for c in stats if c.model == m["label"] and c.task.split("@")[0] == task)
        if not points:
            continue
        xs = [n for n, _ in points]
        ys = [c.mean for _, c in points]
        lo = [c.mean - (c.ci_low if c.ci_low is not None else c.mean) for _, c in points]
        hi = [(c.ci_high if c.ci_high is not None else c.mean) - c.mean for _, c in points]
        recurrent = m["kind"] != "transformer"
        ax.errorbar(xs, ys, yerr=[lo, hi], label=m["label"], marker="s" if recurrent else "o", capsize=3,
                    linestyle="--" if recurrent else "-", linewidth=2.2 if recurrent or m["label"] == "standard" else 1,
                    color="black" if m["label"] == "standard" else cmap(i % 20))
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("sequence length")
    ax.set_ylabel("test accuracy (95 % bootstrap interval)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{task}: accuracy against sequence length (dashed: recurrent baselines)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _impact(comps, kinds: dict[str, str], path: Path) -> Path:
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    comps = sorted(comps, key=lambda c: (assumption_of(c.model, kinds.get(c.model, "transformer")), c.model, c.task))
    groups = list(dict.fromkeys(assumption_of(c.model, kinds.get(c.model, "transformer")) for c in comps))
    cmap = colormaps["tab10"]
    colors = {g: cmap(i % 10) for i, g in enumerate(groups)}
    fig = Figure(figsize=(8, 0.32 * len(comps) + 1.6))
    ax = fig.subplots()
    ys = list(range(len(comps)))
    for y, c in zip(ys, comps):
        group = assumption_of(c.model, kinds.get(c.model, "transformer"))
        color = colors[group] if c.significant else "lightgrey"
        err = None if c.ci_low is None else [[c.diff - c.ci_low], [c.ci_high - c.diff]]
        ax.barh([y], [c.diff], xerr=err, color=color, capsize=2, ecolor="dimgrey")
        if not c.significant:
            ax.text(0.0, y, "  n.s.", va="center", fontsize=7, color="dimgrey")
    ax.set_yticks(ys, [f"{c.model} / {c.task}" for c in comps], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("test accuracy minus the standard model's (paired by seed, 95 % bootstrap interval)")
    ax.set_title("Impact of relaxing each assumption (grey, n.s.: no detectable difference at this budget)")
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
