"""Measurements taken on a model before or after training, never during it: the ``probes`` of ``TrainConfig``.

Every probe runs with the model in eval mode and gradients off (``train._callback``), reads only the task's eval
split, and changes no parameter, so a run's training is the same with or without them. They answer the study
suites' questions:

* ``init_entropy`` (at initialization): the attention entropy of the last query row (it sees all n = T keys), per
  layer, averaged over heads and the eval batch, with the variance sigma^2 of that row's scaled scores. For n iid
  Gaussian scores of variance sigma^2 the softmax entropy tends to ``log n - sigma^2 / 2`` while sigma^2 < 2 log n
  (the high-temperature phase of Derrida's random-energy model, 1981: the partition function concentrates,
  Z ~ n e^{sigma^2/2} and E_u[s] ~ sigma^2) and stays O(1) beyond it (the frozen phase: a few keys carry the row).
  :func:`entropy_closed_form` is that limit. With 1/sqrt(d) the scores of unit-variance q, k have sigma^2 ~ 1;
  without it sigma^2 ~ d (Somani, A5).
* ``sampled_eval`` (after training): accuracy with the normalizer's training-time sampling on (Gumbel noise, hard
  or soft), over ``SAMPLED_DRAWS`` draws of the noise; the trainer's own evaluation is the deterministic mode.
* ``eval_lengths`` (after training, a config field of its own): eval accuracy and loss at other sequence lengths,
  the model unchanged (length extrapolation: train at L, test at 2L, 4L, 8L).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from axiomformer.evaluation import MAX_BATCH_TOKENS, evaluate_as_is

if TYPE_CHECKING:
    from axiomformer.attention import Attention

PROBES = ("init_entropy", "sampled_eval")
"""Probe names accepted by ``TrainConfig.probes``."""

SAMPLED_DRAWS = 4
"""Draws of the sampling noise averaged by ``sampled_eval``."""


def entropy_closed_form(n: int, score_var: float) -> float:
    """Large-n softmax entropy (nats) of n iid Gaussian scores of variance ``score_var``: ``log n - var / 2``.

    Valid in the high-temperature phase ``score_var < 2 log n``; returns NaN beyond it (the frozen phase, where the
    entropy stays O(1) and this limit would go negative). Derivation: H = log Z - E_u[s]; for n -> infinity,
    Z / n -> E[e^s] = e^{var/2} and E_u[s] -> E[s e^s] / E[e^s] = var.
    """
    if n < 1 or score_var < 0:
        raise ValueError(f"need n >= 1 and score_var >= 0, got n={n}, score_var={score_var}")
    if score_var >= 2.0 * math.log(n):
        return float("nan")
    return math.log(n) - score_var / 2.0


def _attention_layers(model: nn.Module) -> list[Attention]:
    from axiomformer.attention import Attention

    return [m for m in model.modules() if isinstance(m, Attention)]


def _row_entropy_and_variance(module: Attention, x: torch.Tensor) -> tuple[float, float]:
    """Entropy of the last query row's attention weights and the variance of its scaled scores, averaged over the
    batch and heads; ``x`` (batch, seq, dim) is the layer's input. Dot-family scores (score_fn(q, k) * scale)."""
    positions = torch.arange(x.shape[1], device=x.device)
    q = module._split_heads(module.q_proj(module.position.encode_inputs(x, positions)))
    k = module._split_heads(module.k_proj(module.position.encode_inputs(x, positions)))
    q, k = module.position.rotate(q, positions), module.position.rotate(k, positions)
    scores = (module.score_fn(q[..., -1:, :], k) * module.scale()).float()  # (batch, heads, 1, seq)
    _, weights = module(x, need_weights=True)
    row = weights[..., -1, :].float().clamp_min(0)
    entropy = -(row * row.clamp_min(1e-30).log()).sum(-1)
    return float(entropy.mean()), float(scores.squeeze(-2).var(dim=-1, unbiased=False).mean())


def init_entropy(model: nn.Module, batches: Sequence[tuple[torch.Tensor, ...]]) -> dict[str, Any]:
    """Per layer: measured entropy of the last query row, score variance, ``log n`` and the closed form."""
    layers = _attention_layers(model)
    inputs_seen: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(layers))}
    handles = [
        layer.register_forward_pre_hook(lambda mod, args, i=i: inputs_seen[i].append(args[0].detach()))
        for i, layer in enumerate(layers)
    ]
    try:
        for inputs, _ in batches:
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    out = []
    for i, layer in enumerate(layers):
        x = torch.cat(inputs_seen[i])
        entropy, var = _row_entropy_and_variance(layer, x)
        n = x.shape[1]
        out.append(
            {
                "layer": i,
                "entropy": entropy,
                "score_var": var,
                "log_n": math.log(n),
                "closed_form": entropy_closed_form(n, var),
            }
        )
    return {"init_entropy": out}


def sampled_accuracy(
    model: nn.Module, batches: Sequence[tuple[torch.Tensor, ...]], draws: int = SAMPLED_DRAWS
) -> dict[str, Any]:
    """Accuracy with the normalizer's training-time sampling on (the model's forward in training mode, gradients
    off), one value per draw. Refuses a model with attention dropout, which training mode would also switch on."""
    if any(layer.spec.dropout > 0 for layer in _attention_layers(model)):
        raise ValueError("sampled evaluation needs attention dropout 0 (training mode would apply dropout)")
    was_training = model.training
    model.train()
    try:
        accuracies = [evaluate_as_is(model, batches)[0] for _ in range(draws)]
    finally:
        model.train(was_training)
    return {"sampled_accuracy": sum(accuracies) / len(accuracies), "sampled_accuracies": accuracies}


def length_accuracy(
    model: nn.Module, task_name: str, options: dict, lengths: list[int], batch_size: int, eval_batches: int
) -> dict[str, Any]:
    """Eval accuracy and loss at each of ``lengths`` (the task rebuilt at that length, test split, the same batch
    seeds as the trainer's evaluation), the model as it is: no parameter changes, no gradient."""
    from axiomformer.tasks import make_task

    device = next(model.parameters()).device
    out = {}
    for length in lengths:
        task = make_task(task_name, seq_len=length, **options)
        size = max(1, min(batch_size, MAX_BATCH_TOKENS // length))
        batches = [tuple(t.to(device) for t in task.batch(size, seed=i, split="test")) for i in range(eval_batches)]
        accuracy, loss = evaluate_as_is(model, batches)
        out[str(length)] = {"accuracy": accuracy, "loss": loss, "chance": task.chance}
    return {"length_accuracy": out}
