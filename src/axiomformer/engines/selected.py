"""The selected engine: a selection's kept keys gathered, and the softmax taken over them alone.

A selection (``axes/select.py``: MoBA's block means, DeepSeek-V3.2's indexer, NSA's compressed blocks) keeps a few
keys per query; as a mask over every key (what the other engines run) it costs O(q_len x k_len) time and memory for
a handful of kept keys. Here the selection is computed a chunk of queries at a time
(:meth:`~axiomformer.axes.select.Selection.keys`: the kept keys as indices, exactly the mask's True entries), and
each query's kept keys and values are gathered, so that the attention itself is

    y_i = sum_{t in S_i} softmax_t(s q_i . k_{j_t}) v_{j_t},     S_i the kept keys visible to query i

(Lu et al. 2025, MoBA, arXiv:2502.13189, eq. 1-2; Yuan et al. 2025, NSA, arXiv:2502.11089, eq. 5 (the selection
branch); DeepSeek-AI 2025, DeepSeek-V3.2-Exp, eq. 2), O(q_len |S| head_dim) in time and memory; only the selection
score reads every candidate, a chunk at a time. The backward recomputes each chunk's gathered keys and softmax from
the saved indices (flash-attention's recomputation, Dao et al. 2022, sec. 3.1) and scatters dL/dk and dL/dv with
``index_add_``; under ``create_graph=True`` it differentiates the same formula written in plain tensor ops
(``engines/autograd.py``).

Keys hidden by the causal rule or a key mask are dropped after the selection, as the mask form ANDs them; a query
that keeps no visible key gets a zero row, as the router gives it elsewhere. The engine reads traits only: a
selection (trait ``blocks`` or ``tokens``), a softmax normalizer, plain dot scores, a proportional contribution; no
float bias, ALiBi, window (refused by the spec anyway), dropout or a mask that depends on the query (those go to the
mask form). It is routed a problem only with its selection left lazy (``attend(select=...)``, which ``Attention``
passes when nothing before the engine reads the mask: ``ProblemKind.select``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from axiomformer.engines.autograd import graph_grads
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.blocks import flat_heads
from axiomformer.engines.plan import DEFAULT_BUDGET, Plan, ProblemKind
from axiomformer.engines.problem import AttentionProblem

SELECT_BUDGET = 4 * DEFAULT_BUDGET
"""Elements of one chunk's selection scores (32 MiB in float32) **(our choice: at L = 4096, 8 heads, the indexer's
4 index heads hold 4 elements per pair while computed; 2^21 elements made chunks of 16 queries, whose Python overhead
cost more than the scores)**."""

GATHERED = 4
"""A group's gathered keys (or values) hold at most 1 / this of the budget's elements **(our choice: 8 MiB in
float32 at the default budget; gathers into fresh tensors beyond glibc's 32 MiB mmap threshold paid their page
faults on every call, 3x the time per entry)**."""

COMPUTES = Computes(
    all_of={"score": {"plain_dot"}, "contribution": {"proportional"}},
    any_of={"normalizer": {"softmax", "softmax_in_eval"}, "select": {"blocks", "tokens"}},
)
"""What the engine computes: a selection by blocks or tokens, weighted by a softmax of plain dot scores."""


@dataclass(frozen=True)
class Picked:
    """A group of queries and the keys each keeps: ``flat`` (..., n) int64 indices into the keys flattened to
    (batch*heads*k_len, head_dim) and ``visible`` (..., n) bool (kept and visible: entries not visible get weight 0
    whatever they point to). ``rows`` a slice: a chunk, the rows ``rows`` of every (batch*heads) query sequence,
    ``flat`` (batch*heads, rows, n); or a tensor (R,) of rows of the queries flattened to (batch*heads*q_len, .),
    ``flat`` (R, n): the rows of a chunk that keep many keys (ties), padded to the most any of them keeps, which come
    after their chunk (where they see no key) and overwrite its rows."""

    rows: slice | Tensor
    flat: Tensor
    visible: Tensor

    def queries(self, q: Tensor) -> Tensor:
        """The group's queries (..., head_dim) of q (batch*heads, q_len, head_dim)."""
        if isinstance(self.rows, slice):
            return q[:, self.rows]
        return q.reshape(-1, q.shape[-1]).index_select(0, self.rows)

    def write(self, out: Tensor, rows: Tensor) -> None:
        """Set the group's rows of ``out`` (batch*heads, q_len, width) to ``rows`` (..., width)."""
        if isinstance(self.rows, slice):
            out[:, self.rows] = rows
        else:
            out.view(-1, out.shape[-1]).index_copy_(0, self.rows, rows)

    def gathered(self, x2: Tensor) -> Tensor:
        """The group's kept rows (..., n, width) of keys or values flattened to (batch*heads*k_len, width)."""
        return x2.index_select(0, self.flat.view(-1)).view(*self.flat.shape, x2.shape[-1])


