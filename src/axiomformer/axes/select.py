"""The select axis: the keys a query attends to, chosen by a second score, then weighted by the layer's normalizer.

Source: the sparse attention of 2025 (issue 34). MoBA, NSA's selection branch and DeepSeek-V3.2's indexer score the
keys twice: a *selection* score picks a few blocks or tokens per query, and the attention score weighs the picked
keys. Standard attention has one score (``none``: every visible key). Selection is computed without gradient from
the queries and keys (after RoPE), as a boolean mask (True = may attend; :meth:`Select.mask`), so every engine that
takes a mask runs it, or a chunk of queries at a time as the kept keys' indices (:class:`Selection`, for the
``selected`` engine, which gathers them: ``engines/selected.py``); both keep the same keys, and ties as
``normalizer=topk`` keeps them (every block or token tied with the k-th largest score), so no engine breaks a tie its
own way. Blocks are ``select_block`` consecutive key positions (block b holds keys b B .. b B + B - 1);
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

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor, nn

from axiomformer.axes.registry import Choice, Registry

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec

Buffer = Callable[[str, tuple[int, ...]], Tensor]
"""``buffer(name, shape)``: an uninitialized tensor of q's dtype and device for a score's intermediate ``name``
(:meth:`Selection.buffer` reuses one between chunks; the mask form takes fresh ones)."""

INDEX_HEADS, INDEX_DIM = 4, 16
"""Index heads and their width of ``select=indexer`` (DeepSeek-V3.2 uses 64 heads of 128 at full size) **(our choice
at this scale)**."""

SELECT_TRAITS = {
    "blocks": "selects blocks of select_block keys: extra['block_keys'](module, mean, blocks) gives each block's "
    "selection key c_b (..., head_dim) from its mean (..., head_dim) and its keys (..., B, head_dim), and the score is "
    "q_i . c_b",
    "tokens": "selects single tokens: extra['token_keys'](module, k) gives each key's index features and "
    "extra['token_scores'](module, q, features, buffer) the scores (batch, heads, q_len, k_len), its large "
    "intermediates in buffer(name, shape) (uninitialized, reused between chunks); extra['width'] elements per "
    "(query, key) pair are held while they are computed",
    "parametric": "has learned parameters: extra['parameters'](spec) creates them",
    "ordered": "which keys are kept depends on the keys' order (blocks are runs of consecutive positions): A0 is "
    "relaxed too (the audit's set_symmetry fails)",
}


def _block_mean(module: Any, mean: Tensor, blocks: Tensor) -> Tensor:
    return mean


def _nsa(module: Any, mean: Tensor, blocks: Tensor) -> Tensor:
    return module.compress(blocks.flatten(-2))  # phi(k_block): the block's keys concatenated, mapped to head_dim


def _index_keys(module: Any, k: Tensor) -> Tensor:
    return module.index_k(k)  # (batch, heads, k_len, INDEX_DIM), shared by the index heads


def _indexer(module: Any, q: Tensor, ki: Tensor, buffer: Buffer) -> Tensor:
    b, h, n, _ = q.shape
    qi = module.index_q(q).view(b, h, n * INDEX_HEADS, INDEX_DIM)
    # One matmul for every index head (rows i * INDEX_HEADS + h), the ReLU in place, then sum_h w_h(q_i) relu_h as a
    # (1 x INDEX_HEADS) @ (INDEX_HEADS x k_len) product per query: no (q_len x k_len x INDEX_HEADS) permuted copy.
    logits = torch.matmul(qi, ki.transpose(-2, -1), out=buffer("index", (b, h, n * INDEX_HEADS, ki.shape[-2])))
    relu = logits.view(b, h, n, INDEX_HEADS, ki.shape[-2]).relu_()
    scores = buffer("scores", (b, h, n, 1, ki.shape[-2]))
    return torch.matmul(module.index_w(q).unsqueeze(-2), relu, out=scores).squeeze(-2)


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
            extra={"block_keys": _block_mean, "always": "own"},
            relaxes="A4: a second score (q . block mean) decides which keys the first one weighs; A0: the blocks "
            "are runs of consecutive positions",
        ),
        Choice(
            "indexer",
            "keep the top select_topk * select_block tokens of I_ij = sum_h w_h(q_i) relu(q_i W_h . k_j W_k)",
            "DeepSeek-AI 2025, DeepSeek-V3.2-Exp, DeepSeek Sparse Attention (the lightning indexer, eq. 1)",
            traits=frozenset({"tokens", "parametric"}),
            extra={
                "token_keys": _index_keys,
                "token_scores": _indexer,
                "width": INDEX_HEADS,
                "parameters": _indexer_parameters,
            },
            relaxes="A4: a second, learned ReLU-weighted multi-head score decides which keys the first one weighs",
        ),
        Choice(
            "nsa",
            "keep the blocks of the top select_topk scores q_i . phi(k_block) (first and two local blocks always)",
            "Yuan et al. 2025, Native Sparse Attention, arXiv:2502.11089, sec. 3.3.1-3.3.2",
            traits=frozenset({"blocks", "parametric", "ordered"}),
            extra={"block_keys": _nsa, "parameters": _nsa_parameters, "always": "nsa"},
            relaxes="A4: a second score on learned compressed blocks decides which keys the first one weighs; A0: "
            "the blocks are runs of consecutive positions (and the first and local ones are kept by position)",
        ),
    ],
    SELECT_TRAITS,
)
"""Every selection: see the module docstring and :data:`SELECT_TRAITS`."""


NEG, POS = float("-inf"), float("inf")


def _top(scores: Tensor, k: int) -> Tensor:
    """True at the top ``k`` finite entries of each row, every entry tied with the k-th kept (as ``topk``)."""
    # k columns of -inf appended, so that topk(k) is defined at every length without a min() that torch.compile
    # would specialise on: with fewer than k finite entries the k-th is -inf and every finite one is kept.
    padded = torch.cat([scores, scores.new_full((*scores.shape[:-1], k), NEG)], dim=-1)
    kth = padded.topk(k, dim=-1).values[..., -1:]
    return (scores >= kth) & (scores > NEG)


class Kept(NamedTuple):
    """The kept entries of a chunk of rows (lead..., cols), as indices: a dense part of n per row and, for the few
    rows that keep many more (ties), a sparse one. Row r keeps {picks[r, t] : kept[r, t]} together with {cols[p] :
    rows[p] == r}; a row is wholly in one part."""

    picks: Tensor
    """(lead..., n) int64, n >= 1; entries not kept may point anywhere (non-negative)."""
    kept: Tensor
    """(lead..., n) bool."""
    rows: Tensor
    """(P,) int64: the row of each sparse entry, flat over the lead dimensions."""
    cols: Tensor
    """(P,) int64: its column."""
    searched: int = 0
    """How many of each row's largest entries the search read last (``top_entries``'s ``width``)."""


SPARSE_SHARE = 8
"""A chunk's rows that keep more than the entries ``topk`` found go to the sparse part when they are at most 1 in
this many of its rows, else ``topk`` widens (doubles) **(our choice: DeepSeek's indexer ties at 0 wherever every
index-head weight w_h(q_i) is negative, about 1 query in 16 at initialization, and then keeps every key whose ReLUs
are all 0; NSA's three always-kept blocks tie at +inf in every row with select_topk = 2)**."""


PREFILTER = 64
"""Columns per group of :func:`_largest`'s prefilter **(our choice: at L = 4096 it cut the indexer's top-k from 1.6 ns
to about 0.2 ns per score, torch 2.13 CPU)**."""


def _largest(scores: Tensor, m: int, group: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """``scores.topk(m)``'s values and indices for each row of ``scores`` (lead..., cols), and the largest entry
    outside the candidates it read (lead...,) (None: it read every column).

    With many columns only the m groups of ``group`` consecutive columns with the largest maxima are read: they hold
    the row's m largest values (an entry outside them is at most the (m + 1)-th largest group maximum, and the m
    larger maxima are entries inside), in the order ``topk`` ranks them (NaN first, as ``amax`` propagates it); so
    the values equal ``topk(m)``'s, for one max pass over the row instead of ``topk``'s partial sort. Indices of
    equal values may differ; the caller checks the largest entry left out against its threshold.
    """
    cols = scores.shape[-1]
    whole = cols // group
    if whole < 4 * (m + 1):  # too few groups to pay
        values, index = scores.topk(m, dim=-1)
        return values, index, None
    maxima = scores[..., : whole * group].unflatten(-1, (whole, group)).amax(-1)
    if whole * group < cols:
        maxima = torch.cat([maxima, scores[..., whole * group :].amax(-1, keepdim=True)], dim=-1)
    top, chosen = maxima.topk(m + 1, dim=-1)
    members = (chosen[..., :m, None] * group + torch.arange(group, device=scores.device)).flatten(-2)
    inside = members < cols  # the last group may be short
    members = members.clamp_max_(cols - 1)
    values, local = scores.gather(-1, members).masked_fill_(~inside, NEG).topk(m, dim=-1)
    return values, members.gather(-1, local), top[..., m]


def top_entries(scores: Tensor, k: int, group: int = PREFILTER, first: int = 0) -> Kept:
    """The entries :func:`_top` marks, as indices (:class:`Kept`): {kept entries of row r} is exactly the set of row
    r's True entries of ``_top(scores, k)``, for ``scores`` (lead..., cols).

    The m = k + 1 largest of each row (:func:`_largest`, prefilter groups of ``group`` columns) give the k-th value
    and show which rows may keep an entry beyond those found (their m-th, or the largest entry left out, is >= the
    k-th); those rows' kept entries are listed from a comparison with the k-th value (the sparse part), unless they
    are many: then m doubles (every column at most). So ties are kept exactly as ``_top`` keeps them. ``first``: an
    m to start from, at most 2 (k + 1) (the previous chunk's ``searched``: NSA's three always-kept blocks tie in every
    row with select_topk = 2; a larger m, from a chunk of ties, would slow every later chunk).
    """
    if scores.shape[-1] < k + 1:  # the -inf columns _top appends: topk(k + 1) defined, the k-th -inf where it is
        scores = torch.cat([scores, scores.new_full((*scores.shape[:-1], k + 1 - scores.shape[-1]), NEG)], dim=-1)
    width = scores.shape[-1]
    m = min(max(k + 1, min(first, 2 * (k + 1))), width)
    while True:
        values, index, beyond = _largest(scores, m, group)
        kth = values[..., k - 1 : k]
        kept = (values >= kth) & (values > NEG)
        more = kept[..., -1] if m < width else torch.zeros_like(kept[..., -1])
        if beyond is not None:
            more = more | ((beyond >= kth[..., 0]) & (beyond > NEG))
        many = int(more.sum())
        if many * SPARSE_SHARE <= more.numel():
            break
        m = min(2 * m, width)
    rows = cols = index.new_empty(0)
    if many:  # those rows keep every entry >= their k-th value, listed in full
        rows = more.flatten().nonzero().squeeze(-1)
        chosen = scores.flatten(0, -2).index_select(0, rows)
        chosen = (chosen >= kth.flatten(0, -2).index_select(0, rows)) & (chosen > NEG)
        pick = chosen.nonzero()
        rows, cols = rows[pick[:, 0]], pick[:, 1]
        kept = kept & ~more.unsqueeze(-1)
    # topk ranks NaN first, so a row's kept entries need not be a prefix: keep up to the last column any row keeps
    used = kept.flatten(0, -2).any(0).nonzero()
    n = int(used[-1]) + 1 if used.numel() else 1
    return Kept(index[..., :n], kept[..., :n], rows, cols, m)


def _always(block: Tensor, own: Tensor, rule: str) -> Tensor:
    """Where ``block`` is kept whatever its score: the query's own block (``own``), and for ``nsa`` also the first
    block and the one before the own (NSA sec. 3.3.2: the initial and the local blocks)."""
    always = block == own
    if rule == "nsa":
        always = always | (block == 0) | (block == own - 1)
    return always


class Select(nn.Module):
    """The selection of ``spec.select`` (owns a learned selection score's parameters): :meth:`mask`, or
    :meth:`selection` for an engine that gathers the selected keys itself."""

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
            features = self.choice.extra["token_keys"](self, k)
            scores = self.choice.extra["token_scores"](self, q, features, lambda name, shape: q.new_empty(shape))
            blocked = (pk[None, :] > pq[:, None]) if causal else torch.zeros_like(pk[None, :] > pq[:, None])
            if keep is not None:
                blocked = blocked | ~keep[:, None, None, :]
            return _top(scores.masked_fill(blocked, NEG), self.topk * self.block)
        return self._block_mask(q, k, pq, pk, causal, keep)

    def selection(self, q: Tensor, k: Tensor, q_offset: int, causal: bool, keep: Tensor | None) -> Selection:
        """The same selection as :meth:`mask` (same arguments), left for the engine to compute: as that mask
        (:meth:`Selection.mask`) or as the kept keys of a chunk of queries at a time (:meth:`Selection.keys`)."""
        return Selection(self, q.detach(), k.detach(), q_offset, causal, keep=keep)

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
        keys = self.choice.extra["block_keys"](self, mean, kb)  # (batch, heads, k_len, head_dim): each key's block
        scores = torch.matmul(q, keys.transpose(-2, -1))  # (batch, heads, q_len, k_len): per block start
        own = (pq // size)[:, None]
        block = (pk // size)[None, :]
        complete = (block + 1) * size - 1 <= pq[:, None] if causal else torch.ones_like(block == own)
        always = _always(block, own, self.choice.extra["always"])
        represents = (pk == start)[None, :]
        scores = scores.masked_fill(~(complete | always) | (counts[:, :, None, :] == 0) | ~represents, NEG)
        scores = scores.masked_fill(always & represents, POS)
        chosen = _top(scores, self.topk)
        return chosen.gather(-1, start.expand(chosen.shape))


class Selection:
    """One call's selection, computed where the engine asks: the dense mask (:meth:`mask`, what every engine that
    takes a mask runs) or, a chunk of queries at a time, the kept keys as indices (:meth:`keys`, for an engine that
    gathers them: ``engines/selected.py``). Both keep exactly the same keys: the same scores, compared by the same
    rule (:func:`top_entries` finds :func:`_top`'s entries), in O(chunk x candidates) memory.

    Args:
        select: the layer's :class:`Select`; q (batch, heads, q_len, head_dim) and k (batch, heads, k_len, head_dim),
            detached, query i at key position ``q_offset + i``; causal: the bottom-right causal rule; keep (batch,
            k_len) bool, False at padded keys, or None.
    """

    def __init__(self, select: Select, q: Tensor, k: Tensor, q_offset: int, causal: bool, *, keep: Tensor | None):
        self.select, self.q, self.k = select, q, k
        self.q_offset, self.causal, self.keep = q_offset, causal, keep
        self.blocks = select.choice.has("blocks")
        self._features: tuple[Tensor, Tensor | None] | None = None
        self._buffers: dict[str, Tensor] = {}
        self._searched = 0  # the last chunk's top_entries width: the next starts there

    def buffer(self, name: str, shape: tuple[int, ...]) -> Tensor:
        """An uninitialized (shape) tensor of q's dtype, the buffer ``name`` reused between chunks (grown as
        needed): a fresh multi-MiB tensor per chunk costs its page faults every time (a (8, 256, 4096) float32
        matmul ran 6x slower into a fresh tensor than into a reused one, torch 2.13 CPU)."""
        size = math.prod(shape)
        held = self._buffers.get(name)
        if held is None or held.numel() < size:
            held = self._buffers[name] = self.q.new_empty(size)
        return held[:size].view(shape)

    def mask(self) -> Tensor:
        """(batch, heads, q_len, k_len) bool, True at the selected keys (:meth:`Select.mask`)."""
        chosen = self.select.mask(self.q, self.k, self.q_offset, self.causal, self.keep)
        assert chosen is not None  # a Selection exists only for a choice with traits
        return chosen

    def _columns(self, stop: int) -> int:
        """Candidates (blocks or keys) the queries before ``stop`` may keep: under the causal rule none past the last
        one's own block (or key); at least one, so that a chunk is never empty."""
        size = self.select.block if self.blocks else 1
        count = -(-self.k.shape[-2] // size)
        return min(count, max(1, (self.q_offset + stop - 1) // size + 1)) if self.causal else count

    def span(self, start: int, budget: int) -> int:
        """The end of the chunk of queries from ``start`` whose scores hold at most ``budget`` elements (at least one
        query): scores (batch, heads, queries, candidates), times ``extra['width']`` for a score that holds more per
        pair while it is computed (the indexer's heads)."""
        q_len = self.q.shape[-2]
        pair = max(self.q.shape[0], self.k.shape[0]) * self.k.shape[1] * self.select.choice.extra.get("width", 1)
        rows = max(1, budget // (pair * self._columns(q_len)))
        # Under the causal rule early queries have fewer candidates: double the chunk while it still fits.
        while start + rows < q_len and budget // (pair * self._columns(min(q_len, start + 2 * rows))) >= 2 * rows:
            rows *= 2
        return min(q_len, start + rows)

    @torch.no_grad()
    def keys(self, start: int, stop: int) -> Kept:
        """The kept keys of queries ``start .. stop - 1`` (:class:`Kept` over (batch, heads, stop - start)): key
        positions in 0..k_len - 1, exactly the True entries of those rows of :meth:`mask` (keys the causal rule or a
        mask hides included, as there: the engine applies those)."""
        k_len = self.k.shape[-2]
        if not self.blocks:
            index, kept, rows, cols, _ = self._token_entries(start, stop)
            return Kept(index.clamp_(0, k_len - 1), kept, rows, cols)  # -inf columns appended may lie past the keys
        index, kept, rows, cols, _ = self._block_entries(start, stop)
        size = self.select.block
        members = torch.arange(size, device=index.device)
        index = (index.unsqueeze(-1) * size + members).flatten(-2)
        kept = (kept.unsqueeze(-1) & (index.view(*kept.shape, size) < k_len)).flatten(-2)
        keys = (cols.unsqueeze(-1) * size + members).flatten()
        rows = rows.repeat_interleave(size)
        inside = keys < k_len  # the last block may be short
        return Kept(index.clamp_(0, k_len - 1), kept, rows[inside], keys[inside])

    def _token_entries(self, start: int, stop: int) -> Kept:
        """:func:`top_entries` of the token scores of queries start..stop - 1 over the keys they may see."""
        extra = self.select.choice.extra
        if self._features is None:
            self._features = (extra["token_keys"](self.select, self.k), None)
        cols = self._columns(stop)
        q = self.q[..., start:stop, :]
        scores = extra["token_scores"](self.select, q, self._features[0][..., :cols, :], self.buffer)
        first = self.q_offset + start + 1  # keys from here on are hidden from some query of the chunk
        if self.causal and first < cols:
            pq = torch.arange(start, stop, device=scores.device) + self.q_offset
            after = torch.arange(max(first, 0), cols, device=scores.device)[None, :] > pq[:, None]
            scores[..., max(first, 0) :].masked_fill_(after, NEG)
        if self.keep is not None:
            scores.masked_fill_(~self.keep[:, None, None, :cols], NEG)
        kept = top_entries(scores, self.select.topk * self.select.block, first=self._searched)
        self._searched = kept.searched
        return kept

    def _block_table(self) -> tuple[Tensor, Tensor | None]:
        """Each block's selection key (batch, heads, blocks, head_dim) and, with padding, which blocks hold no real
        key (batch, 1, blocks); the blocks laid out compactly (the same sums as :meth:`Select._block_mask`'s)."""
        if self._features is None:
            size, (_, h, k_len, d) = self.select.block, self.k.shape
            pad = -k_len % size
            flags = None if self.keep is None else self.keep[:, None, :].to(self.k.dtype)
            kb = self.k if flags is None else self.k * flags[..., None]
            kb = torch.nn.functional.pad(kb, (0, 0, 0, pad)).view(kb.shape[0], h, -1, size, d)
            if flags is None:
                counts = torch.full((1, 1, kb.shape[2], 1), float(size), dtype=kb.dtype, device=kb.device)
                counts[..., -1, :] = size - pad
            else:
                counts = torch.nn.functional.pad(flags, (0, pad)).view(flags.shape[0], 1, -1, size).sum(-1, True)
            mean = kb.sum(-2) / counts.clamp_min(1)
            keys = self.select.choice.extra["block_keys"](self.select, mean, kb)
            self._features = (keys, None if flags is None else counts[..., 0] == 0)
        return self._features

    def _block_entries(self, start: int, stop: int) -> Kept:
        """:func:`top_entries` of the block scores of queries start..stop - 1 (the rule of
        :meth:`Select._block_mask`): complete blocks ranked, the always-kept ones first (+inf), empty ones never."""
        keys, empty = self._block_table()
        size, cols = self.select.block, self._columns(stop)
        q = self.q[..., start:stop, :]
        lead = (max(q.shape[0], keys.shape[0]), keys.shape[1])
        scores = torch.matmul(
            q, keys[..., :cols, :].transpose(-2, -1), out=self.buffer("scores", (*lead, stop - start, cols))
        )
        pq = torch.arange(start, stop, device=scores.device) + self.q_offset
        block = torch.arange(cols, device=scores.device)[None, :]
        own = (pq // size)[:, None]
        complete = (block + 1) * size - 1 <= pq[:, None] if self.causal else torch.ones_like(block == own)
        always = _always(block, own, self.select.choice.extra["always"])
        hidden = ~(complete | always)
        scores.masked_fill_(hidden if empty is None else hidden | empty[:, :, None, :cols], NEG)
        scores.masked_fill_(always, POS)
        kept = top_entries(scores, self.select.topk, first=self._searched)
        self._searched = kept.searched
        return kept


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
