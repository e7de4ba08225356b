"""The chunked engine: every spec without the (q_len x k_len) score matrix in memory, forward or backward.

It computes exactly what ``engines/reference.py`` computes, one block at a time:

- **row-wise normalizers** (softmax, gumbel_softmax, sparsemax, entmax15, linear) need a whole row of scores, so the
  queries are split into chunks of ``cq`` rows; each chunk scores its keys, normalizes, and contributes;
- **elementwise normalizers** (sigmoid, relu) also split each chunk's keys into blocks of ``ck`` and sum the blocks'
  contributions; their n_i (keys visible to query i) is counted from the mask beforehand;
- **pairwise scores and contributions** (``score=additive|mlp``, ``contribution=joint``) materialize
  (cq, ck, hidden) per block, so both the queries and the keys are split.

With a causal mask, a query chunk only reads the keys it can see (``j <= q_offset + last query``).
Each query chunk runs under ``torch.utils.checkpoint`` (non-reentrant): the forward keeps only the chunk's inputs and
the backward recomputes one chunk at a time, so peak memory is O(cq x k_len) rather than O(q_len x k_len)
**(our choice: recomputation instead of a hand-written backward, so that every score, normalizer and contribution
module is differentiated by autograd exactly as in the reference)**.

Sigmoid and relu with dot scores, proportional contributions and at most a causal mask have engines of their own
(``engines/elementwise.py``), and so have sparsemax and entmax15 (``engines/sparse.py``); the router tries them first.

The block sizes come from ``memory_budget`` (float32 elements of one score block, summed over batch and heads) unless
``query_chunk``/``key_chunk`` are set (tests set them small to exercise the chunk boundaries).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
from collections.abc import Iterable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from axiomformer.axes.normalizer import normalize
from axiomformer.axes.position import alibi_bias
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.plan import DEFAULT_BUDGET, REFERENCE_MAX_ELEMENTS, Plan, ProblemKind
from axiomformer.engines.problem import AttentionProblem, block_mask, causal_key_end, row_scale, slice_block
from axiomformer.engines.reference import contribute, scaled_scores
from axiomformer.precision import compute_dtype

__all__ = ["DEFAULT_BUDGET", "REFERENCE_MAX_ELEMENTS", "ChunkedEngine", "attend_chunk", "chunked_attention"]

SORTING_SHARE = 4
"""Normalizers that sort each row (trait ``sorting``: values and int64 indices, several temporaries) get 1 / 4 of the
budget per query chunk."""


# ---------------------------------------------------------------------------------------------- blocks of a problem
def block_bias(problem: AttentionProblem, qs: slice, ks: slice) -> Tensor | None:
    """``problem.full_bias()[..., qs, ks]`` (user bias plus ALiBi), built one block at a time."""
    bias = slice_block(problem.bias, qs, ks)
    if problem.alibi_slopes is not None:
        alibi = alibi_bias(problem.alibi_slopes, problem.q_positions[qs], problem.k_positions[ks], problem.causal)
        bias = alibi if bias is None else bias + alibi
    return bias


def _blocks(length: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, length)) for start in range(0, length, size)]


def _key_blocks(problem: AttentionProblem, qs: slice, k_end: int, size: int) -> list[slice]:
    """Blocks of ``size`` keys, split where the causal mask starts to matter for the query chunk ``qs``, so that the
    blocks left of the diagonal need no mask at all."""
    if not problem.causal:
        return _blocks(k_end, size)
    split = min(k_end, max(0, problem.q_offset + qs.start + 1))  # keys every query of the chunk may see
    return _blocks(split, size) + [slice(split + b.start, split + b.stop) for b in _blocks(k_end - split, size)]


# ---------------------------------------------------------------------------------------------- one query chunk
def _scores(parts: Plan, problem: AttentionProblem, q: Tensor, k: Tensor, qs: slice, ks: slice) -> Tensor:
    """Scaled and biased scores (or, for ``normalizer="linear"``, the kernel) of one block, as the reference."""
    return scaled_scores(parts, q, k, row_scale(problem.scale, qs), block_bias(problem, qs, ks))


def _visible_count(problem: AttentionProblem, qs: slice, k_end: int, key_chunk: int) -> Tensor | None:
    """n_i, the number of keys query i may attend to, (batch|1, heads|1, len(qs), 1) float; None without a mask."""
    if problem.mask is None and not problem.causal and not problem.window:
        return None
    total: Tensor | int = 0
    for ks in _blocks(k_end, key_chunk):
        mask = block_mask(problem, qs, ks)
        total = total + (ks.stop - ks.start if mask is None else mask.sum(-1, keepdim=True))
    if not isinstance(total, Tensor):
        total = torch.tensor(float(total), device=problem.q.device).view(1, 1, 1, 1)
    # A row with no visible key is normalized over every key, then zeroed, as in ``normalize``.
    return torch.where(total > 0, total, problem.k_len).to(compute_dtype(problem.q.dtype))


def _dropout(weights: Tensor, problem: AttentionProblem) -> Tensor:
    if problem.training and problem.dropout_p > 0:
        return F.dropout(weights, p=problem.dropout_p)
    return weights


def _summed(parts: Iterable[Tensor]) -> Tensor:
    # Left to right, one block's contribution at a time (at most one block's output alive besides the sum).
    return functools.reduce(operator.add, parts)


def _elementwise_chunk(
    parts: Plan, problem: AttentionProblem, q: Tensor, k: Tensor, v: Tensor, qs: slice, key_chunk: int
) -> Tensor:
    # An elementwise normalizer needs no row sum: one key block at a time, with n_i counted over the whole row.
    k_end = k.shape[-2]
    counted = _visible_count(problem, qs, k_end, key_chunk)
    n_visible = (
        counted
        if counted is not None
        else torch.full((1, 1, 1, 1), float(problem.k_len), device=q.device, dtype=compute_dtype(q.dtype))
    )

    def block_output(ks: slice) -> Tensor:
        weights = normalize(
            _scores(parts, problem, q, k[..., ks, :], qs, ks),
            block_mask(problem, qs, ks),
            parts.normalizer_choice,
            training=problem.training,
            n_visible=n_visible,
        )
        return contribute(parts.contribution, _dropout(weights, problem), v[..., ks, :])

    return _summed(map(block_output, _key_blocks(problem, qs, k_end, key_chunk)))


def attend_chunk(
    parts: Plan,
    problem: AttentionProblem,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    qs: slice,
    key_chunk: int,
    params: dict | None = None,
) -> Tensor:
    """Output rows ``qs`` (batch, heads, len(qs), head_dim_v) in max(v dtype, float32) from the keys ``k``/``v`` (the
    first k_end ones); ``params``: the normalizer's (default: read from ``parts`` now)."""
    kind = parts.normalizer_choice
    k_end = k.shape[-2]
    blocks = _blocks(k_end, key_chunk)
    if "elementwise" in parts.normalizer_traits:
        return _elementwise_chunk(parts, problem, q, k, v, qs, key_chunk)
    if len(blocks) == 1:
        scores = _scores(parts, problem, q, k, qs, blocks[0])
    else:
        scores = torch.cat([_scores(parts, problem, q, k[..., ks, :], qs, ks) for ks in blocks], dim=-1)
    weights = normalize(
        scores,
        block_mask(problem, qs, slice(0, k_end)),
        kind,
        training=problem.training,
        params=parts.normalizer_params() if params is None else params,
    )
    weights = _dropout(weights, problem)
    if parts.proportional or len(blocks) == 1:
        return contribute(parts.contribution, weights, v)
    return _summed(contribute(parts.contribution, weights[..., ks], v[..., ks, :]) for ks in blocks)


