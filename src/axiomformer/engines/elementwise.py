"""A hand-written backward for the elementwise normalizers (sigmoid, relu) of the chunked engine.

For ``normalizer in ("sigmoid", "relu")`` with dot scores, proportional contributions and no mask other than the
causal one, the weights of query i depend only on its own scores and n_i (its number of visible keys):

    sigmoid:  u_ij = sigmoid(s_ij - log n_i)            du/ds = u (1 - u)
    relu:     u_ij = relu(s_ij) / n_i                    du/ds = [s_ij > 0] / n_i
    y_i = sum_j u_ij v_j,  s_ij = q_i . k_j  (q already scaled)

so the backward needs no stored score block: it recomputes u for one chunk of queries at a time, in place, and applies
the closed-form derivative (flash-attention's recomputation strategy, Dao et al. 2022, sec. 3.1, without the fused
kernel). This takes 3 elementwise passes over a score block forward and about 5 backward, against the dozen of
autograd through ``normalize`` under ``torch.utils.checkpoint`` **(our choice)**. It is tested against the reference
engine forward and backward like every engine.
"""

from __future__ import annotations

import torch
from torch import Tensor

from axiomformer.engines.problem import AttentionProblem, causal_mask

KINDS = ("sigmoid", "relu")


def applies(module, problem: AttentionProblem) -> bool:
    """Whether the closed-form path computes this problem exactly (else the generic chunked path runs)."""
    spec = module.spec
    return (spec.normalizer in KINDS and spec.score == "dot" and spec.contribution == "proportional"
            and problem.mask is None and problem.bias is None and problem.alibi_slopes is None
            and not (problem.training and problem.dropout_p > 0)
            and problem.q.dtype in (torch.float32, torch.float64))


def _counts(rows: int, start: int, offset: int, causal: bool, k_len: int, like: Tensor) -> Tensor:
    """n_i, the keys visible to each query of the chunk, (rows, 1); 1 for a row with none (its weights are 0)."""
    if causal:
        n = (torch.arange(rows, device=like.device, dtype=like.dtype) + (offset + start + 1)).clamp(1, k_len)
    else:
        n = torch.full((rows,), float(k_len), device=like.device, dtype=like.dtype)
    return n.view(-1, 1)


def _chunk_weights(q_c: Tensor, k_c: Tensor, kind: str, start: int, offset: int, causal: bool, k_len: int) -> Tensor:
    """u for queries start.. (absolute rows start + offset ..) against keys k_c, computed in place."""
    rows = q_c.shape[-2]
    w = torch.matmul(q_c, k_c.transpose(-2, -1))
    n = _counts(rows, start, offset, causal, k_len, w)
    if kind == "sigmoid":
        w.sub_(n.log()).sigmoid_()
    else:
        w.relu_().div_(n)
    if causal:
        w.masked_fill_(~causal_mask(rows, k_c.shape[-2], offset + start, q_c.device), 0.0)
    return w


def _k_end(start: int, stop: int, offset: int, causal: bool, k_len: int) -> int:
    return min(k_len, max(1, offset + stop)) if causal else k_len


class ElementwiseAttention(torch.autograd.Function):
    """y = u(q k^T) v for an elementwise normalizer, chunked over queries, with a recomputing closed-form backward."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, kind: str, causal: bool, offset: int, chunk: int) -> Tensor:
        k_len = k.shape[-2]
        out = q.new_zeros(q.shape[:-1] + (v.shape[-1],))
        for start in range(0, q.shape[-2], chunk):
            stop = min(start + chunk, q.shape[-2])
            end = _k_end(start, stop, offset, causal, k_len)
            w = _chunk_weights(q[..., start:stop, :], k[..., :end, :], kind, start, offset, causal, k_len)
            out[..., start:stop, :] = torch.matmul(w, v[..., :end, :])
        ctx.save_for_backward(q, k, v)
        ctx.kind, ctx.causal, ctx.offset, ctx.chunk = kind, causal, offset, chunk
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v = ctx.saved_tensors
        kind, causal, offset, chunk = ctx.kind, ctx.causal, ctx.offset, ctx.chunk
        k_len = k.shape[-2]
        grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for start in range(0, q.shape[-2], chunk):
            stop = min(start + chunk, q.shape[-2])
            end = _k_end(start, stop, offset, causal, k_len)
            q_c, k_c, v_c, g = q[..., start:stop, :], k[..., :end, :], v[..., :end, :], grad_out[..., start:stop, :]
            w = _chunk_weights(q_c, k_c, kind, start, offset, causal, k_len)
            grad_v[..., :end, :] += torch.matmul(w.transpose(-2, -1), g)
            grad_s = torch.matmul(g, v_c.transpose(-2, -1))                       # dL/du
            if kind == "sigmoid":
                grad_s.mul_(w)
                grad_s = torch.addcmul(grad_s, grad_s, w, value=-1.0)             # dL/du * u (1 - u)
            else:
                # relu: u = relu(s) / n, so du/ds = [u > 0] / n (0 at masked keys, where u = 0).
                grad_s.mul_(w > 0).div_(_counts(stop - start, start, offset, causal, k_len, w))
            grad_q[..., start:stop, :] = torch.matmul(grad_s, k_c)
            grad_k[..., :end, :] += torch.matmul(grad_s.transpose(-2, -1), q_c)
        return grad_q, grad_k, grad_v, None, None, None, None


def elementwise_attention(module, problem: AttentionProblem, k: Tensor, v: Tensor, chunk: int) -> Tensor:
    """Output (batch, heads, q_len, head_dim_v) of a problem for which :func:`applies` holds."""
    scale = module.scale()
    q = problem.q * (scale.to(problem.q.dtype) if isinstance(scale, Tensor) else scale)
    return ElementwiseAttention.apply(q, k, v, module.spec.normalizer, problem.causal, problem.q_offset, chunk)
