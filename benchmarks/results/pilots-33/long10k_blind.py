"""Pilot, blind to the test split: does the 1,800-step `needle_kv` budget at 10,000 tokens reach a flat validation
curve on a selection seed (never reported)? Warm start from the long-range store's 64-token state of that seed at the
arm's chosen rate, train N steps with no early stop, evaluate every E steps on V validation batches (of 4 sequences);
print the validation history as JSON. The test score is not printed: the trainer scores one test batch, unread."""

import json
import sys
import time

from long10k import pilot_config  # this folder: sys.path[0] when run as a script

from axiomformer.train import train

task, model, dim, lr, state, steps, every, vb, seed = sys.argv[1:10]
cfg = pilot_config(task, model, dim, lr, state, steps, every, vb, 1, seed)
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
