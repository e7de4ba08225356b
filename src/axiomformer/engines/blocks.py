"""The scratch memory of the chunked engines (``engines/rowwise.py``, ``engines/elementwise.py``): score blocks reused
chunk after chunk, and the gradient buffers their backward accumulates into."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class ScoreBlocks:
    """Reusable score blocks of one call of a chunked engine (``engines/rowwise.py``, ``engines/elementwise.py``):
    ``get(i, rows, end)`` is block i viewed as (batch*heads, rows, end), allocated once at the largest size (``rows``
    up to the chunk size or the widest head_dim, ``end`` up to the keys). A fresh multi-MiB block per product paid
    its page faults every time (glibc serves blocks that large by mmap) **(our choice)**.

    The row-wise engine's use:
    Block 0 holds the logits (and Q^T dt once dt is final), 2 dL/du (and dO^T u before it), 3 the cap's slope, 4 and 5
    the kernel's spares: the VJP contract (``engines/rowkernels.py``) never returns t or a spare.
    """

    def __init__(self, like: Tensor, rows: int, k_len: int):
        self.like, self.rows, self.k_len = like, rows, k_len
        self.flat: dict[int, Tensor] = {}

    def get(self, i: int, rows: int, end: int) -> Tensor:
        batch = self.like.shape[0]
        if i not in self.flat:
            self.flat[i] = self.like.new_empty(batch * max(rows, self.rows) * self.k_len)
        return self.flat[i][: batch * rows * end].view(batch, rows, end)

    def spares(self, rows: int, end: int) -> Callable[[int], Tensor]:
        """The kernels' ``spare(i)``: blocks 4, 5, ... of this chunk's shape."""
        return lambda i: self.get(4 + i, rows, end)


def transposed_grad_buffers(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The gradient buffers of a chunked backward over (batch*heads, seq, head_dim) inputs: dQ (uninitialized, each
    chunk writes its rows) and dK, dV transposed and zeroed, (batch*heads, head_dim, keys): ``Q_c^T dS`` and
    ``dO_c^T u`` are products of the score block's shape, measured faster than ``dS^T Q_c`` (0.76 against 0.97-1.18 ms
    at 64 queries x 2,048 keys), and each chunk adds its part in place."""
    grad_kt = k.new_zeros(k.shape[0], k.shape[2], k.shape[1])
    return torch.empty_like(q), grad_kt, v.new_zeros(v.shape[0], v.shape[2], v.shape[1])
