"""The long-range suite's report body: accuracy against length per model and task, the longest solved length."""

from __future__ import annotations

from pathlib import Path

from axiomformer.study.render import Heading, Image, Paragraph, Table


def _cell(d, label: str, task: str, n: int) -> dict | None:
    rows = [r for r in d.rows if (r["label"], r["task"], r["seq_len"]) == (label, task, n)]
    if not rows:
        return None
    accs = [r["accuracy"] for r in rows]
    outcome = [r.get("outcome") or {} for r in rows]
    vals = [o.get("val_accuracy") for o in outcome if o.get("val_accuracy") is not None]
    return {"mean": sum(accs) / len(accs), "n": len(accs), "lr": outcome[0].get("lr"),
            "val": sum(vals) / len(vals) if vals else None,
            "steps": max(r["steps"] or 0 for r in rows), "converged": all(o.get("converged", True) for o in outcome),
            "chance": (rows[0].get("task_config") or {}).get("chance")}


def longest_solved(d, label: str, task: str, lengths: list[int], solved: float) -> int | None:
    """The longest length at which ``label`` reaches ``solved`` test accuracy on ``task`` (``None``: none)."""
    best = None
    for n in lengths:
        c = _cell(d, label, task, n)
        if c is not None and c["mean"] >= solved:
            best = n
    return best


def _figure(d, tasks: dict[str, list[int]], path: Path) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * len(tasks), 4.2))
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, (task, lengths) in zip(axes, tasks.items()):
        chance = None
        spread = len(d.models) - 1
        for i, m in enumerate(d.models):
            shift = 1.0 + 0.05 * (i - spread / 2)  # a small horizontal offset per model, so equal points stay visible
            xs, ys = [], []
            for n in lengths:
                c = _cell(d, m["label"], task, n)
                if c is not None:
                    xs.append(n * shift)
                    ys.append(c["mean"])
                    chance = c["chance"] if c["chance"] is not None else chance
            if xs:
                recurrent = m["kind"] != "transformer"
                ax.plot(xs, ys, marker="s" if recurrent else "o", linestyle="--" if recurrent else "-",
                        label=m["label"] if m["label"] != "standard" else "Transformer (standard)")
        if chance is not None:
            ax.axhline(chance, color="grey", linewidth=0.8, linestyle=":", label="chance")
        ax.set_xscale("log")
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(task)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def sections(d, figures_dir: Path, *, solved: float) -> list:
    """Protocol, accuracy-vs-length tables, the longest solved length, the figure, failures, provenance."""
    from axiomformer.study import report

    tasks: dict[str, list[int]] = {}
    for task in d.config.get("tasks") or []:  # every configured length, run yet or not
        tasks.setdefault(task["name"], []).extend(task["seq_lens"])
    for task, n in d.tasks:
        tasks.setdefault(task, []).append(n)
    tasks = {t: sorted(set(ns)) for t, ns in tasks.items()}
    cfg = d.config
    seeds = int(cfg.get("seeds", 1))
    out: list = [Paragraph(
        f"Protocol: curriculum over lengths — each (model, task) picks its learning rate from "
        f"{(cfg.get('budget') or {}).get('lr_grid')} on the validation split at the shortest length (selection seed "
        f"{cfg.get('selection_seeds', [cfg.get('selection_seed', 0)])}), then trains length by length from its own weights at the previous length; "
        + (f"reported seeds: 0..{seeds - 1}" if seeds > 1 else "reported seed: 0 (its run at the shortest length is "
           "its selection run; one seed, so no intervals)") + ". Every model gets the same steps, batch and evaluations "
        f"at every length; early stopping on validation (target accuracy or patience). Test accuracy on a held-out "
        f"split at the best validation checkpoint. Solved: test accuracy >= {solved}.")]
    budgets = Table(["task", "length", "steps (at most)", "batch", "warmup", "eval every", "eval batches", "patience"])
    for task in cfg.get("tasks") or []:
        for n in task["seq_lens"]:
            b = {**(cfg.get("budget") or {}), **{k: v for k, v in (task.get("budget") or {}).items() if v is not None},
                 **{k: v for k, v in ((task.get("length_budgets") or {}).get(str(n)) or {}).items() if v is not None}}
            budgets.rows.append([task["name"], str(n), *(str(b.get(k, "—")) for k in (
                "steps", "batch_size", "warmup", "eval_every", "eval_batches", "patience"))])
    budgets.note = "The budget at each length, the same for every model."
    out += [Heading("Budget per length", 3), budgets]
    summary = Table(["model", *(f"{t}: longest solved" for t in tasks)])
    for m in d.models:
        summary.rows.append([m["label"], *(str(longest_solved(d, m["label"], t, ls, solved) or "none")
                                          for t, ls in tasks.items())])
    summary.note = f"Longest length with test accuracy >= {solved} (none: no length reached it)."
    out += [Heading("Longest length solved"), summary]
    for task, lengths in tasks.items():
        table = Table(["model", *(str(n) for n in lengths)])
        for m in d.models:
            cells = []
            for n in lengths:
                c = _cell(d, m["label"], task, n)
                val = "" if c is None or c["val"] is None else f", val {c['val']:.3f}"
                cells.append("—" if c is None else f"{c['mean']:.3f} (lr {c['lr']:g}, {c['steps']} st{val}"
                             + ("" if c["converged"] else ", not converged") + ")")
            table.rows.append([m["label"], *cells])
        chance = next((c["chance"] for m in d.models for n in lengths
                       if (c := _cell(d, m["label"], task, n)) is not None and c["chance"] is not None), None)
        table.note = (f"Test accuracy (lr chosen at the shortest length; steps taken at that length; val: the "
                      f"validation accuracy of the tested checkpoint; test and validation sets hold eval_batches x "
                      f"batch_size sequences, 16-32 at the longest lengths, so single values are coarse)"
                      + (f"; chance {chance:.3f}" if chance is not None else "") + ". `—`: not run (yet).")
        out += [Heading(f"{task}: accuracy against length"), table]
    if d.rows:
        path = _figure(d, tasks, figures_dir / "long_range_accuracy_vs_length.png")
        out.append(Image(f"figures/{path.name}", "test accuracy against sequence length (points offset slightly "
                                                 "per model so that equal values stay visible)"))
    return out + report.failures_block(d) + report.provenance_block(d)
