"""Data-parallel training on ``torch.distributed``: one process per device, launched by ``torchrun``.

>>> torchrun --nproc-per-node 2 -m axiomformer train --task needle --seq-len 32 --steps 20 --json

Every rank draws the global batch that a single process would draw with the same seed (batches are pure functions of
(seed, step), see :mod:`axiomformer.train`) and keeps its contiguous slice of rows; ``--batch-size`` is the global
batch. The loss on a rank is its share of the sum over the global batch's scored positions, scaled so that
``DistributedDataParallel``'s gradient averaging (Li et al. 2020, "PyTorch Distributed", VLDB) yields the gradient of
the single-process mean loss over the whole global batch. Evaluation splits the eval batches across ranks and sums
(correct, scored, loss) over all of them, so the accuracy is that of the whole eval set.

Backends: ``nccl`` for CUDA, ``gloo`` for CPU. The process group is created by the command-line entry point
(:func:`process_group`); :func:`axiomformer.train.train` joins whatever group is initialized and otherwise runs as one
process.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from axiomformer.runtime import reseed_within_scope
from axiomformer.tasks import IGNORE


def launched_by_torchrun() -> bool:
    """True when the torchrun environment (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``) names more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ and "MASTER_ADDR" in os.environ


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; any other name is passed to ``torch.device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def rank_device(name: str, local_rank: int) -> torch.device:
    """The device of one rank: ``"auto"`` or ``"cuda"`` without an index -> ``cuda:<local_rank>`` when CUDA is present
    (``"auto"`` falls back to CPU); an explicit ``cuda:N`` or ``cpu`` is kept."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


@contextlib.contextmanager
def process_group(device: str = "auto") -> Iterator[bool]:
    """Create the default process group from torchrun's environment for the duration of the block; yields whether
    one was created. Outside torchrun (or with one process) it does nothing and yields False.

    The backend is ``nccl`` when the rank's device is CUDA, else ``gloo``. Meant for entry points only: a process group
    is process-wide state.
    """
    if not launched_by_torchrun() or dist.is_initialized():
        yield False
        return
    target = rank_device(device, _local_rank())
    if target.type == "cuda":
        dist.init_process_group("nccl", device_id=target)
    else:
        dist.init_process_group("gloo")
    try:
        yield True
    finally:
        # Without a barrier a rank that finishes first (rank 0 still writing the checkpoint) can tear gloo's
        # connections down under its peer, which then aborts ("terminate called without an active exception").
        dist.barrier()
        dist.destroy_process_group()


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s random draws in a run seeded ``seed``: ``seed`` itself on rank 0, else 63 bits of
    SHA-256 of ``"seed:rank"`` (a torch CPU generator reads only the low 32 bits of a seed, so ``seed + rank * 2**32``
    would repeat rank 0's stream)."""
    if rank == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{rank}".encode()).digest()[:8], "little") >> 1


@dataclass(frozen=True)
class DataParallel:
    """How this process takes part in training: its rank, the world size and its device.

    With ``world_size == 1`` every method is the single-process computation itself (no scaling, no communication).
    """

    rank: int
    world_size: int
    device: torch.device

    @classmethod
    def current(cls, device: str = "auto") -> DataParallel:
        """The initialized default process group, or a world of one process on ``device``."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), rank_device(device, _local_rank()))
        return cls(0, 1, resolve_device(device))

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes checkpoints, logs and JSON."""
        return self.rank == 0

    def check_batch(self, batch_size: int) -> None:
        """Raises ValueError unless ``batch_size`` (the global batch) splits evenly over the ranks."""
        if batch_size % self.world_size:
            raise ValueError(
                f"--batch-size {batch_size} (the global batch) must be divisible by the number of "
                f"processes {self.world_size}"
            )

    def seed_random_draws(self, seed: int) -> None:
        """Give this rank its own stream of random draws (dropout masks, Gumbel noise) after the model is built.

        Every rank seeds ``seed`` before building the model (and DDP broadcasts rank 0's weights anyway); without
        this every rank would then draw the same dropout mask and noise on its shard. Rank 0 keeps the stream of a
        single process with ``seed``; rank r > 0 continues from :func:`rank_seed`, so a run with the same seed and world
        size is reproducible. Call inside the training entry's :func:`~axiomformer.runtime.seeded`
        scope only.
        """
        if self.rank > 0:
            reseed_within_scope(rank_seed(seed, self.rank))

    def wrap(self, model: nn.Module) -> nn.Module:
        """``DistributedDataParallel(model)`` across the ranks (rank 0's initial weights are broadcast); the model
        itself with one process."""
        if self.world_size == 1:
            return model
        ids = [self.device] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def shard(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """This rank's contiguous rows of the global batch (inputs (B, T), targets (B, T)), moved to the device, and
        the number of scored positions (targets != -100) in the whole global batch."""
        scored = int((targets != IGNORE).sum())
        if self.world_size > 1:
            rows = inputs.shape[0] // self.world_size
            start = self.rank * rows
            inputs, targets = inputs[start : start + rows], targets[start : start + rows]
        return inputs.to(self.device), targets.to(self.device), scored

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, global_scored: int) -> torch.Tensor:
        """The loss to backpropagate on this rank: ``world_size * sum(shard cross-entropy) / global_scored``, whose
        gradient averaged over ranks is the gradient of the mean cross-entropy over the global batch."""
        from axiomformer.evaluation import masked_loss

        if self.world_size == 1:
            return masked_loss(logits, targets)
        return masked_loss(logits, targets, reduction="sum") * (self.world_size / max(1, global_scored))

    def global_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The mean loss over the global batch from every rank's :meth:`loss` (an all-reduce); detached."""
        loss = loss.detach()
        if self.world_size == 1:
            return loss
        total = loss.clone()
        dist.all_reduce(total)
        return total / self.world_size

    def eval_indices(self, count: int) -> range:
        """The eval batches this rank evaluates: ``rank, rank + world_size, ...`` below ``count``."""
        return range(self.rank, count, self.world_size)

    def reduce_counts(self, correct: float, scored: float, loss_sum: float) -> tuple[float, float, float]:
        """Sum (correct, scored, loss_sum) over the ranks (float64 all-reduce)."""
        if self.world_size == 1:
            return correct, scored, loss_sum
        totals = torch.tensor(
            [correct, scored, loss_sum],
            dtype=torch.float64,
            device=self.device if dist.get_backend() == "nccl" else "cpu",
        )
        dist.all_reduce(totals)
        correct, scored, loss_sum = totals.tolist()
        return correct, scored, loss_sum


__all__ = ["DataParallel", "launched_by_torchrun", "process_group", "rank_device", "resolve_device"]
