"""``copy``: read n random tokens, then a separator, then reproduce them in order.

Sequence (before the final token is dropped): ``x_1 .. x_n SEP x_1 .. x_n`` with n = seq_len // 2 (one PAD in front
when seq_len is odd). The target at the separator is x_1 and at the j-th copied token x_j it is x_{j+1}; the first
half is not scored. Tokens: data ``0 .. vocab-1``, ``SEP = vocab``, ``PAD = vocab + 1``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from axiomformer.tasks.base import IGNORE, SyntheticTask, left_pad, positive, tuned_budget


class CopyTask(SyntheticTask):
    """The copy task (e.g. Graves et al. 2014, "Neural Turing Machines", sec. 4.1), as next-token prediction.

    Args:
        seq_len: sequence length T >= 2.
        vocab: number of data tokens (default 16).
    """

    name = "copy"
    prefix_determined = True
    budget_defaults: ClassVar[dict[str, Any]] = tuned_budget(steps=1500, target_accuracy=0.99)

    def __init__(self, seq_len: int, vocab: int = 16):
        self.seq_len = positive("seq_len", seq_len, 2)
        self.vocab = positive("vocab", vocab, 2)
        self.n = self.seq_len // 2
        self.sep, self.pad = self.special_tokens(self.vocab, 2)
        self.chance = 1.0 / self.vocab

    def answer(self, data: np.ndarray) -> np.ndarray:
        """What is written after the separator, from the rows read (n, len) int64: the same rows (a subclass may
        write a function of them: ``sort_causal``)."""
        return data

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        data = rng.integers(0, self.vocab, size=(n, self.n))
        sep = np.full((n, 1), self.sep)
        full = np.concatenate([data, sep, self.answer(data)], axis=1)  # (n, 2 len + 1)
        inputs, targets = full[:, :-1], full[:, 1:].copy()
        targets[:, : self.n] = IGNORE  # first half: nothing to predict
        inputs = left_pad(inputs, self.seq_len, self.pad)
        targets = left_pad(targets, self.seq_len, IGNORE)
        return inputs, targets
