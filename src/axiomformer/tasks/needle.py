"""``needle``: a key-value pair near the start, filler, and the key asked at the end.

The derivation's motivating case (docs/SOURCES.md): a crucial token thousands of positions back. The pair
``k v`` sits at a random position p < ``window``; every other position holds a random filler token; the last
position repeats k and its target is v. Only that position is scored. Tokens: keys ``0 .. K-1``, values
``K .. 2K-1``, filler ``2K .. 2K+F-1`` (disjoint vocabularies, **our choice**: the task measures reach, not
disambiguation). Generation is vectorized: seq_len = 10,000 costs one random array.
"""

from __future__ import annotations

import numpy as np

from axiomformer.tasks.base import IGNORE, SyntheticTask, positive


class NeedleTask(SyntheticTask):
    """Needle in a haystack.

    Args:
        seq_len: sequence length T >= 3.
        num_keys: K keys and K values (default 16; chance accuracy 1/K).
        num_filler: F filler tokens (default 32).
        window: the pair starts at a position below ``window`` (default 8, clipped to T - 2).
    """

    name = "needle"

    def __init__(self, seq_len: int, num_keys: int = 16, num_filler: int = 32, window: int = 8):
        self.seq_len = positive("seq_len", seq_len, 3)
        self.num_keys = positive("num_keys", num_keys)
        self.num_filler = positive("num_filler", num_filler)
        self.window = min(positive("window", window), self.seq_len - 2)
        self.vocab_size = 2 * self.num_keys + self.num_filler
        self.chance = 1.0 / self.num_keys

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        k = self.num_keys
        rows = np.arange(n)
        inputs = rng.integers(2 * k, self.vocab_size, size=(n, self.seq_len))
        key = rng.integers(0, k, size=n)
        value = rng.integers(k, 2 * k, size=n)
        start = rng.integers(0, self.window, size=n)
        inputs[rows, start] = key
        inputs[rows, start + 1] = value
        inputs[:, -1] = key
        targets = np.full((n, self.seq_len), IGNORE, dtype=np.int64)
        targets[:, -1] = value
        return inputs, targets
