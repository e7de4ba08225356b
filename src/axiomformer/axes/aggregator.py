"""Axis A1 — the aggregator rho in y_i = rho(sum_j phi(x_j, u_ij)).

Source: Somani, "A Minimal Route to Transformer Attention", assumption A1 (simplicity: rho = identity), applied to
the Deep Sets form of Zaheer et al. 2017, Theorem 2.

Choices:
    identity  rho(s) = s                                   (A1 holds)
    mlp       rho(s) = s + W_2 GELU(W_1 s)                 (A1 relaxed; bias-free so rho(0) = 0, and a query with no
                                                            visible key still gets a zero output) **(our choice)**
rho acts on the concatenated heads, (batch, seq, dim), before the output projection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from axiomformer.axes.mlp import two_layer_mlp
from axiomformer.axes.registry import Choice, Registry

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec


class IdentityAggregator(nn.Identity):
    """rho(s) = s. Input and output: (batch, seq, dim)."""


class MLPAggregator(nn.Module):
    """rho(s) = s + W_2 GELU(W_1 s), hidden width 2*dim, no biases. Input and output: (batch, seq, dim)."""

    def __init__(self, dim: int):
        super().__init__()
        self.mlp = two_layer_mlp(dim, 2 * dim, dim, bias=False)

    def forward(self, s: Tensor) -> Tensor:
        return s + self.mlp(s)


AGGREGATORS = Registry("aggregator", [
    Choice("identity", "rho(s) = s", "Somani, A1; Zaheer et al. 2017, Theorem 2", lambda spec: IdentityAggregator()),
    Choice("mlp", "rho(s) = s + W_2 GELU(W_1 s)", "our choice (see the module docstring)",
           lambda spec: MLPAggregator(spec.dim)),
])
"""Every aggregator (A1)."""


def build_aggregator(spec: AttentionSpec) -> nn.Module:
    """The rho module for ``spec.aggregator``."""
    return AGGREGATORS[spec.aggregator].impl(spec)
