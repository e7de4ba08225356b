"""Models: the causal Transformer built from any AttentionSpec, and the recurrent baselines.

>>> model = build_model("transformer", vocab_size=66, dim=64, num_layers=2, max_len=64)
>>> logits = model(ids)          # ids int64 (batch, seq) -> logits (batch, seq, 66)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from axiomformer.models.controls import CONTROL_KINDS, ControlLM
from axiomformer.models.recurrent import RECURRENT_KINDS, RecurrentLM
from axiomformer.models.transformer import Block, TransformerLM
from axiomformer.spec import AttentionSpec

MODEL_KINDS = ("transformer", "rnn", "lstm", "gru", *CONTROL_KINDS)
"""Every model kind ``build_model`` accepts."""


def default_heads(dim: int) -> int:
    """4 heads when they divide ``dim`` evenly (with an even head_dim for RoPE), else fewer."""
    for heads in (4, 2, 1):
        if dim % heads == 0 and (dim // heads) % 2 == 0:
            return heads
    return 1


def build_model(
    kind: str,
    *,
    vocab_size: int,
    dim: int,
    num_layers: int,
    max_len: int,
    spec: AttentionSpec | None = None,
    causal: bool = True,
    **options: Any,
) -> nn.Module:
    """A model mapping token ids (batch, seq) int64 -> logits (batch, seq, vocab_size).

    Args:
        kind: one of ``MODEL_KINDS``.
        dim: model width; the hidden size for rnn/lstm/gru.
        spec: attention of the transformer (default: standard with ``default_heads(dim)`` heads); its ``dim``,
            ``causal`` and ``max_len`` are replaced by ``dim``, ``causal`` and ``max_len``. Ignored by recurrent kinds.
        causal: a causal language model (default) or, with False, a bidirectional encoder (transformer only;
            the recurrent kinds read left to right either way).
        **options: passed to the model class (``TransformerLM``: mlp_ratio, input_position, engine).

    Raises:
        ValueError: an unknown kind (naming the choices) or an invalid size/spec.
    """
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model {kind!r}; choose one of: {', '.join(MODEL_KINDS)}")
    if kind in RECURRENT_KINDS:
        return RecurrentLM(kind, vocab_size, dim, num_layers, max_len, **options)
    if kind in CONTROL_KINDS:
        return ControlLM(kind, vocab_size, dim, num_layers, max_len, causal=causal, **options)
    if spec is None:
        spec = AttentionSpec.standard(dim, default_heads(dim), causal=causal)
    spec = dataclasses.replace(spec, dim=dim, causal=causal, max_len=max_len)
    return TransformerLM(spec, vocab_size, num_layers, max_len, **options)


def build_from_config(config: dict) -> nn.Module:
    """Rebuild a model from its ``model.config`` dict (as stored in a checkpoint)."""
    config = dict(config)
    kind = config.pop("kind")
    spec = config.pop("spec", None)
    if config.get("layer_specs") is not None:
        config["layer_specs"] = [AttentionSpec.from_dict(s) for s in config["layer_specs"]]
    return build_model(kind, spec=AttentionSpec.from_dict(spec) if spec else None, **config)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = [
    "CONTROL_KINDS",
    "MODEL_KINDS",
    "Block",
    "ControlLM",
    "RecurrentLM",
    "TransformerLM",
    "build_from_config",
    "build_model",
    "count_parameters",
    "default_heads",
]
