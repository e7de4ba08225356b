"""Pilot: needle_kv at 64 tokens, the standard Transformer, no early stop; prints every evaluation and, last, a JSON
line with the history, the test accuracy and its n, and the CPU seconds."""

import json
import sys
import time

from axiomformer.train import TrainConfig, train

pairs, keys, dim, heads, batch, steps, lr = map(float, sys.argv[1:8])
seed = int(sys.argv[8]) if len(sys.argv) > 8 else 7
cfg = TrainConfig(
    task="needle_kv",
    seq_len=64,
    model="transformer",
    dim=int(dim),
    heads=int(heads),
    layers=2,
    lr=lr,
    steps=int(steps),
    batch_size=int(batch),
    warmup=50,
    eval_every=250,
    eval_batches=4,
    test_batches=13 * 32 // int(batch) + 1,
    weight_decay=0.1,
    target_accuracy=None,
    patience=None,
    seed=seed,
    device="cpu",
    task_options={"pairs": int(pairs), "num_keys": int(keys)},
)
c = time.process_time()
r = train(cfg, progress=False, log=lambda s: print(s, flush=True))
print(
    json.dumps(
        {
            "task": "needle_kv",
            "options": cfg.task_options,
            "dim": cfg.dim,
            "heads": cfg.heads,
            "batch": cfg.batch_size,
            "steps": r.steps,
            "lr": lr,
            "seed": seed,
            "history": r.history,
            "test_accuracy": r.accuracy,
            "n_test": r.n_test,
            "chance": r.chance,
            "cpu_seconds": time.process_time() - c,
        }
    )
)
