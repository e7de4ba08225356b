"""Figures of ``axiomformer flow`` (``matplotlib.figure.Figure``; no backend switch): accuracy against K per arm and
noise level, with the 95% intervals, for each theta setting; and the test-time flows."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _panel(ax: Any, rows: list[dict[str, Any]], key: str, title: str) -> None:  # ax: a matplotlib Axes (untyped)
    for name in dict.fromkeys(r[key] for r in rows):
        pts = sorted((r for r in rows if r[key] == name), key=lambda r: r["K"])
        ks = [r["K"] for r in pts]
        mean = [r["acc_mean"] for r in pts]
        low = [r["acc_mean"] - r["ci_low"] if r["ci_low"] is not None else 0.0 for r in pts]
        high = [r["ci_high"] - r["acc_mean"] if r["ci_high"] is not None else 0.0 for r in pts]
        ax.errorbar(ks, mean, yerr=[low, high], marker="o", ms=3, capsize=2, label=name)
    ax.set_title(title, fontsize=8)
    ax.set_xlabel("flow steps K")
    ax.set_xscale("symlog", base=2, linthresh=1)


def write_figures(out: Path, result: dict) -> list[str]:
    """Write ``flow_accuracy.png`` (rows: theta settings; columns: noise levels; one line per arm) and
    ``flow_test_time.png`` into ``out``; return their paths."""
    from matplotlib.figure import Figure

    noise = result["noise"]
    thetas = list(dict.fromkeys(r["theta"] for r in result["arms"]))
    tag = (
        f"{result['data']}, {result['model']}"
        + (f", patch {result['patch']}" if result["patch"] else "")
        + f", readout {result['readout']}, {len(result['seeds'])} seeds, 95% t-intervals"
    )
    fig = Figure(figsize=(3.6 * len(noise), 3.0 * len(thetas) + 0.6))
    axes = fig.subplots(len(thetas), len(noise), squeeze=False, sharey=True)
    for i, theta in enumerate(thetas):
        for j, sigma in enumerate(noise):
            rows = [r for r in result["arms"] if r["theta"] == theta and r["noise"] == sigma]
            _panel(axes[i][j], rows, "arm", f"theta {theta}, noise {sigma:g}")
        axes[i][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("accuracy against flow steps per arm: " + tag, fontsize=9)
    fig.tight_layout()
    paths = [out / "flow_accuracy.png"]
    fig.savefig(paths[-1], dpi=110)

    fig = Figure(figsize=(3.6 * len(noise), 3.2))
    axes = fig.subplots(1, len(noise), squeeze=False, sharey=True)
    for j, sigma in enumerate(noise):
        _panel(
            axes[0][j],
            [r for r in result["test_time_flow"] if r["noise"] == sigma],
            "method",
            f"test-time flow, noise {sigma:g}",
        )
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("test-time flow of the fitted network's test features (theta fixed, no labels): " + tag, fontsize=8)
    fig.tight_layout()
    paths.append(out / "flow_test_time.png")
    fig.savefig(paths[-1], dpi=110)
    return [str(p) for p in paths]