# ---------------------------------------------------------------------------------------------- the engine
class _CastParameters(nn.Module):
    """``module`` computed with its floating parameters cast to ``dtype`` once, at construction.

    Every block of a chunked problem then reads the same cast tensors, so autograd sums the blocks' gradients in
    ``dtype`` and casts the sum back to the parameter's own dtype once. Casting in every block instead (what
    ``call_in`` does for a module whose parameters are in another dtype) rounds each block's gradient to bfloat16 or
    float16 before the sum: with a few blocks that loses most of a small gradient. ``module`` is held, not registered,
    so its parameters stay the caller's."""

    inner: nn.Module  # set with object.__setattr__, so that it is not registered

    def __init__(self, module: nn.Module, dtype: torch.dtype):
        super().__init__()
        object.__setattr__(self, "inner", module)
        self.cast = {name: p.to(dtype) for name, p in module.named_parameters() if p.is_floating_point()}

    def forward(self, *args: Tensor) -> Tensor:
        return torch.func.functional_call(self.inner, self.cast, args)


def _floating_to(value: Any, dtype: torch.dtype) -> Any:
    return value.to(dtype) if isinstance(value, Tensor) and value.is_floating_point() else value


def _in_compute_dtype(
    parts: Plan, problem: AttentionProblem, k: Tensor, v: Tensor, params: dict
) -> tuple[Plan, AttentionProblem, Tensor, Tensor, dict]:
    """The problem with q, k, v, a tensor scale or bias, the normalizer's parameters and the score's and
    contribution's parameters cast once to the dtypes every block computes in (max(input dtype, float32), as the
    reference engine): the same forward, bit for bit, and low-precision gradients summed over blocks in float32."""
    scores_dtype = compute_dtype(problem.q.dtype, k.dtype)
    values_dtype = compute_dtype(scores_dtype, v.dtype)
    tensors = [problem.q, k, v, *parts.parameters(), *(p for p in params.values() if isinstance(p, Tensor))]
    if all(t.dtype in (scores_dtype, values_dtype) for t in tensors if t.is_floating_point()):
        return parts, problem, k, v, params
    # A copy with the two modules swapped, not dataclasses.replace: that would resolve the plan again (registry
    # look-ups, a pair width read from the wrapped module) for what is the same plan in another dtype.
    cast_parts = copy.copy(parts)
    object.__setattr__(cast_parts, "score_fn", _CastParameters(parts.score_fn, scores_dtype))
    object.__setattr__(cast_parts, "contribution", _CastParameters(parts.contribution, values_dtype))
    k, v = k.to(scores_dtype), v.to(values_dtype)
    cast_problem = dataclasses.replace(
        problem,
        q=problem.q.to(scores_dtype),
        k=k,
        v=v,
        scale=_floating_to(problem.scale, scores_dtype),
        bias=_floating_to(problem.bias, scores_dtype),
    )
    cast_params = {name: _floating_to(value, scores_dtype) for name, value in params.items()}
    return cast_parts, cast_problem, k, v, cast_params


