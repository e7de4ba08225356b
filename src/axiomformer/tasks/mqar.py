"""``mqar``: multi-query associative recall (Arora et al. 2023, "Zoology", sec. 3.1).

Layout: a context of ``num_pairs`` key-value pairs ``k_1 v_1 .. k_D v_D`` (keys distinct within a sequence, drawn
from the first half of the vocabulary, values from the second half), then ``num_queries`` of those keys asked again
at random even slots of the remaining positions, each followed by its value; the other slots hold a NOISE token.
The target at each query key is its value. The defaults (16 tokens, 4 pairs at T = 64) are smaller than Zoology's
(64 tokens, 8 pairs) **(our choice)**: a 2-layer width-64 Transformer learns them in a few hundred CPU steps, while
Zoology's setting needs far more steps than a CPU minute allows (pass ``vocab=64, num_pairs=8`` for it). Tokens: keys ``0 .. vocab/2 - 1``, values ``vocab/2 .. vocab - 1``,
``NOISE = vocab``, ``PAD = vocab + 1`` (one in front when the remainder is odd).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from axiomformer.tasks.base import IGNORE, SyntheticTask, left_pad, positive, tuned_budget


class MQARTask(SyntheticTask):
    """Multi-query associative recall.

    Args:
        seq_len: sequence length T.
        vocab: keys plus values (even; default 16: 8 keys, 8 values).
        num_pairs: key-value pairs in the context (default ``min(T // 16, vocab // 4)``: 4 at T = 64).
        pairs_per_token: instead of ``num_pairs``, scale the pairs with the length as in Zoology's capacity sweep:
            ``max(4, floor(T * pairs_per_token))`` pairs (e.g. 1/80: 4 at T = 64, 12 at 1,024, 125 at 10,000), so
            that a fixed-size recurrent state must eventually run out of room.
        num_queries: keys asked again (default ``num_pairs``, at most the free slots).

    Raises:
        ValueError: a context that does not fit, more pairs than keys, more queries than pairs or free slots.
    """

    name = "mqar"
    prefix_determined = True
    budget_defaults: ClassVar[dict[str, Any]] = tuned_budget(steps=1500, target_accuracy=0.99)

    def __init__(
        self,
        seq_len: int,
        vocab: int = 16,
        num_pairs: int | None = None,
        num_queries: int | None = None,
        pairs_per_token: float | None = None,
    ):
        self.seq_len = positive("seq_len", seq_len, 4)
        self.vocab = positive("vocab", vocab, 4)
        if self.vocab % 2:
            raise ValueError(f"vocab must be even (keys and values are its two halves), got {vocab}")
        self.num_keys = self.vocab // 2
        self.chance = 1.0 / self.num_keys
        if pairs_per_token is not None:
            if num_pairs is not None or not 0 < pairs_per_token <= 0.5:
                raise ValueError(
                    f"pairs_per_token must be in (0, 0.5] and exclusive with num_pairs, got "
                    f"pairs_per_token={pairs_per_token}, num_pairs={num_pairs}"
                )
            num_pairs = max(4, int(self.seq_len * pairs_per_token))
        pairs = num_pairs if num_pairs is not None else max(1, min(self.seq_len // 16, self.num_keys // 2))
        self.num_pairs = positive("num_pairs", pairs)
        if self.num_pairs > self.num_keys:
            raise ValueError(f"num_pairs={self.num_pairs} exceeds the {self.num_keys} distinct keys of vocab={vocab}")
        self.slots = (self.seq_len - 2 * self.num_pairs) // 2
        if self.slots < 1:
            raise ValueError(f"seq_len={seq_len} leaves no room for a query after {self.num_pairs} pairs")
        queries = num_queries if num_queries is not None else min(self.num_pairs, self.slots)
        self.num_queries = positive("num_queries", queries)
        if self.num_queries > min(self.num_pairs, self.slots):
            raise ValueError(
                f"num_queries={self.num_queries} exceeds num_pairs={self.num_pairs} or the "
                f"{self.slots} free query slots"
            )
        self.noise, self.pad = self.special_tokens(self.vocab, 2)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        d, q, rows = self.num_pairs, self.num_queries, np.arange(n)[:, None]
        keys = np.argsort(rng.random((n, self.num_keys)), axis=1)[:, :d]  # distinct keys per row
        values = rng.integers(self.num_keys, self.vocab, size=(n, d))
        context = np.stack([keys, values], axis=2).reshape(n, 2 * d)
        asked = np.argsort(rng.random((n, d)), axis=1)[:, :q]  # which pairs are queried
        slot = np.sort(np.argsort(rng.random((n, self.slots)), axis=1)[:, :q], axis=1)
        tail = np.full((n, 2 * self.slots), self.noise, dtype=np.int64)
        tail_targets = np.full((n, 2 * self.slots), IGNORE, dtype=np.int64)
        tail[rows, 2 * slot] = keys[rows, asked]
        tail[rows, 2 * slot + 1] = values[rows, asked]
        tail_targets[rows, 2 * slot] = values[rows, asked]
        inputs = np.concatenate([context, tail], axis=1)
        targets = np.concatenate([np.full((n, 2 * d), IGNORE), tail_targets], axis=1)
        return left_pad(inputs, self.seq_len, self.pad), left_pad(targets, self.seq_len, IGNORE)
