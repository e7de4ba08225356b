"""Rows in tiles of queries x keys, the tiled forms the rowwise engine's kernels name (``RowKernel.tiled``): softmax
(with or without ``softcap``) as flash-attention computes it (Dao et al. 2022, Algorithm 1 forward, Algorithm 2
backward), in PyTorch ops, and softpick the same way with its own terms.

For a chunk of queries the forward walks the keys tile by tile, keeping per row the running maximum m, the running
sum l of exp(t - m) and the output accumulator, rescaled by exp(m_old - m_new) when the maximum grows:

    t = c tanh(q k^T / c) (or q k^T)      the tile's logits (``_Row.logits``), hidden keys -inf
    m' = max(m, max_j t_j),  l' = l e^(m - m') + sum_j e^(t_j - m'),  acc' = acc e^(m - m') + e^(t - m') V
    y = acc / l,  lse = m + log l         (kept for the backward, with q, k, v and y)

Softpick (Zuhri et al. 2025) rescales the same way: its terms a_j = e^-m (e^(t_j) - 1) at the running
m = max(0, max_j t_j), their sum of |a| and the output all scale by e^(m - m') when m grows; the backward recomputes a
from the row's final m and D = sum |a| + eps (:func:`softpick_vjp`).

Under a cap the logits are bounded, and where their range allows (:data:`FIXED_SHIFT_SPAN`) m is fixed per row
from its first tile (:data:`SHIFT_HEADROOM`): softmax is shift invariant, and no rescaling is needed. A row whose
logits so far are all -inf is shifted by 0, so that its weights are 0 rather than NaN.

The backward walks keys outside and chunks of queries inside (a key tile's dK and dV rows stay in cache while every
chunk adds to them) and recomputes each tile's weights from the row's lse, u = exp(t - lse), then the softmax VJP
dt = u (g - delta) with g = dO V^T, delta_i = dO_i . y_i, the cap's slope dt/dz, and dQ += dz K, dK += dz^T Q,
dV += u^T dO: 2 products forward and 5 backward, as flash-attention. A tile
(:data:`~axiomformer.engines.blocks.TILE_ELEMENTS` per thread) stays in cache between its products and its
elementwise passes: at L = 4096, batch 1, 8 heads, causal, softcap 30, forward and backward took 790 ms on one
thread where whole rows of keys (8 MiB blocks, the rowwise engine's chunks) took 1,000 ms and SDPA 540 ms **(our
choice)**. Tested against the reference engine forward and backward (``tests/test_rowwise.py``: tiles of 5 keys,
every cap path, overflowed first tiles, rows at the bottom of a cap's range) and by the generated equivalence matrix,
with a planted wrong rescaling and a planted wrong softpick VJP.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import torch
from torch import Tensor

from axiomformer.axes.normalizer import SOFTPICK_EXPM1_BELOW, softpick_eps
from axiomformer.engines.autograd import RecomputingFunction, keep_for_backward
from axiomformer.engines.blocks import Hidden, ScoreBlocks, tile_keys, tile_shape, tiled_backward
from axiomformer.engines.problem import fill_hidden_, query_chunks


class RowLogits(Protocol):
    """What the tiles read of the rowwise engine's ``_Row``: the cap, the logits of a block and the exact form."""

    cap: float
    logit_range: tuple[float, float] | None
    kernel: Any  # its ``tiled``: the TileForm

    def logits(self, q_c: Tensor, k_c: Tensor, diagonal: Hidden, out: Tensor, slope: Tensor | None = None) -> Tensor:
        """The capped logits of q_c against k_c in ``out``, hidden keys -inf; with ``slope``, dt/dz there."""
        ...

    def exact(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, offset: int) -> Tensor:
        """The output in plain tensor ops (what second-order gradients differentiate)."""
        ...


