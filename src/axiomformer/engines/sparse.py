"""Sparsemax and 1.5-entmax attention without sorting, chunked over queries, with a recomputing closed-form backward.

For a normalizer with the trait ``entmax`` (alpha-entmax of a fixed alpha, ``extra["alpha"]``: 2 for sparsemax, 1.5
for 1.5-entmax; the engine reads the trait, never the name) with dot scores, proportional contributions and no mask
other than the causal one, the weights of query i are a thresholded function of its row of scores z_i = q_i K^T (q already scaled):

    sparsemax (Martins & Astudillo 2016):      p = relu(z - tau),              sum_j p_j = 1
    1.5-entmax (Peters, Niculae & Martins 2019): p = relu(z / 2 - tau)^2,    sum_j p_j = 1

(the 1/2 is how the ``entmax`` package defines 1.5-entmax: it thresholds y = z / 2; we score with q / 2 for it).
The ``entmax`` package finds tau by sorting every row; here it is found without sorting, exactly. Both
f(t) = sum_j relu(x_j - t)^a - 1 (a = 1, x = z: sparsemax; a = 2, x = y: 1.5-entmax) are convex and decreasing, and
on a support S = {j : x_j > t} the root is closed-form:

    sparsemax:  t = (sum_S x - 1) / |S|                       (Michelot 1986: iterated from below, this is Newton's
                                                               method on f and reaches the exact tau in finite steps)
    1.5-entmax: t + u with, for h = relu(x - t),  sum_S (h_j - u)^2 = 1, smaller root written without cancellation:
                u = (sum h^2 - 1) / (sum h + sqrt((sum h)^2 - |S| (sum h^2 - 1)))

If that root keeps every element of S above it (u < min_S h), it is tau exactly: the elements outside S were already
<= t. From a point below tau the sparsemax root never overshoots; the 1.5-entmax root overshoots when S is larger
than the final support (the extra squares only add), so from below we step to that root (an upper bound), and from
above (where S lies inside the final support) to the larger of its root and Newton's step t + f / (2 sum h) from the
last point below (both lower bounds). Two consecutive points with the same |S| have the same S (level sets are
nested), which also certifies the second one. Each pass over a row computes sum h, (1.5-entmax) sum h^2, |S| and
min_S h in place in 7-8 elementwise passes; rows that are done leave the working block.

The iterations start from the threshold of the row's group maxima (strided groups of ``SKETCH_BLOCK`` keys): a lower bound,
since a subset of the row can only lower f, and usually tau itself, since the few keys of a sparse support seldom
share a block. With it, random scores (L = 4096, std 1) needed 1.4 passes per row for either normalizer, against 5
(sparsemax) and 6-8 (1.5-entmax, Newton from max y - 1) without; flat rows (std 0.05) need 2 and 4. Rows still open
after ``MAX_ITERATIONS`` passes (none in our tests) get the ``entmax`` package's sort-based threshold, so the result
is exact either way.

Each block is first shifted by its row maximum (as the ``entmax`` package does), so that z - tau keeps its relative
precision however large the scores. The forward keeps q, k, v, the row maxima and tau per row (and, with a learned
scale, the output), never the weights; the backward is first-order only (``once_differentiable``). The backward
recomputes one chunk of weights at a time (flash-attention's recomputation strategy, Dao et al. 2022, sec. 3.1,
without the fused kernel) and applies the closed-form Jacobian-vector products, with G = dO V^T:

    sparsemax:  s = [p > 0],   dz = s * G - s * (sum_j s_j G_j) / |S|        (the sparsemax Jacobian of Martins &
                                                                             Astudillo 2016)
    1.5-entmax: g = sqrt(p),   dz = g * G - g * (sum_j g_j G_j) / sum_j g_j   (Peters et al. 2019; the ``entmax``
                                                                             package's Entmax15Function.backward)

then dQ = dz K, dK += dz^T Q, dV += p^T dO (scale folded into each query chunk). With a causal mask a query chunk
reads only the keys up to its last visible one, and only the chunk's diagonal block of keys is masked. Every score
block is written into a reused workspace (``out=``): a fresh multi-MiB allocation costs about as much as an
elementwise pass **(our choice)**. A chunk whose weights are sparse enough (``SUPPORT_BELOW``) skips the dense
products: its support, found from the group maxima, is gathered and the weighted sum, G, dz and the three gradients
are computed on the nonzeros only (same formulas). It is tested against the reference engine forward and backward like every engine,
and the thresholds against the ``entmax`` package.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
from entmax import entmax15, sparsemax
from torch import Tensor

from axiomformer.engines.autograd import graph_grads
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.blocks import add_product_
from axiomformer.engines.plan import DEFAULT_BUDGET, Plan, ProblemKind, closed_form_chunk, plain_dot
from axiomformer.engines.problem import AttentionProblem, causal_mask, fill_hidden_, query_chunks

ALPHAS = {2.0: "sparsemax", 1.5: "entmax15"}
"""The alphas of alpha-entmax this engine has a threshold and a Jacobian for, and the name of each kernel here
(alpha = 2 is sparsemax, 1.5 is 1.5-entmax). A normalizer with the trait ``entmax`` and ``extra["alpha"]`` among them
runs here, whatever its name; another alpha needs its own threshold and Jacobian first."""

KINDS = tuple(ALPHAS.values())
"""The kernels (``kind`` of the functions below)."""

COMPUTES = Computes(
    all_of={"normalizer": {"entmax"}, "score": {"plain_dot"}, "contribution": {"proportional"}},
    none_of={"normalizer": {"parametric", "configured", "random", "halves", "columns"}},
)
"""What the engine computes: alpha-entmax normalizers of a fixed alpha in :data:`ALPHAS`, with plain dot scores."""

MAX_ITERATIONS = 100
"""Passes over a block before the remaining rows fall back to the sort-based threshold of the ``entmax`` package."""

SKETCH_BLOCK = 16
"""Keys per block of the sketch (the block maxima) that gives the iterations their starting point **(our choice)**."""

SKETCH_STEPS = 8
"""At most this many Michelot / Newton steps on the sketch (a lower bound after any number of steps); with 4,
1.5-entmax needed 1.96 passes per row instead of 1.41 (random scores, L = 4096) **(our choice)**."""

COMPACT_BELOW = 0.75
"""Rows that are done leave the working block when the open ones drop below this fraction of it **(our choice)**."""

SUPPORT_BELOW = 1 / 256
"""A chunk whose weights have fewer nonzeros than this fraction of its score block takes the support path: the
weighted sum of the forward and every product of the backward gathered over the nonzeros only, instead of dense
(chunk x keys) matrix products, so its backward is one recomputed score block plus O(|support| head_dim) work.
Random scores (std 1) leave 0.75 % (sparsemax) and 3.1 % (1.5-entmax) of the causal block nonzero at L = 1024, 0.2 %
and 1.0 % at L = 4096 **(our choice: each nonzero costs gathers and scatters of 2 x 128 floats; on our CPU the
support path ran 1.9x slower than the dense one at 3 % nonzeros (1.5-entmax, L = 1024), about even at 1 %, and took
sparsemax at L = 4096 from 2.0x to 1.3x SDPA; 1/256 bounds its buffers, of nnz x head_dim each, to a quarter of a
score block, within the 2x SDPA peak-memory goal)**."""


def _group_maxima(x: Tensor) -> Tensor:
    """(rows, groups) maxima of x (rows, n) over the strided groups {g, g + m, ..., g + 15 m} of its first 16 m keys
    (m = n // SKETCH_BLOCK), and one more group of the last n - 16 m keys if any. Strided groups reduce
    elementwise over 16 contiguous slices (a vectorized pass); a reduction over 16 contiguous keys ran 4x slower."""
    rows, n = x.shape
    m = n // SKETCH_BLOCK
    parts = [x[:, : m * SKETCH_BLOCK].view(rows, SKETCH_BLOCK, m).amax(1)] if m else []
    if n > m * SKETCH_BLOCK:
        parts.append(x[:, m * SKETCH_BLOCK :].amax(-1, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


class _Support:
    """The nonzeros of a chunk's (bh, rows, end) weight-like block h: their values, and for each its flat query row
    in the chunk (``b * rows + r``), in the whole (bh * q_len) queries and its flat key (``b * k_len + j``).

    Found through the group maxima (:func:`_group_maxima`): only the groups whose maximum is nonzero are read
    again, so a sparse block costs one vectorized pass instead of ``nonzero`` over it (5x slower)."""

    def __init__(self, flat: Tensor, at: Tensor, rows: int, end: int, start: int, q_len: int, k_len: int) -> None:
        self.values = flat[at]
        row, j = at.div(end, rounding_mode="floor"), at.remainder(end)  # row = b * rows + r
        b = row.div(rows, rounding_mode="floor")
        self.row = row
        self.query = b * q_len + start + row.remainder(rows)
        self.key = b * k_len + j
        self.rows = flat.numel() // end

    @classmethod
    def find(cls, h: Tensor, start: int, q_len: int, k_len: int) -> _Support | None:
        """The support of h, or None when it is too large for the support path (:data:`SUPPORT_BELOW`)."""
        _, rows, end = h.shape
        x = h.reshape(-1, end)
        limit = SUPPORT_BELOW * h.numel()
        m = end // SKETCH_BLOCK
        found = []
        if m:
            groups = x[:, : m * SKETCH_BLOCK].view(-1, SKETCH_BLOCK, m).amax(1).view(-1).nonzero().view(-1)
            if groups.numel() >= limit:
                return None
            row, g = groups.div(m, rounding_mode="floor"), groups.remainder(m)
            steps = torch.arange(0, m * SKETCH_BLOCK, m, device=h.device)
            cand = (row * end + g).unsqueeze(-1).add(steps).view(-1)
            found.append(cand[x.view(-1)[cand].nonzero().view(-1)])
        if end > m * SKETCH_BLOCK:
            tail = x[:, m * SKETCH_BLOCK :].nonzero()
            found.append(tail[:, 0] * end + m * SKETCH_BLOCK + tail[:, 1])
        at = found[0] if len(found) == 1 else torch.cat(found)
        if at.numel() >= limit:
            return None
        return cls(x.view(-1), at, rows, end, start, q_len, k_len)

    def row_sum(self, x: Tensor) -> Tensor:
        """sum over each chunk row's nonzeros of x (nnz,) -> (bh * rows,)."""
        return x.new_zeros(self.rows).index_add_(0, self.row, x)


class _Scratch:
    """Reused buffers of the support path, grown as needed: a fresh multi-MiB tensor per chunk costs its page faults
    every time (an ``index_select`` into a fresh tensor ran 4x slower than into a reused one)."""

    def __init__(self, like: Tensor) -> None:
        self.like = like
        self.buffers: dict[str, Tensor] = {}

    def get(self, name: str, *shape: int) -> Tensor:
        """An uninitialized (shape) view of the buffer ``name``."""
        size = math.prod(shape)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.numel() < size:
            buffer = self.buffers[name] = self.like.new_empty(size + size // 4)
        return buffer[:size].view(shape)


# ---------------------------------------------------------------------------------------------- thresholds
def _fallback(x: Tensor, kind: str) -> Tensor:
    """Sort-based thresholds of the ``entmax`` package for the rows (r, n) the iterations left open."""
    from entmax.activations import _entmax_threshold_and_support, _sparsemax_threshold_and_support

    top = x.amax(-1, keepdim=True)
    clean = torch.where(torch.isnan(x), top, x)  # NaN rows stay NaN through ``top``
    if kind == "sparsemax":
        tau, _ = _sparsemax_threshold_and_support(clean - top, dim=-1)
    else:
        tau, _ = _entmax_threshold_and_support(clean - top, dim=-1)
    return tau + top


def _start(x: Tensor, kind: str, sketch: Tensor | None = None) -> Tensor:
    """A lower bound of tau (rows, 1), usually within rounding of it: the threshold of the row's block maxima.

    Any subset T of a row gives a lower bound, since sum_T relu(x - t)^a <= sum_j relu(x_j - t)^a for every t; the
    maxima of blocks of ``SKETCH_BLOCK`` keys (1 / 16 of the row) hold most supports whole. A few Michelot (sparsemax)
    or Newton (entmax15) steps from max - 1 on them keep it a lower bound. This costs one read of the block (it also
    gives the row maximum) and saves 3-6 passes of the iterations. ``sketch``: the caller's :func:`_group_maxima`
    of x, if it has them.
    """
    n = x.shape[-1]
    if n // SKETCH_BLOCK < 4:
        return x.amax(-1, keepdim=True).sub_(1.0)
    sketch = _group_maxima(x) if sketch is None else sketch
    t = sketch.amax(-1, keepdim=True).sub_(1.0)
    h = torch.empty_like(sketch)
    for _ in range(SKETCH_STEPS):
        torch.sub(sketch, t, out=h).clamp_min_(0.0)
        if kind == "sparsemax":
            s = h.sum(-1, keepdim=True)
            step = (s - 1.0) / h.sign_().sum(-1, keepdim=True)
        else:
            s1 = h.sum(-1, keepdim=True)
            step = (torch.linalg.vector_norm(h, dim=-1, keepdim=True).square_() - 1.0) / (2.0 * s1)
        t = t + step
        if not bool((step > 0).any()):  # converged (or NaN rows)
            break
    return t


def _michelot_step(point: Tensor, s1: Tensor, c: Tensor, gap: Tensor, same: Tensor) -> tuple[Tensor, ...]:
    """One sparsemax pass of :func:`_threshold` on its open rows: (done, value, next point, next state).

    Michelot's step (s1 - 1) / |S| from a lower point keeps all of S above it: the row is then exact (value)."""
    step = (s1 - 1.0) / c
    ahead = (step >= 0) & (step * gap < 1.0)
    done = ahead | same | torch.isnan(s1)
    value = torch.where(ahead, point + step, point)
    return done, value, point + step, c


def _entmax15_step(
    point: Tensor, s1: Tensor, s2: Tensor, c: Tensor, gap: Tensor, same: Tensor, state: Tensor
) -> tuple[Tensor, ...]:
    """One 1.5-entmax pass of :func:`_threshold` on its open rows: (done, value, next point, next state).

    The root u on S of sum (h - u)^2 = 1 gives tau = point + u when S is final; ``state`` carries the support size
    at the previous point and the last point below tau with its sums (for Newton's step)."""
    f = s2 - 1.0
    disc = s1 * s1 - c * f
    u = f / (s1 + disc.clamp_min(0.0).sqrt())  # root on S, tau = point + u if S is final
    lower = f >= 0
    valid = disc >= 0
    ahead = lower & valid & (u * gap < 1.0)
    done = ahead | same | torch.isnan(s1)
    value = torch.where(ahead, point + u, point)
    lows = torch.where(lower, torch.cat([point, s1, s2], dim=-1), state[:, 1:])
    newton = lows[:, :1] + (lows[:, 2:] - 1.0) / (2.0 * lows[:, 1:2])
    root = point + u
    # From a lower point: its root (an upper bound unless S is final; Newton's step if there is no root);
    # from an upper point: the better of its root and Newton's step from the last lower point (both lower
    # bounds), unless rounding puts Newton's step at or above the point (then the root).
    better = torch.fmax(root, newton)
    point = torch.where(lower, torch.where(valid, root, newton), torch.where(better < point, better, root))
    state = torch.cat([torch.where(point == root, c, float("nan")), lows], dim=-1)
    return done, value, point, state


def _pass_sums(point: Tensor, x: Tensor, work: Tensor, kind: str) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
    """sum h, sum h^2 (entmax15; else None), 1 / min_S h and |S| of each row of x (m, n) at its point (m, 1), with
    h = relu(x - point) and S = {x > point}; ``work`` is scratch shaped like x."""
    e = torch.sub(point, x, out=work).clamp_max_(0.0)  # -h
    s1 = e.sum(-1, keepdim=True).neg_()
    s2 = torch.linalg.vector_norm(e, dim=-1, keepdim=True).square_() if kind == "entmax15" else None
    # 1 / (-h) is -1 / h on S and +inf elsewhere: its minimum gives min_S h, its signs |S| = (n - sum) / 2.
    gap = e.reciprocal_().amin(-1, keepdim=True).neg_()  # 1 / min_S h
    c = e.sign_().sum(-1, keepdim=True).sub_(x.shape[-1]).mul_(-0.5)
    return s1, s2, gap, c


def _threshold(
    x: Tensor, kind: str, work: Tensor | None = None, work2: Tensor | None = None, sketch: Tensor | None = None
) -> Tensor:
    """Per-row threshold tau (rows, 1) of a (rows, n) block.

    Each pass evaluates, at the current point t of every open row, with S = {x > t} and h = relu(x - t): sum h,
    (entmax15) sum h^2, |S| and min_S h. The next point is Michelot's / the root on S / Newton's step as described in
    the module docstring; a row is done when that point keeps all of S above it (it is then exact). A point above tau
    (possible through rounding, or after a root on a too large entmax15 support) has S inside the final support, so
    the root on S is a lower bound again: the iterations recover from either side.

    Args:
        x: (rows, n) scores z (sparsemax) or halved scores y = z / 2 (entmax15); masked entries are -inf, and every
            row has a finite entry.
        kind: ``"sparsemax"`` or ``"entmax15"``.
        work, work2: optional flat scratch of at least x.numel() elements each (the caller's reused workspace).
        sketch: optional :func:`_group_maxima` of x (the caller's, when it computed them for the row maxima).
    """
    rows, n = x.shape
    work = work if work is not None and work.numel() >= x.numel() else x.new_empty(x.numel())
    work2 = work2 if work2 is not None and work2.numel() >= x.numel() else x.new_empty(x.numel())
    tau = x.new_empty(rows, 1)
    point = _start(x, kind, sketch)
    # Per open row: the support size at the previous point if the current point is the root on that support (NaN:
    # it is not), then for entmax15 the last point below tau, its sum h and its sum h^2 (Newton's step; NaN: none).
    state = x.new_full((rows, 1 if kind == "sparsemax" else 4), float("nan"))
    idx, cur, live = None, x, None  # x's rows held by ``cur`` (None: all); rows of ``cur`` still open
    for _ in range(MAX_ITERATIONS):
        m = cur.shape[0]
        s1, s2, gap, c = _pass_sums(point, cur, work[: m * n].view(m, n), kind)
        # Level sets are nested, so an unchanged |S| means an unchanged S: the point, the root on the previous
        # support, is the root on its own, f(point) = 0 (this also settles rows where rounding makes f(point) < 0).
        same = c == state[:, :1]
        if s2 is None:
            done, value, point, state = _michelot_step(point, s1, c, gap, same)
        else:
            done, value, point, state = _entmax15_step(point, s1, s2, c, gap, same, state)
        done = done.view(-1)
        if live is not None:
            done &= live
        if not bool(done.any()):
            continue
        target = done.nonzero().view(-1) if idx is None else idx[done]
        tau.index_copy_(0, target, value[done])
        live = ~done if live is None else live & ~done
        remaining = int(live.sum())
        if remaining == 0:
            return tau
        if remaining < COMPACT_BELOW * m:  # the finished rows leave the working block
            keep = live.nonzero().view(-1)
            idx = keep if idx is None else idx[keep]
            cur = torch.index_select(x, 0, idx, out=work2[: idx.numel() * n].view(-1, n))
            point, state, live = point[keep], state[keep], None
    if live is not None:
        keep = live.nonzero().view(-1)
        idx = keep if idx is None else idx[keep]
    if idx is None:
        idx = torch.arange(rows, device=x.device)
    tau.index_copy_(0, idx, _fallback(x.index_select(0, idx), kind))  # rows still open: the exact sort-based threshold
    return tau


def sparsemax_threshold(z: Tensor) -> Tensor:
    """tau (..., 1) with sparsemax(z) = relu(z - tau) along the last dimension.

    ``z`` (..., n) may hold -inf (masked) entries; every row needs a finite one.
    """
    return _threshold(z.reshape(-1, z.shape[-1]), "sparsemax").view(z.shape[:-1] + (1,))


def entmax15_threshold(y: Tensor) -> Tensor:
    """tau (..., 1) with 1.5-entmax(2 y) = relu(y - tau)^2 along the last dimension.

    ``y`` (..., n) are the halved scores (the ``entmax`` package's X / 2); -inf entries are masked keys.
    """
    return _threshold(y.reshape(-1, y.shape[-1]), "entmax15").view(y.shape[:-1] + (1,))


# ---------------------------------------------------------------------------------------------- the autograd function
class SparseAttention(torch.autograd.Function):
    """y = p(scale q k^T) v for sparsemax / 1.5-entmax weights p, chunked over queries, recomputed in the backward.

    Works on (batch * heads, seq, dim) views of q, k, v (a view when their layout allows, else one copy). ``scale`` is
    a float or a tensor broadcastable to (batch, heads, 1, 1) (the learned temperature); it multiplies each query
    chunk as it is used, so no scaled copy of q is kept.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        scale: float | Tensor,
        kind: str,
        causal: bool,
        offset: int,
        chunk: int,
    ) -> Tensor:
        q3, k3, v3, factor = _flat(q, k, v, scale)
        if kind == "entmax15":
            factor = factor * 0.5  # entmax thresholds y = z / 2
        bh, q_len, k_len = q3.shape[0], q3.shape[1], k3.shape[1]
        out = q3.new_empty(bh, q_len, v3.shape[-1])
        tau, shift = q3.new_empty(bh, q_len, 1), q3.new_empty(bh, q_len, 1)
        size = bh * min(chunk, q_len) * k_len
        block, work, work2 = q3.new_empty(size), q3.new_empty(size), q3.new_empty(size)
        scratch = _Scratch(q3)
        for span, end, diag in query_chunks(q_len, chunk, offset, causal, k_len, q3.device):
            start, stop, rows = span.start, span.stop, span.stop - span.start
            z = torch.bmm(
                q3[:, start:stop] * factor,
                k3[:, :end].transpose(1, 2),
                out=block[: bh * rows * end].view(bh, rows, end),
            )
            fill_hidden_(z, diag, float("-inf"))
            # Scores relative to the row maximum, as the entmax package works: z - tau then keeps its relative
            # precision when every score is large (|z| >> 1, where ulp(|z|) would otherwise swamp the weights).
            sketch = _group_maxima(z.view(-1, end))  # also the row maxima, in one vectorized pass
            top = sketch.amax(-1, keepdim=True)
            z.sub_(top.view(bh, rows, 1))
            t = _threshold(z.view(-1, end), kind, work, work2, sketch.sub_(top))
            top = top.view(bh, rows, 1)
            t = t.view(bh, rows, 1)
            tau[:, start:stop] = t
            shift[:, start:stop] = top
            p = z.sub_(t).relu_()
            if kind == "entmax15":
                p.square_()
            sup = _Support.find(p, start, q_len, k_len)
            if sup is not None:  # the weighted sum over the support only
                dv = v3.shape[-1]
                gathered = scratch.get("gathered", sup.key.numel(), dv)
                torch.index_select(v3.reshape(-1, dv), 0, sup.key, out=gathered).mul_(sup.values.unsqueeze(-1))
                summed = scratch.get("summed", bh * rows, dv).zero_().index_add_(0, sup.row, gathered)
                out[:, start:stop] = summed.view(bh, rows, dv)
            else:
                out[:, start:stop] = torch.bmm(p, v3[:, :end])
        # The learned scale's gradient reads the output (see ``backward``).
        keep_out = isinstance(scale, Tensor) and ctx.needs_input_grad[3]
        ctx.save_for_backward(
            q, k, v, tau, shift, scale if isinstance(scale, Tensor) else None, out if keep_out else None
        )
        ctx.scale = None if isinstance(scale, Tensor) else scale
        ctx.kind, ctx.causal, ctx.offset, ctx.chunk = kind, causal, offset, chunk
        return out.view(q.shape[:-1] + (v.shape[-1],))

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, tau, shift, scale_t, out = ctx.saved_tensors
        kind, causal, offset, chunk = ctx.kind, ctx.causal, ctx.offset, ctx.chunk
        scale = ctx.scale if scale_t is None else scale_t
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            exact = partial(exact_sparse, kind=kind, causal=causal, offset=offset)
            return graph_grads(ctx, exact, (q, k, v, scale), grad_out, trailing=4)
        need_q, need_k, need_v, need_scale = ctx.needs_input_grad[:4]
        q3, k3, v3, factor = _flat(q, k, v, scale)
        d_out = grad_out.reshape(q3.shape[0], q3.shape[1], -1)
        sums = _BackwardSums(
            q3, k3, v3, d_out, factor, kind, chunk, (need_q, need_k, need_v), out if need_scale else None
        )
        for span, end, diag in query_chunks(q3.shape[1], chunk, offset, causal, k3.shape[1], q3.device):
            sums.add_chunk(span, end, diag, tau, shift)
        return (*sums.grads(q, k, v, scale_t), None, None, None, None)


class _BackwardSums:
    """The closed-form backward of :class:`SparseAttention`, one query chunk at a time: the gradients of q, k, v and
    the scale's factor (None where none is needed) and the two reused score blocks.

    ``out`` is the forward's output when the learned scale needs its gradient, else None."""

    def __init__(
        self,
        q3: Tensor,
        k3: Tensor,
        v3: Tensor,
        d_out: Tensor,
        factor: float | Tensor,
        kind: str,
        chunk: int,
        needs: tuple[bool, bool, bool],
        out: Tensor | None,
    ):
        need_q, need_k, need_v = needs
        self.q3, self.k3, self.v3, self.d_out, self.factor, self.kind, self.out = q3, k3, v3, d_out, factor, kind, out
        bh, q_len, k_len = q3.shape[0], q3.shape[1], k3.shape[1]
        self.grad_q = torch.empty_like(q3) if need_q else None
        self.grad_k = torch.zeros_like(k3) if need_k else None
        self.grad_v = torch.zeros_like(v3) if need_v else None
        self.grad_factor = q3.new_zeros(bh, 1, 1) if out is not None else None
        size = bh * min(chunk, q_len) * k_len
        need_dz = need_q or need_k or out is not None
        self.block_h, self.block_g = q3.new_empty(size), q3.new_empty(size) if need_dz else None
        self.scratch = _Scratch(q3)

    def add_chunk(self, span: slice, end: int, diag: tuple[int, Tensor] | None, tau: Tensor, shift: Tensor) -> None:
        """Add the share of the queries ``span`` (reading the keys 0..end - 1) to the gradients."""
        bh, start, stop, rows = self.q3.shape[0], span.start, span.stop, span.stop - span.start
        k_c, v_c, do = self.k3[:, :end], self.v3[:, :end], self.d_out[:, start:stop]
        q_c = self.q3[:, start:stop] * self.factor  # scaled queries of the chunk
        half = 0.5 if self.kind == "entmax15" else 1.0
        h = torch.bmm(
            q_c * half if half != 1.0 else q_c,
            k_c.transpose(1, 2),
            out=self.block_h[: bh * rows * end].view(bh, rows, end),
        )
        h.sub_(shift[:, start:stop] + tau[:, start:stop]).relu_()  # relu(z - tau) or relu(y - tau)
        fill_hidden_(h, diag, 0.0)
        sup = _Support.find(h, start, self.q3.shape[1], self.k3.shape[1])
        if sup is not None:
            self._add_support(sup, q_c, span)
            return
        if self.kind == "sparsemax":  # p = h
            if self.grad_v is not None:
                add_product_(self.grad_v[:, :end], h.transpose(1, 2), do)
            h.sign_()  # s = [p > 0]
        dz = None
        if self.block_g is not None:
            grad = torch.bmm(do, v_c.transpose(1, 2), out=self.block_g[: bh * rows * end].view(bh, rows, end))
            grad.mul_(h)  # s G or g G
            # |S| or sum g from this very h, so that sum_j dz_ij = 0 to rounding, as in entmax's backward.
            mean = grad.sum(-1, keepdim=True).div_(h.sum(-1, keepdim=True))
            dz = grad.addcmul_(h, mean, value=-1.0), mean  # dL/dz
        if self.kind == "entmax15" and self.grad_v is not None:  # p = g^2
            add_product_(self.grad_v[:, :end], h.square_().transpose(1, 2), do)
        if dz is not None:
            self._add_dz(*dz, q_c, k_c, do, span, end)

    def _add_support(self, sup: _Support, q_c: Tensor, span: slice) -> None:
        """The chunk's share of the gradients over the support of its weights only (:data:`SUPPORT_BELOW`): the
        same closed forms as :meth:`add_chunk`, with G_ij = dO_i . v_j gathered at the nonzeros (four gathers into
        reused buffers, no copy of K or V)."""
        bh, rows = self.q3.shape[0], span.stop - span.start
        d, dv = self.k3.shape[-1], self.v3.shape[-1]
        nnz = sup.key.numel()
        get = self.scratch.get
        q_rows = torch.index_select(q_c.reshape(-1, d), 0, sup.row, out=get("q", nnz, d))
        do_rows = torch.index_select(self.d_out[:, span].reshape(-1, dv), 0, sup.row, out=get("do", nnz, dv))
        k_rows = torch.index_select(self.k3.reshape(-1, d), 0, sup.key, out=get("k", nnz, d))
        v_rows = torch.index_select(self.v3.reshape(-1, dv), 0, sup.key, out=get("v", nnz, dv))
        h = sup.values
        p = h if self.kind == "sparsemax" else h * h
        grad = torch.linalg.vecdot(do_rows, v_rows)  # G at the support
        s = torch.ones_like(h) if self.kind == "sparsemax" else h  # s = [p > 0] or g = sqrt(p)
        weighted = grad if self.kind == "sparsemax" else grad * s
        mean = sup.row_sum(weighted).div_(sup.row_sum(s))  # (bh * rows,)
        dz = weighted.sub_(s * mean.index_select(0, sup.row)).unsqueeze(-1)  # dL/dz at the support
        if self.grad_v is not None:
            self.grad_v.view(-1, dv).index_add_(0, sup.key, do_rows.mul_(p.unsqueeze(-1)))
        if self.grad_k is not None:
            self.grad_k.view(-1, d).index_add_(0, sup.key, q_rows.mul_(dz))
        if self.grad_q is not None:
            chunk = self.scratch.get("grad_q", bh * rows, d).zero_().index_add_(0, sup.row, k_rows.mul_(dz))
            self.grad_q[:, span] = chunk.view(bh, rows, d) * self.factor  # dL/dq = dL/d(scale q) scale
        if self.grad_factor is not None and self.out is not None:  # as in _add_dz
            centered = torch.linalg.vecdot(self.d_out[:, span], self.out[:, span]).unsqueeze(-1)
            self.grad_factor += centered.sub_(mean.view(bh, rows, 1)).sum(1, keepdim=True)

    def _add_dz(self, grad: Tensor, mean: Tensor, q_c: Tensor, k_c: Tensor, do: Tensor, span: slice, end: int) -> None:
        if self.grad_k is not None:
            add_product_(self.grad_k[:, :end], grad.transpose(1, 2), q_c)
        if self.grad_q is not None:
            self.grad_q[:, span] = torch.bmm(grad, k_c).mul_(self.factor)  # dL/dq = dL/d(scale q) scale
        if self.grad_factor is not None and self.out is not None:
            # dL/dscale = sum_ij dz_ij z_ij / scale. As sum_j dz_ij = 0, z_ij may be replaced by z_ij - tau_i = p_ij
            # (sparsemax) or 2 (y_ij - tau_i) = 2 g_ij (entmax15) on the support, and sum_j dz_ij p_ij (or g_ij)
            # = sum_j p_ij G_ij - mean_i = dO_i . out_i - mean_i: no cancellation between large scores.
            centered = torch.linalg.vecdot(do, self.out[:, span]).unsqueeze(-1) - mean
            self.grad_factor += centered.sum(1, keepdim=True)

    def grads(self, q: Tensor, k: Tensor, v: Tensor, scale_t: Tensor | None) -> tuple[Tensor | None, ...]:
        """dL/dq, dL/dk, dL/dv and dL/dscale in the inputs' shapes (None where not needed)."""
        grad_scale = None
        if self.grad_factor is not None and scale_t is not None:
            grad_factor = self.grad_factor.div_(self.factor).mul_(2.0 if self.kind == "entmax15" else 1.0)
            grad_scale = grad_factor.view(q.shape[:2] + (1, 1)).sum_to_size(scale_t.shape)
        return (
            None if self.grad_q is None else self.grad_q.view(q.shape),
            None if self.grad_k is None else self.grad_k.view(k.shape),
            None if self.grad_v is None else self.grad_v.view(v.shape),
            grad_scale,
        )


def exact_sparse(
    q: Tensor, k: Tensor, v: Tensor, scale: float | Tensor, kind: str, causal: bool, offset: int
) -> Tensor:
    """The same output through the ``entmax`` package (the formula the second-order gradients differentiate)."""
    z = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        z = z.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], offset, q.device), float("-inf"))
    return torch.matmul(sparsemax(z, dim=-1) if kind == "sparsemax" else entmax15(z, dim=-1), v)


