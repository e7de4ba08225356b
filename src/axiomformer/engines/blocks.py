"""The scratch memory of the chunked engines (``engines/rowwise.py``, ``engines/elementwise.py``,
``engines/rowtiles.py``): score blocks reused chunk after chunk, the gradient buffers their backward accumulates into,
and the tiles of queries x keys of the tiled ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


class ScoreBlocks:
    """Reusable score blocks of one call of a chunked engine (``engines/rowwise.py``, ``engines/elementwise.py``):
    ``get(i, rows, end)`` is block i viewed as (batch*heads, rows, end), allocated once at the largest size (``rows``
    up to the chunk size or the widest head_dim, ``end`` up to the keys). A fresh multi-MiB block per product paid
    its page faults every time (glibc serves blocks that large by mmap) **(our choice)**.

    The row-wise engine's use:
    Block 0 holds the logits (and Q^T dt once dt is final), 2 dL/du (and dO^T u before it), 3 the cap's slope, 4 and 5
    the kernel's spares: the VJP contract (``engines/rowkernels.py``) never returns t or a spare.
    """

    def __init__(self, like: Tensor, rows: int, k_len: int):
        self.like, self.rows, self.k_len = like, rows, k_len
        self.flat: dict[int, Tensor] = {}

    def get(self, i: int, rows: int, end: int) -> Tensor:
        batch = self.like.shape[0]
        if i not in self.flat:
            self.flat[i] = self.like.new_empty(batch * max(rows, self.rows) * self.k_len)
        return self.flat[i][: batch * rows * end].view(batch, rows, end)

    def spares(self, rows: int, end: int) -> Callable[[int], Tensor]:
        """The kernels' ``spare(i)``: blocks 4, 5, ... of this chunk's shape."""
        return lambda i: self.get(4 + i, rows, end)


def transposed_grad_buffers(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The gradient buffers of a chunked backward over (batch*heads, seq, head_dim) inputs: dQ (uninitialized, each
    chunk writes its rows) and dK, dV transposed and zeroed, (batch*heads, head_dim, keys): ``Q_c^T dS`` and
    ``dO_c^T u`` are products of the score block's shape, measured faster than ``dS^T Q_c`` (0.76 against 0.97-1.18 ms
    at 64 queries x 2,048 keys), and each chunk adds its part in place."""
    grad_kt = k.new_zeros(k.shape[0], k.shape[2], k.shape[1])
    return torch.empty_like(q), grad_kt, v.new_zeros(v.shape[0], v.shape[2], v.shape[1])


TILE_ELEMENTS = 2**18
"""Elements of one score tile over batch*heads per intra-op thread (1 MiB in float32 each) **(our choice)**: a
thread's share of a tile, its weights and dL/du stay in its core's L2 cache between the products and the
elementwise passes. At L = 4096, batch 1, 8 heads, causal, sigmoid forward + backward took 640 ms on one thread with
tiles of 128 queries x 256 keys, 870 ms with whole rows of keys (64 queries x up to 4,096 keys, 8 MiB blocks), SDPA
530 ms; on two threads 2^18 elements gave 1.50x SDPA, 2^19 1.43x and 2^17 1.75x."""


def tile_budget() -> int:
    """Elements of one score tile: :data:`TILE_ELEMENTS` per intra-op thread (``torch.get_num_threads``)."""
    return TILE_ELEMENTS * torch.get_num_threads()


MIN_KEYS = 64
"""Fewest keys of a tile (many heads make tiles narrow; a narrower product runs far below the machine's rate)."""


QUERY_ROWS = 128
"""Most queries of a chunk (a tile's rows)."""


