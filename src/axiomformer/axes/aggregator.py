"""Axis A1 — the aggregator rho in y_i = rho(sum_j phi(x_j, u_ij)).

Source: Somani, "A Minimal Route to Transformer Attention", assumption A1 (simplicity: rho = identity), applied to
the Deep Sets form of Zaheer et al. 2017, Theorem 2.

Choices:
    identity  rho(s) = s                                   (A1 holds)
    mlp       rho(s) = s + W_2 GELU(W_1 s)                 (A1 relaxed; bias-free so rho(0) = 0, and a query with no
                                                            visible key still gets a zero output) **(our choice)**
    gate      rho(s) = sigmoid(W_g x_i + b_g) * s          (A1 relaxed: an elementwise output gate from the query's
                                                            own input x_i; Qiu et al. 2025, arXiv:2505.06708, "G1",
                                                            as in Qwen3-Next); rho(0) = 0
rho acts on the concatenated heads, (batch, seq, dim), before the output projection: ``rho(s, x)`` with x the layer's
query input (batch, seq, dim), which only ``gate`` reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from axiomformer.axes.mlp import two_layer_mlp
from axiomformer.axes.registry import Choice, Registry

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec


class IdentityAggregator(nn.Module):
    """rho(s) = s. Input and output: (batch, seq, dim)."""

    def forward(self, s: Tensor, x: Tensor | None = None) -> Tensor:
        return s


class MLPAggregator(nn.Module):
    """rho(s) = s + W_2 GELU(W_1 s), hidden width 2*dim, no biases. Input and output: (batch, seq, dim)."""

    def __init__(self, dim: int):
        super().__init__()
        self.mlp = two_layer_mlp(dim, 2 * dim, dim, bias=False)

    def forward(self, s: Tensor, x: Tensor | None = None) -> Tensor:
        return s + self.mlp(s)


class GateAggregator(nn.Module):
    """rho(s, x) = sigmoid(W_g x + b_g) * s, elementwise: the head-specific, query-dependent output gate "G1" of Qiu
    et al. 2025 (arXiv:2505.06708, sec. 2), applied to the concatenated heads before the output projection.

    Args (forward): s (batch, seq, dim) the attention output; x (batch, seq, dim) the layer's query input.

    Raises:
        ValueError: ``x`` missing or of another shape than ``s`` (naming both shapes).
    """

    def __init__(self, dim: int):
        super().__init__()
        self.gate = nn.Linear(dim, dim)

    def forward(self, s: Tensor, x: Tensor | None = None) -> Tensor:
        if x is None or x.shape != s.shape:
            raise ValueError(
                f"aggregator='gate' needs the query input x shaped like the heads' output "
                f"{tuple(s.shape)}, got {None if x is None else tuple(x.shape)}"
            )
        return torch.sigmoid(self.gate(x)).to(s.dtype) * s


AGGREGATORS = Registry(
    "aggregator",
    [
        Choice(
            "identity", "rho(s) = s", "Somani, A1; Zaheer et al. 2017, Theorem 2", lambda spec: IdentityAggregator()
        ),
        Choice(
            "mlp",
            "rho(s) = s + W_2 GELU(W_1 s)",
            "our choice (see the module docstring)",
            lambda spec: MLPAggregator(spec.dim),
            relaxes="A1: a learned nonlinear rho after the sum over tokens",
        ),
        Choice(
            "gate",
            "rho(s, x_i) = sigmoid(W_g x_i + b_g) * s, elementwise, before the output projection",
            "Qiu et al. 2025, arXiv:2505.06708, 'G1' (gated attention; Qwen3-Next)",
            lambda spec: GateAggregator(spec.dim),
            relaxes="A1: a multiplicative gate from the query's input after the sum over tokens",
        ),
    ],
)
"""Every aggregator (A1)."""


def build_aggregator(spec: AttentionSpec) -> nn.Module:
    """The rho module for ``spec.aggregator``."""
    return AGGREGATORS[spec.aggregator].impl(spec)
