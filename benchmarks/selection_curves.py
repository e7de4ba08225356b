"""Validation curves of a suite store's selection runs: the pilot that shows where each arm's plateau ends.

A suite's selection runs train at seeds no study reports (1000, 1001), every arm at every rate of its grid, and store
their validation history; read together they are a pilot of the budget: per arm and rate, the first evaluation step
at which validation accuracy reached the solve threshold (``battery.steps_to_solve``) and the budget over it. The
output is a Markdown table and a figure of the curves, beside the store's report (issue 33: "a committed pilot shows
the budgets reach past the plateau"). It reads the store only.

    python benchmarks/selection_curves.py benchmarks/results/suites/scale benchmarks/results/pilots-33/scale_curves
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path


def main(store_dir: Path, out: Path) -> None:
    from axiomformer.study import ResultsStore
    from axiomformer.study.battery import steps_to_solve
    from axiomformer.study.report import StudyData
    from axiomformer.study.suites.common import new_figure, save

    with ResultsStore(store_dir, readonly=True) as store:
        d = StudyData(store)
    threshold = d.config.solve_threshold
    runs = [r for r in d.all_rows if r.seed in d.config.selection_seeds]
    groups: dict[tuple, list] = defaultdict(list)
    for r in runs:
        groups[(r.task, r.seq_len, r.label, r.outcome.lr)].append(r)
    lines = [
        f"# Selection-run curves of `{store_dir}`",
        "",
        f"Seeds {d.config.selection_seeds} (never reported); solved = validation accuracy >= {threshold}.",
        "",
        "| task | arm | lr | steps (budget) | steps to solve per seed | budget / slowest solve | test accuracy |",
        "|:---|:---|---:|---:|:---|---:|:---|",
    ]
    fig, (ax,) = new_figure(1, width=8.0, height=4.5)
    for (task, n, label, lr), rows in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        budget = max(int(r.train_config.get("steps") or 0) for r in rows)
        solved = [steps_to_solve(r, threshold) for r in rows]
        ratio = "—" if None in solved or not solved else f"{budget / max(max(solved), 1):.1f}"
        lines.append(
            f"| {task}@{n} | {label} | {lr:g} | {budget} | {', '.join('never' if s is None else str(s) for s in solved)}"
            f" | {ratio} | {', '.join(f'{r.accuracy:.3f}' for r in rows if r.accuracy is not None)} |"
        )
        for r in rows:
            points = [(p["step"], p["accuracy"]) for p in r.outcome.history if p.get("accuracy") is not None]
            if points:
                ax.plot(*zip(*points), lw=0.8, alpha=0.7, label=f"{label} lr {lr:g}" if r is rows[0] else None)
    ax.axhline(threshold, color="gray", ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("validation accuracy")
    ax.legend(fontsize=6, ncol=2)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = save(fig, out.parent, out.name)
    lines += ["", f"![validation curves]({path.name})", ""]
    out.with_suffix(".md").write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
