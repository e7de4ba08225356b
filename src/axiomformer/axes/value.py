"""Axis A3 — the value map v(x) in phi(x_j, u_ij) = u_ij * v(x_j).

Source: Somani, assumption A3 (linear change of coordinates, v(x) = W_v x).

Choices (all map (batch, seq, dim) -> (batch, seq, kv_dim), kv_dim = dim unless the spec groups key/value heads;
heads are split afterwards):
    linear    v(x) = W_v x + b_v          (A3 holds; the standard value projection)
    identity  v(x) = x                    (A3 relaxed to its simplest special case: no learned coordinates)
    mlp       v(x) = W_2 GELU(W_1 x)      (A3 relaxed: a non-linear value map, hidden width 2*dim)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from axiomformer.axes.mlp import two_layer_mlp
from axiomformer.axes.registry import Choice, Registry

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec


VALUES = Registry(
    "value",
    [
        Choice(
            "linear", "v(x) = W_v x + b_v", "Somani, A3", lambda spec: nn.Linear(spec.dim, spec.kv_dim, bias=spec.bias)
        ),
        Choice(
            "identity",
            "v(x) = x",
            "our choice: A3's simplest special case",
            lambda spec: nn.Identity(),
            relaxes="none (inside A3's class): the identity is linear; only the learned value map is given up",
        ),
        Choice(
            "mlp",
            "v(x) = W_2 GELU(W_1 x)",
            "our choice: a non-linear value map",
            lambda spec: two_layer_mlp(spec.dim, 2 * spec.dim, spec.kv_dim, bias=spec.bias),
            relaxes="A3: a nonlinear value map",
        ),
    ],
)
"""Every value map (A3)."""


def build_value(spec: AttentionSpec) -> nn.Module:
    """The value map for ``spec.value``."""
    return VALUES[spec.value].implementation()(spec)
