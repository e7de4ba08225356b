"""Scoring a model on batches: masked cross-entropy and accuracy over the scored positions (target != IGNORE).

Shared by the trainer (``axiomformer.train``) and the probes (``axiomformer.probes``), which measure a model without
training it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from axiomformer.tasks import IGNORE

MAX_BATCH_TOKENS = 16384
"""A defaulted batch size shrinks so that batch_size * seq_len stays within this (long sequences, small batches)."""


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over scored positions; logits (B, T, V), targets (B, T) with -100 = unscored."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE, reduction=reduction)


@torch.no_grad()
def eval_counts(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, ...]]) -> tuple[int, int, float]:
    """(correct predictions, scored positions, summed cross-entropy in nats) over the scored positions of
    ``batches``, the model in eval mode: the sums that distributed evaluation adds up across ranks."""
    was_training = model.training
    model.eval()
    try:
        return eval_counts_as_is(model, batches)
    finally:
        model.train(was_training)


@torch.no_grad()
def eval_counts_as_is(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, ...]]) -> tuple[int, int, float]:
    """:func:`eval_counts` in whatever mode the model is (e.g. training mode: Gumbel noise on)."""
    correct = total = 0
    loss_sum = 0.0
    for inputs, targets in batches:
        logits = model(inputs)
        scored = targets != IGNORE
        correct += int((logits.argmax(-1) == targets)[scored].sum())
        total += int(scored.sum())
        loss_sum += float(masked_loss(logits, targets, reduction="sum"))
    return correct, total, loss_sum


def evaluate_as_is(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, ...]]) -> tuple[float, float]:
    """(accuracy, mean loss) over the scored positions of ``batches``, in whatever mode the model is."""
    correct, total, loss_sum = eval_counts_as_is(model, batches)
    return correct / max(1, total), loss_sum / max(1, total)
