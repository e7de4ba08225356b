"""The small two-layer perceptron used by the ``mlp`` choices of several axes."""

from __future__ import annotations

from torch import nn


def two_layer_mlp(in_dim: int, hidden: int, out_dim: int, *, bias: bool = True) -> nn.Sequential:
    """``Linear(in_dim, hidden) -> GELU -> Linear(hidden, out_dim)``, applied to the last dimension."""
    return nn.Sequential(nn.Linear(in_dim, hidden, bias=bias), nn.GELU(), nn.Linear(hidden, out_dim, bias=bias))
