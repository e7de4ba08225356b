"""Pilot: how long must a 64-token-trained model train at 10,000 tokens before validation accuracy is flat?
Warm start from the committed long-range store's 64-token state (seed 0), train N steps at 10,000 tokens with no early
stop, evaluate every E steps on V validation batches (of 4 sequences); print the history as JSON. Optional: test batches
(default V) and a path for the tested weights (safetensors), so a later pilot can continue from them."""

import json
import sys
import time

from axiomformer.train import TrainConfig, train


def pilot_config(task, model, dim, lr, state, steps, every, vb, tb, seed=0) -> TrainConfig:
    """The long-range preset at 10,000 tokens, warm-started from ``state``, no early stop (also long10k_blind.py's)."""
    opts = {"shared": False} if task == "needle" else {"pairs": 2, "num_keys": 4}  # the suite's needle_kv since 8e741a6
    return TrainConfig(
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
        test_batches=int(tb),
        weight_decay=0.1,
        target_accuracy=None,
        patience=None,
        seed=int(seed),
        device="cpu",
        task_options=opts,
        init_from=state,
    )


if __name__ == "__main__":
    task, model, dim, lr, state, steps, every, vb = sys.argv[1:9]
    tb = sys.argv[9] if len(sys.argv) > 9 else vb
    save = sys.argv[10] if len(sys.argv) > 10 else None
    cfg = pilot_config(task, model, dim, lr, state, steps, every, vb, tb)
    c = time.process_time()
    r = train(cfg, progress=False, log=lambda s: print(s, flush=True), save_state=save)
    print(
        json.dumps(
            {
                "task": task,
                "model": model,
                "lr": float(lr),
                "init_from": state,
                "steps": r.steps,
                "val_sequences": int(vb) * 4,
                "history": r.history,
                "test_accuracy": r.accuracy,
                "n_test": r.n_test,
                "cpu_seconds": time.process_time() - c,
            }
        )
    )