FIXED_SHIFT_SPAN = {torch.float32: 80.0, torch.float64: 700.0}
"""Widest range of logits (highest minus lowest possible, under a cap) whose softmax takes a fixed shift per row
instead of a running maximum **(our choice: this drops 6 of 15 operations per tile)**; see :data:`SHIFT_HEADROOM`."""

SHIFT_HEADROOM = {torch.float32: 40.0, torch.float64: 350.0}
"""The fixed shift of a row is the largest of its first tile's logits, raised to at least the cap's highest logit
minus this headroom. No e^(t - shift) then exceeds e^headroom (float32: 2.4e17), and the row's largest weight is at
least e^(headroom - span) >= e^-40, so that the products with the values stay normal numbers: a shift by the cap's
highest logit alone left the weights of a row whose logits all lie near the bottom of an 80-wide range at e^-80,
whose products with values below 7e-4 are subnormal (1.8e-5 relative error in float32, and 0 with denormals
flushed)."""


def rescale(m: Tensor, m_new: Tensor) -> Tensor:
    """e^(m - m'): what the running sum and output of a row are multiplied by when its maximum grows from m to m'."""
    return torch.sub(m, m_new).exp_()


def lowest_shift(row: RowLogits, dtype: torch.dtype) -> float | None:
    """The lowest fixed shift of a row (the cap's highest logit minus :data:`SHIFT_HEADROOM`) where the cap's range
    allows a fixed shift (:data:`FIXED_SHIFT_SPAN`), else None."""
    bounds = row.logit_range
    if bounds is None or bounds[1] - bounds[0] > FIXED_SHIFT_SPAN.get(dtype, 0.0):
        return None
    return bounds[1] - SHIFT_HEADROOM[dtype]


class TileForm:
    """How one normalizer runs in tiles: the forward of a chunk of queries over its tiles, which returns the output
    and a few numbers per row (``state_width`` of them), and per tile of the backward the weights from those numbers
    and the VJP."""

    state_width = 1

    def chunk_forward(
        self, row: RowLogits, blocks: ScoreBlocks, q_c: Tensor, kv: tuple[Tensor, Tensor], tiles: list
    ) -> Tensor:
        """(output ‖ state) (batch*heads, rows, head_dim_v + state_width) of one chunk over ``tiles`` [(keys, hidden)]."""
        raise NotImplementedError

    def weights(self, t: Tensor, state: Tensor, blocks: ScoreBlocks, hidden: Hidden) -> tuple[Tensor, Any]:
        """(u, what ``vjp`` reads) of a tile from its logits t (overwritten) and its rows' ``state``."""
        raise NotImplementedError

    def vjp(self, g: Tensor, u: Tensor, saved: Any, delta: Tensor, state: Tensor) -> Tensor:
        """dL/dt of a tile from g = dL/du (overwritten), u (may be overwritten), delta = dO . y per row."""
        raise NotImplementedError


class SoftmaxTiles(TileForm):
    """Softmax: the running maximum and sum forward (or a fixed shift, :func:`lowest_shift`), state lse per row; the
    weights u = exp(t - lse), the VJP u (g - delta)."""

    def chunk_forward(
        self, row: RowLogits, blocks: ScoreBlocks, q_c: Tensor, kv: tuple[Tensor, Tensor], tiles: list
    ) -> Tensor:
        k, v = kv
        n = q_c.shape[-2]
        acc = q_c.new_zeros(q_c.shape[0], n, v.shape[-1])
        total = q_c.new_zeros(q_c.shape[0], n, 1)
        lowest = lowest_shift(row, q_c.dtype)
        m = q_c.new_full((q_c.shape[0], n, 1), float("-inf"))
        for i, (keys, hidden) in enumerate(tiles):
            t = row.logits(q_c, k[:, keys], hidden, blocks.get(0, n, keys.stop - keys.start))
            if lowest is not None:  # a fixed shift per row, from the first tile (SHIFT_HEADROOM)
                m = t.amax(-1, keepdim=True).clamp_min_(lowest) if i == 0 else m
                p = t.sub_(m).exp_()
                total.add_(p.sum(-1, keepdim=True))
                acc.baddbmm_(p, v[:, keys])
                continue
            m_new = torch.maximum(m, t.amax(-1, keepdim=True))
            # a row whose logits so far are all -inf (overflowed products) keeps m = -inf: shift it by 0 instead, so
            # that e^(t - m) is 0 rather than NaN (flash-attention's guard)
            shifted = m_new.masked_fill(torch.isneginf(m_new), 0.0)
            factor = rescale(m, shifted)
            p = t.sub_(shifted).exp_()
            total.mul_(factor).add_(p.sum(-1, keepdim=True))
            acc.mul_(factor).baddbmm_(p, v[:, keys])
            m = m_new
        return torch.cat([acc.div_(total), m.add_(total.log_())], -1)

    def weights(self, t: Tensor, state: Tensor, blocks: ScoreBlocks, hidden: Hidden) -> tuple[Tensor, Any]:
        return t.sub_(state).exp_(), None

    def vjp(self, g: Tensor, u: Tensor, saved: Any, delta: Tensor, state: Tensor) -> Tensor:
        return g.sub_(delta).mul_(u)  # 0 at hidden keys: u = 0 there


