"""Run under ``torchrun``: train one step with attention dropout and write this rank's first dropout mask.

Usage: ``torchrun --nproc-per-node 2 tests/ddp_mask_worker.py OUT_DIR CONFIG_JSON``; writes ``OUT_DIR/mask<r>.json``.
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from axiomformer.distributed import DataParallel, process_group
from axiomformer.train import TrainConfig, train

if __name__ == "__main__":
    out, config = Path(sys.argv[1]), TrainConfig(**json.loads(sys.argv[2]))
    torch.set_num_threads(1)
    masks = []
    original = F.dropout

    def spy(x, p=0.5, training=True, inplace=False):
        y = original(x, p=p, training=training, inplace=inplace)
        if training and p > 0 and not masks:
            masks.append(((y == 0) & (x != 0)).flatten().tolist())
        return y

    F.dropout = spy
    with process_group(config.device):
        rank = DataParallel.current(config.device).rank
        train(config, progress=False)
    (out / f"mask{rank}.json").write_text(json.dumps(masks[0] if masks else None))
