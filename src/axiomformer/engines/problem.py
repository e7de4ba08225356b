"""What every engine receives: one attention problem in (batch, heads, seq, head_dim) layout."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from axiomformer.axes.position import alibi_bias


def causal_mask(q_len: int, k_len: int, q_offset: int, device: torch.device | None = None) -> Tensor:
    """Bool (q_len, k_len), True = may attend: key j is visible to query i iff j <= q_offset + i.

    With ``q_offset = k_len - q_len`` this is the bottom-right aligned causal mask (the last query sees every key).
    """
    i = torch.arange(q_len, device=device).unsqueeze(-1) + q_offset
    j = torch.arange(k_len, device=device).unsqueeze(0)
    return j <= i


@dataclass
class AttentionProblem:
    """Queries, keys, values and everything that masks or biases their scores.

    Attributes:
        q: (batch, heads, q_len, head_dim), after projection and RoPE.
        k: (batch, heads, k_len, head_dim), after projection and RoPE (cache included).
        v: (batch, heads, k_len, head_dim_v).
        causal: bottom-right aligned causal masking (see :func:`causal_mask`), not folded into ``mask``.
        mask: bool, True = may attend, broadcastable to (batch, heads, q_len, k_len), or None; from ``attn_mask``
            and ``key_padding_mask`` (and ``-inf`` entries of a float ``attn_mask``).
        bias: float added to the scores, broadcastable to (batch, heads, q_len, k_len), or None (finite).
        alibi_slopes: (heads,) ALiBi slopes, or None.
        q_offset: absolute position of query 0 among the key positions (``k_len - q_len`` unless a cache says else).
        dropout_p: dropout on the attention weights, applied only when ``training``.
        training: module mode (dropout, Gumbel noise).
    """

    q: Tensor
    k: Tensor
    v: Tensor
    causal: bool = False
    mask: Tensor | None = None
    bias: Tensor | None = None
    alibi_slopes: Tensor | None = None
    q_offset: int = 0
    dropout_p: float = 0.0
    training: bool = False

    @property
    def q_len(self) -> int:
        return self.q.shape[-2]

    @property
    def k_len(self) -> int:
        return self.k.shape[-2]

    @property
    def q_positions(self) -> Tensor:
        return torch.arange(self.q_len, device=self.q.device) + self.q_offset

    @property
    def k_positions(self) -> Tensor:
        return torch.arange(self.k_len, device=self.q.device)

    def full_mask(self) -> Tensor | None:
        """The bool mask with the causal mask folded in, broadcastable to (batch, heads, q_len, k_len), or None."""
        mask = self.mask
        if self.causal:
            c = causal_mask(self.q_len, self.k_len, self.q_offset, self.q.device)
            mask = c if mask is None else mask & c
        return mask

    def full_bias(self) -> Tensor | None:
        """The float bias with ALiBi folded in, broadcastable to (batch, heads, q_len, k_len), or None."""
        bias = self.bias
        if self.alibi_slopes is not None:
            alibi = alibi_bias(self.alibi_slopes, self.q_positions, self.k_positions, self.causal)
            bias = alibi if bias is None else bias + alibi
        return bias

    def rows_without_keys(self) -> Tensor | None:
        """(batch|1, heads|1, q_len) bool marking queries with no visible key, or None when every query has one.

        Reads ``mask`` (at most (batch, heads, q_len, k_len)) and the causal rule j <= q_offset + i without building
        their combination: a row is empty when its first unmasked key lies after its causal limit.
        """
        if self.mask is None:
            if not self.causal or self.q_offset >= 0:
                return None
            return (self.q_positions < 0).view(1, 1, -1)
        mask = self.mask if self.mask.dim() == 4 else self.mask.view((1,) * (4 - self.mask.dim()) + self.mask.shape)
        if not self.causal:
            return ~mask.any(-1)
        first = torch.where(mask.any(-1), mask.to(torch.uint8).argmax(-1), self.k_len)     # first unmasked key
        return first > self.q_positions

    @cached_property
    def nonfinite_keys(self) -> Tensor | None:
        """(batch, heads, k_len) bool marking keys whose key or value holds NaN/inf, or None if all are finite.

        Engines compute with those keys zeroed and then poison exactly the outputs that may see them, so a NaN in
        a masked-out key never reaches the output (nor, through ``0 * NaN``, the gradients of other tokens).
        """
        # Fast path: one reduction per tensor. A NaN or inf anywhere makes the sum non-finite (inf - inf is NaN);
        # a non-finite sum of finite values (overflow) only sends us to the exact check below.
        with torch.no_grad():
            if bool(torch.isfinite(self.k.sum() + self.v.sum())):
                return None
        if bool(torch.isfinite(self.k).all()) and bool(torch.isfinite(self.v).all()):
            return None
        return ~(torch.isfinite(self.k).all(-1) & torch.isfinite(self.v).all(-1))


# ---------------------------------------------------------------------------------------------- query chunks
def plain_dot_problem(module, problem: AttentionProblem) -> bool:
    """Dot scores, proportional contributions, no mask but the causal one, no bias or ALiBi, no dropout, float32/64:
    the problems whose weights are a function of one row of q k^T alone (the closed-form engines' condition)."""
    spec = module.spec
    return (spec.score == "dot" and spec.contribution == "proportional"
            and problem.mask is None and problem.bias is None and problem.alibi_slopes is None
            and not (problem.training and problem.dropout_p > 0)
            and problem.q.dtype in (torch.float32, torch.float64))


def causal_key_end(start: int, stop: int, offset: int, causal: bool, k_len: int) -> int:
    """Keys read by the queries start..stop - 1: with a causal mask, up to the last one visible to query stop - 1."""
    return min(k_len, max(1, offset + stop)) if causal else k_len


def causal_diagonal(start: int, stop: int, end: int, offset: int, causal: bool,
                    device: torch.device | None = None) -> tuple[int, Tensor] | None:
    """(first, hidden) for the queries start..stop - 1 against the keys 0..end - 1, or None when none is hidden.

    Query start + r (absolute position offset + start + r) sees the keys j <= offset + start + r, so keys before
    ``first = offset + start + 1`` are visible to the whole chunk; ``hidden`` (stop - start, end - first) bool is True
    where key first + c lies after query r (only that diagonal block needs masking).
    """
    first = max(0, min(end, offset + start + 1)) if causal else end
    if first >= end:
        return None
    i = torch.arange(start, stop, device=device).view(-1, 1) + offset
    return first, torch.arange(first, end, device=device).view(1, -1) > i


# ---------------------------------------------------------------------------------------------- blocks and NaN
def slice_block(t: Tensor | None, qs: slice, ks: slice) -> Tensor | None:
    """Rows ``qs`` and columns ``ks`` of a tensor broadcastable to (batch, heads, q_len, k_len)."""
    if t is None:
        return None
    if t.shape[-2] != 1:
        t = t[..., qs, :]
    if t.shape[-1] != 1:
        t = t[..., ks]
    return t


def block_mask(problem: AttentionProblem, qs: slice, ks: slice) -> Tensor | None:
    """``problem.full_mask()[..., qs, ks]`` without building the full mask; None when the block is fully visible."""
    mask = slice_block(problem.mask, qs, ks)
    if problem.causal and ks.stop - 1 > problem.q_offset + qs.start:
        causal = causal_mask(qs.stop - qs.start, ks.stop - ks.start, problem.q_offset + qs.start - ks.start,
                             problem.q.device)
        mask = causal if mask is None else mask & causal
    return mask


def nonfinite_hits(problem: AttentionProblem, chunk: int = 256) -> Tensor | None:
    """(batch, heads, q_len, 1) bool: queries that may attend to a non-finite key (None if every key is finite).

    The visibility mask is built ``chunk`` queries at a time, so no (q_len x k_len) mask is ever held.
    """
    bad = problem.nonfinite_keys
    if bad is None:
        return None
    batch, heads = bad.shape[:2]
    hits = []
    for start in range(0, problem.q_len, chunk):
        qs = slice(start, min(start + chunk, problem.q_len))
        mask = block_mask(problem, qs, slice(0, problem.k_len))
        seen = bad.unsqueeze(-2) if mask is None else mask & bad.unsqueeze(-2)
        seen = torch.broadcast_to(seen, (batch, heads, qs.stop - qs.start, problem.k_len))
        hits.append(seen.any(-1, keepdim=True))
    return torch.cat(hits, dim=-2)


def clean_nonfinite(problem: AttentionProblem) -> tuple[Tensor, Tensor]:
    """k and v with non-finite keys zeroed (see ``AttentionProblem.nonfinite_keys``)."""
    bad = problem.nonfinite_keys
    if bad is None:
        return problem.k, problem.v
    keep = ~bad.unsqueeze(-1)
    return torch.where(keep, problem.k, 0.0), torch.where(keep, problem.v, 0.0)


def poison_rows(out: Tensor, problem: AttentionProblem) -> Tensor:
    """NaN in the output rows (batch, heads, q_len, head_dim) of queries that may see a non-finite key."""
    hits = nonfinite_hits(problem)
    return out if hits is None else out.masked_fill(hits, float("nan"))
