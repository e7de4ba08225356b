"""``needle``: one key-value pair anywhere in the sequence, filler, and the key asked at the end.

The derivation's motivating case (docs/SOURCES.md): a crucial token thousands of positions back. The pair ``k v``
starts at a position p drawn uniformly from ``0 .. T - 3`` (or below ``window`` when given); every other position
holds filler; the last position repeats k and its target is v. Only that position is scored.

Vocabulary **(our choice)**: by default (``shared=False``) keys ``0 .. K-1``, values ``K .. 2K-1`` and filler
``2K .. 2K+F-1`` are disjoint, so the pair is marked; since it sits anywhere, the model must keep that one item over a
distance uniform in ``2 .. T`` (retention, not a latch on the first few tokens). With ``shared=True`` keys, values and
filler are one vocabulary of ``num_keys`` tokens; the key occurs exactly once before the query (filler avoids it) and
the value differs from the key; nothing marks the pair, so a model must keep, or look up, what followed every token —
a harder associative-recall task that a 2-layer width-32 Transformer did not learn at T = 64 in 1,000 CPU steps
(measured), which is why it is not the default.
Generation is vectorized: seq_len = 10,000 costs one random array.
"""

from __future__ import annotations

import numpy as np

from axiomformer.tasks.base import IGNORE, SyntheticTask, positive


class NeedleTask(SyntheticTask):
    """Needle in a haystack.

    Args:
        seq_len: sequence length T >= 3.
        num_keys: K keys and K values (default 16; chance 1/K); with ``shared=True``, the size of the one vocabulary
            (chance 1/(K-1)).
        num_filler: F filler tokens (default 32; ``shared=False`` only).
        window: the pair starts at a position below ``window`` (default: anywhere, ``T - 2``; clipped to it).
        shared: one vocabulary for keys, values and filler (default False).

    Raises:
        ValueError: non-positive sizes, or ``num_keys < 3`` with a shared vocabulary (filler needs a token that is
            not the key).
    """

    name = "needle"

    def __init__(self, seq_len: int, num_keys: int = 16, num_filler: int = 32, window: int | None = None,
                 shared: bool = False):
        self.seq_len = positive("seq_len", seq_len, 3)
        self.shared = bool(shared)
        self.num_keys = positive("num_keys", num_keys, 3 if self.shared else 1)
        self.num_filler = positive("num_filler", num_filler)
        self.window = self.seq_len - 2 if window is None else min(positive("window", window), self.seq_len - 2)
        if self.shared:
            self.vocab_size = self.num_keys
            self.chance = 1.0 / (self.num_keys - 1)
        else:
            self.vocab_size = 2 * self.num_keys + self.num_filler
            self.chance = 1.0 / self.num_keys

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        k = self.num_keys
        rows = np.arange(n)
        start = rng.integers(0, self.window, size=n)
        if self.shared:
            key = rng.integers(0, k, size=n)
            value = rng.integers(0, k - 1, size=n)
            value += value >= key                                   # any token but the key
            inputs = rng.integers(0, k - 1, size=(n, self.seq_len))
            inputs += inputs >= key[:, None]                        # filler avoids the key
        else:
            key = rng.integers(0, k, size=n)
            value = rng.integers(k, 2 * k, size=n)
            inputs = rng.integers(2 * k, self.vocab_size, size=(n, self.seq_len))
        inputs[rows, start] = key
        inputs[rows, start + 1] = value
        inputs[:, -1] = key
        targets = np.full((n, self.seq_len), IGNORE, dtype=np.int64)
        targets[:, -1] = value
        return inputs, targets
