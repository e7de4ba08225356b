"""A bank of attention functions for the audit, each (q, k, v) -> out on (batch, seq, dim) tensors, one head.

Every function but ``loop_over_queries`` is deliberately wrong in one way; ``tests/test_audit.py`` pins the verdict
each must get, and they are reachable as ``module:audit_bank:<name>`` targets when ``tests/`` is on the path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _softmax_weights(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return torch.softmax(scale * q @ k.transpose(-2, -1), dim=-1)


def loop_over_queries(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Scaled dot-product attention computed one query at a time (the same map as SDPA; bottom-right causal
    alignment): it must pass every check."""
    rows = []
    offset = k.shape[1] - q.shape[1]
    for i in range(q.shape[1]):
        end = i + offset + 1 if causal else k.shape[1]
        kk, vv = k[:, :end], v[:, :end]
        rows.append(
            torch.nn.functional.scaled_dot_product_attention(q[:, None, i : i + 1], kk[:, None], vv[:, None])[:, 0]
        )
    return torch.cat(rows, dim=1)


def u_squared(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """out_i = sum_j u_ij^2 v_j with u = softmax(q.k / sqrt(d)): the contribution is not proportional to u (A2)."""
    return _softmax_weights(q, k) ** 2 @ v


def key_order_weights(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Weights that depend on the keys' order: a bias of 0.5 j on key j's score (breaks A0)."""
    bias = 0.5 * torch.arange(k.shape[1], dtype=q.dtype)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias, dim=-1) @ v


def tanh_values(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """A per-key nonlinearity of the values, sum_j u_ij tanh(v_j) (breaks A3)."""
    return _softmax_weights(q, k) @ torch.tanh(v)


def unscaled_softmax(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q.k) without 1/sqrt(d) (breaks the A5 scale argument)."""
    return _softmax_weights(q, k, scale=1.0) @ v


def query_mixing(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Each query first averaged with the others: a row's output depends on the other queries (not parallel)."""
    mixed = 0.5 * (q + q.mean(dim=1, keepdim=True))
    return torch.nn.functional.scaled_dot_product_attention(mixed[:, None], k[:, None], v[:, None])[:, 0]