def _flat(q: Tensor, k: Tensor, v: Tensor, scale: float | Tensor) -> tuple[Tensor, Tensor, Tensor, float | Tensor]:
    """(batch * heads, seq, dim) views of q, k, v and the scale as a float or a (batch * heads, 1, 1) tensor."""
    lead = q.shape[:-2]
    bh = lead.numel()
    q3, k3, v3 = q.reshape(bh, q.shape[-2], -1), k.reshape(bh, k.shape[-2], -1), v.reshape(bh, v.shape[-2], -1)
    if isinstance(scale, Tensor):
        scale = scale.expand(lead + (1, 1)).reshape(bh, 1, 1)
    return q3, k3, v3, scale


def sparse_attention(plan: Plan, problem: AttentionProblem, chunk: int) -> Tensor:
    """Output (batch, heads, q_len, head_dim_v) of a problem :class:`SparseEngine` accepts."""
    scale = problem.scale
    if isinstance(scale, Tensor):
        scale = scale.to(problem.q.dtype)
    kind = ALPHAS[plan.normalizer_choice.extra["alpha"]]
    # a batch or head dim of 1 broadcast against more (autograd of the expansion sums its gradient back)
    lead = torch.broadcast_shapes(problem.q.shape[:-2], problem.k.shape[:-2], problem.v.shape[:-2])
    q, k, v = (torch.broadcast_to(t, lead + t.shape[-2:]) for t in (problem.q, problem.k, problem.v))
    return SparseAttention.apply(q, k, v, scale, kind, problem.causal, problem.q_offset, chunk)


class SparseEngine(EngineBase):
    """alpha-entmax of a fixed alpha in :data:`ALPHAS` (sparsemax, 1.5-entmax: trait ``entmax``) with dot scores,
    sort-free, in chunks of queries, with the closed-form backward.

    With causal masking, ``q_offset >= 0`` guarantees every query sees at least one key (key 0). Declines while
    ``torch.compile`` traces (a Python loop over query chunks and a convergence test read back to the host).
    """

    name = "sparse"
    computes = COMPUTES

    def __init__(self, memory_budget: int = DEFAULT_BUDGET):
        self.memory_budget = memory_budget

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return (
            plan.normalizer_choice.extra.get("alpha") in ALPHAS
            and plain_dot(plan, kind)
            and (not kind.causal or kind.offset_ok)
            and not kind.compiling
        )

    def __call__(self, plan: Plan, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, None]:
        return sparse_attention(plan, problem, closed_form_chunk(problem, self.memory_budget, blocks=2)), None
