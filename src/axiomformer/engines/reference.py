"""The reference engine: the full (q_len x k_len) score matrix in plain tensor ops.

It runs every spec and is the ground truth every other engine is tested against, forward and backward.
Formula: y_i = sum_j phi(v_j, u_ij), u_ij = normalize_j(scale * score(q_i, k_j) + bias_ij), masked j dropped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from axiomformer.axes.normalizer import feature_map, normalize
from axiomformer.engines.problem import AttentionProblem, clean_nonfinite, poison_rows


def attention_weights(module, problem: AttentionProblem, k: Tensor | None = None) -> Tensor:
    """Attention weights (batch, heads, q_len, k_len), float32, before dropout.

    ``module`` is an :class:`axiomformer.Attention` (its score, scale and normalizer are used).
    """
    spec = module.spec
    k = problem.k if k is None else k
    mask = problem.full_mask()
    bias = problem.full_bias()
    if spec.normalizer == "linear":
        # Katharopoulos et al. 2020, eq. 6: the kernel phi(q).phi(k) takes the place of exp(scaled score); a float
        # bias b multiplies it by exp(b), as it would multiply exp(s) inside a softmax.
        scores = torch.matmul(feature_map(problem.q.float(), spec.feature_map),
                              feature_map(k.float(), spec.feature_map).transpose(-2, -1))
        if bias is not None:
            scores = scores * bias.float().exp()
    else:
        scores = module.score_fn(problem.q, k) * module.scale()
        if bias is not None:
            scores = scores + bias
    return normalize(scores, mask, spec.normalizer, training=problem.training)


def run(module, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """Attention output (batch, heads, q_len, head_dim_v) and, if asked, the weights before dropout."""
    k, v = clean_nonfinite(problem)
    weights = attention_weights(module, problem, k)
    dropped = F.dropout(weights, p=problem.dropout_p) if problem.training and problem.dropout_p > 0 else weights
    out = module.contribution(dropped.to(v.dtype), v)
    out = poison_rows(out, problem)
    return out, (weights if need_weights else None)


class ReferenceEngine:
    """Runs every spec by materializing the scores; the ground truth."""

    name = "reference"

    def accepts(self, module, problem: AttentionProblem) -> bool:
        return True

    def run(self, module, problem: AttentionProblem, need_weights: bool = False):
        return run(module, problem, need_weights)
