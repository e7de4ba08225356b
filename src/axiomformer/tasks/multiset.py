"""``majority`` and ``distinct``: a target that depends only on the multiset of the tokens, never on their order.

The derivation starts from permutation invariance (A0, Deep Sets); this task is what such a map is made for. A
sequence of T tokens drawn from ``num_symbols`` symbols; every position is scored with the same target, a function of
the token counts alone:

    majority   the most frequent symbol (rows are drawn so that it is unique): argmax_c count_c
    distinct   the number of distinct symbols, sum_c 1[count_c > 0] — a nonlinearity *after* the sum over tokens
               (a step function of each count), the case where rho = identity (A1) may not suffice

Tokens: symbols ``0 .. S-1``; the ``distinct`` answers are the tokens ``S .. 2S-1`` (answer k is token S + k - 1),
so both targets are ids of the vocabulary **(our choice: the models' output head is tied to the embedding)**.
Generation **(our choice)**: ``majority`` draws a favoured symbol and then every token with weight 3 for it and 1 for
each other symbol, redrawing rows whose mode is tied; ``distinct`` draws k uniformly from 1..min(S, T), k distinct
symbols, one copy of each and T - k more from those k, shuffled. ``min_distinct`` (default 1) raises the smallest k:
with k = 1 there are only S sequences (one symbol repeated), and the train/val/test split by example (tasks.base)
holds some of them out of training entirely, so a held-out set would test answers the model never saw; k >= 2 keeps
every answer's example space large.
"""

from __future__ import annotations

import numpy as np

from axiomformer.tasks.base import SyntheticTask, positive

TARGETS = ("majority", "distinct")


def multiset_targets(inputs: np.ndarray, kind: str, num_symbols: int) -> np.ndarray:
    """The per-row answer (n,) of ``kind`` for token rows (n, T): a function of each row's counts only."""
    counts = np.stack([(inputs == c).sum(axis=1) for c in range(num_symbols)], axis=1)  # (n, S)
    if kind == "majority":
        return counts.argmax(axis=1)
    if kind == "distinct":
        return num_symbols + (counts > 0).sum(axis=1) - 1
    raise ValueError(f"unknown multiset target {kind!r}; choose one of: {', '.join(TARGETS)}")


class MultisetTask(SyntheticTask):
    """A set task: the target at every position is a function of the multiset of input tokens.

    Args:
        seq_len: sequence length T >= 2.
        num_symbols: S symbols (default 8).
        target: ``majority`` (chance 1/S) or ``distinct`` (chance 1/(min(S, T) - min_distinct + 1)).
        min_distinct: ``distinct`` only: the fewest distinct symbols in a row (default 1).

    Raises:
        ValueError: an unknown target (naming the choices), non-positive sizes, or ``min_distinct`` above
            ``min(S, T)``.
    """

    name = "multiset"

    def __init__(self, seq_len: int, num_symbols: int = 8, target: str = "majority", min_distinct: int = 1):
        self.seq_len = positive("seq_len", seq_len, 2)
        self.num_symbols = positive("num_symbols", num_symbols, 2)
        if target not in TARGETS:
            raise ValueError(f"unknown multiset target {target!r}; choose one of: {', '.join(TARGETS)}")
        self.target = target
        self.min_distinct = positive("min_distinct", min_distinct)
        top = min(self.num_symbols, self.seq_len)
        if self.min_distinct > top:
            raise ValueError(f"min_distinct={self.min_distinct} exceeds min(num_symbols, seq_len) = {top}")
        self.vocab_size = 2 * self.num_symbols
        self.chance = 1.0 / (self.num_symbols if target == "majority" else top - self.min_distinct + 1)

    def _majority_rows(self, rng: np.random.Generator, n: int) -> np.ndarray:
        s, out, have = self.num_symbols, [], 0
        while have < n:
            favoured = rng.integers(0, s, size=(2 * n, 1))
            weights = np.where(np.arange(s)[None, :] == favoured, 3.0, 1.0)
            cum = np.cumsum(weights / weights.sum(axis=1, keepdims=True), axis=1)
            rows = (rng.random((2 * n, self.seq_len, 1)) > cum[:, None, :]).sum(axis=2)
            counts = np.sort(np.stack([(rows == c).sum(axis=1) for c in range(s)], axis=1), axis=1)
            unique = counts[:, -1] > counts[:, -2]
            out.append(rows[unique])
            have += int(unique.sum())
        return np.concatenate(out)[:n]

    def _distinct_rows(self, rng: np.random.Generator, n: int) -> np.ndarray:
        s, t = self.num_symbols, self.seq_len
        k = rng.integers(self.min_distinct, min(s, t) + 1, size=n)
        symbols = np.argsort(rng.random((n, s)), axis=1)  # a random order of the symbols
        pick = np.arange(t)[None, :] % k[:, None]  # 0..k-1 each at least once
        pick = np.where(np.arange(t)[None, :] < k[:, None], pick, rng.integers(0, 1 << 30, size=(n, t)) % k[:, None])
        rows = np.take_along_axis(symbols, pick, axis=1)
        return np.take_along_axis(rows, np.argsort(rng.random((n, t)), axis=1), axis=1)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self._majority_rows(rng, n) if self.target == "majority" else self._distinct_rows(rng, n)
        answer = multiset_targets(rows, self.target, self.num_symbols)
        return rows.astype(np.int64), np.repeat(answer[:, None], self.seq_len, axis=1).astype(np.int64)


class MajorityTask(MultisetTask):
    """``multiset`` with ``target="majority"``: every position's target is the most frequent symbol."""

    name = "majority"

    def __init__(self, seq_len: int, num_symbols: int = 8):
        super().__init__(seq_len, num_symbols, target="majority")


class DistinctTask(MultisetTask):
    """``multiset`` with ``target="distinct"``: every position's target is the number of distinct symbols."""

    name = "distinct"

    def __init__(self, seq_len: int, num_symbols: int = 8, min_distinct: int = 1):
        super().__init__(seq_len, num_symbols, target="distinct", min_distinct=min_distinct)
