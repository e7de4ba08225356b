"""The per-arm cost of ``axiomformer flow``, measured before sizing the default run (``docs/flows.md``).

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/flow_cost.py

Trains every arm of the default for one epoch of the default data (mnist5k, 2,000 training images, batch 128) with 6
networks side by side at K = 1 and K = 4, and prints the CPU seconds (``time.process_time``, so the load of other
jobs on the shared machine inflates it only through cache contention) per network and epoch.
"""

from __future__ import annotations

import time

import torch

from axiomformer.flows.data import load_dataset
from axiomformer.flows.experiment import ArmSetup, default_config, fit_classifiers, prepare, train_arm

ARMS = [
    ("attention/tied", "attention", "tied"),
    ("attention/classifier", "attention", "classifier"),
    ("shuffled/tied", "shuffled", "tied"),
    ("shuffled/classifier", "shuffled", "classifier"),
    ("token_mlp", "token_mlp", "none"),
    ("mlp", "mlp", "none"),
    ("both/tied", "both", "tied"),
    ("both/classifier", "both", "classifier"),
    ("neither", "neither", "none"),
]


def main(nets: int = 6) -> None:
    torch.set_num_threads(1)
    cfg = default_config(False, epochs=1, fit_epochs=1)
    x, y, _, _ = prepare(load_dataset("mnist5k", None, seed=0), cfg)
    fits = fit_classifiers(cfg, x, y, [0.5] * nets, list(range(nets)))
    for arm, mixing, value in ARMS:
        for K in (0,) if mixing == "neither" else (1, 4):
            start = time.process_time()
            train_arm(
                fits,
                ArmSetup("fixed", mixing, value, K),
                cfg=cfg,
                x=x,
                y=y,
                sigmas=[0.5] * nets,
                seeds=list(range(nets)),
                lr=3e-3,
            )
            print(f"{arm} K={K}: {(time.process_time() - start) / nets:.3f} CPU s per network and epoch", flush=True)


if __name__ == "__main__":
    main()
