import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
# Every test works on tiny tensors: a second intra-op thread only adds synchronisation (measured 10-25x slower per
# small op on a loaded 2-core machine).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
