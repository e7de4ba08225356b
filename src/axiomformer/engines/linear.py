"""The linear engine: O(L) kernelized attention for ``normalizer="linear"`` (Katharopoulos et al. 2020).

With phi the feature map (``spec.feature_map``; elu(x) + 1 by default, their eq. 7) and keys masked by zeroing
phi(k_j), the reference's weights u_ij = K_ij / (sum_j K_ij + eps), K_ij = phi(s q_i).phi(k_j) (s the scale, which
enters through the query: ``reference.scaled_query``), give (their eq. 6, with q_i for s q_i)

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps),     eps = 1e-6,

so the keys are summed once into a (head_dim x head_dim_v) state instead of a (q_len x k_len) matrix.

Causal (bottom-right aligned, query i sees keys j <= q_offset + i): the keys before ``q_offset`` (a KV cache's past)
are summed into the initial state; the other ``q_len`` keys are cut into chunks of ``chunk`` positions. Each chunk
reads the prefix sum of the states of the chunks before it (their eq. 9-10, in chunks instead of one step at a time)
plus a masked (chunk x chunk) kernel within itself **(our choice: the chunked prefix-sum form, which keeps the
backward O(L) without a custom autograd function)**. The prefix sums are exclusive by shifting an inclusive
``cumsum`` one chunk, never by subtracting the current chunk's state from it: a subtraction would cancel a large
future state against itself in floating point and leak it into earlier outputs.

Accepted: the linear normalizer with proportional contributions, no float bias or ALiBi (they multiply the kernel
entrywise and break the factorization), and masks that depend on the key only (key padding). Other masks route to
the chunked engine. Computed in max(input dtype, float32) (as the reference's kernel), returned in the value dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from axiomformer.axes.normalizer import LINEAR_EPS
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.plan import Plan, ProblemKind
from axiomformer.engines.problem import AttentionProblem
from axiomformer.engines.reference import scaled_query
from axiomformer.precision import compute_dtype


class _Divide(torch.autograd.Function):
    """out = num / den for den (..., 1), keeping out (the result) instead of num for the backward:
    dL/dden = -sum(g * out) / den. The (L x head_dim_v) numerator is freed after the forward."""

    @staticmethod
    def forward(ctx: Any, num: Tensor, den: Tensor) -> Tensor:
        out = num / den
        ctx.save_for_backward(out, den)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        out, den = ctx.saved_tensors
        return grad / den, -(grad * out).sum(-1, keepdim=True) / den


def exclusive_cumsum(x: Tensor, start: Tensor) -> Tensor:
    """Along dim 2: out[:, :, i] = start + sum_{c < i} x[:, :, c], without subtraction (each prefix is a sum of
    earlier terms only, so a later term cannot change it)."""
    start = torch.broadcast_to(start.unsqueeze(2), x.shape[:2] + (1,) + x.shape[3:])
    return torch.cumsum(torch.cat([start, x[:, :, :-1]], dim=2), dim=2)


def _causal_linear(phi_q: Tensor, phi_k: Tensor, v: Tensor, q_offset: int, chunk: int) -> tuple[Tensor, Tensor]:
    """Numerators (B, H, L, dv) and denominators (B, H, L, 1) of causal linear attention, ``chunk`` queries at a time.

    phi_k and v hold k_len = q_offset + L keys; the first ``q_offset`` are visible to every query.
    """
    batch, heads, length, _dim = phi_q.shape
    past_k, phi_k = phi_k[..., :q_offset, :], phi_k[..., q_offset:, :]
    past_v, v = v[..., :q_offset, :], v[..., q_offset:, :]
    pad = (-length) % chunk
    if pad:
        phi_q, phi_k, v = (F.pad(t, (0, 0, 0, pad)) for t in (phi_q, phi_k, v))
    n = (length + pad) // chunk
    cq, ck, cv = (t.reshape(batch, heads, n, chunk, t.shape[-1]) for t in (phi_q, phi_k, v))
    # State of each chunk (B, H, n, d, dv) and its key sum (B, H, n, d); exclusive prefix sums over the chunks.
    state = torch.matmul(ck.transpose(-2, -1), cv)
    ksum = ck.sum(-2)
    state = exclusive_cumsum(state, torch.matmul(past_k.transpose(-2, -1), past_v))
    ksum = exclusive_cumsum(ksum, past_k.sum(-2))
    # In place where autograd allows it (a matmul's backward reads its inputs, not its output): one (L x chunk)
    # block and one (L x dv) block fewer at the peak.
    within = torch.matmul(cq, ck.transpose(-2, -1)).tril_()  # (B, H, n, chunk, chunk)
    num = torch.matmul(within, cv).add_(torch.matmul(cq, state))
    den = torch.matmul(cq, ksum.unsqueeze(-1)).add_(within.sum(-1, keepdim=True))
    num = num.reshape(batch, heads, n * chunk, -1)[..., :length, :]
    den = den.reshape(batch, heads, n * chunk, 1)[..., :length, :]
    return num, den


def linear_attention(
    problem: AttentionProblem, k: Tensor, v: Tensor, phi: Callable[[Tensor], Tensor], chunk: int = 64
) -> Tensor:
    """Linear attention output (batch, heads, q_len, head_dim_v) in ``v.dtype``.

    Args:
        problem: its mask must depend on the key only; bias and ALiBi must be None.
        k, v: keys and values (non-finite keys already zeroed).
        phi: the feature map (``Plan.feature_map``: elu(x) + 1, relu, identity, taylor).
        chunk: queries per chunk of the causal prefix sum.
    """
    dtype = compute_dtype(problem.q.dtype, k.dtype, v.dtype)
    scale = problem.scale.to(dtype) if isinstance(problem.scale, Tensor) else problem.scale
    phi_q = phi(scaled_query(problem.q.to(dtype), scale))
    phi_k = phi(k.to(dtype))
    v32 = v.to(dtype)
    if problem.mask is not None:
        keep = problem.mask.squeeze(-2).unsqueeze(-1)  # (B|1, H|1, k_len, 1)
        phi_k = phi_k * keep
    phi_k = torch.broadcast_to(phi_k, phi_q.shape[:2] + phi_k.shape[2:])
    if problem.causal:
        num, den = _causal_linear(phi_q, phi_k, v32, problem.q_offset, chunk)
    else:
        num = torch.matmul(phi_q, torch.matmul(phi_k.transpose(-2, -1), v32))
        den = torch.matmul(phi_q, phi_k.sum(-2).unsqueeze(-1))
    return _Divide.apply(num, den + LINEAR_EPS).to(v.dtype)


class LinearEngine(EngineBase):
    """O(q_len + k_len) linear attention; causal by chunked prefix sums of (phi(k) v^T) states."""

    name = "linear"
    computes = Computes(all_of={"normalizer": {"kernel"}, "contribution": {"proportional"}})

    def __init__(self, chunk: int = 64):
        self.chunk = chunk

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return (
            not kind.bias
            and kind.alibi == "none"
            and not kind.window
            and kind.mask in ("none", "key")
            and (not kind.causal or (kind.offset_ok and kind.aligned))
            and not kind.dropout
        )

    def __call__(self, plan: Plan, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, None]:
        return linear_attention(problem, problem.k, problem.v, plan.feature_map, self.chunk), None
