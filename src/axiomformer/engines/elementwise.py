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

from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
from torch import Tensor

from axiomformer.axes.registry import Choice
from axiomformer.engines.autograd import graph_backward
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.blocks import ScoreBlocks, transposed_grad_buffers
from axiomformer.engines.plan import DEFAULT_BUDGET, Plan, ProblemKind, closed_form_chunk, plain_dot
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
    """One chunk of queries: rows ``start:stop`` (absolute positions ``offset + start ..``) and their visible keys."""

    def __init__(
        self,
        rows: slice,
        end: int,
        diagonal: tuple[int, Tensor] | None,
        offset: int,
        causal: bool,
        k_len: int,
        like: Tensor,
    ):
        self.rows, self.end, self.diagonal = rows, end, diagonal
        self.size = rows.stop - rows.start
        self.n = _counts(rows.stop - rows.start, rows.start, offset, causal, k_len, like)

    def weights(self, s: Tensor, choice: Choice) -> Tensor:
        """u (batch*heads, rows, end) from the chunk's scores (overwritten with a ``closed_grad`` choice), 0 after
        each query's diagonal."""
        impl = choice.extra["impl_"] if "closed_grad" in choice.traits else choice.implementation()
        return fill_hidden_(impl(s, self.n), self.diagonal, 0.0)

    def grad(self, s: Tensor, u: Tensor, choice: Choice, grad_u: Tensor) -> Tensor:
        """dL/ds of the chunk from its scores s (before ``weights`` ran), weights u and dL/du, 0 at the hidden keys;
        may overwrite u and dL/du."""
        grad_u = fill_hidden_(grad_u, self.diagonal, 0.0)
        if "closed_grad" in choice.traits:
            return choice.extra["grad_"](u, self.n, grad_u)
        impl = choice.implementation()
        with torch.enable_grad():  # the Jacobian of an elementwise map is diagonal: one VJP per chunk is exact
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


def _chunks(q_len: int, size: int, offset: int, causal: bool, k_len: int, like: Tensor) -> Iterator[_Chunk]:
    for rows, end, diagonal in query_chunks(q_len, size, offset, causal, k_len, like.device):
        yield _Chunk(rows, end, diagonal, offset, causal, k_len, like)


class ElementwiseAttention(torch.autograd.Function):
    """y = u(q k^T) v for an elementwise normalizer ``choice``, chunked over queries, with a recomputing backward.

    Inputs are (batch*heads, seq, head_dim) (3-d, so that the chunk products are single ``bmm`` calls).
    """

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, choice: Choice, causal: bool, offset: int, size: int
    ) -> Tensor:
        k_len = k.shape[-2]
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        blocks = ScoreBlocks(q, min(size, q.shape[-2]), k_len)
        for c in _chunks(q.shape[-2], size, offset, causal, k_len, q):
            s = torch.bmm(q[:, c.rows], k[:, : c.end].transpose(-2, -1), out=blocks.get(0, c.size, c.end))
            out[:, c.rows] = torch.bmm(c.weights(s, choice), v[:, : c.end])
        ctx.save_for_backward(q, k, v)
        ctx.choice, ctx.causal, ctx.offset, ctx.size = choice, causal, offset, size
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        choice = ctx.choice
        exact = partial(exact_elementwise, choice=choice, causal=ctx.causal, offset=ctx.offset)
        if (graphed := graph_backward(ctx, exact, grad_out)) is not None:
            return graphed
        q, k, v = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        # dK and dV are added in place by baddbmm_ into the strided slice (rows of stride k_len): 1.8 ms where a
        # product into a block and an add took 2.6 ms
        grad_q, grad_kt, grad_vt = transposed_grad_buffers(q, k, v)
        blocks = ScoreBlocks(q, min(ctx.size, q.shape[-2]), k.shape[-2])
        for c in _chunks(q.shape[-2], ctx.size, ctx.offset, ctx.causal, k.shape[-2], q):
            q_c, k_c, v_c, g = q[:, c.rows], k[:, : c.end], v[:, : c.end], grad_out[:, c.rows]
            s = torch.bmm(q_c, k_c.transpose(-2, -1), out=blocks.get(0, c.size, c.end))
            w = c.weights(s if "closed_grad" in choice.traits else s.clone(), choice)  # autograd's path re-reads s
            grad_vt[..., : c.end].baddbmm_(g.transpose(-2, -1), w)
            grad_s = c.grad(s, w, choice, torch.bmm(g, v_c.transpose(-2, -1), out=blocks.get(1, c.size, c.end)))
            grad_q[:, c.rows] = torch.bmm(grad_s, k_c)
            grad_kt[..., : c.end].baddbmm_(q_c.transpose(-2, -1), grad_s)
        del blocks
        return grad_q, grad_kt.transpose(-2, -1).contiguous(), grad_vt.transpose(-2, -1).contiguous(), *(None,) * 4


def elementwise_attention(plan: Plan, problem: AttentionProblem, chunk: int) -> Tensor:
    """Output (batch, heads, q_len, head_dim_v) of a problem :class:`ElementwiseEngine` accepts."""
    scale = problem.scale
    q = problem.q * (scale.to(problem.q.dtype) if isinstance(scale, Tensor) else scale)
    batch, heads = q.shape[0], q.shape[1]
    q3, k3, v3 = (
        torch.broadcast_to(t, (batch, heads) + t.shape[2:]).reshape((batch * heads,) + t.shape[2:])
        for t in (q, problem.k, problem.v)
    )
    out = ElementwiseAttention.apply(q3, k3, v3, plan.normalizer_choice, problem.causal, problem.q_offset, chunk)
    return out.view(batch, heads, *out.shape[1:])


class ElementwiseEngine(EngineBase):
    """Elementwise normalizers (sigmoid, relu, and any choice with the trait) with dot scores, in chunks of queries,
    with the recomputing backward.

    Declines while ``torch.compile`` traces (its Python loop over query chunks would compile a graph per length).
    """

    name = "elementwise"
    computes = COMPUTES

    def __init__(self, memory_budget: int = DEFAULT_BUDGET):
        self.memory_budget = memory_budget

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return plain_dot(plan, kind) and not kind.compiling

    def __call__(self, plan: Plan, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, None]:
        return elementwise_attention(plan, problem, closed_form_chunk(problem, self.memory_budget, blocks=1)), None
