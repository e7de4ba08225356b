"""Decayed Gram matrices of a chunk and their gradients, for the chunkwise state form (``engines/state_chunked.py``).

G(x, y)_ab = sum_i x_ai y_bi e^(c_ai - c_bi) for a >= b (0 above the diagonal), c the chunk's cumulative log decay
(non-increasing along the chunk), either one per token (a scalar decay: Mamba-2, Gated DeltaNet) or one per token and
key channel (KDA). Every exponential here has an exponent <= 0, so nothing overflows whatever the decays; the
gradients are written out (the backward of ``engines/state_chunked.py`` calls them with the Gram matrix's gradient)
so that no autograd graph of the (C x C) blocks is kept. Shapes: x, y, c (..., C, d | 1) with broadcastable leading
dims, G (..., C, C).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from axiomformer.axes.transport import FACTOR_SPAN


def sum_to(t: Tensor, shape: torch.Size) -> Tensor:
    """``t`` summed over the dims it was broadcast along to reach its shape from ``shape``."""
    extra = t.dim() - len(shape)
    dims = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(shape) if n == 1 and t.shape[extra + i] != 1)
    return t.sum(dims, keepdim=True).reshape(shape) if dims else t


def _scalar_decay(c: Tensor) -> Tensor:
    """E_ab = e^(c_a - c_b) for a >= b, 0 above the diagonal; c (..., C, 1). Masked before ``exp``: no overflow."""
    n = c.shape[-2]
    pos = torch.arange(n, device=c.device)
    lower = pos[:, None] >= pos[None, :]
    return torch.where(lower, c - c.transpose(-2, -1), float("-inf")).exp()


def scalar_gram(x: Tensor, y: Tensor, c: Tensor) -> Tensor:
    """G(x, y) with a scalar decay, c (..., C, 1): (x y^T) o E."""
    return torch.matmul(x, y.transpose(-2, -1)) * _scalar_decay(c)


def scalar_gram_backward(x: Tensor, y: Tensor, c: Tensor, gram: Tensor, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dy, dc) of :func:`scalar_gram` from ``gram`` (its output) and ``grad`` = dG, in the shapes of x, y, c.

    dx = (dG o E) y, dy = (dG o E)^T x, and with H = dG o G, dc_a = sum_b H_ab - sum_b H_ba (c_a enters row a
    with a plus sign, column a with a minus sign).
    """
    scaled = grad * _scalar_decay(c)
    dx = torch.matmul(scaled, y)
    dy = torch.matmul(scaled.transpose(-2, -1), x)
    h = grad * gram
    dc = (h.sum(-1) - h.sum(-2)).unsqueeze(-1)
    return sum_to(dx, x.shape), sum_to(dy, y.shape), sum_to(dc, c.shape)


