"""Pilot, blind to the test split: does the 1,800-step `needle_kv` budget at 10,000 tokens reach a flat validation
curve on a selection seed (never reported)? Warm start from the long-range store's 64-token state of that seed at the
arm's chosen rate, train N steps with no early stop, evaluate every E steps on V validation batches (of 4 sequences);
print the validation history as JSON. The test score is not printed: the trainer scores one test batch, unread."""

import json
import sys
import time

from axiomformer.train import TrainConfig, train

task, model, dim, lr, state, steps, every, vb, seed = sys.argv[1:10]
cfg = TrainConfig(
    task=task,
    seq_len=10000,
    model=model,
    dim=int(dim),
    heads=2,  # the long-range preset's
    layers=2,
    lr=float(lr),
    steps=int(steps),
    batch_size=4,
    warmup=3,
    eval_every=int(every),
    eval_batches=int(vb),
    test_batches=1,
    weight_decay=0.1,
    target_accuracy=None,
    patience=None,
    seed=int(seed),
    device="cpu",
    task_options={"pairs": 2, "num_keys": 4},
    init_from=state,
)
c = time.process_time()
r = train(cfg, progress=False, log=lambda s: print(s, flush=True))
print(
    json.dumps(
        {
            "task": task,
            "model": model,
            "lr": float(lr),
            "seed": int(seed),
            "init_from": state,
            "steps": r.steps,
            "val_sequences": int(vb) * 4,
            "history": r.history,
            "cpu_seconds": time.process_time() - c,
        }
    )
)