def chunked_attention(
    parts: Plan, problem: AttentionProblem, k: Tensor, v: Tensor, query_chunk: int, key_chunk: int
) -> Tensor:
    """Attention output (batch, heads, q_len, head_dim_v) in v's dtype, ``query_chunk`` queries at a time, each
    checkpointed. Inputs and parameters are cast to the compute dtype once, before the problem is split."""
    out_dtype = v.dtype
    needs_grad = torch.is_grad_enabled() and (
        problem.q.requires_grad
        or k.requires_grad
        or v.requires_grad
        or any(p.requires_grad for p in parts.parameters())
        or (isinstance(problem.scale, Tensor) and problem.scale.requires_grad)
        or (isinstance(problem.bias, Tensor) and problem.bias.requires_grad)
    )
    parts, problem, k, v, params = _in_compute_dtype(parts, problem, k, v, parts.normalizer_params())
    q = problem.q
    outs = []
    for qs in _blocks(problem.q_len, query_chunk):
        k_end = causal_key_end(qs.start, qs.stop, problem.q_offset, problem.causal, problem.k_len)
        # The normalizer's parameters are read once, here, not again when the checkpoint recomputes: under
        # torch.func.functional_call (a layer run in a promoted dtype) the module holds other tensors by then.
        fn = partial(attend_chunk, parts, problem, qs=qs, key_chunk=key_chunk, params=params)
        args = (q[..., qs, :], k[..., :k_end, :], v[..., :k_end, :])
        outs.append(checkpoint(fn, *args, use_reentrant=False) if needs_grad else fn(*args))
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)).to(out_dtype)


class ChunkedEngine(EngineBase):
    """Any spec, in blocks of queries (and keys) small enough for ``memory_budget``.

    Declines while ``torch.compile`` traces: its Python loop over query chunks would compile a graph per length (the
    reference engine runs the problem then).

    Args:
        memory_budget: float32 elements of one (batch, heads, query chunk, key block[, hidden]) block.
        query_chunk, key_chunk: fixed block sizes instead of the budget's (``None`` = from the budget).
    """

    name = "chunked"
    # A ``columns`` normalizer (sinkhorn) couples every query of a head: a chunk of queries cannot be normalized
    # alone, so it runs on the reference engine, which holds the whole matrix.
    computes = Computes(none_of={"normalizer": {"columns"}})

    def __init__(
        self, memory_budget: int = DEFAULT_BUDGET, query_chunk: int | None = None, key_chunk: int | None = None
    ):
        self.memory_budget = memory_budget
        self.query_chunk = query_chunk
        self.key_chunk = key_chunk

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return not kind.compiling

    def worthwhile(self, plan: Plan, kind: ProblemKind) -> bool:
        """Whether automatic routing should chunk this problem.

        False when the whole (batch, heads, q_len, k_len[, hidden]) block has at most ``REFERENCE_MAX_ELEMENTS``
        elements (``kind.large``): the reference engine then computes the same thing in one pass, without the
        recomputation that chunking costs in the backward (at the sizes of the study's runs that is 2-4x faster)
        **(our choice)**. Always True with fixed chunk sizes (tests set them to exercise the boundaries).
        """
        return bool(self.query_chunk or self.key_chunk or kind.large)

    def chunk_sizes(self, plan: Plan, problem: AttentionProblem) -> tuple[int, int]:
        """(query chunk, key block) for this problem."""
        rows = problem.q.shape[0] * problem.q.shape[1]
        budget = self.memory_budget // (SORTING_SHARE if "sorting" in plan.normalizer_traits else 1)
        cq = self.query_chunk or max(1, min(problem.q_len, budget // max(1, rows * problem.k_len)))
        ck = self.key_chunk or max(1, min(problem.k_len, self.memory_budget // max(1, rows * cq * plan.pair_width)))
        return cq, ck

    def __call__(self, plan: Plan, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, None]:
        cq, ck = self.chunk_sizes(plan, problem)
        return chunked_attention(plan, problem, problem.k, problem.v, cq, ck), None