FEW_KEYS = 16
"""Kept keys per row up to which a weighted sum of gathered rows is a product and a sum, beyond which a batched
matmul **(our choice: with 6 keys of 64 dims a (1 x 6) @ (6 x 64) matmul per query took 1.1 ms where multiplying and
summing took 0.6 ms, and with 255 keys 1.8 ms against 22 ms)**."""


def _mix(weights: Tensor, rows: Tensor) -> Tensor:
    """sum_t weights[..., t] rows[..., t, :]: (..., n) and (..., n, width) -> (..., width)."""
    if weights.shape[-1] <= FEW_KEYS:
        return (weights.unsqueeze(-1) * rows).sum(-2)
    return torch.matmul(weights.unsqueeze(-2), rows).squeeze(-2)


def _weights(q_rows: Tensor, keys: Tensor, group: Picked) -> Tensor:
    """Softmax weights (..., n) of the queries (..., head_dim), already scaled, over their gathered keys (..., n,
    head_dim); a row with no visible key gets weights 0 (exp(-inf - 0))."""
    s = torch.matmul(keys, q_rows.unsqueeze(-1)).squeeze(-1)
    s.masked_fill_(~group.visible, float("-inf"))
    top = s.amax(-1, keepdim=True)
    e = s.sub_(top.masked_fill_(top == float("-inf"), 0.0)).exp_()
    return e.div_(e.sum(-1, keepdim=True).clamp_min_(1.0))  # a row with a key sums to >= 1 (its max is e^0)


def exact_selected(q: Tensor, k: Tensor, v: Tensor, groups: list[Picked], scale: float) -> Tensor:
    """The same output in plain differentiable tensor ops (what second-order gradients differentiate): q, k, v
    (batch*heads, seq, head_dim)."""
    k2, v2 = k.reshape(-1, k.shape[-1]), v.reshape(-1, v.shape[-1])
    out = q.new_zeros(q.shape[:-1] + (v.shape[-1],))
    for group in groups:
        s = torch.matmul(group.gathered(k2), (group.queries(q) * scale).unsqueeze(-1)).squeeze(-1)
        s = s.masked_fill(~group.visible, float("-inf"))
        top = s.amax(-1, keepdim=True).detach()
        e = torch.exp(s - top.masked_fill(top == float("-inf"), 0.0))
        rows = _mix(e / e.sum(-1, keepdim=True).clamp_min(1.0), group.gathered(v2))
        if isinstance(group.rows, slice):
            out = torch.cat([out[:, : group.rows.start], rows, out[:, group.rows.stop :]], dim=1)
        else:
            out = out.reshape(-1, out.shape[-1]).index_copy(0, group.rows, rows).view_as(out)
    return out


