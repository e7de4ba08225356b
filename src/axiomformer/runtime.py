"""Process-wide settings: set only by the command-line entry point, or explicitly and scoped by the caller.

A library does not change its host process. ``axiomformer``'s modules never set floating-point modes, thread counts,
allocator modes or environment variables; the command line does it once at start (:func:`command_line_defaults`), and
library users choose for themselves:

- ``torch.set_flush_denormal(True)`` at program start flushes denormal floats to zero on the main thread and on the
  OpenMP worker threads it creates afterwards. ALiBi's far keys give denormal weights that made SDPA's CPU forward
  + backward about 3x slower (torch 2.13, L = 4096); flushed, those weights (below 2^-126 of the largest) are zero,
  which changes nothing at float32 precision.
- :func:`torch_threads` sets PyTorch's intra-op thread count for a block and puts it back.
- :func:`seeded` seeds PyTorch's global random number generators for a block and puts their state back, so that a
  library call that needs reproducible initialization (the trainer, the bench, the flow experiment) leaves the
  caller's random stream where it was.
- :func:`axiomformer.memory.owning_process_memory` lets the peak-memory meter reset the process's peak counters and
  glibc's allocator thresholds; the command line enters it for each command.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch


def command_line_defaults() -> None:
    """What the ``axiomformer`` command sets for its own process: flush-to-zero for denormal floats."""
    torch.set_flush_denormal(True)


@contextlib.contextmanager
def seeded(seed: int, devices: Sequence[torch.device | str | int] = ()) -> Iterator[None]:
    """Run the block with PyTorch's global generators seeded by ``seed`` (``torch.manual_seed``), then restore the
    CPU generator's state and that of each CUDA device in ``devices`` (``torch.random.fork_rng``).

    Inside the block, draws without an explicit generator (parameter initialization, dropout, Gumbel noise) are a
    pure function of ``seed``; after it, the caller's random stream continues as if the block had not run.
    """
    cuda = [
        torch.device(d).index or 0 for d in devices if not isinstance(d, int) and torch.device(d).type == "cuda"
    ] + [d for d in devices if isinstance(d, int)]
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield


def reseed_within_scope(seed: int) -> None:
    """Re-seed PyTorch's global generators with ``seed`` inside a :func:`seeded` block (whose exit restores the
    caller's stream), e.g. to give each torchrun rank its own dropout masks after the shared model initialization.
    Calling it outside such a block changes the process's random stream: do not."""
    torch.manual_seed(seed)


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with ``count`` intra-op threads (``None`` or 0: unchanged), then restore the previous count."""
    previous = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count:
            torch.set_num_threads(previous)
