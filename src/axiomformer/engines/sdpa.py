"""The sdpa engine: specs that reduce exactly to ``torch.nn.functional.scaled_dot_product_attention``.

Accepts softmax (and Gumbel-softmax in eval, which is a softmax) with proportional contributions, any value map and
aggregator (they act outside the attention core), RoPE (applied to q and k before), any scale (a learned per-head
scale is folded into q), and every score that is a dot product of transformed queries and keys:

    bilinear  q^T W_h k            = (q W_h) . k
    cosine    tau_h cos(q, k)      = (tau_h q / |q|) . (k / |k|)                  (QK-norm with learned temperature)
    neg_l2    -|q - k|^2           = [2q, 1] . [k, -|k|^2]  - |q|^2               (augmented q and k; the -|q|^2 is
                                                                                  constant in j and cancels in softmax)
ALiBi with a causal mask is a dot product too: -m_h (p_i - p_j) = m_h p_j - m_h p_i, whose query term is constant in
j, so q and k gain one column [1] and [m_h (p_j - c)] (c, the middle key position, keeps the column small). Extra
columns are zero-padded to a multiple of 8 (CPU kernels are much slower on odd head dims) **(our choice)**. In
float32 this column adds a rounding error of about 2^-24 m_h |p_j - c| to each logit, so it is used only while
that stays below 2^-14 (for float64 always); other ALiBi problems, and any float ``attn_mask``, go to SDPA as a
float mask when it is small, and to the flex or chunked engine when it is not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from axiomformer.engines.chunked import DEFAULT_BUDGET
from axiomformer.engines.problem import AttentionProblem, clean_nonfinite, poison_rows
from axiomformer.engines.reference import attention_weights

REDUCIBLE_SCORES = ("dot", "bilinear", "cosine", "neg_l2")
"""Scores with softmax(score) = softmax(q' . k') for transformed q', k' (up to a per-row constant)."""

ALIBI_F32_MAX_SPAN = 2.0**10
"""Largest m_h |p_j - c| folded into a float32 key column (rounding error <= 2^-24 * 2^10 = 2^-14 per logit)."""


def softmax_like(spec, training: bool) -> bool:
    """The normalizer is a plain softmax (Gumbel-softmax is one outside training)."""
    return spec.normalizer == "softmax" or (spec.normalizer == "gumbel_softmax" and not training)


def dot_form(module, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float | Tensor, list[tuple]]:
    """Queries, keys, scale and extra (query column, key column) pairs of a dot-product form of the scores.

    softmax_j(scale * score(q_i, k_j)) = softmax_j(scale * q'_i . k'_j + sum_c qcol_c[i] kcol_c[j]) for every
    score in :data:`REDUCIBLE_SCORES` (see the module docstring). Columns are (..., seq, 1) tensors.
    """
    spec, score = module.spec, module.score_fn
    scale = module.scale()
    extras: list[tuple] = []
    if spec.score == "bilinear":
        q = torch.matmul(q, score.weight.to(q.dtype))
    elif spec.score == "cosine":
        q = score.normalize(q) * score.temperature().to(q.dtype)
        k = score.normalize(k)
    elif spec.score == "neg_l2":
        # Extra columns add to the final logits, so the query column carries the scale.
        extras.append((torch.ones_like(q[..., :1]) * scale, -k.pow(2).sum(-1, keepdim=True)))
        q = 2 * q
    return q, k, scale, extras


def alibi_column_ok(problem: AttentionProblem) -> bool:
    """Causal ALiBi folds into one key column without losing float32 precision (see the module docstring)."""
    if problem.alibi_slopes is None or not problem.causal:
        return False
    if problem.q.dtype == torch.float64:
        return True
    center = (problem.k_len - 1) // 2
    span = float(problem.alibi_slopes.abs().max()) * max(center, problem.k_len - 1 - center)
    return problem.q.dtype == torch.float32 and span <= ALIBI_F32_MAX_SPAN


def _augment(q: Tensor, k: Tensor, v: Tensor, scale, extras) -> tuple[Tensor, Tensor, Tensor, float]:
    """Fold the scale and extra columns into q and k, zero-padded with v to a common multiple of 8."""
    q = q * (scale.to(q.dtype) if isinstance(scale, Tensor) else scale)
    batch, heads = q.shape[0], q.shape[1]
    qcols = [torch.broadcast_to(c.to(q.dtype), (batch, heads, q.shape[-2], 1)) for c, _ in extras]
    kcols = [torch.broadcast_to(c.to(k.dtype), (batch, heads, k.shape[-2], 1)) for _, c in extras]
    width = max(q.shape[-1] + len(extras), v.shape[-1])
    width += (-width) % 8
    q = F.pad(torch.cat([q, *qcols], dim=-1), (0, width - q.shape[-1] - len(extras)))
    k = F.pad(torch.cat([k, *kcols], dim=-1), (0, width - k.shape[-1] - len(extras)))
    v = F.pad(v, (0, width - v.shape[-1]))
    return q, k, v, 1.0


class _FlushDenormals(torch.autograd.Function):
    """Identity whose backward sets the CPU flush-denormal flag to ``mode`` (brackets SDPA's backward, see below)."""

    @staticmethod
    def forward(ctx, x: Tensor, mode: bool) -> Tensor:
        ctx.mode = mode
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        torch.set_flush_denormal(ctx.mode)
        return grad, None


def _sdpa_flushing_denormals(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """SDPA with denormal floats flushed to zero, forward and backward, on CPU.

    ALiBi makes the logits of far keys very negative (-m_h * distance), so exp() in the CPU kernels yields denormal
    numbers, which made SDPA's backward 3x slower in our measurements (torch 2.13). Their weights are below 1e-38 of
    the largest, so flushing them changes nothing at float32 precision **(our choice)**. Assumes the flag is off
    outside (PyTorch's default).
    """
    q = _FlushDenormals.apply(q, False)                  # its backward runs after SDPA's: flag off again
    torch.set_flush_denormal(True)
    try:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    finally:
        torch.set_flush_denormal(False)
    return _FlushDenormals.apply(out, True)              # its backward runs before SDPA's: flag on


class SDPAEngine:
    """PyTorch's fused scaled dot-product attention for the standard point and the scores that reduce to it."""

    name = "sdpa"

    def accepts(self, module, problem: AttentionProblem) -> bool:
        spec = module.spec
        if not (spec.score in REDUCIBLE_SCORES and spec.contribution == "proportional"
                and softmax_like(spec, problem.training)):
            return False
        if problem.alibi_slopes is not None and not alibi_column_ok(problem):
            # Non-causal ALiBi only as a materialized float mask, and only while it is small.
            heads, rows = problem.alibi_slopes.numel(), problem.q_len * problem.k_len
            return heads * rows <= DEFAULT_BUDGET
        return True

    def run(self, module, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        k, v = clean_nonfinite(problem)
        q, k_dot, scale, extras = dot_form(module, problem.q, k)
        bias = problem.bias
        if problem.alibi_slopes is not None:
            if alibi_column_ok(problem):
                center = (problem.k_len - 1) // 2
                slopes = problem.alibi_slopes.to(q.dtype).view(1, -1, 1, 1)
                positions = (problem.k_positions - center).to(q.dtype).view(1, 1, -1, 1)
                extras.append((torch.ones_like(q[..., :1]), slopes * positions))
            else:
                bias = problem.full_bias()
        head_dim_v = v.shape[-1]
        v_in = v
        if extras:
            q, k_dot, v_in, scale = _augment(q, k_dot, v, scale, extras)
        elif isinstance(scale, Tensor):
            q, scale = q * scale.to(q.dtype), 1.0
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
        attend = F.scaled_dot_product_attention
        if problem.alibi_slopes is not None and q.device.type == "cpu":
            attend = _sdpa_flushing_denormals
        out = attend(
            q, k_dot, v_in,
            attn_mask=attn_mask,
            dropout_p=problem.dropout_p if problem.training else 0.0,
            is_causal=use_is_causal,
            scale=float(scale),
        )
        if out.shape[-1] != head_dim_v:
            out = out[..., :head_dim_v]
        if empty_rows is not None:
            out = out.masked_fill(torch.broadcast_to(empty_rows, out.shape[:-1] + (1,)), 0.0)
        out = poison_rows(out, problem)
        return out, (attention_weights(module, problem, k) if need_weights else None)
