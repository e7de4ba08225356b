"""What every engine receives: one attention problem in (batch, heads, seq, head_dim) layout, and the one policy for
blocked keys, empty rows and non-finite keys.

Policy (applied by :func:`axiomformer.engines.attend`, so every engine sees the same problem):

- a key is *blocked* for a query when the bool mask says False, the causal rule hides it, or a float mask holds a value
  at or below its dtype's minimum (``masks.prepare_masks`` turns those into False);
- a query with no visible key gets an all-zero output row (finite gradients everywhere);
- a key whose key or value holds NaN/inf is computed as zeros, and exactly the outputs that may see it are set to NaN,
  so a NaN in a blocked token never reaches another token's output or, through ``0 * NaN``, its gradient.

None of it reads a value back to the host where that costs anything: the checks are tensor ops whose result is
applied with ``torch.where`` (no graph break under ``torch.compile``, no wait on a GPU queue). On the CPU outside
``torch.compile``, where a read is free, the cleaning is skipped when no key is non-finite (no copies of k and v).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

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


def window_mask(
    q_len: int, k_len: int, q_offset: int, window: int, causal: bool, device: torch.device | None = None
) -> Tensor:
    """Bool (q_len, k_len), True = inside the sliding window of ``window`` keys.

    Query i sits at position p_i = q_offset + i. Causal: key j is inside iff p_i - window < j (with the causal rule
    j <= p_i that makes the ``window`` most recent keys, the query's own included); not causal: iff |p_i - j| < window.
    The same absolute positions as the KV cache, so decoding step by step gives the rows of the full computation.
    """
    i = torch.arange(q_len, device=device).unsqueeze(-1) + q_offset
    j = torch.arange(k_len, device=device).unsqueeze(0)
    return (j > i - window) if causal else ((j - i).abs() < window)


def visible_range(
    q_len: int, k_len: int, q_offset: int, window: int, causal: bool, device: torch.device | None = None
) -> tuple[Tensor, Tensor]:
    """(first, stop), each (q_len,) int64: the keys first..stop - 1 that the causal rule and the window leave visible
    to each query (first >= stop when none), clamped to 0..k_len."""
    p = torch.arange(q_len, device=device) + q_offset
    first = (p - window + 1) if window else torch.zeros_like(p)
    last = p if causal else ((p + window - 1) if window else torch.full_like(p, k_len - 1))
    return first.clamp(0, k_len), (last + 1).clamp(0, k_len)


def count_in_range(flags: Tensor, first: Tensor, stop: Tensor) -> Tensor:
    """(..., q_len) int: how many of ``flags`` (..., k_len) bool lie in first..stop - 1 of each query (one cumsum,
    no (q_len x k_len) tensor, no Python loop over the length)."""
    sums = torch.cumsum(flags.to(torch.int32), dim=-1)
    sums = torch.cat([torch.zeros_like(sums[..., :1]), sums], dim=-1)  # sums[..., j] = flags[:j]
    return (sums[..., stop] - sums[..., first]).clamp_min(0)


def _key_flags(mask: Tensor | None) -> Tensor | None:
    """A key-only bool mask (..., 1, k_len) as (batch|1, heads|1, k_len)."""
    if mask is None:
        return None
    mask = mask if mask.dim() == 4 else mask.view((1,) * (4 - mask.dim()) + mask.shape)
    return mask[..., 0, :]


@dataclass(frozen=True)
class KeyVisibility:
    """Which of ``k_len`` keys each of ``q_len`` queries may attend to: ``mask`` (bool, True = may attend,
    broadcastable to (batch, heads, q_len, k_len), or None), the bottom-right causal rule j <= q_offset + i when
    ``causal``, and the sliding ``window`` (0 = every key), each only where given; tensors are made on ``device``.

    The three are kept apart so that the questions below are answered without building their (q_len x k_len)
    combination where the mask depends on the key only.
    """

    q_len: int
    k_len: int
    mask: Tensor | None = None
    causal: bool = False
    q_offset: int = 0
    window: int = 0
    device: torch.device | None = None

    def key_range(self) -> tuple[Tensor, Tensor]:
        """(first, stop), each (q_len,) int64: the keys the causal rule and the window leave (:func:`visible_range`)."""
        return visible_range(self.q_len, self.k_len, self.q_offset, self.window, self.causal, self.device)

    def rows_without_keys(self) -> Tensor | None:
        """(batch|1, heads|1, q_len) bool marking queries with no visible key, or None when every query has one.

        A row is empty when no unmasked key lies in its visible range (:meth:`key_range`), one cumsum over a
        key-only mask; a mask that depends on the query is combined with the rules and scanned.
        """
        mask = self.mask
        if mask is None and not self.window and (not self.causal or self.q_offset >= 0):
            return None
        if mask is None or mask.shape[-2] == 1:
            first, stop = self.key_range()
            keep = _key_flags(mask)
            if keep is None:
                return (first >= stop).view(1, 1, -1)
            return count_in_range(keep, first, stop) == 0
        return ~self._combined().any(-1)

    def counts(self) -> Tensor:
        """n_i, the number of keys query i may attend to, float32 (batch|1, heads|1, q_len, 1); closed form without
        a mask and window (no (q_len x k_len) temporary)."""
        if self.mask is None and not self.window:
            if self.causal:
                n = (torch.arange(self.q_len, device=self.device) + self.q_offset + 1).clamp(0, self.k_len)
            else:
                n = torch.full((self.q_len,), self.k_len, device=self.device)
            return n.float().view(1, 1, -1, 1)
        visible = self._combined()
        return torch.broadcast_to(visible, visible.shape[:2] + (self.q_len, self.k_len)).sum(-1, keepdim=True).float()

    def _combined(self) -> Tensor:
        """bool (batch|1, heads|1, q_len|1, k_len): the mask and the causal and window rules, whichever apply."""
        visible = None
        if self.window:
            visible = window_mask(self.q_len, self.k_len, self.q_offset, self.window, self.causal, self.device)
        if self.causal:
            c = causal_mask(self.q_len, self.k_len, self.q_offset, self.device)
            visible = c if visible is None else visible & c
        if self.mask is not None:
            visible = self.mask if visible is None else self.mask & visible
        assert visible is not None  # the callers have a mask, a causal rule or a window
        return visible if visible.dim() == 4 else visible.view((1,) * (4 - visible.dim()) + visible.shape)


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
        scale: the temperature multiplying the scores: a float or a tensor broadcastable to (batch, heads, 1, 1).
        window: sliding window of keys (see :func:`window_mask`), not folded into ``mask``; 0 = every key.
        transport: the :class:`~axiomformer.axes.transport.TransportGates` over the key positions of a plan with a
            transport, or None.
        select: the :class:`~axiomformer.axes.select.Selection` of a plan with a selection, left for the engine to
            compute (not folded into ``mask``), or None; only engines with ``selects = True`` are routed it.
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
    scale: Any = 1.0
    window: int = 0
    transport: Any = None
    select: Any = None

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
        if self.window:
            w = window_mask(self.q_len, self.k_len, self.q_offset, self.window, self.causal, self.q.device)
            mask = w if mask is None else mask & w
        return mask

    def full_bias(self) -> Tensor | None:
        """The float bias with ALiBi folded in, broadcastable to (batch, heads, q_len, k_len), or None."""
        bias = self.bias
        if self.alibi_slopes is not None:
            alibi = alibi_bias(self.alibi_slopes, self.q_positions, self.k_positions, self.causal)
            bias = alibi if bias is None else bias + alibi
        return bias

    @property
    def visibility(self) -> KeyVisibility:
        """Which keys each query may attend to: ``mask``, ``causal`` and ``window`` kept apart."""
        return KeyVisibility(self.q_len, self.k_len, self.mask, self.causal, self.q_offset, self.window, self.q.device)

    def rows_without_keys(self) -> Tensor | None:
        """(batch|1, heads|1, q_len) bool marking queries with no visible key (see
        :meth:`KeyVisibility.rows_without_keys`)."""
        return self.visibility.rows_without_keys()


# ---------------------------------------------------------------------------------------------- query chunks
def per_row_scale(scale: object) -> TypeGuard[Tensor]:
    """The scale differs between queries (``scale=log_n``: a (batch|1, heads, q_len, 1) tensor with q_len > 1)."""
    return isinstance(scale, Tensor) and scale.dim() >= 2 and scale.shape[-2] != 1


def row_scale(scale: float | Tensor, qs: slice) -> float | Tensor:
    """The scale of the queries ``qs``: a per-row scale sliced, anything else as it is."""
    return scale[..., qs, :] if per_row_scale(scale) else scale


def causal_key_end(start: int, stop: int, offset: int, causal: bool, k_len: int) -> int:
    """Keys read by the queries start..stop - 1: with a causal mask, up to the last one visible to query stop - 1."""
    return min(k_len, max(1, offset + stop)) if causal else k_len


def causal_diagonal(
    start: int, stop: int, end: int, offset: int, causal: bool, device: torch.device | None = None
) -> tuple[int, Tensor] | None:
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


def fill_hidden_(x: Tensor, diagonal: tuple[int, Tensor] | None, value: float) -> Tensor:
    """Set the keys a causal chunk hides (``diagonal``, from :func:`causal_diagonal`) to ``value`` in x (..., rows,
    keys), in place: only the diagonal block is touched, the keys before it are visible to every row."""
    if diagonal is not None:
        first, hidden = diagonal
        x[..., first : first + hidden.shape[-1]].masked_fill_(hidden, value)
    return x


def query_chunks(
    q_len: int, size: int, offset: int, causal: bool, k_len: int, device: torch.device | None = None
) -> Iterator[tuple[slice, int, tuple[int, Tensor] | None]]:
    """(rows, end, diagonal) for each chunk of ``size`` queries: its rows, the keys 0..end - 1 it reads
    (:func:`causal_key_end`) and its hidden keys (:func:`causal_diagonal`), for the engines that loop over queries."""
    for start in range(0, q_len, size):
        stop = min(start + size, q_len)
        end = causal_key_end(start, stop, offset, causal, k_len)
        yield slice(start, stop), end, causal_diagonal(start, stop, end, offset, causal, device)


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
        causal = causal_mask(
            qs.stop - qs.start, ks.stop - ks.start, problem.q_offset + qs.start - ks.start, problem.q.device
        )
        mask = causal if mask is None else mask & causal
    if problem.window:
        offset = problem.q_offset + qs.start - ks.start
        band = window_mask(
            qs.stop - qs.start, ks.stop - ks.start, offset, problem.window, problem.causal, problem.q.device
        )
        mask = band if mask is None else mask & band
    return mask


def nonfinite_keys(k: Tensor, v: Tensor) -> Tensor:
    """(batch, heads, k_len) bool marking keys whose key or value holds NaN/inf (a tensor op, no host sync).

    One reduction per tensor: a NaN or inf in a row makes its sum non-finite. Finite entries so large that their sum
    overflows (|x| near 1e38 in float32) are marked too; such keys give non-finite scores anyway."""
    return ~torch.isfinite(k.sum(-1) + v.sum(-1))


def nonfinite_hits(problem: AttentionProblem, bad: Tensor, chunk: int = 256) -> Tensor:
    """(batch, heads, q_len, 1) bool: queries that may attend to a non-finite key.

    Key-only masks (and none) need one (batch, heads, k_len) scan: a query sees a bad key iff one lies in its visible
    range (:func:`count_in_range`). Masks that depend on the query are scanned ``chunk`` queries at a time in eager
    mode, so no (q_len x k_len) mask beyond the user's own is held (in one block while ``torch.compile`` traces: a
    Python loop over the length would compile a graph per length).
    """
    batch, heads = max(bad.shape[0], problem.q.shape[0]), max(bad.shape[1], problem.q.shape[1])
    mask = problem.mask
    if mask is None or mask.shape[-2] == 1:
        keep = _key_flags(mask)
        seen = torch.broadcast_to(bad if keep is None else bad & keep, (batch, heads, problem.k_len))
        first, stop = problem.visibility.key_range()
        return (count_in_range(seen, first, stop) > 0).unsqueeze(-1)
    # While torch.compile traces, one block of every query: a Python range over the length would specialise it.
    spans = (
        [slice(0, problem.q_len)]
        if torch.compiler.is_compiling()
        else [slice(s, min(s + chunk, problem.q_len)) for s in range(0, problem.q_len, max(1, chunk))]
    )
    hits = []
    for qs in spans:
        block = block_mask(problem, qs, slice(0, problem.k_len))
        seen = bad.unsqueeze(-2) if block is None else block & bad.unsqueeze(-2)
        seen = torch.broadcast_to(seen, (batch, heads, qs.stop - qs.start, problem.k_len))
        hits.append(seen.any(-1, keepdim=True))
    if not hits:
        return bad.new_zeros(batch, heads, 0, 1)
    return hits[0] if len(hits) == 1 else torch.cat(hits, dim=-2)


def clean_nonfinite(problem: AttentionProblem) -> tuple[Tensor, Tensor, Tensor | None]:
    """k and v with the keys that hold a non-finite entry zeroed, and the (batch, heads, k_len) bool marking them
    (None, with k and v themselves, when a free read shows that no key is non-finite).

    A blocked key must contribute exactly 0 forward and backward, and 0 * NaN is NaN (weights times values, and the
    score gradient times the keys in dL/dq). ``torch.where`` keeps only the bool condition for the backward, so in a
    model, where nothing else holds the uncleaned tensors, this costs no memory (the bench, whose inputs are leaves,
    holds both).
    """
    bad = nonfinite_keys(problem.k, problem.v)
    if _reads_are_free(problem.k) and not bool(bad.any()):
        return problem.k, problem.v, None  # nothing to clean: no copies of k and v
    keep = ~bad.unsqueeze(-1)
    return torch.where(keep, problem.k, 0.0), torch.where(keep, problem.v, 0.0), bad


def _reads_are_free(t: Tensor) -> bool:
    """Reading a value back costs nothing: a CPU tensor (no asynchronous queue to wait for) outside
    ``torch.compile`` (where a read would break the graph). On other devices the checks stay tensor ops."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def poison_rows(out: Tensor, problem: AttentionProblem, bad: Tensor | None) -> Tensor:
    """NaN in the output rows (batch, heads, q_len, head_dim) of queries that may see a non-finite key ``bad``
    (None: no key is non-finite)."""
    if bad is None:
        return out
    return out.masked_fill(nonfinite_hits(problem, bad), float("nan"))


def zero_rows_without_keys(out: Tensor, problem: AttentionProblem) -> Tensor:
    """Zeros in the output rows (batch, heads, q_len, head_dim) of queries with no visible key."""
    empty = problem.rows_without_keys()
    return out if empty is None else out.masked_fill(empty.unsqueeze(-1), 0.0)