class SoftpickTiles(TileForm):
    """Softpick (Zuhri et al. 2025, eq. 2): online forward, its terms a_j = e^-m (e^(t_j) - 1) at the running
    m = max(0, max_j t_j) rescaled by e^(m - m') as it grows; state (m, D = sum |a| + eps) per row; the VJP
    :func:`softpick_vjp` (``engines/rowkernels.Softpick``'s formula)."""

    state_width = 2

    def __init__(self, shifted_eps: bool = False) -> None:
        self.shifted_eps = shifted_eps

    def chunk_forward(
        self, row: RowLogits, blocks: ScoreBlocks, q_c: Tensor, kv: tuple[Tensor, Tensor], tiles: list
    ) -> Tensor:
        k, v = kv
        n = q_c.shape[-2]
        m = q_c.new_zeros(q_c.shape[0], n, 1)  # max(0, ...): the clamp is the start
        acc = q_c.new_zeros(q_c.shape[0], n, v.shape[-1])
        total = q_c.new_zeros(q_c.shape[0], n, 1)
        for keys, hidden in tiles:
            width = keys.stop - keys.start
            t = row.logits(q_c, k[:, keys], hidden, blocks.get(0, n, width))
            m_new = torch.maximum(m, t.amax(-1, keepdim=True))
            factor = rescale(m, m_new)
            _, a = _softpick_terms(t, m_new, blocks.get(1, n, width), hidden)
            signed = a.sum(-1, keepdim=True)
            u = a.relu_()
            # sum |a| = 2 sum relu(a) - sum a: two reductions instead of an |a| block
            total.mul_(factor).add_(u.sum(-1, keepdim=True).mul_(2).sub_(signed))
            acc.mul_(factor).baddbmm_(u, v[:, keys])
            m = m_new
        denom = total.add_(softpick_eps(m.neg().exp_(), self.shifted_eps))
        return torch.cat([acc.div_(denom), m, denom], -1)

    def weights(self, t: Tensor, state: Tensor, blocks: ScoreBlocks, hidden: Hidden) -> tuple[Tensor, Any]:
        e, a = _softpick_terms(t, state[..., :1], blocks.get(3, *t.shape[1:]), hidden)
        sign = torch.sign(a, out=blocks.get(4, *t.shape[1:]))
        return a.relu_().div_(state[..., 1:]), (e, sign)

    def vjp(self, g: Tensor, u: Tensor, saved: Any, delta: Tensor, state: Tensor) -> Tensor:
        e, sign = saved
        return softpick_vjp(g, u, sign, delta, e, state[..., 1:])


