"""The elementwise engine: normalizers whose weight u_ij depends on s_ij and n_i alone (trait ``elementwise``), in
chunks of queries, with a recomputing backward.

For an ``elementwise`` normalizer (``axes/normalizer.py``: ``impl(s, n) -> u``, applied entry by entry) with dot
scores, proportional contributions and no mask other than the causal one, the weights of query i depend only on its
own scores and n_i, its number of visible keys:

    u_ij = f(s_ij, n_i)        e.g. sigmoid: sigmoid(s_ij - log n_i), relu: relu(s_ij) / n_i
    y_i = sum_j u_ij v_j,      s_ij = q_i . k_j  (q already scaled)

so the backward needs no stored score block: it recomputes s and u for one chunk of queries at a time and applies
du/ds, an elementwise factor (flash-attention's recomputation strategy, Dao et al. 2022, sec. 3.1, without the fused
kernel): with the trait ``closed_grad`` the choice's in-place forms ``extra["impl_"](s, n)`` and
``extra["grad_"](u, n, g)`` (sigmoid: du/ds = u (1 - u); relu: [u > 0] / n), 3 elementwise passes over a score block
forward and about 5 backward, against the dozen of autograd through ``normalize`` under ``torch.utils.checkpoint``
**(our choice)**; without it the choice's ``impl`` and autograd of it on the chunk, exact since the Jacobian of an
elementwise map is diagonal. The score blocks of a call are allocated once and reused chunk after chunk, and dK,
dV accumulate transposed (as ``engines/rowwise.py``). The engine names no choice: a normalizer another package registers with the trait
``elementwise`` runs here too. It is tested against the reference engine forward and backward like every engine
(``tests/test_engine_matrix.py``), and a plugged-in normalizer in ``tests/test_engine_plugins.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from torch import Tensor

from axiomformer.axes.registry import Choice
from axiomformer.engines.autograd import RecomputingFunction, keep_for_backward
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.blocks import (
    Hidden,
    ScoreBlocks,
    flat_heads,
    tile_budget,
    tile_keys,
    tile_shape,
    tiled_backward,
)
from axiomformer.engines.plan import Plan, ProblemKind, plain_dot
from axiomformer.engines.problem import AttentionProblem, causal_mask, fill_hidden_, query_chunks

COMPUTES = Computes(
    all_of={"normalizer": {"elementwise"}, "score": {"plain_dot"}, "contribution": {"proportional"}},
    # impl(s, n) receives no options or parameters, and a chunk of queries cannot hold column sums.
    none_of={"normalizer": {"parametric", "configured", "random", "halves", "columns"}},
)
"""What the engine computes: any ``elementwise`` normalizer with plain dot scores (see the module docstring)."""


def _counts(rows: int, start: int, offset: int, causal: bool, k_len: int, like: Tensor) -> Tensor:
    """n_i, the keys visible to each query of the chunk, (rows, 1); 1 for a row with none (its weights are 0)."""
    if causal:
        n = (torch.arange(rows, device=like.device, dtype=like.dtype) + (offset + start + 1)).clamp(1, k_len)
    else:
        n = torch.full((rows,), float(k_len), device=like.device, dtype=like.dtype)
    return n.view(-1, 1)


class _Chunk:
    """One chunk of queries: rows ``start:stop`` (absolute positions ``offset + start ..``), the keys 0..end - 1 they
    read and n_i, split into tiles of keys by :meth:`tiles`."""

    def __init__(self, rows: slice, end: int, diagonal: Hidden, n: Tensor):
        self.rows, self.end, self.diagonal, self.n = rows, end, diagonal, n
        self.size = rows.stop - rows.start

    def tiles(self, width: int) -> Iterator[tuple[slice, Hidden]]:
        """The chunk's tiles of ``width`` keys and the keys each hides (:func:`~axiomformer.engines.blocks.tile_keys`)."""
        for start in range(0, self.end, width):
            yield tile_keys(self.diagonal, start, width, self.end)

    def weights(self, s: Tensor, choice: Choice, hidden: Hidden) -> Tensor:
        """u (batch*heads, rows, keys) from a tile's scores (overwritten with a ``closed_grad`` choice), 0 at the
        keys ``hidden``."""
        impl = choice.extra["impl_"] if "closed_grad" in choice.traits else choice.implementation()
        return fill_hidden_(impl(s, self.n), hidden, 0.0)

    def grad(self, s: Tensor, u: Tensor, choice: Choice, grad_u: Tensor, hidden: Hidden) -> Tensor:
        """dL/ds of a tile from its scores s (before ``weights`` ran), weights u and dL/du, 0 at the keys
        ``hidden``; may overwrite u and dL/du."""
        grad_u = fill_hidden_(grad_u, hidden, 0.0)
        if "closed_grad" in choice.traits:
            return choice.extra["grad_"](u, self.n, grad_u)
        impl = choice.implementation()
        with torch.enable_grad():  # the Jacobian of an elementwise map is diagonal: one VJP per tile is exact
            leaf = s.detach().requires_grad_()
            (grad_s,) = torch.autograd.grad(impl(leaf, self.n), leaf, grad_u)
        return grad_s


