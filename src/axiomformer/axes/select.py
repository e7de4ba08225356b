"""The select axis: the keys a query attends to, chosen by a second score, then weighted by the layer's normalizer.

Source: the sparse attention of 2025 (issue 34). MoBA, NSA's selection branch and DeepSeek-V3.2's indexer score the
keys twice: a *selection* score picks a few blocks or tokens per query, and the attention score weighs the picked
keys. Standard attention has one score (``none``: every visible key). Selection is a boolean mask (True = may
attend) computed without gradient from the queries and keys (after RoPE), so every engine that takes a mask runs it;
ties are kept as ``normalizer=topk`` keeps them (every block or token tied with the k-th largest score), so no engine
breaks a tie its own way. Blocks are ``select_block`` consecutive key positions (block b holds keys b B .. b B + B - 1);
a query at position p has its own block p // B; a past block is *complete* for it when its last key is <= p.

Choices (``select_topk``: blocks kept per query, own block included; ``select_block``: B):
    none        every visible key                                                  (A4 holds)
    block_mean  blocks ranked by q_i . mean(k_j in b) over the complete blocks, the own block always kept, top
                select_topk (Lu et al. 2025, MoBA, arXiv:2502.13189, sec. 2.2, eq. 5-6)
    indexer     tokens ranked by I_ij = sum_h w_h(q_i) relu(q_i W_h . k_j W_k), the top select_topk * select_block
                tokens (DeepSeek-AI 2025, DeepSeek-V3.2-Exp, the lightning indexer, eq. 1; here per attention head
                from the head's own q and k, with INDEX_HEADS index heads of width INDEX_DIM)
    nsa         blocks ranked by q_i . phi(k_block), phi a learned linear map of the block's keys concatenated (so
                it sees the position in the block), the first block and the two local blocks always kept, top
                select_topk in all (Yuan et al. 2025, NSA, arXiv:2502.11089, sec. 3.3.1-3.3.2; their importance is
                the softmax of these scores, whose top-n is the same)
The selection scores get no gradient (MoBA's gate has none; DSA trains its indexer with a separate loss, NSA its
compression through the compressed branch, neither of which is here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from axiomformer.axes.registry import Choice, Registry

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec

INDEX_HEADS, INDEX_DIM = 4, 16
"""Index heads and their width of ``select=indexer`` (DeepSeek-V3.2 uses 64 heads of 128 at full size) **(our choice
at this scale)**."""

SELECT_TRAITS = {
    "blocks": "selects blocks of select_block keys: extra['block_scores'](module, q, mean, blocks) scores them, with "
    "the mean (batch, heads, k_len, head_dim) and the keys (batch, heads, k_len, B, head_dim) of each key's block",
    "tokens": "selects single tokens (extra['token_scores'](module, q, k) scores them)",
    "parametric": "has learned parameters: extra['parameters'](spec) creates them",
    "ordered": "which keys are kept depends on the keys' order (blocks are runs of consecutive positions): A0 is "
    "relaxed too (the audit's set_symmetry fails)",
}


def _block_mean(module: Any, q: Tensor, mean: Tensor, blocks: Tensor) -> Tensor:
    return torch.matmul(q, mean.transpose(-2, -1))


def _nsa(module: Any, q: Tensor, mean: Tensor, blocks: Tensor) -> Tensor:
    compressed = module.compress(blocks.flatten(-2))  # (batch, heads, k_len, head_dim): each key's block
    return torch.matmul(q, compressed.transpose(-2, -1))


def _indexer(module: Any, q: Tensor, k: Tensor) -> Tensor:
    b, h, n, _ = q.shape
    qi = module.index_q(q).view(b, h, n, INDEX_HEADS, INDEX_DIM)
    ki = module.index_k(k)  # (batch, heads, k_len, INDEX_DIM), shared by the index heads
    relu = torch.relu(torch.einsum("bhqid,bhkd->bhqki", qi, ki))
    return torch.einsum("bhqki,bhqi->bhqk", relu, module.index_w(q))


def _nsa_parameters(spec: AttentionSpec) -> dict[str, nn.Module]:
    return {"compress": nn.Linear(spec.select_block * spec.head_dim, spec.head_dim)}


def _indexer_parameters(spec: AttentionSpec) -> dict[str, nn.Module]:
    d = spec.head_dim
    return {
        "index_q": nn.Linear(d, INDEX_HEADS * INDEX_DIM, bias=False),
        "index_k": nn.Linear(d, INDEX_DIM, bias=False),
        "index_w": nn.Linear(d, INDEX_HEADS, bias=False),
    }


SELECTS = Registry(
    "select",
    [
        Choice("none", "every visible key", "Somani, A4 (one score decides every weight)"),
        Choice(
            "block_mean",
            "keep the blocks of the top select_topk scores q_i . mean(k_j in b) (own block always)",
            "Lu et al. 2025, MoBA, arXiv:2502.13189, sec. 2.2 (eq. 5-6)",
            traits=frozenset({"blocks", "ordered"}),
            extra={"block_scores": _block_mean, "always": "own"},
            relaxes="A4: a second score (q . block mean) decides which keys the first one weighs; A0: the blocks "
            "are runs of consecutive positions",
        ),
        Choice(
            "indexer",
            "keep the top select_topk * select_block tokens of I_ij = sum_h w_h(q_i) relu(q_i W_h . k_j W_k)",
            "DeepSeek-AI 2025, DeepSeek-V3.2-Exp, DeepSeek Sparse Attention (the lightning indexer, eq. 1)",
            traits=frozenset({"tokens", "parametric"}),
            extra={"token_scores": _indexer, "parameters": _indexer_parameters},
            relaxes="A4: a second, learned ReLU-weighted multi-head score decides which keys the first one weighs",
        ),
        Choice(
            "nsa",
            "keep the blocks of the top select_topk scores q_i . phi(k_block) (first and two local blocks always)",
            "Yuan et al. 2025, Native Sparse Attention, arXiv:2502.11089, sec. 3.3.1-3.3.2",
            traits=frozenset({"blocks", "parametric", "ordered"}),
            extra={"block_scores": _nsa, "parameters": _nsa_parameters, "always": "nsa"},
            relaxes="A4: a second score on learned compressed blocks decides which keys the first one weighs; A0: "
            "the blocks are runs of consecutive positions (and the first and local ones are kept by position)",
        ),
    ],
    SELECT_TRAITS,
)
"""Every selection: see the module docstring and :data:`SELECT_TRAITS`."""


def _top(scores: Tensor, k: int) -> Tensor:
    """True at the top ``k`` finite entries of each row, every entry tied with the k-th kept (as ``topk``)."""
    # k columns of -inf appended, so that topk(k) is defined at every length without a min() that torch.compile
    # would specialise on: with fewer than k finite entries the k-th is -inf and every finite one is kept.
    padded = torch.cat([scores, scores.new_full((*scores.shape[:-1], k), float("-inf"))], dim=-1)
    kth = padded.topk(k, dim=-1).values[..., -1:]
    return (scores >= kth) & (scores > float("-inf"))


class Select(nn.Module):
    """The selection of ``spec.select`` (owns a learned selection score's parameters): :meth:`mask`."""

    def __init__(self, spec: AttentionSpec):
        super().__init__()
        self.choice = SELECTS[spec.select]
        self.block, self.topk = spec.select_block, spec.select_topk
        if self.choice.has("parametric"):
            for name, module in self.choice.extra["parameters"](spec).items():
                self.add_module(name, module)

    @torch.no_grad()
    def mask(self, q: Tensor, k: Tensor, q_offset: int, causal: bool, keep: Tensor | None) -> Tensor | None:
        """(batch, heads, q_len, k_len) bool, True at the selected keys (None for ``none``).

        q (batch, heads, q_len, head_dim), query i at key position ``q_offset + i``; k (batch, heads, k_len,
        head_dim); ``keep`` (batch, k_len) False at padded keys, which are never selected nor averaged.
        """
        if not self.choice.traits:
            return None
        pq = torch.arange(q.shape[-2], device=q.device) + q_offset
        pk = torch.arange(k.shape[-2], device=q.device)
        if self.choice.has("tokens"):
            scores = self.choice.extra["token_scores"](self, q, k)
            blocked = (pk[None, :] > pq[:, None]) if causal else torch.zeros_like(pk[None, :] > pq[:, None])
            if keep is not None:
                blocked = blocked | ~keep[:, None, None, :]
            return _top(scores.masked_fill(blocked, float("-inf")), self.topk * self.block)
        return self._block_mask(q, k, pq, pk, causal, keep)

    def _block_mask(self, q: Tensor, k: Tensor, pq: Tensor, pk: Tensor, causal: bool, keep: Tensor | None) -> Tensor:
        # Blocks are represented by their first key (j % B == 0) and gathered, never reshaped: no shape depends on
        # k_len modulo B, so torch.compile traces one graph for every length.
        size, k_len = self.block, k.shape[-2]
        flags = torch.ones_like(k[:, :1, :, 0]) if keep is None else keep[:, None, :].to(k.dtype)
        start = (pk // size) * size  # the first key of each key's block
        members = start[:, None] + torch.arange(size, device=k.device)[None, :]  # (k_len, B)
        inside = members < k_len
        idx = members.clamp_max(k_len - 1)
        kb = (k * flags[..., None])[:, :, idx] * inside[..., None]  # (batch, heads, k_len, B, head_dim)
        counts = (flags[:, :, idx] * inside).sum(-1)  # (batch, 1, k_len)
        mean = kb.sum(-2) / counts.clamp_min(1)[..., None]
        scores = self.choice.extra["block_scores"](self, q, mean, kb)  # (batch, heads, q_len, k_len): per block start
        own = (pq // size)[:, None]
        block = (pk // size)[None, :]
        complete = (block + 1) * size - 1 <= pq[:, None] if causal else torch.ones_like(block == own)
        always = block == own
        if self.choice.extra["always"] == "nsa":
            always = always | (block == 0) | (block == own - 1)
        represents = (pk == start)[None, :]
        scores = scores.masked_fill(~(complete | always) | (counts[:, :, None, :] == 0) | ~represents, float("-inf"))
        scores = scores.masked_fill(always & represents, float("inf"))
        chosen = _top(scores, self.topk)
        return chosen.gather(-1, start.expand(chosen.shape))


def check_select(spec: AttentionSpec) -> None:
    """A selection needs blocks of >= 2 keys and at most ``max_len``, >= 1 block kept, and no window or transport.

    Raises:
        ValueError: naming the field and its valid values.
    """
    for name in ("select_block", "select_topk"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not SELECTS[spec.select].traits:
        return
    if spec.select_block < 2:
        raise ValueError(
            f"select={spec.select!r} with select_block=1 ranks single keys by the attention score itself: that is "
            f"normalizer='topk'; choose select_block >= 2"
        )
    if spec.select_block > spec.max_len:
        raise ValueError(
            f"select={spec.select!r} with select_block={spec.select_block} ranks blocks of more keys than the longest "
            f"sequence (max_len={spec.max_len}) holds: no block is ever complete, so nothing is selected; choose "
            f"select_block <= max_len"
        )
    if spec.window or spec.transport != "none":
        raise ValueError(
            f"select={spec.select!r} chooses among every visible key; it is not defined with a window or a transport "
            f"(window={spec.window}, transport={spec.transport!r})"
        )
