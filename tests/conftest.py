import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
# Every test works on tiny tensors: a second intra-op thread only adds synchronisation (measured 10-25x slower per
# small op on a loaded 2-core machine).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