def exact_elementwise(q: Tensor, k: Tensor, v: Tensor, choice: Choice, causal: bool, offset: int) -> Tensor:
    """The same output in plain tensor ops, from the registry's ``impl`` (what second-order gradients
    differentiate)."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    w = choice.implementation()(torch.bmm(q, k.transpose(-2, -1)), _counts(q_len, 0, offset, causal, k_len, q))
    if causal:
        w = w.masked_fill(~causal_mask(q_len, k_len, offset, q.device), 0.0)
    return torch.bmm(w, v)


def _chunks(q_len: int, size: int, offset: int, causal: bool, k_len: int, like: Tensor) -> list[_Chunk]:
    return [
        _Chunk(rows, end, diagonal, _counts(rows.stop - rows.start, rows.start, offset, causal, k_len, like))
        for rows, end, diagonal in query_chunks(q_len, size, offset, causal, k_len, like.device)
    ]


class ElementwiseAttention(RecomputingFunction):
    """y = u(q k^T) v for an elementwise normalizer ``choice``, in tiles of queries x keys, with a recomputing
    backward.

    Inputs are (batch*heads, seq, head_dim) (3-d, so that the tile products are single ``bmm`` calls).
    """

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, choice: Choice, causal: bool, offset: int, budget: int
    ) -> Tensor:
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        size, width = tile_shape(q.shape[0], q.shape[-2], budget)
        chunks = _chunks(q.shape[-2], size, offset, causal, k.shape[-2], q)
        blocks = ScoreBlocks(q, size, width)
        for c in chunks:
            acc = q.new_zeros(q.shape[0], c.size, v.shape[-1])  # contiguous: one batched baddbmm_ per tile
            for keys, hidden in c.tiles(width):
                s = torch.bmm(
                    q[:, c.rows], k[:, keys].transpose(-2, -1), out=blocks.get(0, c.size, keys.stop - keys.start)
                )
                acc.baddbmm_(c.weights(s, choice, hidden), v[:, keys])
            out[:, c.rows] = acc
        ctx.choice, ctx.causal, ctx.offset, ctx.budget = choice, causal, offset, budget
        keep_for_backward(
            ctx,
            (q, k, v),
            partial(exact_elementwise, choice=choice, causal=causal, offset=offset),
            _elementwise_backward,
        )
        return out


def _elementwise_backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
    """:class:`ElementwiseAttention`'s first-order backward: tile by tile (``blocks.tiled_backward``)."""
    choice, (q, k, v) = ctx.choice, ctx.saved_tensors
    size, width = tile_shape(q.shape[0], q.shape[-2], ctx.budget)
    chunks = _chunks(q.shape[-2], size, ctx.offset, ctx.causal, k.shape[-2], q)
    blocks = ScoreBlocks(q, size, width)

    def step(i: int, rows: slice, keys: slice, hidden: Hidden) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        c = chunks[i]
        s = torch.bmm(q[:, rows], k[:, keys].transpose(-2, -1), out=blocks.get(0, c.size, keys.stop - keys.start))
        w = c.weights(s if "closed_grad" in choice.traits else s.clone(), choice, hidden)  # autograd re-reads s
        return w, lambda grad_u: c.grad(s, w, choice, grad_u, hidden)

    spans = [(c.rows, c.end, c.diagonal) for c in chunks]
    return *tiled_backward((q, k, v), grad_out, spans, width, blocks, step), *(None,) * 4


def elementwise_attention(plan: Plan, problem: AttentionProblem, budget: int | None = None) -> Tensor:
    """Output (batch, heads, q_len, head_dim_v) of a problem :class:`ElementwiseEngine` accepts, in tiles of at most
    ``budget`` score elements over batch*heads (:func:`~axiomformer.engines.blocks.tile_shape`; None:
    :func:`~axiomformer.engines.blocks.tile_budget`)."""
    scale = problem.scale
    q = problem.q * (scale.to(problem.q.dtype) if isinstance(scale, Tensor) else scale)
    (batch, heads), q3, k3, v3 = flat_heads(q, problem.k, problem.v)
    out = ElementwiseAttention.apply(
        q3, k3, v3, plan.normalizer_choice, problem.causal, problem.q_offset, budget or tile_budget()
    )
    return out.view(batch, heads, *out.shape[1:])


class ElementwiseEngine(EngineBase):
    """Elementwise normalizers (sigmoid, relu, and any choice with the trait) with dot scores, in tiles of queries x
    keys, with the recomputing backward; ``memory_budget``: the elements of one score tile over batch*heads (None:
    :func:`~axiomformer.engines.blocks.tile_budget` at each call).

    Declines while ``torch.compile`` traces (its Python loop over query chunks would compile a graph per length).
    """

    name = "elementwise"
    computes = COMPUTES

    def __init__(self, memory_budget: int | None = None):
        self.memory_budget = memory_budget

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return plain_dot(plan, kind) and not kind.compiling

    def __call__(self, plan: Plan, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, None]:
        return elementwise_attention(plan, problem, self.memory_budget), None
