"""The state transport chunk by chunk under autograd (``engines/recurrent.py``'s module docstring has the algebra):
the reference the recurrent engine's chunkwise form (``engines/state_chunked.py``) equals, run by KV-cache decoding
and by a second-order backward. Its own module so that both engines read it without importing each other."""

from __future__ import annotations

import torch
from torch import Tensor

from axiomformer.axes.transport import TransportGates, decayed_gram

DEFAULT_CHUNK = 64
"""Tokens per chunk **(our choice: fla's chunk size for these kernels)**."""

DIAG_CHUNK = 16
"""Tokens per chunk with a per-channel decay (trait ``diag_decay``): its decayed products hold (chunk x chunk x
head_dim) factors. At L = 1024, 8 heads of 64, one CPU thread, chunks of 64 took 4.2 s and 1.1 GiB for KDA's forward
and backward (47.8x SDPA) **(our choice; fla's KDA kernels use sub-chunks of 16 too)**."""


def chunk_for(traits: frozenset, chunk: int) -> int:
    """The chunk size for a transport with ``traits``: at most DIAG_CHUNK with a per-channel decay."""
    return min(chunk, DIAG_CHUNK) if "diag_decay" in traits else chunk


def _chunk(q: Tensor, k: Tensor, v: Tensor, g: TransportGates, state: Tensor) -> tuple[Tensor, Tensor]:
    """(out (batch, heads, n, head_dim_v), state after the chunk) for one chunk (module docstring)."""
    n = k.shape[-2]
    pos = torch.arange(n, device=k.device)
    c = g.log_decay.cumsum(-2)
    write = torch.ones_like(k[..., 0]) if g.write is None else g.write
    out = torch.matmul(q * c.exp(), state.transpose(-2, -1))
    out = out + torch.matmul(decayed_gram(q, c, pos, k, c, pos, False) * write.unsqueeze(-2), v)
    end = c[..., -1:, :]
    to_end = (end - c).exp()
    new_state = state * end.exp() + torch.matmul((v * write.unsqueeze(-1)).transpose(-2, -1), k * to_end)
    if g.w is not None and g.beta is not None:
        w, beta = g.w, g.beta
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        lower = eye + decayed_gram(w, c, pos, w, c, pos, True) * beta.unsqueeze(-2)
        rhs = torch.matmul(w * c.exp(), state.transpose(-2, -1))
        rhs = rhs + torch.matmul(decayed_gram(w, c, pos, k, c, pos, True) * write.unsqueeze(-2), v)
        u = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
        out = out - torch.matmul(decayed_gram(q, c, pos, w, c, pos, False) * beta.unsqueeze(-2), u)
        new_state = new_state - torch.matmul((u * beta.unsqueeze(-1)).transpose(-2, -1), w * to_end)
    return out, new_state


def state_form(
    q: Tensor, k: Tensor, v: Tensor, gates: TransportGates, state: Tensor | None = None, chunk: int = DEFAULT_CHUNK
) -> tuple[Tensor, Tensor]:
    """The transport's output and final state, chunk by chunk.

    Args:
        q: (batch, heads, n, head_dim) queries, already scaled (query t at token t); k: (batch, heads, n, head_dim);
            v: (batch, heads, n, head_dim_v); gates: the :class:`TransportGates` of the n tokens.
        state: (batch, heads, head_dim_v, head_dim) the state before the first token (zeros when None).
        chunk: tokens per chunk (1: the token-by-token recurrence; n: the parallel form).

    Returns:
        out (batch, heads, n, head_dim_v) and the state after the last token, in the dtype of q.
    """
    b, h, n, d = k.shape
    if state is None:
        state = q.new_zeros(b, h, v.shape[-1], d)
    outs = []
    for s in range(0, n, max(1, chunk)):
        part = slice(s, s + chunk)
        g = gates.tokens(part)
        out, state = _chunk(q[:, :, part], k[:, :, part], v[:, :, part], g, state)
        outs.append(out)
    out = torch.cat(outs, dim=-2) if outs else q.new_zeros(b, h, 0, v.shape[-1])
    return out, state


__all__ = ["DEFAULT_CHUNK", "DIAG_CHUNK", "chunk_for", "state_form"]
