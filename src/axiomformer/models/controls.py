"""Validity controls for a task: the standard Transformer with its token mixing taken away or made score-free.

A task can tell the assumptions of attention apart only if it needs what attention does. Two controls say whether
it does (the study's task battery trains them like any other arm, ``axiomformer.study``):

* ``no_mixing``: every position sees only its own token, y_i = W_o W_v x_i (a token-wise MLP stack). What it
  reaches, a task gives away without looking at other tokens.
* ``uniform_mixing``: every visible key weighs the same, y_i = W_o (1 / (i + 1)) sum_{j <= i} W_v x_j (causal mean
  pooling: no scores at all, so neither A4 nor A5 has anything to act on). What it reaches, a task gives away to a
  bag of the prefix. With ``causal=False`` (a bidirectional suite's control) every position takes the mean of the
  whole row instead: what it reaches, a task gives away to a bag of the row.

Both keep everything else of the standard model of ``axiomformer.models.TransformerLM``: the scaled token embedding
plus Vaswani's sinusoidal input encoding, pre-norm residual blocks with the same MLP, a final LayerNorm and the
output head tied to the embedding. **(our choice: the controls differ from the standard model only in the mixer)**
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from axiomformer.axes.mlp import two_layer_mlp
from axiomformer.axes.position import sinusoidal_table

INPUT_POSITIONS = ("sinusoidal", "none")
"""The controls' input encodings: the standard model's, or none."""
CONTROL_KINDS = ("no_mixing", "uniform_mixing")
"""The control models: no token mixing, and uniform causal mixing (every visible key weighted equally)."""


def row_mean(values: Tensor) -> Tensor:
    """(batch, seq, dim) -> (batch, seq, dim): every position holds the mean of the whole row (the bidirectional
    counterpart of :func:`causal_mean`)."""
    return values.mean(dim=1, keepdim=True).expand_as(values)


def causal_mean(values: Tensor) -> Tensor:
    """(batch, seq, dim) -> (batch, seq, dim): position i holds the mean of ``values[:, : i + 1]``."""
    counts = torch.arange(1, values.shape[1] + 1, device=values.device, dtype=values.dtype)
    return values.cumsum(dim=1) / counts[None, :, None]


class _MixBlock(nn.Module):
    """Pre-norm residual block ``x + W_o mix(W_v LN(x))`` then ``x + MLP(LN(x))``; x (batch, seq, dim)."""

    def __init__(self, kind: str, dim: int, mlp_ratio: int, causal: bool = True):
        super().__init__()
        self.kind, self.causal = kind, causal
        self.norm1 = nn.LayerNorm(dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim) if mlp_ratio > 0 else None
        self.mlp = two_layer_mlp(dim, mlp_ratio * dim, dim) if mlp_ratio > 0 else None

    def forward(self, x: Tensor) -> Tensor:
        v = self.value(self.norm1(x))
        if self.kind == "uniform_mixing":
            v = causal_mean(v) if self.causal else row_mean(v)
        x = x + self.out(v)
        return x if self.mlp is None or self.norm2 is None else x + self.mlp(self.norm2(x))


class ControlLM(nn.Module):
    """A control language model: token ids (batch, seq) int64 -> logits (batch, seq, vocab_size).

    Args:
        kind: ``"no_mixing"`` or ``"uniform_mixing"`` (see the module docstring).
        vocab_size: number of token ids.
        dim: model width (even: the sinusoidal input encoding pairs sines and cosines).
        num_layers: number of blocks.
        max_len: longest sequence accepted.
        mlp_ratio: MLP hidden width = ``mlp_ratio * dim`` (0: no MLP sublayer).
        causal: False: every position mixes the whole row.
        input_position: ``"sinusoidal"`` (the standard model's input encoding) or ``"none"`` (no position signal:
            the control of a reference arm without one, e.g. the rho suite's set encoders).

    Raises:
        ValueError: an unknown kind or input position (naming the choices), non-positive sizes, an odd ``dim``, or
            (in forward) ids that are not (batch, seq) or a sequence longer than ``max_len``.
    """

    def __init__(
        self,
        kind: str,
        vocab_size: int,
        dim: int,
        num_layers: int,
        max_len: int,
        *,
        mlp_ratio: int = 4,
        causal: bool = True,
        input_position: str = "sinusoidal",
    ):
        super().__init__()
        if kind not in CONTROL_KINDS:
            raise ValueError(f"unknown control {kind!r}; choose one of: {', '.join(CONTROL_KINDS)}")
        if input_position not in INPUT_POSITIONS:
            raise ValueError(f"unknown input_position {input_position!r}; choose one of: {', '.join(INPUT_POSITIONS)}")
        for name, value in (("vocab_size", vocab_size), ("dim", dim), ("num_layers", num_layers), ("max_len", max_len)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if dim % 2:
            raise ValueError(f"dim must be even for the sinusoidal input encoding, got {dim}")
        if mlp_ratio < 0:
            raise ValueError(f"mlp_ratio must be >= 0, got {mlp_ratio}")
        self.kind, self.vocab_size, self.dim, self.max_len = kind, vocab_size, dim, max_len
        self.encoded = input_position == "sinusoidal"
        self.embed = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.embed.weight, std=dim**-0.5)
        self.blocks = nn.ModuleList(_MixBlock(kind, dim, mlp_ratio, causal) for _ in range(num_layers))
        self.norm = nn.LayerNorm(dim)
        self.config = {
            "kind": kind,
            "vocab_size": vocab_size,
            "dim": dim,
            "num_layers": num_layers,
            "max_len": max_len,
            "mlp_ratio": mlp_ratio,
            **({} if causal else {"causal": False}),
            **({} if self.encoded else {"input_position": input_position}),
        }

    @property
    def engines(self) -> list[str]:
        """What mixed the tokens, one entry per layer (there is no attention engine)."""
        return [self.kind for _ in self.blocks]

    def forward(self, ids: Tensor) -> Tensor:
        """Logits (batch, seq, vocab_size) for token ids (batch, seq) int64."""
        if ids.dim() != 2:
            raise ValueError(f"ids must be (batch, seq) int64, got shape {tuple(ids.shape)}")
        if ids.shape[1] > self.max_len:
            raise ValueError(f"sequence of {ids.shape[1]} tokens exceeds max_len={self.max_len}")
        x = self.embed(ids) * math.sqrt(self.dim)
        if self.encoded:
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = x + sinusoidal_table(positions, self.dim).to(self.embed.weight.dtype)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.t()
