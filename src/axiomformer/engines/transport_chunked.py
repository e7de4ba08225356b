"""The chunked transport engine: a Householder transport under a row normalizer (PaTH with softmax) in O(L) memory.

Source: Yang et al. 2025, PaTH attention, arXiv:2505.16381, sec. 3.2 (the blockwise algorithm; fla's
``naive_path_attn`` is the same sweep). With H_t = I - beta_t w_t w_t^T and blocks of C tokens, the score of key j in
block J = [c, d) for query i in a later block I = [a, b) factors through the blocks in between:

    s_ij = k~_j . q~_i,   k~_j = (H_{j+1} ... H_{d-1})^T k_j,   q~_i <- B_J q~_i after each block J,  B_J = H_c ... H_{d-1},

starting from q~_i = (H_a ... H_i) q_i and sweeping the key blocks backward; within a block the parallel form
(``transported_scores``). The keys transported to their block's end, the queries to their block's start and each block's
(head_dim x head_dim) product come from the same UT form: K~ = K - A^T (beta o W) with A the transported scores of the
Householder vectors against the keys, Q~ = Q - S (beta o W), B = I - (beta o W)^T W~. The softmax is accumulated
online over the key blocks (Milakov & Gimelshein 2018); each query block is recomputed in the backward
(``torch.utils.checkpoint``), so memory stays O(L head_dim) plus one block of scores.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from axiomformer.axes.transport import TransportGates, transported_scores
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.plan import Plan, ProblemKind
from axiomformer.engines.problem import AttentionProblem
from axiomformer.engines.recurrent import aligned_inputs, sequential_kind

DEFAULT_BLOCK = 64
"""Tokens per block **(our choice: fla's PaTH kernels use 64)**."""


def _householder(g: TransportGates) -> tuple[Tensor, Tensor]:
    """(w, beta) of a Householder transport (the engine accepts only those)."""
    if g.w is None or g.beta is None:
        raise ValueError("chunked_transport needs Householder gates (w and beta)")
    return g.w, g.beta


def _block_pieces(k: Tensor, g: TransportGates) -> tuple[Tensor, Tensor]:
    """Keys transported to the end of their block, and the block's product B (batch, heads, d, d)."""
    w, beta = _householder(g)
    wb = w * beta.unsqueeze(-1)
    plain = TransportGates(g.log_decay, beta, w, None)
    keys = k - transported_scores(w, k, plain, -1).transpose(-2, -1) @ wb  # query m sits at position m - 1
    w_end = w - transported_scores(w, w, plain, -1).transpose(-2, -1) @ wb
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    return keys, eye - wb.transpose(-2, -1) @ w_end


def _query_block(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: TransportGates,
    keep: Tensor,
    ends: Tensor,
    products: Tensor,
    start: int,
    size: int,
) -> Tensor:
    """Softmax-normalized output of the queries of block ``start`` over every key up to them (module docstring);
    ``ends`` are the keys transported to their block's end, ``products`` (batch, heads, blocks, d, d) each block's B."""
    stop = min(start + size, k.shape[-2])
    part = g.tokens(slice(start, stop))
    qb, kb, vb = q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop]
    w, beta = _householder(part)
    plain = TransportGates(part.log_decay, beta, w, None)
    local = transported_scores(qb, kb, part, 0)  # within the block (gamma applied)
    n = stop - start
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    local = local.masked_fill(~(causal & keep[:, None, None, start:stop]), float("-inf"))
    top = local.amax(-1, keepdim=True)
    qt = qb - transported_scores(qb, w, plain, 0) @ (w * beta.unsqueeze(-1))  # the queries to the block start
    blocks = []
    for c in range(start - size, -size, -size):  # the earlier blocks, backward
        write = g.write
        s = qt @ ends[:, :, c : c + size].transpose(-2, -1)
        s = s if write is None else s * write[:, :, None, c : c + size]
        s = s.masked_fill(~keep[:, None, None, c : c + size], float("-inf"))
        blocks.append((s, v[:, :, c : c + size]))
        top = torch.maximum(top, s.amax(-1, keepdim=True))
        qt = qt @ products[:, :, c // size].transpose(-2, -1)
    top = torch.where(torch.isfinite(top), top, 0.0)
    weights = (local - top).exp()
    total, out = weights.sum(-1, keepdim=True), weights @ vb
    for s, vj in blocks:
        e = (s - top).exp()
        total, out = total + e.sum(-1, keepdim=True), out + e @ vj
    return out / total.clamp_min(torch.finfo(out.dtype).tiny)


def chunked_softmax_transport(
    q: Tensor, k: Tensor, v: Tensor, gates: TransportGates, keep: Tensor | None, block: int = DEFAULT_BLOCK
) -> Tensor:
    """softmax_j(s_ij) v_j over the causal keys with s the Householder transport, block by block.

    q, k (batch, heads, n, head_dim), already scaled; v (batch, heads, n, head_dim_v); ``keep`` (batch, n) False at
    padded keys (their gates must be zero: ``TransportGates.masked``). Rows without a visible key get 0. Each key
    block's transported keys and product are computed once; each query block is recomputed in the backward.
    """
    keep = torch.ones(k.shape[0], k.shape[-2], dtype=torch.bool, device=k.device) if keep is None else keep
    pieces = [
        _block_pieces(k[:, :, c : c + block], gates.tokens(slice(c, c + block))) for c in range(0, k.shape[-2], block)
    ]
    ends = torch.cat([p[0] for p in pieces], dim=-2)
    products = torch.stack([p[1] for p in pieces], dim=2)
    outs = []
    for start in range(0, k.shape[-2], block):
        args = (q, k, v, gates, keep, ends, products, start, block)
        outs.append(
            checkpoint(_query_block, *args, use_reentrant=False) if torch.is_grad_enabled() else _query_block(*args)
        )
    return torch.cat(outs, dim=-2)


class ChunkedTransportEngine(EngineBase):
    """A Householder transport without a decay (PaTH) under the softmax, blockwise in O(L) memory.

    Declines: weights requests, masks other than key padding, float biases, ALiBi, dropout, windows, a query offset
    other than the bottom-right one, and ``torch.compile`` tracing (a Python loop over the blocks)."""

    name = "chunked_transport"
    returns_weights = False
    double_backward = True
    transports = True
    computes = Computes(
        all_of={"transport": {"householder"}, "normalizer": {"softmax"}, "contribution": {"proportional"}},
        none_of={"transport": {"decay", "diag_decay", "state"}},
    )

    def __init__(self, block: int = DEFAULT_BLOCK):
        self.block = block

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return not kind.mask_heads and sequential_kind(kind)

    def __call__(
        self, plan: Plan, problem: AttentionProblem, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        qs, k, v, gates, keep, lead = aligned_inputs(problem)  # the lead query rows are padding
        out = chunked_softmax_transport(qs, k, v, gates, keep, self.block)
        return out[:, :, lead:].to(problem.v.dtype), None
