"""``induction``: after a trigger token, recall what followed its earlier occurrence (Fu et al. 2023, "Hungry Hungry
Hippos", sec. 3.1 "Induction Head"; Olsson et al. 2022).

Random tokens from ``0 .. vocab-1`` everywhere, except: the trigger ``S = vocab`` at a random position p <= T - 3,
then the answer b (a random token), and S again at the last position, whose target is b. The answer shares its
vocabulary with the filler, so the model must find the token *after* the earlier trigger.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from axiomformer.tasks.base import IGNORE, SyntheticTask, positive, tuned_budget


class InductionTask(SyntheticTask):
    """Induction head.

    Args:
        seq_len: sequence length T >= 3.
        vocab: number of ordinary tokens (default 16; chance accuracy 1/vocab).
    """

    name = "induction"
    prefix_determined = True
    budget_defaults: ClassVar[dict[str, Any]] = tuned_budget(steps=1500, target_accuracy=0.98, eval_batches=8)

    def __init__(self, seq_len: int, vocab: int = 16):
        self.seq_len = positive("seq_len", seq_len, 3)
        self.vocab = positive("vocab", vocab, 2)
        (self.trigger,) = self.special_tokens(self.vocab, 1)
        self.chance = 1.0 / self.vocab

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        rows = np.arange(n)
        inputs = rng.integers(0, self.vocab, size=(n, self.seq_len))
        start = rng.integers(0, self.seq_len - 2, size=n)
        inputs[rows, start] = self.trigger
        inputs[:, -1] = self.trigger
        targets = np.full((n, self.seq_len), IGNORE, dtype=np.int64)
        targets[:, -1] = inputs[rows, start + 1]
        return inputs, targets
