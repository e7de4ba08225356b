"""Run under ``torchrun``: train a tiny config data parallel and let rank 0 write the result as JSON.

Usage: ``torchrun --nproc-per-node 2 tests/ddp_worker.py OUT_DIR CONFIG_JSON``; writes ``OUT_DIR/result.json`` (rank 0
only), the checkpoint into ``OUT_DIR/checkpoint`` (rank 0 only), and ``OUT_DIR/rank<r>.json`` with each rank's losses.
"""

import json
import sys
from pathlib import Path

import torch

from axiomformer.distributed import DataParallel, process_group
from axiomformer.train import TrainConfig, train

if __name__ == "__main__":
    out, config = Path(sys.argv[1]), TrainConfig(**json.loads(sys.argv[2]))
    torch.set_num_threads(1)
    with process_group(config.device) as created:
        assert created, "not launched by torchrun with more than one process"
        parallel = DataParallel.current(config.device)
        result = train(config, progress=False, checkpoint_dir=out / "checkpoint")
        (out / f"rank{parallel.rank}.json").write_text(
            json.dumps({"losses": result.losses, "accuracy": result.accuracy})
        )
        if parallel.main:
            (out / "result.json").write_text(json.dumps(result.to_dict()))
