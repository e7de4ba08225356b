"""The rowwise engine: normalizers with a closed-form backward (trait ``closed_vjp``), and logit soft-capping, in
chunks of queries, with a recomputing backward.

For dot scores, proportional contributions and no mask other than the causal one, the weights of query i are a
function of its row of logits alone:

    z_i = scale_i q_i K^T                 (a per-row scale, ``scale=log_n``, folds into q)
    t_i = c tanh(z_i / c)                 (``softcap`` = c > 0, Gemma 2; else t = z), keys after the causal limit
                                           -> -inf
    u_i = kernel(t_i)                     (the normalizer's row kernel, ``engines/rowkernels.py``)
    y_i = u_i V

Softmax (with or without the cap) and softpick run in tiles of queries x keys with a running maximum
(``engines/rowtiles.py``, the kernels' ``tiled``); the other kernels as follows. The forward keeps
q, k, v and y, never the weights. The backward recomputes one chunk of weights at a time
(flash-attention's recomputation strategy, Dao et al. 2022, sec. 3.1, without the fused kernel) and applies the
kernel's closed-form vector-Jacobian product with g = dO V^T and delta_i = sum_j u_ij g_ij = dO_i . y_i, then the
cap's dt/dz = 1 - (t / c)^2: dQ = dz K, dK += dz^T Q, dV += u^T dO. That is 2 matrix products forward and 5 backward,
as in flash-attention. The score blocks of one call are allocated once and reused chunk after chunk (``ScoreBlocks``), and
the kernels work in place in them: at L = 4096 (8 MiB blocks) the allocations and the passes over memory, not the
arithmetic, made the difference to SDPA **(our choice)**. A backward with ``create_graph=True`` differentiates the
registry's formula in plain tensor ops (``engines/autograd.py``). Tested against the reference engine forward and
backward by the generated equivalence matrix (``tests/test_engine_matrix.py``), like every engine, with a planted
wrong backward per kernel and a planted wrong cap slope.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor

from axiomformer.engines.autograd import RecomputingFunction, keep_for_backward
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.blocks import ScoreBlocks, flat_heads, tile_budget, transposed_grad_buffers
from axiomformer.engines.plan import DEFAULT_BUDGET, Plan, ProblemKind, closed_form_chunk
from axiomformer.engines.problem import AttentionProblem, causal_mask, fill_hidden_, query_chunks
from axiomformer.engines.rowkernels import StickBreaking, TopK, reads_options, row_kernel
from axiomformer.engines.rowtiles import TiledRowAttention

SIGMOID_CAP_MAX = 64.0
"""Largest cap computed as 2c sigmoid(2z / c) (- c) rather than c tanh(z / c). The two are equal, and sigmoid took
0.12 ms where tanh took 1.2 ms on one 8 MiB block; but 2 sigmoid - 1 has an absolute error of about c eps near 0
where tanh's is eps |t|. Softmax depends on absolute logit differences, so c eps (at most 64 float32 ulps of 1, 4e-6,
for c <= 64) is its error either way; every other kernel takes tanh: softpick and power are nearly scale invariant
for small logits, where c eps becomes a relative error (2e-2 in float32 at logits of 1e-4), and top-k's selection
jumps with the last bit of a logit near the cap **(our choice)**."""


class _Row:
    """How to turn a chunk of queries into weights and back: the cap, the blocking of hidden keys and the kernel."""

    def __init__(self, plan: Plan):
        choice = plan.normalizer_choice
        self.choice, self.options = choice, plan.options
        self.kernel = row_kernel(choice, plan.options)
        self.cap = float(plan.spec.softcap)
        kernel = self.kernel
        self.sigmoid_cap = 0 < self.cap <= SIGMOID_CAP_MAX and kernel.shift_invariant and not kernel.selects
        self.top = int(self.options.get("k", 1)) if type(kernel) is TopK and not self.cap else 0
        """k of top-k without a cap (the selected path: :class:`_Selected`), else 0."""
        self.band = type(kernel) is StickBreaking
        """Stick-breaking: a chunk reads only the keys before its last ones whose stick is not used up (:func:`_band`)."""

    def logits(
        self, q_c: Tensor, k_c: Tensor, diagonal: tuple[int, Tensor] | None, out: Tensor, slope: Tensor | None = None
    ) -> Tensor:
        """The capped logits t of the chunk in ``out``, hidden keys -inf; with a cap and ``slope``, dt/dz there."""
        if not self.cap:
            return fill_hidden_(torch.bmm(q_c, k_c.transpose(-2, -1), out=out), diagonal, float("-inf"))
        if not self.sigmoid_cap:
            t = torch.bmm(q_c * (1.0 / self.cap), k_c.transpose(-2, -1), out=out).tanh_()
            if slope is not None:
                torch.addcmul(torch.ones((), dtype=t.dtype), t, t, value=-1.0, out=slope)  # 1 - tanh^2
            return fill_hidden_(t.mul_(self.cap), diagonal, float("-inf"))
        s = torch.bmm(q_c * (2.0 / self.cap), k_c.transpose(-2, -1), out=out).sigmoid_()
        if slope is not None:
            torch.addcmul(s, s, s, value=-1.0, out=slope).mul_(4.0)  # 1 - tanh^2 = 4 s (1 - s)
        s.mul_(2.0 * self.cap)
        return fill_hidden_(s, diagonal, float("-inf"))  # 2c sigmoid: the -c is a shift softmax ignores

    @property
    def late_slope(self) -> bool:
        """The cap's slope is recomputed from t after the VJP (in t's block) rather than kept in a block of its
        own: the kernel leaves t intact."""
        return bool(self.cap) and self.kernel.keeps_logits

    @property
    def logit_range(self) -> tuple[float, float] | None:
        """(lowest, highest) a visible logit can be: [-c, c] under a cap c (computed as c tanh), [0, 2c] (as 2c
        sigmoid); None without a cap."""
        if not self.cap:
            return None
        return (0.0, 2.0 * self.cap) if self.sigmoid_cap else (-self.cap, self.cap)

    def exact(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, offset: int) -> Tensor:
        """:func:`exact_rowwise` of this row."""
        return exact_rowwise(q, k, v, self, causal, offset)

    def slope_(self, t: Tensor, diagonal: tuple[int, Tensor] | None) -> Tensor:
        """dt/dz from the capped logits t, in place (0 at hidden keys)."""
        if not self.sigmoid_cap:
            slope = t.div_(self.cap).square_().neg_().add_(1.0)  # 1 - tanh^2
        else:
            s = t.div_(2.0 * self.cap)  # the sigmoid
            slope = s.sub_(s * s).mul_(4.0)  # 4 s (1 - s)
        return fill_hidden_(slope, diagonal, 0.0)


def exact_rowwise(q: Tensor, k: Tensor, v: Tensor, row: _Row, causal: bool, offset: int) -> Tensor:
    """The same output in plain tensor ops, from the registry's ``impl`` (what second-order gradients
    differentiate)."""
    z = torch.bmm(q, k.transpose(-2, -1))
    if row.cap:
        z = row.cap * torch.tanh(z / row.cap)
    if causal:
        z = z.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], offset, q.device), float("-inf"))
    return torch.bmm(row.choice.implementation()(z, False, **row.options), v)


class _Selected:
    """Top-k's chunk on its k selected keys only (uncapped): from the chunk's logits t, ``torch.topk`` with one key
    more than k tells whether the k-th largest logit is tied with the next (then the chunk takes the dense path,
    which keeps every tied key, as the registry's formula); otherwise the weights are the softmax of the k largest
    logits and the output, and in the backward every product, reads k rows of K and V per query: the backward
    recomputes no score block and makes no (chunk x keys) product, where SDPA's makes five.

    ``index`` (batch*heads, rows, k) are the selected keys; a row with fewer than k visible keys selects hidden ones
    too, which get weight 0 (their logits are -inf).
    """

    def __init__(self, index: Tensor, rows: slice, causal: bool, offset: int) -> None:
        self.index, self.rows, self.causal, self.offset = index, rows, causal, offset

    @staticmethod
    def find(t: Tensor, k: int, rows: slice, causal: bool, offset: int) -> _Selected | None:
        """The selection of a chunk's logits t (hidden keys -inf), or None where the k-th logit of a row is tied."""
        end = t.shape[-1]
        if k >= end:
            index = torch.arange(end, device=t.device).expand(t.shape)
            return _Selected(index, rows, causal, offset)
        values, index = t.topk(k + 1, dim=-1)
        kth, after = values[..., k - 1], values[..., k]
        if bool(((kth == after) & torch.isfinite(after)).any()):
            return None
        return _Selected(index[..., :k], rows, causal, offset)

    def gather(self, x: Tensor) -> Tensor:
        """The selected rows of x (batch*heads, keys, width): (batch*heads, rows, k, width)."""
        bh, keys, width = x.shape
        flat = (self.index + (torch.arange(bh, device=x.device) * keys).view(bh, 1, 1)).view(-1)
        return x.reshape(-1, width).index_select(0, flat).view(*self.index.shape, width)

    def weights(self, q_c: Tensor, keys: Tensor) -> Tensor:
        """Softmax over the selected logits q_i . k_j (hidden keys -inf)."""
        logits = torch.matmul(keys, q_c.unsqueeze(-1)).squeeze(-1)  # batched products, no (k x d) block
        if self.causal:
            last = torch.arange(self.rows.start, self.rows.stop, device=q_c.device) + self.offset
            logits = logits.masked_fill(self.index > last.view(1, -1, 1), float("-inf"))
        return torch.softmax(logits, dim=-1)

    def forward(self, q_c: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The chunk's output sum_j u_j v_j over the selected keys."""
        u = self.weights(q_c, self.gather(k))
        return torch.matmul(u.unsqueeze(-2), self.gather(v)).squeeze(-2)

    def backward(self, q_c: Tensor, k: Tensor, v: Tensor, d_out: Tensor, grads: tuple[Tensor, ...]) -> None:
        """Add the chunk's share to dQ (its rows), dK and dV ((batch*heads, keys, width), not transposed)."""
        grad_q, grad_k, grad_v = grads
        keys, values = self.gather(k), self.gather(v)
        u = self.weights(q_c, keys)
        g = torch.matmul(values, d_out.unsqueeze(-1)).squeeze(-1)  # dL/du at the selected keys
        dt = g.sub_((u * g).sum(-1, keepdim=True)).mul_(u)  # softmax's VJP
        grad_q[:, self.rows] = torch.matmul(dt.unsqueeze(-2), keys).squeeze(-2)
        bh = self.index.shape[0]
        flat = (self.index + (torch.arange(bh, device=k.device) * k.shape[1]).view(bh, 1, 1)).view(-1)
        grad_k.view(-1, k.shape[-1]).index_add_(0, flat, (dt.unsqueeze(-1) * q_c.unsqueeze(-2)).view(-1, q_c.shape[-1]))
        grad_v.view(-1, v.shape[-1]).index_add_(
            0, flat, (u.unsqueeze(-1) * d_out.unsqueeze(-2)).view(-1, d_out.shape[-1])
        )


BAND_START = 256
"""Keys of a stick-breaking chunk's first band (:func:`_band`), doubled until the stick is used up **(our choice: with
logits of std 1 the product of 1 - beta underflows to 0 within about 150 keys in float32)**."""


def _finite_logits(*tensors: Tensor) -> bool:
    """Whether every input is finite and no dot product of q and k can overflow (so every logit is finite), which the
    stick-breaking band needs: a NaN or infinite logit or value before the band would reach the output.

    A sum is finite only where every entry is (NaN and inf propagate; finite entries whose sum overflows read as not
    finite, which only costs the band), and the largest |entry| is the larger of -min and max (``aminmax``, one
    pass): no full-size temporary, where ``isfinite(t).all()`` and ``t.abs().amax()`` took 14 of 84 ms at L = 1024
    and the infinity norm 0.7 ms a tensor **(our choice)**."""
    if not all(bool(torch.isfinite(t.sum())) for t in tensors):
        return False
    q, k = tensors[0], tensors[1]
    largest = [max(-float(low), float(high)) for low, high in (torch.aminmax(t) for t in (q, k))]
    return largest[0] * largest[1] * q.shape[-1] < 0.5 * torch.finfo(q.dtype).max


def _band(
    row: _Row, blocks: ScoreBlocks, q_c: Tensor, k: Tensor, end: int, diagonal: tuple[int, Tensor] | None, width: int
) -> tuple[int, Tensor, Tensor]:
    """Stick-breaking's weights of a causal chunk on the keys [start, end) only, with every key before ``start``
    of weight exactly 0: (start, logits, weights).

    u_j = beta_j prod_{l > j} (1 - beta_l) reads only the keys after j, and the kernel multiplies the product
    from the row's end backward, so on a band of the last keys it computes the same values, bit for bit, as on the
    whole row; once that product is exactly 0 at the band's first key for every row of the chunk (checked, not
    assumed), it is 0 for every earlier key (0 times a finite factor in [0, 1]), and so are their weights and, in the
    backward, their gradients (a cumulative sum of exact zeros). The band starts at ``width`` keys and doubles until
    then (at most the whole row); the callers check that every logit is finite first."""
    n = q_c.shape[-2]
    lowest = end if diagonal is None else diagonal[0]  # the band holds the chunk's hidden keys whole
    while True:
        start = max(0, min(end - width, lowest))
        shifted = None if diagonal is None else (diagonal[0] - start, diagonal[1])
        t = row.logits(q_c, k[:, start:end], shifted, blocks.get(0, n, end - start))
        u, _ = row.kernel.weights(t, shifted, blocks.spares(n, end - start))
        assert isinstance(row.kernel, StickBreaking)
        if start == 0 or row.kernel.stick_used_up():
            return start, t, u
        width *= 2


def _backward_chunk(
    row: _Row,
    blocks: ScoreBlocks,
    saved: tuple[Tensor, ...],
    grads: tuple[Tensor, ...],
    rows: slice,
    end: int,
    diagonal: tuple[int, Tensor] | None,
    first: int = 0,
) -> None:
    """Add one chunk's share to dQ, dK^T and dV^T (the chunk's blocks are views of ``blocks``, dropped on return);
    the keys before ``first`` have weight 0 (stick-breaking's band, :func:`_band`)."""
    q, k, v, out, grad_out = saved
    grad_q, grad_kt, grad_vt = grads
    n = rows.stop - rows.start
    if first:
        diagonal = None if diagonal is None else (diagonal[0] - first, diagonal[1])
    width = end - first
    q_c, k_c, v_c, d_out = q[:, rows], k[:, first:end], v[:, first:end], grad_out[:, rows]
    slope = blocks.get(3, n, width) if row.cap and not row.late_slope else None
    t = row.logits(q_c, k_c, diagonal, blocks.get(0, n, width), slope)
    spare = blocks.spares(n, width)
    u, state = row.kernel.weights(t, diagonal, spare)
    # dO_c^T u goes through g's block before g is computed, Q_c^T dt through t's once the slope is applied
    grad_vt[..., first:end] += torch.bmm(d_out.transpose(-2, -1), u, out=blocks.get(2, v.shape[-1], width))
    g = torch.bmm(d_out, v_c.transpose(-2, -1), out=blocks.get(2, n, width))  # dL/du
    delta = (d_out * out[:, rows]).sum(-1, keepdim=True)  # sum_j u_j g_j
    dt = row.kernel.vjp(t, u, g, delta, state, spare)
    if row.late_slope:
        slope = row.slope_(t, diagonal)
    if slope is not None:
        dt.mul_(slope)  # hidden keys: dt = 0 and a finite slope
    grad_q[:, rows] = torch.bmm(dt, k_c)
    grad_kt[..., first:end] += torch.bmm(q_c.transpose(-2, -1), dt, out=blocks.get(0, k.shape[-1], width))


class RowwiseAttention(RecomputingFunction):
    """y = u(q k^T) v chunked over queries, with the normalizer's closed-form backward, recomputing the weights.

    Inputs are (batch*heads, seq, head_dim), q already scaled.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, row: _Row, causal: bool, offset: int, size: int) -> Tensor:
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        blocks = ScoreBlocks(q, size, k.shape[-2])
        selected: list[_Selected | None] = []
        firsts: list[int] = []  # stick-breaking: the first key each chunk reads (_band)
        banded = row.band and causal and _finite_logits(q, k, v)
        width = BAND_START
        for rows, end, diagonal in query_chunks(q.shape[-2], size, offset, causal, k.shape[-2], q.device):
            n = rows.stop - rows.start
            if banded:
                first, _, u = _band(row, blocks, q[:, rows], k, end, diagonal, width)
                width = max(BAND_START, end - first)  # the next chunk starts from this one's band
                firsts.append(first)
                selected.append(None)
                out[:, rows] = torch.bmm(u, v[:, first:end])
                continue
            t = row.logits(q[:, rows], k[:, :end], diagonal, blocks.get(0, n, end))
            chosen = _Selected.find(t, row.top, rows, causal, offset) if row.top else None
            selected.append(chosen)
            if chosen is not None:
                out[:, rows] = chosen.forward(q[:, rows], k, v)
                continue
            u, _ = row.kernel.weights(t, diagonal, blocks.spares(n, end))
            out[:, rows] = torch.bmm(u, v[:, :end])
        ctx.selected, ctx.firsts = selected, firsts
        ctx.row, ctx.causal, ctx.offset, ctx.size = row, causal, offset, size
        keep_for_backward(ctx, (q, k, v, out), partial(row.exact, causal=causal, offset=offset), _rowwise_backward)
        return out


def _rowwise_backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
    """:class:`RowwiseAttention`'s first-order backward, chunk by chunk (module docstring)."""
    row, (q, k, v, out) = ctx.row, ctx.saved_tensors
    grad_q, grad_kt, grad_vt = transposed_grad_buffers(q, k, v)
    blocks = ScoreBlocks(q, max(ctx.size, k.shape[-1], v.shape[-1]), k.shape[-2])
    sparse_grads = (grad_q, torch.zeros_like(k), torch.zeros_like(v)) if any(ctx.selected) else None
    chunks = query_chunks(q.shape[-2], ctx.size, ctx.offset, ctx.causal, k.shape[-2], q.device)
    # the band's keys only where the output gradient is finite too (a NaN there would reach every key's)
    firsts = ctx.firsts if ctx.firsts and bool(torch.isfinite(grad_out).all()) else None
    for i, ((rows, end, diagonal), chosen) in enumerate(zip(chunks, ctx.selected)):
        if chosen is not None and sparse_grads is not None:
            chosen.backward(q[:, rows], k, v, grad_out[:, rows], sparse_grads)
            continue
        saved = (q, k, v, out, grad_out)
        first = firsts[i] if firsts is not None else 0
        _backward_chunk(row, blocks, saved, (grad_q, grad_kt, grad_vt), rows, end, diagonal, first)
    del blocks
    grad_k, grad_v = grad_kt.transpose(-2, -1).contiguous(), grad_vt.transpose(-2, -1).contiguous()
    if sparse_grads is not None:
        grad_k += sparse_grads[1]
        grad_v += sparse_grads[2]
    return grad_q, grad_k, grad_v, None, None, None, None


def rowwise_attention(plan: Plan, problem: AttentionProblem, chunk: int, budget: int | None = None) -> Tensor:
    """Output (batch, heads, q_len, head_dim_v) of a problem :class:`RowwiseEngine` accepts: in chunks of ``chunk``
    queries, or for a kernel with a ``tiled`` form (softmax, softpick) in tiles of at most ``budget`` score elements
    (``engines/rowtiles.py``; None: :func:`~axiomformer.engines.blocks.tile_budget`)."""
    scale = problem.scale
    q = problem.q * (scale.to(problem.q.dtype) if isinstance(scale, Tensor) else scale)
    (batch, heads), q3, k3, v3 = flat_heads(q, problem.k, problem.v)
    row = _Row(plan)
    if row.kernel.tiled is not None:
        out = TiledRowAttention.apply(q3, k3, v3, row, problem.causal, problem.q_offset, budget or tile_budget())
    else:
        out = RowwiseAttention.apply(q3, k3, v3, row, problem.causal, problem.q_offset, chunk)
    return out.view(batch, heads, *out.shape[1:])


class RowwiseEngine(EngineBase):
    """Normalizers with a closed-form backward (``closed_vjp``: softmax with ``softcap``, topk, softpick,
    stick_breaking), any scale, dot scores, at most a causal mask, in chunks of queries.

    Declines while ``torch.compile`` traces (its Python loop over query chunks would compile a graph per length), and
    problems whose rows may have no key (a causal query before the first key).
    """

    name = "rowwise"
    computes = Computes(
        all_of={"normalizer": {"closed_vjp"}, "score": {"plain_dot"}, "contribution": {"proportional"}},
        none_of={"normalizer": {"parametric"}},
    )

    def __init__(self, memory_budget: int = DEFAULT_BUDGET):
        self.memory_budget = memory_budget

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return (
            kind.mask == "none"
            and not kind.bias
            and kind.alibi == "none"
            and not kind.dropout
            and not kind.window
            and kind.offset_ok
            and not kind.compiling
            and kind.dtype in (torch.float32, torch.float64)
            and (plan.at_defaults or reads_options(plan.normalizer_choice))
        )

    def __call__(self, plan: Plan, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, None]:
        # One budget per block: the backward holds about six blocks (logits, weights, dL/du, the cap's slope and the
        # VJP's temporaries), so two (as sparse.py) peaked at 3.6x SDPA's memory at L = 4096 **(our choice)**.
        chunk = closed_form_chunk(problem, self.memory_budget, blocks=1)
        return rowwise_attention(plan, problem, chunk, min(self.memory_budget, tile_budget())), None
