"""The sdpa engine: specs that reduce exactly to ``torch.nn.functional.scaled_dot_product_attention``.

Accepts dot scores with the softmax normalizer (and Gumbel-softmax in eval, which is a softmax), proportional
contributions, any scale (a learned per-head scale is folded into q), any value map and aggregator (they act outside
the attention core), RoPE (applied to q and k before), and ALiBi or a float ``attn_mask`` (passed as a float mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from axiomformer.engines.problem import AttentionProblem
from axiomformer.engines.reference import attention_weights


def _softmax_like(spec, training: bool) -> bool:
    return spec.normalizer == "softmax" or (spec.normalizer == "gumbel_softmax" and not training)


class SDPAEngine:
    """PyTorch's fused scaled dot-product attention for the standard point of the design space."""

    name = "sdpa"

    def accepts(self, module, problem: AttentionProblem) -> bool:
        spec = module.spec
        return (
            spec.score == "dot"
            and spec.contribution == "proportional"
            and _softmax_like(spec, problem.training)
            and problem.nonfinite_keys is None
        )

    def run(self, module, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        q, k, v = problem.q, problem.k, problem.v
        scale = module.scale()
        if isinstance(scale, Tensor):
            q, scale = q * scale.to(q.dtype), 1.0
        bias = problem.full_bias()
        # SDPA's is_causal is aligned top-left; ours is bottom-right, which coincides only when q_len == k_len.
        use_is_causal = problem.causal and problem.mask is None and bias is None and problem.q_len == problem.k_len
        mask = None if use_is_causal else problem.full_mask()
        empty_rows = None
        if mask is not None:
            has_key = mask.any(-1, keepdim=True)
            if not bool(has_key.all()):
                # SDPA returns NaN for a row with no visible key; let such rows see every key, then zero them.
                empty_rows = ~has_key
                mask = mask | empty_rows
        attn_mask = mask
        if bias is not None:
            attn_mask = bias.to(q.dtype) if mask is None else bias.to(q.dtype).masked_fill(~mask, float("-inf"))
        out = F.scaled_dot_product_attention(
            q, k, v,
            attn_mask=attn_mask,
            dropout_p=problem.dropout_p if problem.training else 0.0,
            is_causal=use_is_causal,
            scale=float(scale),
        )
        if empty_rows is not None:
            out = out.masked_fill(torch.broadcast_to(empty_rows, out.shape[:-1] + (1,)), 0.0)
        weights = attention_weights(module, problem) if need_weights else None
        return out, weights
