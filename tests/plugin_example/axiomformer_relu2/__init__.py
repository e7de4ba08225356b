"""An example third-party package that adds one normalizer to axiomformer through the entry-point group
``axiomformer.choices`` (see ``axiomformer/axes/plugins.py``). Its installed metadata is the ``.dist-info`` folder
beside it; putting this folder on ``sys.path`` is what ``pip install`` of such a package would do.
"""

import torch

from axiomformer.axes.registry import Choice


def _relu2(s: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return torch.relu(s).square() / n


RELU2 = Choice(
    "relu2",
    "u = relu(s)^2 / n_i",
    "So et al. 2021 (Primer, squared ReLU), as an example plugin",
    _relu2,
    frozenset({"elementwise"}),
    relaxes="A5: each weight from its own score, squared ReLU; rows need not sum to 1",
)
