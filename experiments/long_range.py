"""Issue 4 acceptance: long-range recall with default settings, on CPU.

Runs, with every tunable left at its task default (the task class's ``budget_defaults``):

    mqar   seq_len 64   transformer (standard spec)   -> accuracy >= 0.95
    needle seq_len 256  transformer (standard spec)   -> accuracy >= 0.9

and, for context (no acceptance line: nothing may require a model to fail), the tanh RNN, LSTM and GRU on needle. Prints a table (wall seconds and process CPU seconds; on a shared
machine the CPU seconds are the better estimate of an unshared run) and exits 1 if an acceptance line fails.

    python experiments/long_range.py [--threads 2] [--seed 0] [--only mqar,needle] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from axiomformer.train import TrainConfig, train

RUNS = [
    # (task, seq_len, model, check, threshold)
    ("mqar", 64, "transformer", ">=", 0.95),
    ("needle", 256, "transformer", ">=", 0.9),
    ("needle", 256, "rnn", None, None),
    ("needle", 256, "lstm", None, None),
    ("needle", 256, "gru", None, None),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated task names or task:model pairs to run")
    parser.add_argument("--json", action="store_true", help="also print one JSON line per run")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    only = {item for item in args.only.split(",") if item}

    rows, failed = [], False
    for task, seq_len, model, check, threshold in RUNS:
        if only and task not in only and f"{task}:{model}" not in only:
            continue
        cpu = time.process_time()
        result = train(TrainConfig(task=task, seq_len=seq_len, model=model, seed=args.seed), progress=False)
        cpu = time.process_time() - cpu
        ok = None
        if check is not None:
            ok = result.accuracy >= threshold if check == ">=" else result.accuracy <= threshold
            failed |= not ok
        rows.append((result, cpu, check, threshold, ok))
        if args.json:
            print(
                json.dumps(
                    {
                        **result.summary(),
                        "cpu_seconds": cpu,
                        "chance": result.chance,
                        "engine": result.engine,
                        "pass": ok,
                    }
                ),
                flush=True,
            )

    header = (
        f"{'task':8} {'seq':>5} {'model':12} {'acc':>6} {'chance':>6} {'steps':>5} {'wall s':>7} {'cpu s':>7} "
        f"{'params':>7} {'tok/s':>8}  acceptance"
    )
    print(header)
    print("-" * len(header))
    for result, cpu, check, threshold, ok in rows:
        verdict = "" if check is None else f"{check} {threshold}: {'pass' if ok else 'FAIL'}"
        print(
            f"{result.task:8} {result.seq_len:>5} {result.model:12} {result.accuracy:>6.3f} {result.chance:>6.3f} "
            f"{result.steps:>5} {result.seconds:>7.1f} {cpu:>7.1f} {result.params:>7} "
            f"{result.tokens_per_second:>8.0f}  {verdict}"
        )
    print(f"torch {torch.__version__}, {args.threads} thread(s), seed {args.seed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
