"""The pilot that chose the main study's task battery (docs/study.md, "The battery").

For each candidate task it trains the standard model and the two validity controls (``no_mixing``,
``uniform_mixing``; ``axiomformer.models.controls``) at pilot seeds no study reports (``PILOT_SEEDS``), with a
fixed budget and no patience (the runs go to the end unless they reach the target accuracy), and records the test
accuracy, the validation curve (steps to solve: the first evaluation at or above ``SOLVED``), whether the training
loss was still falling over the last quarter, and CPU seconds (one torch thread per run, two runs at once).

    nice -n 5 python benchmarks/battery_pilot.py benchmarks/results/study-pilot/pilot.json [round]
    python benchmarks/battery_pilot.py --summary benchmarks/results/study-pilot/pilot.json  # writes pilot.md

The summary gives, per candidate, the task's ceiling on the pilot's test items (``Task.ceiling``), each arm's mean
test accuracy, the standard model's solve rate and median steps to solve, and the call: a candidate qualifies when
the standard model solves at every pilot seed and its mean lies at least ``GAP`` above uniform mixing's.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

PILOT_SEEDS = (2000, 2001)
"""Pilot seeds: no study reports seeds >= 1000."""
SOLVED = 0.9
"""A run solves a task when its accuracy reaches this (the study's solve threshold)."""
ARMS = ("transformer", "uniform_mixing", "no_mixing")
CANDIDATES = {
    "r1": [
        ("mqar", 32, {"vocab": 16, "num_pairs": 4}, 64, 3000),
        ("copy", 16, {"vocab": 8}, 32, 2000),
        ("selective_copy", 32, {"vocab": 8, "num_tokens": 4}, 32, 2000),
        ("induction", 32, {"vocab": 16}, 32, 2000),
    ],
    "r2": [
        ("mqar", 32, {"vocab": 16, "num_pairs": 2}, 32, 2000),
        ("mqar", 16, {"vocab": 16, "num_pairs": 2}, 32, 2000),
        ("selective_copy", 16, {"vocab": 8, "num_tokens": 3}, 32, 2000),
    ],
    "r3": [  # for the positions suite: sort in a causal layout (issue 33)
        ("sort_causal", 16, {"num_symbols": 8}, 32, 2000)
    ],
    "r4": [  # r3's sort_causal@16 is solved by uniform mixing (0.99): more symbols, longer rows
        ("sort_causal", 16, {"num_symbols": 32}, 32, 2000),
        ("sort_causal", 32, {"num_symbols": 16}, 32, 2000),
    ],
    "r5": [  # r1's selective_copy@32 at the positions suite's 4,000 steps: uniform mixing was still rising at 2,000
        ("selective_copy", 32, {"vocab": 8, "num_tokens": 4}, 32, 4000)
    ],
    "r6": [  # r5: uniform mixing reaches the standard model at 4,000 steps; more tokens to order, longer rows
        ("selective_copy", 64, {"vocab": 8, "num_tokens": 8}, 32, 4000),
        ("selective_copy", 32, {"vocab": 16, "num_tokens": 8}, 32, 4000),
    ],
}
BUDGET = {
    "batch_size": 32,
    "warmup": 20,
    "eval_every": 100,
    "eval_batches": 8,
    "test_batches": 16,
    "target_accuracy": 0.99,
    "lr": 3e-3,
}


def one(job: tuple) -> dict:
    import torch

    from axiomformer.train import TrainConfig, train

    task, seq_len, options, dim, steps, model, seed = job
    torch.set_num_threads(1)
    config = TrainConfig(
        task=task,
        seq_len=seq_len,
        task_options=options,
        model=model,
        dim=dim,
        layers=2,
        heads=2,
        seed=seed,
        device="cpu",
        steps=steps,
        **BUDGET,
    )
    cpu = time.process_time()
    result = train(config, progress=False)
    cpu = time.process_time() - cpu
    losses = result.losses
    q = max(1, len(losses) // 4)
    falling = len(losses) >= 8 and sum(losses[-q:]) / q < 0.95 * sum(losses[-2 * q : -q]) / q
    solved_at = next((h["step"] for h in result.history if h["accuracy"] >= SOLVED), None)
    return {
        "task": task,
        "seq_len": seq_len,
        "options": options,
        "dim": dim,
        "model": model,
        "seed": seed,
        "steps_budget": steps,
        "steps": result.steps,
        "test_accuracy": result.accuracy,
        "params": result.params,
        "solved_at": solved_at,
        "loss_falling_at_end": falling,
        "cpu_seconds": cpu,
        "curve": [(h["step"], round(h["accuracy"], 4)) for h in result.history],
    }


GAP = 0.05
"""The study's discrimination gap (``axiomformer.study.battery.DISCRIMINATION_GAP``)."""


def summarize(path: str) -> str:
    """The pilot's table (markdown) from its JSON, written beside it as ``pilot.md``."""
    import statistics

    from axiomformer.study.sections import task_test_items

    rows = [r for group in json.loads(Path(path).read_text()).values() for r in group]
    keys = list(
        dict.fromkeys((r["task"], r["seq_len"], json.dumps(r["options"]), r["dim"], r["steps_budget"]) for r in rows)
    )
    lines = [
        "| task | options | dim | steps | ceiling | standard | solved (steps) | uniform mixing | no mixing | call |",
        "|:---|:---|---:|---:|---:|---:|:---|---:|---:|:---|",
    ]
    for task, seq_len, options, dim, budget in keys:
        group = [
            r
            for r in rows
            if (r["task"], r["seq_len"], json.dumps(r["options"]), r["dim"], r["steps_budget"])
            == (task, seq_len, options, dim, budget)
        ]
        built, x, y = task_test_items(task, seq_len, json.loads(options), BUDGET["batch_size"], BUDGET["test_batches"])
        ceiling = built.ceiling(x, y)

        def mean(model: str, group: list = group) -> float:
            return statistics.fmean(r["test_accuracy"] for r in group if r["model"] == model)

        std = [r for r in group if r["model"] == "transformer"]
        solved = [r["solved_at"] for r in std if r["solved_at"] is not None]
        ok = len(solved) == len(std) and mean("transformer") - mean("uniform_mixing") >= GAP
        lines.append(
            f"| {task}@{seq_len} | {options} | {dim} | {std[0]['steps_budget']} | "
            f"{'—' if ceiling is None else f'{ceiling.value:.3f} ({ceiling.method})'} | {mean('transformer'):.3f} | "
            f"{len(solved)}/{len(std)} ({', '.join(map(str, solved)) or '—'}) | {mean('uniform_mixing'):.3f} | "
            f"{mean('no_mixing'):.3f} | {'qualifies' if ok else 'rejected'} |"
        )
    text = "\n".join(lines) + "\n"
    Path(path).with_name("pilot.md").write_text(
        "# Battery pilot\n\nSeeds " + ", ".join(map(str, PILOT_SEEDS)) + f" (never reported), lr {BUDGET['lr']:g}, "
        f"2 layers, 2 heads; steps: the budget (runs stop early at validation accuracy {BUDGET['target_accuracy']}). "
        f"`solved (steps)`: pilot runs whose validation accuracy reached {SOLVED} and the step it first did.\n\n" + text
    )
    return text


def main(path: str, round_name: str = "r1") -> None:
    jobs = [
        (t, n, o, d, s, m, seed) for (t, n, o, d, s) in CANDIDATES[round_name] for m in ARMS for seed in PILOT_SEEDS
    ]
    out = Path(path)
    done = json.loads(out.read_text()) if out.exists() else {}
    rows = done.setdefault(round_name, [])
    have = {(r["task"], r["seq_len"], json.dumps(r["options"]), r["dim"], r["model"], r["seed"]) for r in rows}
    todo = [j for j in jobs if (j[0], j[1], json.dumps(j[2]), j[3], j[5], j[6]) not in have]
    with ProcessPoolExecutor(2) as pool:
        for row in pool.map(one, todo):
            rows.append(row)
            out.write_text(json.dumps(done, indent=1))
            print(
                row["task"],
                row["model"],
                row["seed"],
                row["test_accuracy"],
                row["solved_at"],
                round(row["cpu_seconds"]),
                flush=True,
            )


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        print(summarize(sys.argv[2]))
    else:
        main(*sys.argv[1:])
