"""Process-wide settings: set only by the command-line entry point, or explicitly and scoped by the caller.

A library does not change its host process. ``axiomformer``'s modules never set floating-point modes, thread counts,
allocator modes or environment variables; the command line does it once at start (:func:`command_line_defaults`), and
library users choose for themselves:

- ``torch.set_flush_denormal(True)`` at program start flushes denormal floats to zero on the main thread and on the
  OpenMP worker threads it creates afterwards. ALiBi's far keys give denormal weights that made SDPA's CPU forward
  + backward about 3x slower (torch 2.13, L = 4096); flushed, those weights (below 2^-126 of the largest) are zero,
  which changes nothing at float32 precision.
- :func:`torch_threads` sets PyTorch's intra-op thread count for a block and puts it back.
"""

from __future__ import annotations

import contextlib

import torch


def command_line_defaults() -> None:
    """What the ``axiomformer`` command sets for its own process: flush-to-zero for denormal floats."""
    torch.set_flush_denormal(True)


@contextlib.contextmanager
def torch_threads(count: int | None):
    """Run the block with ``count`` intra-op threads (``None`` or 0: unchanged), then restore the previous count."""
    previous = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count:
            torch.set_num_threads(previous)
