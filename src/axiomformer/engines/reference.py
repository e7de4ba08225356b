"""The reference engine: the full (q_len x k_len) score matrix in plain tensor ops.

It runs every spec, is the ground truth every other engine is tested against (forward and backward), returns the
weights that produced its output, and is differentiable to every order.
Formula: y_i = sum_j phi(v_j, u_ij), u_ij = normalize_j(scale * score(q_i, k_j) + bias_ij), masked j dropped.
Scores, scale and bias are added in float32 (a float16 score plus a float16 bias may overflow).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from axiomformer.axes.normalizer import normalize
from axiomformer.engines.base import EngineBase
from axiomformer.engines.plan import Plan
from axiomformer.engines.problem import AttentionProblem


def scaled_scores(parts: Plan, q: Tensor, k: Tensor, scale, bias: Tensor | None) -> Tensor:
    """float32 ``softcap(scale * score(q, k)) + bias`` (or, for the linear normalizer, the kernel phi(q).phi(k)
    exp(bias)); for a ``halves`` normalizer the two halves' scores stacked, (2, batch, heads, q_len, k_len).
    ``scale`` is a float or broadcastable to (batch, heads, q_len, 1)."""
    if "kernel" in parts.normalizer_traits:
        # Katharopoulos et al. 2020, eq. 6: the kernel phi(q).phi(k) takes the place of exp(scaled score); a float
        # bias b multiplies it by exp(b), as it would multiply exp(s) inside a softmax.
        scores = torch.matmul(parts.feature_map(q.float()), parts.feature_map(k.float()).transpose(-2, -1))
        return scores if bias is None else scores * bias.float().exp()
    scale = scale.float() if isinstance(scale, Tensor) else scale
    if "halves" in parts.normalizer_traits:
        # Differential attention: the two halves of each head scored apart, stacked (2, batch, heads, q_len, k_len).
        h = q.shape[-1] // 2
        scores = torch.stack([parts.score_fn(q[..., :h], k[..., :h]), parts.score_fn(q[..., h:], k[..., h:])])
        scores = scores.float() * scale
    else:
        scores = parts.score_fn(q, k).float() * scale
    cap = parts.spec.softcap
    if cap:
        scores = cap * torch.tanh(scores / cap)      # Gemma 2's soft-capping, before any bias
    return scores if bias is None else scores + bias.float()


def attention_weights(parts: Plan, problem: AttentionProblem, k: Tensor | None = None) -> Tensor:
    """Attention weights (batch, heads, q_len, k_len), float32, before dropout."""
    k = problem.k if k is None else k
    scores = scaled_scores(parts, problem.q, k, problem.scale, problem.full_bias())
    return normalize(scores, problem.full_mask(), parts.normalizer_choice, training=problem.training,
                     params=parts.normalizer_params())


class ReferenceEngine(EngineBase):
    """Runs every spec by materializing the scores; the ground truth."""

    name = "reference"
    returns_weights = True
    double_backward = True

    def __call__(self, parts: Plan, problem: AttentionProblem, need_weights: bool = False):
        weights = attention_weights(parts, problem)
        dropped = F.dropout(weights, p=problem.dropout_p) if problem.training and problem.dropout_p > 0 else weights
        out = parts.contribution(dropped.to(problem.v.dtype), problem.v)
        return out, (weights if need_weights else None)
