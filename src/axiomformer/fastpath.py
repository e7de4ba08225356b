"""The trainer's fast path (``TrainConfig(fast=True)``, and ``compile=True``): the same training step, less work.

What it changes, each measured at the study's size (``docs/training_speed.md``; ``axiomformer bench --train``).
``fast=True``:

- **AdamW's fused kernel** (``torch.optim.AdamW(fused=True)``, one kernel for every parameter instead of a dozen
  tensor ops per parameter): the same update rule (Loshchilov & Hutter 2019, Algorithm 2), rounded differently
  (1-ulp differences per step, so runs agree in distribution, not bit for bit).
- **Gradient clipping on a parameter list built once**, with the multi-tensor norm (``foreach=True``, bitwise the same
  norm): ``model.parameters()`` walks the module tree on every call.

``compile=True`` (independent of ``fast``; the bench's fast path sets both):

- **The training forward under ``torch.compile``** (inductor; the model's attention routes while dynamo traces, so the
  compiled graph runs the engine eager routing picks, see ``axiomformer.engines.router``). It compiles once per
  process and model structure (a second model of the same structure reuses the graph; inductor's on-disk cache
  shortens the compile in the next process); evaluation stays eager. Left out when the loop changes the model between
  steps (an annealed Gumbel temperature would recompile every step). It pays only when a process trains enough runs
  of one structure to cover the compile (``bench --train`` reports the cost).

Everything else -- batches, schedule, evaluation, early stopping, the selection of the tested weights -- is the plain
loop's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

COMPILE_BACKEND = "inductor"
"""The ``torch.compile`` backend of ``TrainConfig(compile=True)``; the tests use ``"aot_eager"`` (the same traced forward
and backward graphs, without inductor's code generation, which takes 10-40 s per model structure on a cold cache)."""


def fused_available(params: Iterable[torch.Tensor]) -> bool:
    """True when ``torch.optim.AdamW(fused=True)`` takes these parameters: floating point, on CPU or CUDA."""
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def training_forward(net: nn.Module, *, compile_model: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The callable the training step runs the model with: ``torch.compile(net)`` on :data:`COMPILE_BACKEND` (static
    shapes: every training batch has the same shape) when ``compile_model``, else ``net`` itself."""
    if compile_model:
        return torch.compile(net, backend=COMPILE_BACKEND, dynamic=False)
    return net


def clip_gradients(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` over a prebuilt list with the multi-tensor kernels; returns the total norm."""
    return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)


__all__ = ["COMPILE_BACKEND", "clip_gradients", "fused_available", "training_forward"]
