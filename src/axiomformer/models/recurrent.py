"""Recurrent baselines: relaxing A0 (permutation invariance) gives an order-dependent aggregator — an RNN.

``RecurrentLM(kind)`` with kind ``rnn`` (Elman 1990, h_t = tanh(W x_t + U h_{t-1} + b)), ``lstm`` (Hochreiter &
Schmidhuber 1997) or ``gru`` (Cho et al. 2014), via ``torch.nn.RNN/LSTM/GRU``. Same interface as ``TransformerLM``:
embedding, recurrent stack, final LayerNorm, output head tied to the embedding.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

RECURRENT_KINDS = ("rnn", "lstm", "gru")

RecurrentState = Tensor | tuple[Tensor, Tensor]
"""The final state of the stack: h (num_layers, batch, dim); for ``lstm`` the pair (h, c)."""


class RecurrentLM(nn.Module):
    """Recurrent language model: token ids (batch, seq) int64 -> logits (batch, seq, vocab_size).

    Args:
        kind: ``"rnn"`` (tanh Elman), ``"lstm"`` or ``"gru"``.
        vocab_size: number of token ids.
        dim: embedding width and hidden size.
        num_layers: stacked recurrent layers.
        max_len: accepted for interface parity; a recurrent model has no length limit.

    Raises:
        ValueError: an unknown kind (naming the choices) or non-positive sizes.
    """

    def __init__(self, kind: str, vocab_size: int, dim: int, num_layers: int, max_len: int | None = None):
        super().__init__()
        if kind not in RECURRENT_KINDS:
            raise ValueError(f"unknown recurrent kind {kind!r}; choose one of: {', '.join(RECURRENT_KINDS)}")
        for name, value in (("vocab_size", vocab_size), ("dim", dim), ("num_layers", num_layers)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        self.kind, self.vocab_size, self.dim = kind, vocab_size, dim
        self.embed = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.embed.weight, std=dim**-0.5)
        self.rnn: nn.RNNBase
        if kind == "rnn":
            self.rnn = nn.RNN(dim, dim, num_layers, nonlinearity="tanh", batch_first=True)
        else:
            self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(dim, dim, num_layers, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.config = {"kind": kind, "vocab_size": vocab_size, "dim": dim, "num_layers": num_layers, "max_len": max_len}

    @property
    def engines(self) -> list[str]:
        return ["recurrent"]

    def forward(
        self, ids: Tensor, state: RecurrentState | None = None, *, return_state: bool = False
    ) -> Tensor | tuple[Tensor, RecurrentState]:
        """Logits (batch, seq, vocab_size); with ``return_state`` also the final recurrent state.

        Args:
            state: a state returned earlier (continue decoding), or None to start from zeros.
        """
        if ids.dim() != 2:
            raise ValueError(f"ids must be (batch, seq) int64, got shape {tuple(ids.shape)}")
        hidden, state = self.rnn(self.embed(ids) * math.sqrt(self.dim), state)
        logits = self.norm(hidden) @ self.embed.weight.t()
        return (logits, state) if return_state else logits