class TiledRowAttention(RecomputingFunction):
    """y = u(t(q k^T)) v in tiles of queries x keys for a normalizer's :class:`TileForm` ``row.kernel.tiled``
    (module docstring).

    Inputs are (batch*heads, seq, head_dim), q already scaled; ``budget``: the elements of one tile over batch*heads.
    """

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, row: RowLogits, causal: bool, offset: int, budget: int
    ) -> Tensor:
        form: TileForm = row.kernel.tiled
        size, width = tile_shape(q.shape[0], q.shape[-2], budget)
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        state = q.new_empty(q.shape[:-1] + (form.state_width,))
        blocks = ScoreBlocks(q, size, width)
        for rows, end, diagonal in query_chunks(q.shape[-2], size, offset, causal, k.shape[-2], q.device):
            tiles = [tile_keys(diagonal, start, width, end) for start in range(0, end, width)]
            found = form.chunk_forward(row, blocks, q[:, rows], (k, v), tiles)
            out[:, rows], state[:, rows] = found[..., : v.shape[-1]], found[..., v.shape[-1] :]
        ctx.row, ctx.causal, ctx.offset, ctx.budget = row, causal, offset, budget
        keep_for_backward(ctx, (q, k, v, out, state), partial(row.exact, causal=causal, offset=offset), _backward)
        return out


def _backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
    """:class:`TiledRowAttention`'s first-order backward (``blocks.tiled_backward``), each tile's weights recomputed
    from its rows' state."""
    row, (q, k, v, out, state) = ctx.row, ctx.saved_tensors
    form: TileForm = row.kernel.tiled
    delta = (grad_out * out).sum(-1, keepdim=True)
    size, width = tile_shape(q.shape[0], q.shape[-2], ctx.budget)
    chunks = list(query_chunks(q.shape[-2], size, ctx.offset, ctx.causal, k.shape[-2], q.device))
    blocks = ScoreBlocks(q, size, width)

    def step(i: int, rows: slice, keys: slice, hidden: Hidden) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        n, n_keys = rows.stop - rows.start, keys.stop - keys.start
        slope = blocks.get(2, n, n_keys) if row.cap else None
        t = row.logits(q[:, rows], k[:, keys], hidden, blocks.get(0, n, n_keys), slope)
        u, saved = form.weights(t, state[:, rows], blocks, hidden)

        def vjp(g: Tensor) -> Tensor:
            dt = form.vjp(g, u, saved, delta[:, rows], state[:, rows])
            return dt if slope is None else dt.mul_(slope)  # hidden keys: dt = 0 and a finite slope

        return u, vjp

    return *tiled_backward((q, k, v), grad_out, chunks, width, blocks, step), *(None,) * 4


# ---------------------------------------------------------------------------------------------- softpick's terms
def _softpick_terms(t: Tensor, m: Tensor, a_block: Tensor, hidden: Hidden) -> tuple[Tensor, Tensor]:
    """(e, a) of a tile: e = e^(t - m) in t's block, a = e - e^-m in ``a_block`` (e^-m expm1(t) in the rows whose
    largest logit m is below ``SOFTPICK_EXPM1_BELOW``, as ``axes.normalizer.softpick_terms``), a = 0 at hidden keys."""
    floor = m.neg().exp_()
    small = m < SOFTPICK_EXPM1_BELOW
    exact = torch.expm1(t.clamp_max(SOFTPICK_EXPM1_BELOW)).mul_(floor) if bool(small.any()) else None
    e = t.sub_(m).exp_()
    a = torch.sub(e, floor, out=a_block)
    if exact is not None:
        a.copy_(torch.where(small, exact, a))
    return e, fill_hidden_(a, hidden, 0.0)


def softpick_vjp(g: Tensor, u: Tensor, sign: Tensor, delta: Tensor, e: Tensor, denom: Tensor) -> Tensor:
    """dL/dt = e ([a > 0] g - sign(a) delta) / D of a tile, in g (u, >= 0, is overwritten by [a > 0])."""
    return g.mul_(u.sign_()).addcmul_(sign, delta, value=-1.0).mul_(e).div_(denom)
