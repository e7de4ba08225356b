"""The study's PNG figures (matplotlib ``Figure``s): accuracy against sequence length, and impact bars."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from axiomformer.study.report import StudyData


def draw_figures(d: "StudyData", folder: Path) -> dict[str, Path]:
    """Draw every figure the data allows into ``folder``.

    Returns:
        ``{"length:<task>": path}`` for ``needle`` (always, when it was run) and any other task run at two or more
        lengths, and ``{"impact": path}`` when there are relaxations to compare with the standard spec.
    """
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for task in dict.fromkeys(t for t, _ in d.tasks):
        lengths = sorted(n for t, n in d.tasks if t == task)
        if task == "needle" or len(lengths) > 1:
            out[f"length:{task}"] = _accuracy_vs_length(d, task, lengths, folder / f"{task}_accuracy_vs_length.png")
    from axiomformer.study.report import assumption_of

    bars = [(m["label"], assumption_of(m["label"], m["kind"]), d.mean_delta(m["label"])) for m in d.models
            if m["label"] != "standard"]
    bars = [b for b in bars if b[2] is not None]
    if bars:
        out["impact"] = _impact_bars(bars, folder / "assumption_impact.png")
    return out


def _accuracy_vs_length(d: "StudyData", task: str, lengths: list[int], path: Path) -> Path:
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    cmap = matplotlib.colormaps.get_cmap("tab20")
    for i, m in enumerate(d.models):
        xs, ys, errs = [], [], []
        for n in lengths:
            values = d.acc.get((m["label"], task, n))
            if values:
                xs.append(n)
                ys.append(statistics.fmean(values))
                errs.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        if not xs:
            continue
        recurrent = m["kind"] != "transformer"
        ax.errorbar(xs, ys, yerr=errs, label=m["label"], marker="s" if recurrent else "o", capsize=3,
                    linestyle="--" if recurrent else "-", linewidth=2.2 if recurrent or m["label"] == "standard" else 1,
                    color="black" if m["label"] == "standard" else cmap(i % 20))
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("sequence length")
    ax.set_ylabel("eval accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{task}: accuracy against sequence length (dashed: recurrent baselines)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _impact_bars(bars: list[tuple[str, str, float]], path: Path) -> Path:
    import matplotlib
    from matplotlib.figure import Figure

    bars = sorted(bars, key=lambda b: (b[1], b[0]))
    groups = list(dict.fromkeys(b[1] for b in bars))
    cmap = matplotlib.colormaps.get_cmap("tab10")
    colors = {g: cmap(i % 10) for i, g in enumerate(groups)}
    fig = Figure(figsize=(8, 0.35 * len(bars) + 1.5))
    ax = fig.subplots()
    ys = range(len(bars))
    ax.barh(list(ys), [b[2] for b in bars], color=[colors[b[1]] for b in bars])
    ax.set_yticks(list(ys), [b[0] if b[0].startswith(b[1].split()[0]) else f"{b[1]}: {b[0]}" for b in bars],
                  fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("accuracy change against the standard spec (mean over tasks)")
    ax.set_title("Impact of relaxing each assumption")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
