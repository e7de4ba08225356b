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
With ``pairs=P > 1`` (disjoint vocabularies), P key-value pairs with distinct keys sit at non-overlapping random
positions and one of the P keys, drawn uniformly, is asked at the end: a model that latches one marked value scores
1/P + (1 - 1/P)/K (values may coincide); it must bind every key to its value over the whole distance (associative recall at length; a one-query MQAR
whose pairs are scattered through filler, Arora et al. 2023).
Generation is vectorized: seq_len = 10,000 costs one random array.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from axiomformer.tasks.base import IGNORE, SyntheticTask, positive, tuned_budget


class NeedleTask(SyntheticTask):
    """Needle in a haystack.

    Args:
        seq_len: sequence length T >= 3.
        num_keys: K keys and K values (default 16; chance 1/K); with ``shared=True``, the size of the one vocabulary
            (chance 1/(K-1)).
        num_filler: F filler tokens (default 32; ``shared=False`` only).
        window: the pair starts at a position below ``window`` (default: anywhere, ``T - 2``; clipped to it).
        shared: one vocabulary for keys, values and filler (default False).
        pairs: P key-value pairs with distinct keys, one of them asked (default 1; ``shared=False`` only).

    Raises:
        ValueError: non-positive sizes, ``num_keys < 3`` with a shared vocabulary (filler needs a token that is
            not the key), ``pairs > 1`` with a shared vocabulary, more pairs than keys, or pairs that do not fit in
            the window (``2 * pairs > window + 1``).
    """

    name = "needle"
    prefix_determined = True
    """The asked key occurs once before the query and its value follows it: the target is a token of the prefix."""
    budget_defaults: ClassVar[dict[str, Any]] = tuned_budget(
        steps=600, target_accuracy=0.98, eval_every=50, eval_batches=8
    )

    def __init__(
        self,
        seq_len: int,
        num_keys: int = 16,
        num_filler: int = 32,
        window: int | None = None,
        shared: bool = False,
        pairs: int = 1,
    ):
        self.seq_len = positive("seq_len", seq_len, 3)
        self.shared = bool(shared)
        self.num_keys = positive("num_keys", num_keys, 3 if self.shared else 1)
        self.num_filler = positive("num_filler", num_filler)
        self.window = self.seq_len - 2 if window is None else min(positive("window", window), self.seq_len - 2)
        self.pairs = positive("pairs", pairs)
        if self.pairs > 1 and self.shared:
            raise ValueError("needle: pairs > 1 needs disjoint vocabularies (shared=False)")
        if self.pairs > self.num_keys:
            raise ValueError(f"needle: pairs={self.pairs} needs at least as many keys, got num_keys={self.num_keys}")
        if 2 * self.pairs > self.window + 1:
            raise ValueError(
                f"needle: {self.pairs} pairs do not fit in a window of {self.window} positions (seq_len={self.seq_len})"
            )
        if self.shared:
            self.vocab_size = self.num_keys
            self.chance = 1.0 / (self.num_keys - 1)
        else:
            self.vocab_size = 2 * self.num_keys + self.num_filler
            self.chance = 1.0 / self.num_keys

    @property
    def latch_accuracy(self) -> float:
        """Expected accuracy of a *latch*, a constant-memory reader that keeps the last marked value it saw and
        answers it: 1 with one pair (disjoint vocabularies), ``1/P + (1 - 1/P)/K`` with P pairs (the last pair is the
        one asked with probability 1/P; otherwise its value equals the asked one with probability 1/K); with a shared
        vocabulary nothing marks the pair, and the latch is not defined (``nan``)."""
        if self.shared:
            return float("nan")
        return 1.0 / self.pairs + (1.0 - 1.0 / self.pairs) / self.num_keys

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.pairs > 1:
            return self._sample_pairs(rng, n)
        k = self.num_keys
        rows = np.arange(n)
        start = rng.integers(0, self.window, size=n)
        if self.shared:
            key = rng.integers(0, k, size=n)
            value = rng.integers(0, k - 1, size=n)
            value += value >= key  # any token but the key
            inputs = rng.integers(0, k - 1, size=(n, self.seq_len))
            inputs += inputs >= key[:, None]  # filler avoids the key
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

    def _sample_pairs(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """P pairs at non-overlapping positions: sorted draws s_1 <= .. <= s_P from ``0 .. W - 2P + 1`` shifted by
        ``2 i`` (so consecutive starts differ by >= 2), keys a random P-subset of the K keys, one of them asked."""
        k, p = self.num_keys, self.pairs
        rows = np.arange(n)[:, None]
        starts = np.sort(rng.integers(0, self.window - 2 * p + 2, size=(n, p)), axis=1) + 2 * np.arange(p)
        keys = np.argsort(rng.random((n, k)), axis=1)[:, :p]  # distinct keys per row, random order
        values = rng.integers(k, 2 * k, size=(n, p))
        inputs = rng.integers(2 * k, self.vocab_size, size=(n, self.seq_len))
        inputs[rows, starts] = keys
        inputs[rows, starts + 1] = values
        asked = rng.integers(0, p, size=n)
        inputs[:, -1] = keys[np.arange(n), asked]
        targets = np.full((n, self.seq_len), IGNORE, dtype=np.int64)
        targets[:, -1] = values[np.arange(n), asked]
        return inputs, targets


class KeyValueNeedleTask(NeedleTask):
    """``needle_kv``: the needle with several key-value pairs (default 4), one key asked at the end — the variant a
    latch cannot solve (latching one value scores ``1/P + (1 - 1/P)/K``, 0.30 at the default 4 pairs and 16 keys). Same arguments as :class:`NeedleTask` without
    ``shared`` (the vocabularies stay disjoint); chance ``1 / num_keys``.

    Raises:
        ValueError: as :class:`NeedleTask`.
    """

    name = "needle_kv"
    budget_defaults: ClassVar[dict[str, Any]] = {}  # the generic budget: the needle's tuning is not inherited

    def __init__(
        self, seq_len: int, num_keys: int = 16, num_filler: int = 32, window: int | None = None, pairs: int = 4
    ):
        super().__init__(seq_len, num_keys=num_keys, num_filler=num_filler, window=window, shared=False, pairs=pairs)
