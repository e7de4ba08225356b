"""Axis A3 — the value map v(x) in phi(x_j, u_ij) = u_ij * v(x_j).

Source: Somani, assumption A3 (linear change of coordinates, v(x) = W_v x).

Choices (all map (batch, seq, dim) -> (batch, seq, dim); heads are split afterwards):
    linear    v(x) = W_v x + b_v          (A3 holds; the standard value projection)
    identity  v(x) = x                    (A3 relaxed to its simplest special case: no learned coordinates)
    mlp       v(x) = W_2 GELU(W_1 x)      (A3 relaxed: a non-linear value map, hidden width 2*dim)
"""

from __future__ import annotations

from torch import nn

from axiomformer.axes.mlp import two_layer_mlp
from axiomformer.spec import AttentionSpec


def build_value(spec: AttentionSpec) -> nn.Module:
    """The value map for ``spec.value``."""
    if spec.value == "linear":
        return nn.Linear(spec.dim, spec.dim, bias=spec.bias)
    if spec.value == "identity":
        return nn.Identity()
    return two_layer_mlp(spec.dim, 2 * spec.dim, spec.dim, bias=spec.bias)
