"""The chunkwise form of a state transport, with a hand-scheduled backward: O(L) memory, forward and backward.

Source: Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length",
arXiv:2406.06484, sec. 3 (the WY/UT form of a chunk), with the decay of Gated DeltaNet (Yang, Kautz & Hatamizadeh
2025, arXiv:2412.06464, sec. 3.3) and KDA's per-channel decay (Kimi Team 2025, arXiv:2510.26692, sec. 3). The state
S_t = S_{t-1} P_t + gamma_t v_t k_t^T, P_t = Diag(alpha_t) (I - beta_t w_t w_t^T), o_t = S_t q_t (``axes/transport.py``)
is, over a chunk of C tokens entering with the state S_0, *linear in S_0*:

    O = Qt S_0^T + Oi,    S_end = S_0 P + D,

with c the chunk's cumulative log decay, G(x, y)_ab = sum_i x_ai y_bi e^(c_ai - c_bi) (a >= b; M' keeps a > b),
T = (I + (M' o G(W, W)) diag beta)^-1, [Wt | Ut] = T [W o e^c | (M' o G(W, K)) (gamma o V)] and B = G(Q, W) diag beta:

    Qt = Q o e^c - B Wt,   Oi = G(Q, K) (gamma o V) - B Ut,
    P  = Diag(e^(c_end)) - Wt^T diag(beta) (W o e^(c_end - c)),   D = (gamma o V)^T (K o e^(c_end - c)) - Ut^T diag(beta) (W o e^(c_end - c))

(no Householder factor: Qt = Q o e^c, Oi = G(Q, K) (gamma o V), P = Diag(e^(c_end)), D as above without its second
term). Every chunk's (Qt, Oi, P, D) is computed at once for a group of chunks (batched matrix products, no loop over
tokens); only S_n = S_{n-1} P_n + D_n runs chunk after chunk. Every exponent is <= 0, so nothing overflows: c is
cumulated within the chunk, and a per-channel G is built by halving the chunk (:func:`channel_gram`).

The backward (:class:`_Chunkwise`) keeps only the inputs and the state entering each group of chunks; it walks the
groups backward, recomputes a group's (Qt, Oi, P, D) under autograd, runs the state recurrence backward by hand
(dS_{n-1} = dS_n P_n^T + dO_n^T Qt_n, dP_n = S_{n-1}^T dS_n, dD_n = dS_n, dQt_n = dO_n S_{n-1}) and lets autograd take
the group's products back to its inputs **(our choice: fla writes every kernel's backward by hand; recomputing a group
under autograd keeps each product's gradient autograd's own)**. Memory: the inputs, the output, one group's graph and
(groups x head_dim_v x head_dim) states. A backward with ``create_graph=True`` differentiates the autograd chunk form
(``engines/state_form.state_form``) instead, so second-order gradients stay exact.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from axiomformer.axes.transport import TransportGates
from axiomformer.engines.chunk_grams import gram, gram_backward, leaf_size
from axiomformer.engines.state_form import chunk_for, state_form

CHUNK = 64
"""Tokens per chunk **(our choice: fla's chunk size for the delta-rule kernels)**."""

GROUP_ELEMENTS = 1 << 18
"""A group of chunks holds about this many elements per (tokens x head_dim) tensor, summed over batch and heads, half
as many with a per-channel decay (whose decay factors are such tensors too): the backward of a group holds a few
dozen such tensors at once **(our choice: 512 tokens at 8 heads of 64, 256 with KDA's decay. At L = 4096 on 2
threads, KDA's forward and backward took 0.90-0.94x SDPA's time where half as many took 0.98-1.03x (7 paired
repeats, two runs each), with the same peak, 1.81x SDPA's; 512 tokens with KDA's decay went past 2x SDPA's peak, and
64 tokens cost time)**."""


# ---------------------------------------------------------------------------------------------- one chunk's products
def chunk_products(
    q: Tensor, k: Tensor, v: Tensor, *, w: Tensor | None, log_decay: Tensor, beta: Tensor | None, write: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(Qt, Oi, P, D) of every chunk (module docstring), chunks along dim -3.

    Args:
        q, k: (..., C, d) scaled queries and keys; v: (..., C, e); log_decay: (..., C, 1 or d) log alpha <= 0;
            beta: (..., C) Householder strengths or None (no Householder factor); w: (..., C, d) its vectors, None
            with a ``beta`` for w = k (the delta rule, :func:`delta_forward`); write: (..., C) gamma or None
            (gamma = 1).

    Returns:
        Qt (..., C, d), Oi (..., C, e), P (..., d, d) with a Householder factor, else its diagonal (..., 1, 1 or d),
        and D (..., e, d).
    """
    c = log_decay.cumsum(-2)
    end = c[..., -1:, :]
    to_end = (end - c).exp()
    vw = v if write is None else v * write.unsqueeze(-1)
    if w is None or beta is None:
        outs, _ = decay_forward(q, k, vw, c) if beta is None else delta_forward(q, k, vw, c, beta)
        assert outs[1] is not None
        return outs[0], outs[1], outs[2], outs[3]
    d = k.shape[-1]
    xs, ys = torch.stack([q, w], -3).unsqueeze(-3), torch.stack([k, w], -3).unsqueeze(-4)
    grams = gram(xs, ys, c[..., None, None, :, :])  # (..., 2, 2, C, C): [Q; W] against [K, W]
    gqk, gqw = grams[..., 0, 0, :, :], grams[..., 0, 1, :, :]
    gwk, gww = grams[..., 1, 0, :, :].tril(-1), grams[..., 1, 1, :, :].tril(-1)
    columns = beta.unsqueeze(-2)
    rhs = torch.cat([w * c.exp(), torch.matmul(gwk, vw)], -1)
    # unitriangular: the solve reads only the strictly lower part, I + (M' o G(W, W)) diag beta
    solved = torch.linalg.solve_triangular(gww * columns, rhs, upper=False, unitriangular=True)  # [Wt | Ut]
    through = torch.matmul(gqw * columns, solved)
    qt = q * c.exp() - through[..., :d]
    oi = torch.matmul(gqk, vw) - through[..., d:]
    back = torch.matmul(solved.transpose(-2, -1), w * (to_end * beta.unsqueeze(-1)))  # [Wt | Ut]^T diag(beta) Wd
    p = _diagonal(end, d) - back[..., :d, :]
    return qt, oi, p, torch.matmul(vw.transpose(-2, -1), k * to_end) - back[..., d:, :]


def _diagonal(end: Tensor, d: int) -> Tensor:
    """Diag(e^(c_end)) (..., d, d) from the chunk's last cumulative log decay (..., 1, 1 or d)."""
    return torch.diag_embed(end.exp().expand(*end.shape[:-1], d)[..., 0, :])


def decay_forward(
    q: Tensor, k: Tensor, vw: Tensor, c: Tensor, *, leaf: int | None = None, oi: bool = True
) -> tuple[tuple[Tensor, Tensor | None, Tensor, Tensor], tuple[Any, ...]]:
    """((Qt, Oi, P, D), what :func:`decay_backward` reads) of a chunk with a decay and no Householder factor
    (Mamba-2's SSD, Dao & Gu 2024, arXiv:2405.21060, sec. 6): Qt = Q o e^c, Oi = G(Q, K) (gamma o V),
    P = e^(c_end) (a diagonal, (..., 1, 1 or d)), D = (gamma o V)^T Kd. ``leaf``: as ``chunk_grams.channel_gram``
    (computed when None; the tape's last entry); ``oi=False`` leaves Oi out (None: the backward does not read it)."""
    leaf = leaf_size(c) if leaf is None and c.shape[-1] > 1 else leaf
    value = gram(q, k, c, leaf)
    ec, to_end = c.exp(), (c[..., -1:, :] - c).exp()
    kd = k * to_end
    outs = (q * ec, torch.matmul(value, vw) if oi else None, ec[..., -1:, :], torch.matmul(vw.transpose(-2, -1), kd))
    return outs, (value, ec, to_end, kd, leaf)


def decay_backward(
    q: Tensor, k: Tensor, vw: Tensor, c: Tensor, *, tape: list[Any], grads: list[Tensor]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dvw, dc) of :func:`decay_forward` from ``grads`` = [dQt, dOi, dP, dD], written out; ``tape`` and
    ``grads`` are emptied (their tensors freed as soon as read)."""
    value, ec, to_end, kd, leaf = tape
    d_qt, d_oi, d_p, d_d = grads
    tape.clear()
    grads.clear()
    d_kd = torch.matmul(vw, d_d)
    d_vw = torch.matmul(value.transpose(-2, -1), d_oi) + torch.matmul(kd, d_d.transpose(-2, -1))
    dq, dk, dc = gram_backward(q, k, c, [value], [torch.matmul(d_oi, vw.transpose(-2, -1)).tril_()], leaf=leaf)
    del value
    into_end = _channels(d_kd * kd, c)  # d(e^(c_end - c)) o e^(c_end - c)
    dc = dc + _channels(d_qt * q, c) * ec - into_end
    end = d_p * ec[..., -1:, :] + into_end.sum(-2, keepdim=True)
    dc = torch.cat([dc[..., :-1, :], dc[..., -1:, :] + end], -2)
    return dq + d_qt * ec, dk + d_kd * to_end, d_vw, dc


def delta_forward(
    q: Tensor, k: Tensor, vw: Tensor, c: Tensor, beta: Tensor, *, leaf: int | None = None, oi: bool = True
) -> tuple[tuple[Tensor, Tensor | None, Tensor, Tensor], tuple[Any, ...]]:
    """((Qt, Oi, P, D), what :func:`delta_backward` reads) of a delta-rule chunk, c its cumulative log decay.

    With S~_{t-1} = S_{t-1} Diag(alpha_t), the state gains d_t k_t^T with d_t = gamma_t v_t - beta_t S~_{t-1} k_t,
    so within a chunk (I + diag(beta) (M' o G(K, K))) Dl = gamma o V - (beta o K o e^c) S_0^T: with [Wf | Uf] =
    T [beta o K o e^c | gamma o V], T that inverse, Dl = Uf - Wf S_0^T and

        Qt = Q o e^c - G(Q, K) Wf,   Oi = G(Q, K) Uf,   P = Diag(e^(c_end)) - Wf^T Kd,   D = Uf^T Kd

    (Kd = K o e^(c_end - c); Yang et al. 2024, arXiv:2406.06484, eqs. 7-9, with the decay). One Gram matrix of
    [Q; K] against K, one triangular solve: 7 (C x C x d) products per chunk where the general form takes 10.
    ``leaf``: as ``chunk_grams.channel_gram`` (computed when None; the tape's last entry); ``oi=False`` leaves Oi
    out (None: the backward does not read it, and G(Q, K) Uf is a seventh of the products).
    """
    d = k.shape[-1]
    leaf = leaf_size(c) if leaf is None and c.shape[-1] > 1 else leaf
    grams = gram(torch.stack([q, k], -3), k.unsqueeze(-3), c.unsqueeze(-3), leaf)  # (..., 2, C, C)
    ec, to_end = c.exp(), (c[..., -1:, :] - c).exp()
    rhs = torch.cat([k * (ec * beta.unsqueeze(-1)), vw], -1)
    lower = grams[..., 1, :, :] * beta.unsqueeze(-1)
    # unitriangular: the solve reads only the strictly lower part of I + diag(beta) (M' o G(K, K))
    solved = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)  # [Wf | Uf]
    through = torch.matmul(grams[..., 0, :, :], solved if oi else solved[..., :d])  # G(Q, K) [Wf | Uf]
    kd = k * to_end
    back = torch.matmul(solved.transpose(-2, -1), kd)  # [Wf | Uf]^T Kd
    p = back[..., :d, :].neg()
    p.diagonal(dim1=-2, dim2=-1).add_(ec[..., -1, :])  # Diag(e^(c_end)) - Wf^T Kd
    outs = (q * ec - through[..., :d], through[..., d:] if oi else None, p, back[..., d:, :])
    return outs, (grams, lower, solved, ec, to_end, kd, leaf)


def _channels(t: Tensor, like: Tensor) -> Tensor:
    """A (..., C, d) gradient of a decay factor summed to the decay's channels (one for a scalar decay)."""
    return t.sum(-1, keepdim=True) if like.shape[-1] == 1 else t


def delta_backward(
    q: Tensor, k: Tensor, vw: Tensor, c: Tensor, beta: Tensor, *, tape: list[Any], grads: list[Tensor]
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dvw, dc, dbeta) of :func:`delta_forward` from ``grads`` = [dQt, dOi, dP, dD], written out; ``tape``
    and ``grads`` are emptied.

    Reverse of the forward's steps: dY = [-dQt | dOi] for Y = G(Q, K) [Wf | Uf]; dB = [-dP; dD] for
    B = [Wf | Uf]^T Kd; dX = G(Q, K)^T dY + Kd dB^T; the solve X = (I + A)^-1 R gives dR = (I + A)^-T dX and
    dA = -dR X^T (strictly lower); then the Gram matrices' own backward (``engines/chunk_grams.py``). Runs without
    autograd: each temporary is dropped (or overwritten) as soon as it is read for the last time, since one group's
    temporaries are the engine's peak memory.
    """
    grams, lower, solved, ec, to_end, kd, leaf = tape
    d_qt, d_oi, d_p, d_d = grads
    tape.clear()
    grads.clear()
    d = k.shape[-1]
    d_b = torch.cat([-d_p, d_d], -2)
    from_p = torch.diagonal(d_p, dim1=-2, dim2=-1).unsqueeze(-2)  # Diag(e^(c_end)) in P
    del d_p, d_d
    d_kd = torch.matmul(solved, d_b)
    d_x = torch.matmul(kd, d_b.transpose(-2, -1))
    del d_b
    d_y = torch.cat([-d_qt, d_oi], -1)
    del d_oi
    d_x += torch.matmul(grams[..., 0, :, :].transpose(-2, -1), d_y)
    d_gq = torch.matmul(d_y, solved.transpose(-2, -1)).tril_()
    del d_y
    d_r = torch.linalg.solve_triangular(lower.transpose(-2, -1), d_x, upper=True, unitriangular=True)
    del d_x, lower
    d_a = torch.matmul(d_r, solved.transpose(-2, -1)).tril_(-1).neg_()
    del solved
    d_beta = (d_a * grams[..., 1, :, :]).sum(-1)
    d_grams = [torch.stack([d_gq, d_a.mul_(beta.unsqueeze(-1))], -3)]
    del d_gq, d_a
    value = [grams] if c.shape[-1] == 1 else []  # the per-channel backward does not read G
    del grams
    dx, dk, dc = gram_backward(torch.stack([q, k], -3), k.unsqueeze(-3), c.unsqueeze(-3), value, d_grams, leaf=leaf)
    d_rw = d_r[..., :d] * ec  # the gradient of beta o K o e^c, times e^c
    d_beta += (d_rw * k).sum(-1)
    dk = dk[..., 0, :, :].add_(dx[..., 1, :, :]).addcmul_(d_rw, beta.unsqueeze(-1)).addcmul_(d_kd, to_end)
    into_end = _channels(d_kd.mul_(kd), c)  # d(e^(c_end - c)) o e^(c_end - c)
    dc = dc[..., 0, :, :] + _channels(d_qt * q * ec + d_rw.mul_(k).mul_(beta.unsqueeze(-1)), c) - into_end
    dc[..., -1:, :] += _channels(from_p, c) * ec[..., -1:, :] + into_end.sum(-2, keepdim=True)
    return dx[..., 0, :, :].addcmul_(d_qt, ec), dk, d_r[..., d:], dc, d_beta


# ---------------------------------------------------------------------------------------------- the state recurrence
def _times(s: Tensor, p: Tensor) -> Tensor:
    """S P: a matrix product with a full P (..., d, d), a column scaling with its diagonal (..., 1, 1 or d)."""
    return torch.matmul(s, p) if p.shape[-2] > 1 else s * p


def _times_transposed(g: Tensor, p: Tensor) -> Tensor:
    """G P^T (see :func:`_times`)."""
    return torch.matmul(g, p.transpose(-2, -1)) if p.shape[-2] > 1 else g * p


def scan(state: Tensor, p: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """S_n = S_{n-1} P_n + D_n over the chunks (dim 2 of p and d): (the state entering each chunk (batch, heads,
    chunks, e, d), the state after the last)."""
    entering = []
    for n in range(p.shape[2]):
        entering.append(state)
        state = _times(state, p[:, :, n]) + d[:, :, n]
    return torch.stack(entering, 2), state


def scan_backward(grad: Tensor, p: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
    """The state recurrence backward: dS_{n-1} = dS_n P_n^T + E_n from ``grad`` = dS after the last chunk, with
    E_n = dO_n^T Qt_n. Returns (dS_n for every chunk n (= dD_n), dS entering the first chunk)."""
    after: list[Tensor] = []
    for n in reversed(range(p.shape[2])):
        after.append(grad)
        grad = _times_transposed(grad, p[:, :, n]) + e[:, :, n]
    return torch.stack(after[::-1], 2), grad


def _p_grad(entering: Tensor, grad_d: Tensor, p: Tensor) -> Tensor:
    """dP_n = S_{n-1}^T dS_n, or its diagonal (summed to P's shape) when P is a diagonal."""
    if p.shape[-2] > 1:
        return torch.matmul(entering.transpose(-2, -1), grad_d)
    return (
        (entering * grad_d).sum(-2, keepdim=True).sum(-1, keepdim=True)
        if p.shape[-1] == 1
        else (entering * grad_d).sum(-2, keepdim=True)
    )


# ---------------------------------------------------------------------------------------------- groups of chunks
def _groups(n: int, size: int) -> list[slice]:
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


def _split(t: Tensor | None, part: slice, chunk: int) -> Tensor | None:
    """Tokens ``part`` of t (batch, heads, n[, width]) as (batch, heads, chunks, chunk[, width]), zero-padded to
    whole chunks (a zero token writes, decays and reflects nothing)."""
    if t is None:
        return None
    t = t[:, :, part]
    pad = -t.shape[2] % chunk
    if pad:
        t = F.pad(t, (0, 0) * (t.dim() - 3) + (0, pad))
    return t.unflatten(2, (t.shape[2] // chunk, chunk))


def _merge(t: Tensor, length: int) -> Tensor:
    """(batch, heads, chunks, chunk, width) back to (batch, heads, length, width)."""
    return t.flatten(2, 3)[:, :, :length]


# ---------------------------------------------------------------------------------------------- forward and backward
INPUTS = ("q", "k", "v", "w", "log_decay", "beta", "write", "state")

FORWARD_ELEMENTS = 1 << 18
"""The forward runs parts of about this many elements per (tokens x head_dim) tensor (whole groups of the backward,
at least one): it holds no gradients yet, so its peak stays below the backward's with parts as long as or longer than
the backward's groups, and it pays the per-part cost of Python less often **(our choice: 512 tokens at 8 heads of
64, as many as a backward group since GROUP_ELEMENTS is the same; 1024 raised the bench's peak for Gated DeltaNet by
a third)**."""


class _Chunkwise(torch.autograd.Function):
    """(out, final state) of :func:`chunkwise_state_form`; the backward of the module docstring."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> tuple[Tensor, Tensor]:
        *inputs, scale, chunk, group = args
        q, k, v, w, log_decay, beta, write, state = inputs
        b, h, n, e = v.shape
        part_length = group * max(1, FORWARD_ELEMENTS // (b * h * max(k.shape[-1], e, chunk) * group))
        out = v.new_empty(b, h, n, e)
        state = v.new_zeros(b, h, e, k.shape[-1]) if state is None else state
        starts, leaves = [], []
        for part in _groups(n, part_length):
            pieces = [_split(t, part, chunk) for t in (q, k, v, w, log_decay, beta, write)]
            if w is None:
                (qt, oi, p, d), tape = _written_out(_prepared(pieces, scale), None)
            else:
                (qt, oi, p, d), tape = _general(pieces, scale), (None,)
            entering, state = scan(state, p, d)
            starts.append(entering[:, :, :: group // chunk])  # the state entering each group of the backward
            leaves += [tape[-1]] * starts[-1].shape[2]  # a leaf size that fits the whole part fits each group
            assert oi is not None
            out[:, :, part] = _merge(torch.matmul(qt, entering.transpose(-2, -1)).add_(oi), part.stop - part.start)
        ctx.save_for_backward(*inputs, torch.cat(starts, 2) if starts else None)
        ctx.options = (scale, chunk, group, leaves)
        return out, state

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor, grad_state: Tensor) -> tuple[Tensor | None, ...]:
        *inputs, starts = ctx.saved_tensors
        scale, chunk, group, _ = ctx.options
        needs = ctx.needs_input_grad[: len(INPUTS)]
        if torch.is_grad_enabled():  # create_graph=True: a graph of the autograd chunk form
            return (*_graph_grads(inputs, needs, grad_out, grad_state, scale=scale, chunk=chunk), None, None, None)
        # Every token's gradient is written by its group (the autograd path leaves an unused input's at zero).
        fill = torch.zeros_like if inputs[3] is not None else torch.empty_like
        grads = [fill(t) if need and t is not None else None for t, need in zip(inputs, needs)]
        for index in reversed(range(len(_groups(grad_out.shape[2], group)))):
            grad_state = _group_backward(
                inputs, needs, grads, grad_out, grad_state, start=starts[:, :, index], index=index, ctx=ctx
            )
        if needs[-1]:
            grads[-1] = grad_state
        return (*grads, None, None, None)


def _prepared(pieces: list[Tensor | None], scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """(scale q, k, gamma o v, c = cumsum(log_decay), beta) of a group's split inputs."""
    q, k, v, _, log_decay, beta, write = pieces
    assert q is not None and k is not None and v is not None and log_decay is not None
    return q * scale, k, v if write is None else v * write.unsqueeze(-1), log_decay.cumsum(-2), beta


def _written_out(
    prepared: tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None], leaf: int | None, *, oi: bool = True
) -> tuple[tuple[Tensor, Tensor | None, Tensor, Tensor], tuple[Any, ...]]:
    """(Qt, Oi, P, D) and the tape of a group without Householder vectors of its own: :func:`delta_forward` (w = k)
    or :func:`decay_forward` (no Householder factor), from :func:`_prepared` inputs."""
    qs, k, vw, c, beta = prepared
    if beta is None:
        return decay_forward(qs, k, vw, c, leaf=leaf, oi=oi)
    return delta_forward(qs, k, vw, c, beta, leaf=leaf, oi=oi)


def _general(pieces: list[Tensor | None], scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`chunk_products` of a group's split inputs (q, k, v, w, log_decay, beta, write), q times ``scale``."""
    q, k, v, w, log_decay, beta, write = pieces
    assert q is not None and k is not None and v is not None and log_decay is not None
    return chunk_products(q * scale, k, v, w=w, log_decay=log_decay, beta=beta, write=write)


def _write_grads(grads: list[Tensor | None], found: list[Tensor | None], part: slice) -> None:
    """Write a group's chunked gradients ``found`` into the tokens ``part`` of the inputs' gradients ``grads``
    (those both exist)."""
    for target, g in zip(grads, found):
        if target is not None and g is not None:
            target[:, :, part] = _merge(g, part.stop - part.start)


class _Group(NamedTuple):
    """One group of chunks in the backward: its inputs and dO split into chunks, the state entering it, its tokens."""

    pieces: list[Tensor | None]
    grad_o: Tensor
    start: Tensor
    part: slice


def _group_backward(
    inputs: list[Tensor | None],
    needs: tuple[bool, ...],
    grads: list[Tensor | None],
    grad_out: Tensor,
    grad_state: Tensor,
    *,
    start: Tensor,
    index: int,
    ctx: Any,
) -> Tensor:
    """Group ``index`` of chunks backward (module docstring): writes its inputs' gradients into ``grads`` and
    returns dS entering the group. Without Householder vectors of their own (w = k, or no Householder factor) the
    chunk products' backward is written out (:func:`delta_backward`, :func:`decay_backward`); with them, autograd
    differentiates :func:`chunk_products` recomputed."""
    scale, chunk, group, leaves = ctx.options
    part = _groups(grad_out.shape[2], group)[index]
    pieces = [_split(t, part, chunk) for t in inputs[:-1]]
    grad_o = _split(grad_out, part, chunk)
    assert grad_o is not None
    if pieces[3] is not None:
        return _autograd_group(_Group(pieces, grad_o, start, part), needs, grads, grad_state, scale)
    prepared = _prepared(pieces, scale)
    (qt, _, p, d), taped = _written_out(prepared, leaves[index], oi=False)
    tape = list(taped)  # emptied by the backward below, which frees each piece after its last read
    del taped
    entering, _ = scan(start, p, d)
    grad_d, grad_state = scan_backward(grad_state, p, torch.matmul(grad_o.transpose(-2, -1), qt))
    chunk_grads = [torch.matmul(grad_o, entering), grad_o, _p_grad(entering, grad_d, p), grad_d]
    del qt, p, d, entering, grad_d
    qs, k, vw, c, beta = prepared
    _, _, v, _, _, _, write = pieces
    assert v is not None
    if beta is None:
        dq, dk, d_vw, dc = decay_backward(qs, k, vw, c, tape=tape, grads=chunk_grads)
        d_beta = None
    else:
        dq, dk, d_vw, dc, d_beta = delta_backward(qs, k, vw, c, beta, tape=tape, grads=chunk_grads)
    del tape, chunk_grads
    d_write = None if write is None else (d_vw * v).sum(-1)
    dv = d_vw if write is None else d_vw.mul_(write.unsqueeze(-1))
    found = [dq.mul_(scale), dk, dv, None, dc.flip(-2).cumsum(-2).flip(-2), d_beta, d_write]  # c = cumsum(log_decay)
    _write_grads(grads, found, part)
    return grad_state


def _autograd_group(
    group: _Group, needs: tuple[bool, ...], grads: list[Tensor | None], grad_state: Tensor, scale: float
) -> Tensor:
    """:func:`_group_backward` by autograd of :func:`chunk_products` (Householder vectors of their own)."""
    pieces, grad_o, start, part = group
    leaves = [None if t is None else t.detach().requires_grad_(need) for t, need in zip(pieces, needs)]
    with torch.enable_grad():
        qt, oi, p, d = _general(leaves, scale)
    entering, _ = scan(start, p.detach(), d.detach())
    grad_d, grad_state = scan_backward(grad_state, p.detach(), torch.matmul(grad_o.transpose(-2, -1), qt.detach()))
    pairs = [(qt, torch.matmul(grad_o, entering)), (oi, grad_o), (p, _p_grad(entering, grad_d, p)), (d, grad_d)]
    pairs = [(t, g) for t, g in pairs if t.requires_grad]
    wanted = [(i, t) for i, t in enumerate(leaves) if t is not None and t.requires_grad]
    if pairs and wanted:
        got = torch.autograd.grad(
            [t for t, _ in pairs], [t for _, t in wanted], [g for _, g in pairs], allow_unused=True
        )
        found: list[Tensor | None] = [None] * len(grads)
        for (i, _), g in zip(wanted, got):
            found[i] = g
        _write_grads(grads, found, part)
    return grad_state


def _graph_grads(
    inputs: list[Tensor | None],
    needs: tuple[bool, ...],
    grad_out: Tensor,
    grad_state: Tensor,
    *,
    scale: float,
    chunk: int,
) -> list[Tensor | None]:
    """The inputs' gradients as a graph (a backward with ``create_graph=True``): autograd of ``state_form`` (in the
    chunks ``state_form.chunk_for`` gives a per-channel decay, whose products it builds from (chunk x chunk x d)
    factors)."""
    q, k, v, w, log_decay, beta, write, state = inputs
    assert q is not None and k is not None and v is not None and log_decay is not None
    with torch.enable_grad():
        gates = TransportGates(log_decay, beta, k if w is None and beta is not None else w, write)
        traits = frozenset({"diag_decay"} if log_decay.shape[-1] > 1 else ())
        out, last = state_form(q * scale, k, v, gates, state, chunk_for(traits, chunk))
    wanted = [t for t, need in zip(inputs, needs) if need and t is not None]
    got = iter(torch.autograd.grad((out, last), wanted, (grad_out, grad_state), create_graph=True, allow_unused=True))
    return [next(got) if need and t is not None else None for t, need in zip(inputs, needs)]


def chunkwise_state_form(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gates: TransportGates,
    state: Tensor | None = None,
    *,
    scale: float = 1.0,
    chunk: int = CHUNK,
    group: int | None = None,
    shared: bool = False,
) -> tuple[Tensor, Tensor]:
    """The state transport's output and final state, chunkwise (module docstring); equal to ``state_form``.

    Args:
        q: (batch, heads, n, head_dim) queries (query t at token t), multiplied by ``scale`` here; k: (batch, heads,
            n, head_dim); v: (batch, heads, n, head_dim_v); gates: the :class:`TransportGates` of the n tokens, all in
            one floating dtype.
        state: (batch, heads, head_dim_v, head_dim) the state before the first token (zeros when None).
        chunk: tokens per chunk (any n: the last chunk is zero-padded); group: tokens per group of chunks (default:
            :data:`GROUP_ELEMENTS` worth), rounded up to whole chunks.
        shared: the Householder vectors are the keys (the delta rule, trait ``delta``): ``gates.w`` is not read.

    Returns:
        out (batch, heads, n, head_dim_v) and the state after the last token, in v's dtype.

    Raises:
        ValueError: ``shared`` without a Householder factor, or a chunk or group below one token.
    """
    if shared and gates.beta is None:
        raise ValueError("shared=True (w = k) needs a Householder factor (gates.beta)")
    if chunk < 1 or (group is not None and group < 1):
        raise ValueError(f"chunk and group must be at least one token, got chunk={chunk}, group={group}")
    b, h, _, d = k.shape
    width = b * h * max(d, v.shape[-1], chunk) * (2 if gates.log_decay.shape[-1] > 1 else 1)
    tokens = group if group is not None else max(chunk, GROUP_ELEMENTS // max(1, width))
    tokens = -(-tokens // chunk) * chunk
    w = None if shared or gates.beta is None else gates.w
    out, last = _Chunkwise.apply(q, k, v, w, gates.log_decay, gates.beta, gates.write, state, scale, chunk, tokens)
    return out, last