def _pow2(x: Tensor, y: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
    """x, y zero-padded and c padded with its last decay to a power-of-two chunk (padded tokens add nothing)."""
    n = x.shape[-2]
    size = 1 << max(0, (n - 1).bit_length())
    if size != n:
        x, y = F.pad(x, (0, 0, 0, size - n)), F.pad(y, (0, 0, 0, size - n))
        c = torch.cat([c, c[..., -1:, :].expand(*c.shape[:-2], size - n, c.shape[-1])], -2)
    return x, y, c, size


def _halves(x: Tensor, y: Tensor, c: Tensor, m: int, s: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """At block size 2s: the later halves of x scaled to r and the earlier halves of y scaled from r, r the last token
    of each earlier half, with their factors: (later (..., m, s, d), earlier, e^(c_later - c_r), e^(c_r - c_earlier))."""
    xs, ys, cs = (t.unflatten(-2, (m, 2, s)) for t in (x, y, c))
    ref = cs[..., 0, s - 1 :, :]
    to_ref, from_ref = (cs[..., 1, :, :] - ref).exp(), (ref - cs[..., 0, :, :]).exp()
    return xs[..., 1, :, :] * to_ref, ys[..., 0, :, :] * from_ref, to_ref, from_ref


def _off_blocks(t: Tensor, m: int, s: int) -> Tensor:
    """The m blocks (..., m, s, s) of a (..., 2ms, 2ms) matrix where a later half meets the earlier half of the same
    block of 2s tokens (rows 2js + s .. 2js + 2s, columns 2js .. 2js + s): a view."""
    blocks = torch.diagonal(t.unflatten(-1, (m, 2 * s)).unflatten(-3, (m, 2 * s)), dim1=-4, dim2=-2)
    return blocks.movedim(-1, -3)[..., s:, :s]


def leaf_size(c: Tensor) -> int:
    """The largest block (a power of two, down to 1) within which every span of log decays is at most
    ``FACTOR_SPAN``: such a block factors through its own last token without overflow (:func:`_leaves`)."""
    c = _pow2(c, c, c)[2]  # the last decay repeated: no wider span
    size = c.shape[-2]
    sizes = [1 << i for i in range(size.bit_length() - 1, 0, -1)]  # size, size / 2, ..., 2
    spans = [(t[..., 0, :] - t[..., -1, :]).amax() for t in (c.unflatten(-2, (size // b, b)) for b in sizes)]
    fits = [float(x) <= FACTOR_SPAN for x in torch.stack(spans).tolist()] if spans else []
    return next((b for b, ok in zip(sizes, fits) if ok), 1)


def _leaves(x: Tensor, y: Tensor, c: Tensor, b: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Blocks of b tokens factored through their last token r: (x e^(c - c_r), y e^(c_r - c), e^(c - c_r),
    e^(c_r - c)), each (..., size / b, b, d); every factor lies in [e^-FACTOR_SPAN, e^FACTOR_SPAN] (:func:`leaf_size`)."""
    xs, ys, cs = (t.unflatten(-2, (t.shape[-2] // b, b)) for t in (x, y, c))
    ref = cs[..., -1:, :]
    to_ref, from_ref = (cs - ref).exp(), (ref - cs).exp()
    return xs * to_ref, ys * from_ref, to_ref, from_ref


def channel_gram(x: Tensor, y: Tensor, c: Tensor, leaf: int | None = None) -> Tensor:
    """G(x, y) with a per-channel decay, c (..., C, d); ``leaf``: :func:`leaf_size` of c (computed when None).

    Blocks of tokens whose log decays span at most ``FACTOR_SPAN`` factor through their last token r:
    G_ab = (x_a e^(c_a - c_r)) . (y_b e^(c_r - c_b)), no factor beyond e^FACTOR_SPAN. Above that block size the
    chunk is halved recursively: the block of a later half I against an earlier half J factors through r, the last
    token of J, with both exponents <= 0 -- exact for any decay, where one reference token for the whole chunk (or
    one per sub-chunk of 16, as fla's ``chunk_kda``) overflows once the decays span more than the float's range.
    Cost: about one (C x C x d) product, in a few batched steps, each written into its blocks of the result.
    """
    n = x.shape[-2]
    x, y, c, size = _pow2(x, y, c)
    lead = torch.broadcast_shapes(x.shape[:-2], y.shape[:-2], c.shape[:-2])
    out = x.new_zeros(*lead, size, size)
    leaf = leaf_size(c) if leaf is None else leaf
    s = size // 2
    while s >= leaf:
        later, earlier, _, _ = _halves(x, y, c, size // (2 * s), s)
        _off_blocks(out, size // (2 * s), s).copy_(torch.matmul(later, earlier.transpose(-2, -1)))
        s //= 2
    xl, yl, _, _ = _leaves(x, y, c, leaf)
    _diagonal_blocks(out, size // leaf, leaf).copy_(torch.matmul(xl, yl.transpose(-2, -1)).tril())
    return out[..., :n, :n]


def _diagonal_blocks(t: Tensor, m: int, b: int) -> Tensor:
    """The m diagonal blocks (..., m, b, b) of a (..., mb, mb) matrix: a view."""
    return torch.diagonal(t.unflatten(-1, (m, b)).unflatten(-3, (m, b)), dim1=-4, dim2=-2).movedim(-1, -3)


def channel_gram_backward(
    x: Tensor, y: Tensor, c: Tensor, grad: Tensor, *, leaf: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dy, dc) of :func:`channel_gram` from ``grad`` = dG (..., C, C), in the shapes of x, y, c.

    Each block product later earlier^T gives d later = dG_block . earlier, d earlier = dG_block^T . later, and
    those scaled by their factors are dx and dy. G depends on c only through c_a - c_b, and x_a, y_b enter every term
    of G_ab with e^(c_a - c_b): so dc = dx o x - dy o y (the reference tokens cancel, and so does the diagonal).
    """
    n = x.shape[-2]
    shapes = (x.shape, y.shape, c.shape)
    x, y, c, size = _pow2(x, y, c)
    grad = F.pad(grad, (0, size - n, 0, size - n)) if size != n else grad
    leaf = leaf_size(c) if leaf is None else leaf
    xl, yl, to_ref, from_ref = _leaves(x, y, c, leaf)
    block = _diagonal_blocks(grad, size // leaf, leaf).tril()
    dx = sum_to(torch.matmul(block, yl) * to_ref, x.shape[:-2] + (size // leaf, leaf, x.shape[-1])).flatten(-3, -2)
    dy = sum_to(torch.matmul(block.transpose(-2, -1), xl) * from_ref, y.shape[:-2] + (size // leaf, leaf, y.shape[-1]))
    dy = dy.flatten(-3, -2)
    del xl, yl
    s = size // 2
    while s >= leaf:
        m = size // (2 * s)
        later, earlier, to_ref, from_ref = _halves(x, y, c, m, s)
        block = _off_blocks(grad, m, s).contiguous()
        dx.unflatten(-2, (m, 2, s))[..., 1, :, :] += sum_to(
            torch.matmul(block, earlier) * to_ref, dx.shape[:-2] + (m, s, dx.shape[-1])
        )
        d_earlier = torch.matmul(block.transpose(-2, -1), later) * from_ref
        dy.unflatten(-2, (m, 2, s))[..., 0, :, :] += sum_to(d_earlier, dy.shape[:-2] + (m, s, dy.shape[-1]))
        s //= 2
    dc = sum_to(dx * x, c.shape) - sum_to(dy * y, c.shape)
    return sum_to(dx[..., :n, :], shapes[0]), sum_to(dy[..., :n, :], shapes[1]), sum_to(dc[..., :n, :], shapes[2])


def gram(x: Tensor, y: Tensor, c: Tensor, leaf: int | None = None) -> Tensor:
    """G(x, y): :func:`scalar_gram` for c (..., C, 1), else :func:`channel_gram` (``leaf`` as there)."""
    return scalar_gram(x, y, c) if c.shape[-1] == 1 else channel_gram(x, y, c, leaf)


def gram_backward(
    x: Tensor, y: Tensor, c: Tensor, value: list[Tensor], grad: list[Tensor], *, leaf: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dy, dc) of :func:`gram` from ``value`` = [its output] (a scalar decay; [] for a per-channel one, whose
    backward does not read it) and ``grad`` = [dG] (zero above the diagonal). Both lists are emptied, so that the
    caller's (C x C) tensors are freed as soon as read."""
    values, grads = list(value), grad.pop()
    value.clear()
    if c.shape[-1] == 1:
        return scalar_gram_backward(x, y, c, values.pop(), grads)
    return channel_gram_backward(x, y, c, grads, leaf=leaf)
