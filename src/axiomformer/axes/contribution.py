"""Axis A2 — the contribution phi(v_j, u_ij) of key j to query i.

Source: Somani, assumption A2 (scaling the relevance u_ij by k scales the contribution by k), which forces
phi(v, u) = u * v.

Choices, with v_j (batch, heads, k_len, head_dim) and weights u (batch, heads, q_len, k_len):
    proportional  out_i = sum_j u_ij v_j                                  (A2 holds)
    joint         out_i = sum_j u_ij (v_j + g([v_j, u_ij]))               (A2 relaxed) **(our choice)**
                  g is a two-layer MLP on the value concatenated with its weight. phi(v, 0) = 0, so keys of zero
                  weight (masked keys) still contribute nothing, but phi is not homogeneous in u unless g = 0.
                  Materializes (batch, heads, q_len, k_len, hidden) in the reference engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from axiomformer.axes.registry import Choice, Registry

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec


class ProportionalContribution(nn.Module):
    """out = u @ v: (batch, heads, q_len, k_len) x (batch, heads, k_len, head_dim) -> (batch, heads, q_len, head_dim)."""

    def forward(self, weights: Tensor, v: Tensor) -> Tensor:
        return torch.matmul(weights.to(v.dtype), v)


class JointContribution(nn.Module):
    """out_i = sum_j u_ij (v_j + g([v_j, u_ij])), g: Linear(head_dim + 1, hidden) -> GELU -> Linear(hidden, head_dim)."""

    def __init__(self, head_dim: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or max(8, head_dim)
        # g([v, u]) = W_2 GELU(W_v v + w_u u + b_1) + b_2: the v part is computed once per key, not per (i, j) pair.
        self.w_v = nn.Linear(head_dim, hidden)
        self.w_u = nn.Parameter(torch.randn(hidden) / hidden**0.5)
        self.out = nn.Linear(hidden, head_dim)

    def pair_contribution(self, weights: Tensor, v: Tensor) -> Tensor:
        """phi(v_j, u_ij) for every pair: (batch, heads, q_len, k_len, head_dim)."""
        u = weights.to(v.dtype).unsqueeze(-1)  # (B, H, L, S, 1)
        hidden = torch.nn.functional.gelu(self.w_v(v).unsqueeze(-3) + u * self.w_u)
        return u * (v.unsqueeze(-3) + self.out(hidden))

    def forward(self, weights: Tensor, v: Tensor) -> Tensor:
        # sum_j u_ij (v_j + W_2 h_ij + b_2) = u @ v + W_2 (sum_j u_ij h_ij) + b_2 sum_j u_ij: the output layer is
        # linear, so it is applied once per query after the sum instead of to every (i, j) pair (the same function
        # as ``pair_contribution(...).sum(-2)``, about half the work at the study's size).
        u = weights.to(v.dtype)
        hidden = torch.nn.functional.gelu(self.w_v(v).unsqueeze(-3) + u.unsqueeze(-1) * self.w_u)
        pooled = torch.einsum("...ij,...ijh->...ih", u, hidden)
        mixed = torch.nn.functional.linear(pooled, self.out.weight)
        return torch.matmul(u, v) + mixed + u.sum(dim=-1, keepdim=True) * self.out.bias


CONTRIBUTIONS = Registry(
    "contribution",
    [
        Choice(
            "proportional",
            "out_i = sum_j u_ij v_j",
            "Somani, A2 (phi(v, u) = u v)",
            lambda spec: ProportionalContribution(),
            frozenset({"proportional"}),
        ),
        Choice(
            "joint",
            "out_i = sum_j u_ij (v_j + g([v_j, u_ij]))",
            "our choice (see the module docstring)",
            lambda spec: JointContribution(spec.head_dim),
            frozenset({"pairwise"}),
            {"pair_width": lambda module: max(module.w_v.out_features, module.out.out_features)},
            relaxes="A2: a token's contribution is not proportional to its weight",
        ),
    ],
    {
        "proportional": "out = weights @ v (linear in the weights: engines may fuse it)",
        "pairwise": "builds a (q_len, k_len, hidden) tensor; extra['pair_width'](module) is hidden",
    },
)
"""Every contribution (A2)."""


def build_contribution(spec: AttentionSpec) -> nn.Module:
    """The contribution module for ``spec.contribution``."""
    return CONTRIBUTIONS[spec.contribution].implementation()(spec)