def tile_shape(batch_heads: int, q_len: int, budget: int) -> tuple[int, int]:
    """(queries, keys) of a tile of at most ``budget`` elements over batch*heads: up to :data:`QUERY_ROWS` queries,
    and keys a multiple of :data:`MIN_KEYS` where the budget allows that many (a small budget, as the tests set, gives
    tiles of a few keys)."""
    rows = max(1, min(q_len, QUERY_ROWS, budget // max(1, batch_heads * MIN_KEYS)))
    keys = max(1, budget // max(1, batch_heads * rows))
    return rows, keys // MIN_KEYS * MIN_KEYS if keys >= MIN_KEYS else keys


Hidden = tuple[int, Tensor] | None
"""The keys a causal chunk or tile hides: (first, hidden) as :func:`~axiomformer.engines.problem.causal_diagonal`."""


def tile_keys(diagonal: Hidden, start: int, width: int, end: int) -> tuple[slice, Hidden]:
    """The keys ``start .. start + width - 1`` of a chunk of queries that reads the keys 0..end - 1 and hides
    ``diagonal`` of them (clipped to ``end``), and those of the tile's keys it hides, counted from the tile's first
    key."""
    keys = slice(start, min(end, start + width))
    if diagonal is None or keys.stop <= diagonal[0]:
        return keys, None
    first, hidden = diagonal
    lo = max(first, start)
    return keys, (lo - start, hidden[:, lo - first : keys.stop - first])


def flat_heads(q: Tensor, k: Tensor, v: Tensor) -> tuple[tuple[int, int], Tensor, Tensor, Tensor]:
    """((batch, heads), q, k, v as (batch*heads, seq, dim)): the inputs (batch, heads, seq, dim) of a chunked engine
    with their batch and heads dims broadcast against each other (a dim of 1 against more; autograd of the expansion
    sums its gradient back)."""
    batch, heads = torch.broadcast_shapes(q.shape[:2], k.shape[:2], v.shape[:2])
    q3, k3, v3 = (torch.broadcast_to(t, (batch, heads) + t.shape[2:]).flatten(0, 1) for t in (q, k, v))
    return (batch, heads), q3, k3, v3


def add_product_(target: Tensor, a: Tensor, b: Tensor) -> None:
    """target += a @ b (batched): one ``baddbmm_`` where target is contiguous, else a product and an add (a tile of
    keys a chunk reads only in part: ``baddbmm_`` into a strided target runs one ``addmm_`` per batch entry)."""
    if target.is_contiguous():
        target.baddbmm_(a, b)
    else:
        target.add_(torch.bmm(a, b))


class TileGrads:
    """The gradient buffers of a tiled backward that walks tiles of keys outside and chunks of queries inside
    (``engines/elementwise.py``, ``engines/rowtiles.py``): dQ one contiguous block per chunk, dK and dV one per tile of
    keys, so that each product adds into its block in one batched ``baddbmm_``. Into a strided slice of the whole
    gradient ``baddbmm_`` runs one ``addmm_`` per batch*heads entry: 3,456 calls and a third of the backward at
    L = 4096, 8 heads, on two threads **(our choice)**.

    Inputs (batch*heads, seq, head_dim); ``chunks`` the rows of each chunk of queries, in order.
    """

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, chunks: list[slice]) -> None:
        self.q = [q.new_zeros(q.shape[0], rows.stop - rows.start, q.shape[-1]) for rows in chunks]
        self.q_shape = q.shape
        self.k, self.v = torch.zeros_like(k), torch.zeros_like(v)
        self.keys: slice | None = None
        self.k_tile, self.v_tile = self.k[:, :0], self.v[:, :0]

    def key_tile(self, start: int, width: int) -> tuple[Tensor, Tensor]:
        """Zeroed dK and dV blocks (batch*heads, keys, head_dim) for the keys ``start .. start + width - 1``; the
        previous tile's are written into the whole gradients first."""
        self._flush()
        self.keys = slice(start, min(start + width, self.k.shape[1]))
        n = self.keys.stop - self.keys.start
        self.k_tile = self.k.new_zeros(self.k.shape[0], n, self.k.shape[-1])
        self.v_tile = self.v.new_zeros(self.v.shape[0], n, self.v.shape[-1])
        return self.k_tile, self.v_tile

    def _flush(self) -> None:
        if self.keys is not None:
            self.k[:, self.keys], self.v[:, self.keys] = self.k_tile, self.v_tile

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        """(dQ, dK, dV), each as its input."""
        self._flush()
        self.keys = None
        return torch.cat(self.q, 1) if self.q else self.k.new_zeros(self.q_shape), self.k, self.v


TileStep = Callable[[int, slice, slice, Hidden], tuple[Tensor, Callable[[Tensor], Tensor]]]
"""``step(chunk index, rows, keys, hidden) -> (u, vjp)``: a tile's weights u (batch*heads, rows, keys) and the map
from g = dL/du (in a score block) to dL/dt."""


def tiled_backward(
    qkv: tuple[Tensor, Tensor, Tensor],
    grad_out: Tensor,
    chunks: list[Any],
    width: int,
    blocks: ScoreBlocks,
    step: TileStep,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dQ, dK, dV) of a tiled attention (``engines/elementwise.py``, ``engines/rowtiles.py``): tiles of ``width``
    keys outside, the ``chunks`` (rows, end, hidden) of queries inside, so that a key tile's dK and dV stay in cache
    while every chunk adds to them. Per tile, ``step`` recomputes the weights and this adds dV += u^T dO,
    dQ += dt K and dK += dt^T Q, with g = dO V^T in score block 1."""
    q, k, v = qkv
    grads = TileGrads(q, k, v, [rows for rows, _, _ in chunks])
    for start in range(0, max((end for _, end, _ in chunks), default=0), width):
        grad_k, grad_v = grads.key_tile(start, width)
        for i, ((rows, end, diagonal), grad_q) in enumerate(zip(chunks, grads.q)):
            if end <= start:
                continue
            keys, hidden = tile_keys(diagonal, start, width, end)
            n_keys = keys.stop - keys.start
            q_c, k_t, v_t, d_out = q[:, rows], k[:, keys], v[:, keys], grad_out[:, rows]
            u, vjp = step(i, rows, keys, hidden)
            add_product_(grad_v[:, :n_keys], u.transpose(-2, -1), d_out)
            dt = vjp(torch.bmm(d_out, v_t.transpose(-2, -1), out=blocks.get(1, rows.stop - rows.start, n_keys)))
            grad_q.baddbmm_(dt, k_t)
            add_product_(grad_k[:, :n_keys], dt.transpose(-2, -1), q_c)
    return grads.result()
