"""The main suite's PNG figures (``matplotlib.figure.Figure``: no pyplot state, no backend switch).

* accuracy against sequence length per task (mean test accuracy and its 95 % interval per model, ``cell_interval``);
* the differences figure (:func:`draw_differences`): the paired difference to the standard model per comparison with
  its family-corrected interval, the ±margin band shaded, coloured by verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from axiomformer.study.report import StudyData
    from axiomformer.study.statistics import Verdict
    from axiomformer.study.summary import CellStat


def draw_figures(d: StudyData, folder: Path) -> dict[str, Path]:
    """Draw every figure the data allows into ``folder``.

    Returns:
        ``{"length:<task>": path}`` for every task run at two or more lengths (a line over one length carries no
        information: one length is in the tables only).
    """
    from axiomformer.study.summary import cell_stats

    folder.mkdir(parents=True, exist_ok=True)
    stats = cell_stats(d)
    out: dict[str, Path] = {}
    for task in dict.fromkeys(t for t, _ in d.tasks):
        lengths = sorted(n for t, n in d.tasks if t == task)
        if len(lengths) > 1:
            out[f"length:{task}"] = _accuracy_vs_length(
                d, stats, task, lengths, folder / f"{task}_accuracy_vs_length.png"
            )
    return out


def _accuracy_vs_length(d: StudyData, stats: list[CellStat], task: str, lengths: list[int], path: Path) -> Path:
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    cmap = colormaps["tab20"]
    for i, m in enumerate(d.models):
        points = sorted((c.seq_len, c) for c in stats if c.model == m.label and c.task.split("@")[0] == task)
        if not points:
            continue
        xs = [n for n, _ in points]
        ys = [c.mean for _, c in points]
        lo = [c.mean - (c.ci_low if c.ci_low is not None else c.mean) for _, c in points]
        hi = [(c.ci_high if c.ci_high is not None else c.mean) - c.mean for _, c in points]
        recurrent = m.kind != "transformer"
        ax.errorbar(
            xs,
            ys,
            yerr=[lo, hi],
            label=m.label,
            marker="s" if recurrent else "o",
            capsize=3,
            linestyle="--" if recurrent else "-",
            linewidth=2.2 if recurrent or m.label == "standard" else 1,
            color="black" if m.label == "standard" else cmap(i % 20),
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("sequence length")
    ax.set_ylabel("test accuracy (95 % interval)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{task}: accuracy against sequence length (dashed: recurrent baselines)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


COLORS = {
    "forced": "tab:red",
    "better": "tab:blue",
    "free": "tab:green",
    "inconclusive": "dimgrey",
    "pilot": "darkgrey",
}


def draw_differences(found: list[tuple[Verdict, int, str]], margin: float, path: Path) -> Path:
    """The paired difference to the standard model of every comparison with its interval, the ±``margin`` band
    shaded, coloured by verdict; primary family on top, then the secondary one. ``found``: ``(Verdict, seq_len,
    family)`` as ``study.summary.verdicts`` gives them."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(8, 0.34 * len(found) + 1.8))
    ax = fig.subplots()
    ax.axvspan(-margin, margin, color="tab:green", alpha=0.12, linewidth=0)
    ax.axvline(0.0, color="black", linewidth=0.8)
    for y, (v, _, family) in enumerate(found):
        color = COLORS.get(v.verdict, "black")
        if v.ci_low is not None and v.ci_high is not None:
            ax.plot([v.ci_low, v.ci_high], [y, y], color=color, linewidth=2.2, solid_capstyle="butt")
        ax.plot([v.diff], [y], marker="o" if family == "primary" else "s", color=color, markersize=5)
    labels = [
        f"{v.assumption}: {v.model} / {v.task}{' [solve rate]' if v.metric == 'solve_rate' else ''}"
        f"{'' if f == 'primary' else f' ({f})'}"
        for v, _, f in found
    ]
    ax.set_yticks(range(len(found)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        f"relaxation minus the standard model: test accuracy, or solve rate where marked (family-corrected "
        f"interval; band: the accuracy margin ±{margin:g})"
    )
    ax.set_title("Relaxing each assumption: difference to the standard model")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
