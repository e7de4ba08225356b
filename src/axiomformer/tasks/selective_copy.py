"""``selective_copy``: copy the data tokens scattered among noise, in order (Gu & Dao 2023, "Mamba", sec. 3.1).

Sequence (before the final token is dropped): a context of ``seq_len - num_tokens`` positions holding
``num_tokens`` data tokens at random positions and NOISE elsewhere, then ``SEP d_1 .. d_N``. The target at SEP is
d_1 and at d_j it is d_{j+1}. Tokens: data ``0 .. vocab-1``, ``NOISE = vocab``, ``SEP = vocab + 1``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from axiomformer.tasks.base import IGNORE, SyntheticTask, positive, tuned_budget


class SelectiveCopyTask(SyntheticTask):
    """Selective copying.

    Args:
        seq_len: sequence length T.
        vocab: number of data tokens (default 16).
        num_tokens: data tokens to copy (default ``max(1, T // 8)``); needs ``2 * num_tokens <= T``.
    """

    name = "selective_copy"
    prefix_determined = True
    budget_defaults: ClassVar[dict[str, Any]] = tuned_budget(steps=1500, target_accuracy=0.99)

    def __init__(self, seq_len: int, vocab: int = 16, num_tokens: int | None = None):
        self.seq_len = positive("seq_len", seq_len, 2)
        self.vocab = positive("vocab", vocab, 2)
        self.chance = 1.0 / self.vocab
        self.num_tokens = positive("num_tokens", num_tokens if num_tokens is not None else max(1, seq_len // 8))
        self.context = self.seq_len - self.num_tokens
        if self.context < self.num_tokens:
            raise ValueError(
                f"num_tokens={self.num_tokens} data tokens do not fit a context of "
                f"{self.context} positions at seq_len={seq_len}"
            )
        self.noise, self.sep = self.special_tokens(self.vocab, 2)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        k, rows = self.num_tokens, np.arange(n)[:, None]
        data = rng.integers(0, self.vocab, size=(n, k))
        where = np.sort(np.argsort(rng.random((n, self.context)), axis=1)[:, :k], axis=1)
        context = np.full((n, self.context), self.noise, dtype=np.int64)
        context[rows, where] = data
        full = np.concatenate([context, np.full((n, 1), self.sep), data], axis=1)  # (n, T + 1)
        inputs, targets = full[:, :-1], full[:, 1:].copy()
        targets[:, : self.context] = IGNORE
        return inputs, targets
