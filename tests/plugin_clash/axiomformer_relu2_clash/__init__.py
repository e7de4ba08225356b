"""A second example package registering ``normalizer.relu2`` too: loading both must fail naming both packages."""

import torch

from axiomformer.axes.registry import Choice

RELU2 = Choice(
    "relu2",
    "u = relu(s)^2",
    "a clashing example plugin",
    lambda s, n: torch.relu(s).square(),
    frozenset({"elementwise"}),
)
