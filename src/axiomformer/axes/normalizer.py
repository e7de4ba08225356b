"""Axis A5 — the normalizer turning scaled scores into attention weights, and its temperature.

Source: Somani, assumption A5 (relevance is relative and differentiable): u_ij = softmax_j(s_ij / sqrt(d_k)); the
1/sqrt(d_k) keeps the logits O(1) because Var(q.k) = d_k for unit-variance entries.

Every normalizer maps scores (batch, heads, q_len, k_len) and an optional boolean mask (True = may attend,
broadcastable to the scores) to weights of the same shape, computed in float32. Masked keys get weight 0; a query row
with no visible key gets all-zero weights with finite gradients.

Choices (n_i is the number of keys visible to query i, so appending masked keys changes nothing):
    softmax         u = exp(s) / sum_j exp(s)                         (A5 holds with scale inv_sqrt_d)
    sigmoid         u = sigmoid(s - log n_i)                          (Ramapuram et al. 2024, sigmoid attention with
                                                                       their b = -log n bias)
    relu            u = relu(s) / n_i                                 (Wortsman et al. 2023, ReLU attention)
    sparsemax       u = sparsemax(s)                                  (Martins & Astudillo 2016, via the entmax package)
    entmax15        u = 1.5-entmax(s)                                 (Peters et al. 2019, via the entmax package)
    gumbel_softmax  u = softmax(s + g), g ~ Gumbel(0, 1) in training; plain softmax in eval (Jang et al. 2017)
    linear          u = K_ij / sum_j K_ij with kernel K_ij = phi(q_i).phi(k_j) taking the place of the scores
                    (Katharopoulos et al. 2020, eq. 6-7); phi(x) = elu(x) + 1 by default
Scale choices (A5's temperature): inv_sqrt_d (1/sqrt(head_dim)), none (1), learned (per head, init 1/sqrt(head_dim)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from entmax import entmax15, sparsemax
from torch import Tensor, nn

from axiomformer.spec import AttentionSpec

LINEAR_EPS = 1e-6
"""Added to the row sum of the linear-attention kernel (Katharopoulos et al. 2020 use the same 1e-6)."""


def feature_map(x: Tensor, kind: str = "elu") -> Tensor:
    """Kernel feature map of linear attention: ``elu(x) + 1`` (default), ``relu(x)`` or ``x`` (identity)."""
    if kind == "elu":
        return F.elu(x) + 1
    if kind == "relu":
        return F.relu(x)
    if kind == "identity":
        return x
    raise ValueError(f"unknown feature_map {kind!r}; choose one of: elu, relu, identity")


class Scale(nn.Module):
    """The temperature multiplying the scores: a float, or a (1, heads, 1, 1) tensor when learned."""

    def __init__(self, spec: AttentionSpec):
        super().__init__()
        self.kind = spec.scale
        self.head_dim = spec.head_dim
        if self.kind == "learned":
            self.log_scale = nn.Parameter(torch.full((spec.num_heads,), -0.5 * math.log(spec.head_dim)))

    def forward(self) -> float | Tensor:
        if self.kind == "inv_sqrt_d":
            return 1.0 / math.sqrt(self.head_dim)
        if self.kind == "none":
            return 1.0
        return self.log_scale.exp().view(1, -1, 1, 1)


def _row_normalize(scores: Tensor, kind: str, training: bool) -> Tensor:
    """Apply the normalizer along the last dimension of scores whose masked entries are already -inf."""
    if kind == "softmax" or (kind == "gumbel_softmax" and not training):
        return torch.softmax(scores, dim=-1)
    if kind == "gumbel_softmax":
        return F.gumbel_softmax(scores, tau=1.0, hard=False, dim=-1)
    if kind == "sparsemax":
        return sparsemax(scores, dim=-1)
    if kind == "entmax15":
        return entmax15(scores, dim=-1)
    raise ValueError(kind)


def normalize(
    scores: Tensor, mask: Tensor | None, kind: str, *, training: bool = False, n_visible: Tensor | None = None
) -> Tensor:
    """Attention weights from scores.

    Args:
        scores: (batch, heads, q_len, k_len) float scores, already scaled and biased. For ``kind="linear"`` these
            are the non-negative kernel values phi(q).phi(k).
        mask: bool, True = may attend, broadcastable to ``scores``; ``None`` means every key is visible.
        kind: one of the normalizer choices of :data:`axiomformer.spec.AXES`.
        training: enables the Gumbel noise of ``gumbel_softmax``.
        n_visible: float (..., q_len, 1), the n_i of ``sigmoid`` and ``relu`` (keys visible to each query, the
            key length for a row with none); computed from ``mask`` when None. Engines that score one block of
            keys at a time pass the count over the whole row.

    Returns:
        float32 weights shaped like ``scores``; masked entries and rows without a visible key are exactly 0.
    """
    s = scores.float()
    if mask is not None:
        mask = torch.broadcast_to(mask, s.shape)
        has_key = mask.any(dim=-1, keepdim=True)
        # A row with no visible key is normalized as if every key were visible with score 0, then zeroed by the mask:
        # the weights are 0 and every gradient stays finite.
        s = s.masked_fill(~has_key, 0.0)
        visible = mask | ~has_key
    if n_visible is None:
        n_visible = (torch.full_like(s[..., :1], float(s.shape[-1])) if mask is None
                     else visible.sum(dim=-1, keepdim=True).float())
    if kind in ("softmax", "gumbel_softmax", "sparsemax", "entmax15"):
        if mask is not None:
            s = s.masked_fill(~visible, float("-inf"))
        if kind in ("sparsemax", "entmax15"):
            # The entmax sort-based threshold fails on NaN; such rows are computed on zeros and reported as NaN.
            nan_rows = torch.isnan(s).any(dim=-1, keepdim=True)
            weights = _row_normalize(s.masked_fill(nan_rows, 0.0), kind, training).masked_fill(nan_rows, float("nan"))
        else:
            weights = _row_normalize(s, kind, training)
    elif kind == "sigmoid":
        weights = torch.sigmoid(s - n_visible.log())
    elif kind == "relu":
        weights = F.relu(s) / n_visible
    elif kind == "linear":
        kernel = s if mask is None else s.masked_fill(~mask, 0.0)
        return kernel / (kernel.sum(dim=-1, keepdim=True) + LINEAR_EPS)
    else:
        raise ValueError(f"unknown normalizer {kind!r}")
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights


class Normalizer(nn.Module):
    """Module form of :func:`normalize` for ``spec.normalizer`` (Gumbel noise follows ``self.training``)."""

    def __init__(self, spec: AttentionSpec):
        super().__init__()
        self.kind = spec.normalizer
        self.feature_map = spec.feature_map

    def forward(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        return normalize(scores, mask, self.kind, training=self.training)