class SelectedAttention(torch.autograd.Function):
    """y_i = softmax over the kept visible keys of query i, times their values (module docstring), group by group
    (:class:`Picked`), with a recomputing backward. q, k, v are (batch*heads, seq, head_dim); ``scale`` multiplies
    q . k."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, groups: list[Picked], scale: float) -> Tensor:
        k2, v2 = k.reshape(-1, k.shape[-1]), v.reshape(-1, v.shape[-1])
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        for group in groups:
            p = _weights(group.queries(q) * scale, group.gathered(k2), group)
            group.write(out, _mix(p, group.gathered(v2)))
        ctx.save_for_backward(q, k, v)
        ctx.groups, ctx.scale = groups, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            return graph_grads(ctx, partial(exact_selected, groups=ctx.groups, scale=ctx.scale), (q, k, v), grad_out, 2)
        k2, v2 = k.reshape(-1, k.shape[-1]), v.reshape(-1, v.shape[-1])
        grad_q, grad_k2, grad_v2 = torch.empty_like(q), torch.zeros_like(k2), torch.zeros_like(v2)
        for group in ctx.groups:
            q_rows, keys = group.queries(q) * ctx.scale, group.gathered(k2)
            p = _weights(q_rows, keys, group)
            g = group.queries(grad_out)
            dp = torch.matmul(group.gathered(v2), g.unsqueeze(-1)).squeeze(-1)  # dL/dp_t = g . v_t
            ds = p * (dp - (p * dp).sum(-1, keepdim=True))  # the softmax's VJP
            group.write(grad_q, _mix(ds, keys).mul_(ctx.scale))
            flat = group.flat.view(-1)
            grad_k2.index_add_(0, flat, (ds.unsqueeze(-1) * q_rows.unsqueeze(-2)).view(-1, k.shape[-1]))
            grad_v2.index_add_(0, flat, (p.unsqueeze(-1) * g.unsqueeze(-2)).view(-1, v.shape[-1]))
        return grad_q, grad_k2.view_as(k), grad_v2.view_as(v), None, None


class SelectedEngine(EngineBase):
    """Selections (trait ``blocks`` or ``tokens``) with a softmax of plain dot scores: the kept keys gathered per
    query, O(q_len x kept keys) attention (module docstring).

    Args:
        memory_budget: elements of one chunk's selection scores (:data:`SELECT_BUDGET`); the gathered keys and
            values of a chunk are held within it too.
    """

    name = "selected"
    computes = COMPUTES
    selects = True
    """It computes a lazy selection itself (``attend(select=...)``); the router materializes it for other engines."""

    def __init__(self, memory_budget: int = SELECT_BUDGET):
        self.memory_budget = memory_budget

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return (
            kind.select
            and plan.softmax_like(kind.training)
            and not plan.spec.softcap
            and kind.mask in ("none", "key")
            and not kind.bias
            and kind.alibi == "none"
            and not kind.dropout
            and not kind.window
            and kind.dtype in (torch.float32, torch.float64)
            and not kind.compiling  # its Python loop over query chunks would compile a graph per length
        )

    def __call__(self, plan: Plan, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, None]:
        """Output (batch, heads, q_len, head_dim_v) of a problem it accepts (``problem.select`` a
        :class:`~axiomformer.axes.select.Selection`)."""
        q, scale = problem.q, problem.scale
        if isinstance(scale, Tensor):  # a learned or per-row scale: folded into q, autograd carries its gradient
            q, scale = q * scale.to(q.dtype), 1.0
        (batch, heads), q3, k3, v3 = flat_heads(q, problem.k, problem.v)
        groups = picked_groups(plan, problem, (batch, heads), self.memory_budget)
        out = SelectedAttention.apply(q3, k3, v3, groups, float(scale))
        return out.view(batch, heads, *out.shape[1:]), None


def picked_groups(plan: Plan, problem: AttentionProblem, lead: tuple[int, int], budget: int) -> list[Picked]:
    """Each chunk of queries with its kept visible keys, then the rows that keep many keys (:class:`Picked`):
    chunks whose selection scores fit ``budget`` elements (``Selection.span``) and whose gathered keys and values
    do too.

    Raises:
        ValueError: a selection computed for other batch and head sizes than the problem's.
    """
    selection, (batch, heads) = problem.select, lead
    kept_per_query = plan.spec.select_topk * plan.spec.select_block  # ties may keep more: the chunk holds them
    width = max(problem.k.shape[-1], problem.v.shape[-1])
    gathered_rows = max(1, budget // GATHERED // (batch * heads * kept_per_query * width))
    key_flags = _key_flags(problem, batch, heads)
    groups: list[Picked] = []
    pairs: list[tuple[Tensor, Tensor]] = []
    start = 0
    while start < problem.q_len:
        stop = min(selection.span(start, budget), start + gathered_rows)
        kept = selection.keys(start, stop)
        if kept.picks.shape[:2] != (batch, heads):
            raise ValueError(f"a selection of {tuple(kept.picks.shape[:2])} (batch, heads) for a problem of {lead}")
        positions = torch.arange(start, stop, device=kept.picks.device) + problem.q_offset
        base = (torch.arange(batch * heads, device=kept.picks.device) * problem.k_len).view(batch, heads, 1, 1)
        flat = kept.picks + base
        visible = _visible(problem, flat, kept.picks, kept.kept, positions.view(-1, 1), key_flags=key_flags)
        groups.append(Picked(slice(start, stop), flat.flatten(0, 1), visible.flatten(0, 1)))
        if kept.rows.numel():  # rows flat over (batch, heads, chunk rows)
            head, row = kept.rows // (stop - start), kept.rows % (stop - start)
            flat_keys = head * problem.k_len + kept.cols
            visible = _visible(problem, flat_keys, kept.cols, None, positions[row], key_flags=key_flags)
            pairs.append(((head * problem.q_len + start + row)[visible], flat_keys[visible]))
        start = stop
    if pairs:
        groups += _wide(torch.cat([r for r, _ in pairs]), torch.cat([k for _, k in pairs]), budget // GATHERED // width)
    return groups


def _visible(
    problem: AttentionProblem,
    flat: Tensor,
    index: Tensor,
    kept: Tensor | None,
    positions: Tensor,
    *,
    key_flags: Tensor | None,
) -> Tensor:
    """Which kept keys (key positions ``index``, flat indices ``flat``; every one where ``kept`` is None) the
    causal rule (the queries at ``positions``, broadcastable) and a key mask leave visible."""
    visible = torch.ones_like(index, dtype=torch.bool) if kept is None else kept
    if problem.causal:  # key j is hidden from the query at position p when j > p
        visible = visible & (index <= positions)
    if key_flags is not None:
        visible = visible & key_flags[flat]
    return visible


WIDE_BUCKETS = 2.0
"""The rows that keep many keys are grouped by how many they keep, each group padded to its most: within a factor
of this, so that the padding is at most that share **(our choice: one group per power of 2)**."""


def _wide(rows: Tensor, keys: Tensor, most: int) -> list[Picked]:
    """The visible (query, key) pairs of the rows that keep many keys (flat indices, each row's pairs together), as
    :class:`Picked` groups of rows that keep about as many (:data:`WIDE_BUCKETS`), padded, of at most ``most``
    entries (or one row)."""
    distinct, counts = torch.unique_consecutive(rows, return_counts=True)
    if not distinct.numel():
        return []
    slot = torch.arange(rows.numel(), device=rows.device) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    bucket = torch.floor(torch.log2(counts.double()) / torch.log2(torch.tensor(WIDE_BUCKETS, dtype=torch.float64)))
    groups = []
    for level in torch.unique(bucket).tolist():
        lines = (bucket == level).nonzero().squeeze(-1)  # this group's rows among ``distinct``
        line_of = torch.full_like(distinct, -1)
        line_of[lines] = torch.arange(lines.numel(), device=rows.device)
        line = torch.repeat_interleave(line_of, counts)
        inside = line >= 0
        flat = keys.new_zeros(lines.numel(), int(counts[lines].max()))
        visible = torch.zeros(flat.shape, dtype=torch.bool, device=flat.device)
        flat[line[inside], slot[inside]], visible[line[inside], slot[inside]] = keys[inside], True
        step = max(1, most // flat.shape[1])
        groups += [
            Picked(distinct[lines[i : i + step]], flat[i : i + step], visible[i : i + step])
            for i in range(0, lines.numel(), step)
        ]
    return groups


def _key_flags(problem: AttentionProblem, batch: int, heads: int) -> Tensor | None:
    """A key-only mask (batch|1, heads|1, 1, k_len) as flat (batch*heads*k_len,) flags, or None without a mask."""
    if problem.mask is None:
        return None
    flags = torch.broadcast_to(problem.mask[..., 0, :], (batch, heads, problem.k_len))
    return flags.reshape(-1)
