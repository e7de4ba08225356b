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

from axiomformer.engines.autograd import differentiable_backward
from axiomformer.engines.base import EngineBase
from axiomformer.engines.plan import DEFAULT_BUDGET, Plan, ProblemKind, closed_form_chunk, plain_dot
from axiomformer.engines.problem import AttentionProblem, causal_mask, fill_hidden_, query_chunks

KINDS = ("sigmoid", "relu")
"""The normalizers this engine has a hand-written closed form for (accepted by name: a new elementwise choice needs
its own formula here before this engine may run it)."""


def _counts(rows: int, start: int, offset: int, causal: bool, k_len: int, like: Tensor) -> Tensor:
    """n_i, the keys visible to each query of the chunk, (rows, 1); 1 for a row with none (its weights are 0)."""
    if causal:
        n = (torch.arange(rows, device=like.device, dtype=like.dtype) + (offset + start + 1)).clamp(1, k_len)
    else:
        n = torch.full((rows,), float(k_len), device=like.device, dtype=like.dtype)
    return n.view(-1, 1)


class _Chunk:
    """One chunk of queries: rows ``start:stop`` (absolute positions ``offset + start ..``) and their visible keys."""

    def __init__(self, rows: slice, end: int, diagonal, offset: int, causal: bool, k_len: int, like: Tensor):
        self.rows, self.end, self.diagonal = rows, end, diagonal
        self.n = _counts(rows.stop - rows.start, rows.start, offset, causal, k_len, like)

    def mask_(self, w: Tensor) -> Tensor:
        """Zero the weights of keys after each query's diagonal, in place (only the diagonal block is touched)."""
        return fill_hidden_(w, self.diagonal, 0.0)


def _query_operand(q_c: Tensor, kind: str, chunk: _Chunk) -> Tensor:
    """Queries of a chunk as they enter the score product: relu(s) / n = relu(s / n) for n > 0, so relu divides the
    rows of q by n_i before the matmul (one pass per block fewer); sigmoid subtracts log n_i after it (a column
    [-log n_i] in q, with [1] in k, made the 65-wide products 20% slower at 2 threads)."""
    return q_c / chunk.n if kind == "relu" else q_c


def _chunk_weights(q_c: Tensor, k_c: Tensor, kind: str, chunk: _Chunk) -> Tensor:
    """u (batch*heads, rows, end) from the chunk's query operand and the keys, computed in place."""
    w = torch.bmm(q_c, k_c.transpose(-2, -1))
    w = w.sub_(chunk.n.log()).sigmoid_() if kind == "sigmoid" else w.relu_()
    return chunk.mask_(w)


def exact_elementwise(q: Tensor, k: Tensor, v: Tensor, kind: str, causal: bool, offset: int) -> Tensor:
    """The same output in plain tensor ops (the formula the second-order gradients differentiate)."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    n = _counts(q_len, 0, offset, causal, k_len, q)
    s = torch.bmm(q, k.transpose(-2, -1))
    w = torch.sigmoid(s - n.log()) if kind == "sigmoid" else torch.relu(s) / n
    if causal:
        w = w.masked_fill(~causal_mask(q_len, k_len, offset, q.device), 0.0)
    return torch.bmm(w, v)


def _chunks(q_len: int, size: int, offset: int, causal: bool, k_len: int, like: Tensor):
    for rows, end, diagonal in query_chunks(q_len, size, offset, causal, k_len, like.device):
        yield _Chunk(rows, end, diagonal, offset, causal, k_len, like)


class ElementwiseAttention(torch.autograd.Function):
    """y = u(q k^T) v for an elementwise normalizer, chunked over queries, with a recomputing closed-form backward.

    Inputs are (batch*heads, seq, head_dim) (3-d, so that the chunk products are single ``bmm``/``baddbmm`` calls).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, kind: str, causal: bool, offset: int, size: int) -> Tensor:
        k_len = k.shape[-2]
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        for c in _chunks(q.shape[-2], size, offset, causal, k_len, q):
            w = _chunk_weights(_query_operand(q[:, c.rows], kind, c), k[:, : c.end], kind, c)
            out[:, c.rows] = torch.bmm(w, v[:, : c.end])
        ctx.save_for_backward(q, k, v)
        ctx.kind, ctx.causal, ctx.offset, ctx.size = kind, causal, offset, size
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v = ctx.saved_tensors
        kind = ctx.kind
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            grads = differentiable_backward(
                lambda q, k, v: exact_elementwise(q, k, v, kind, ctx.causal, ctx.offset),
                (q, k, v),
                grad_out,
                ctx.needs_input_grad[:3],
            )
            return (*grads, None, None, None, None)
        grad_out = grad_out.contiguous()
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for c in _chunks(q.shape[-2], ctx.size, ctx.offset, ctx.causal, k.shape[-2], q):
            q_c, k_c, v_c, g = q[:, c.rows], k[:, : c.end], v[:, : c.end], grad_out[:, c.rows]
            w = _chunk_weights(_query_operand(q_c, kind, c), k[:, : c.end], kind, c)
            grad_v[:, : c.end] += torch.bmm(w.transpose(-2, -1), g)  # one batched call (a strided baddbmm_ loops)
            if kind == "sigmoid":
                grad_s = torch.bmm(g, v_c.transpose(-2, -1))  # dL/du
                grad_s.mul_(w.addcmul_(w, w, value=-1.0))  # dL/du * u (1 - u)
            else:
                # relu: u = relu(s / n), du/ds = [u > 0] / n; the 1/n_i is applied to the rows of dL/dy first.
                grad_s = torch.bmm(g / c.n, v_c.transpose(-2, -1))
                grad_s.mul_(w.sign_())  # [u > 0] (u >= 0); also 0 at masked keys
            grad_q[:, c.rows] = torch.bmm(grad_s, k_c)
            grad_k[:, : c.end] += torch.bmm(grad_s.transpose(-2, -1), q_c)
        return grad_q, grad_k, grad_v, None, None, None, None


def elementwise_attention(plan: Plan, problem: AttentionProblem, chunk: int) -> Tensor:
    """Output (batch, heads, q_len, head_dim_v) of a problem :class:`ElementwiseEngine` accepts."""
    scale = problem.scale
    q = problem.q * (scale.to(problem.q.dtype) if isinstance(scale, Tensor) else scale)
    batch, heads = q.shape[0], q.shape[1]
    q3, k3, v3 = (
        torch.broadcast_to(t, (batch, heads) + t.shape[2:]).reshape((batch * heads,) + t.shape[2:])
        for t in (q, problem.k, problem.v)
    )
    out = ElementwiseAttention.apply(q3, k3, v3, plan.kind, problem.causal, problem.q_offset, chunk)
    return out.view(batch, heads, *out.shape[1:])


class ElementwiseEngine(EngineBase):
    """Sigmoid and relu attention with dot scores in chunks of queries, with the recomputing closed-form backward.

    Declines while ``torch.compile`` traces (its Python loop over query chunks would compile a graph per length).
    """

    name = "elementwise"

    def __init__(self, memory_budget: int = DEFAULT_BUDGET):
        self.memory_budget = memory_budget

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return plan.kind in KINDS and plain_dot(plan, kind) and not kind.compiling

    def __call__(self, plan: Plan, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, None]:
        return elementwise_attention(plan, problem, closed_form_chunk(problem, self.memory_budget, blocks=1)), None
