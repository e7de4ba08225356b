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

from typing import ClassVar

import numpy as np
from torch import Tensor

from axiomformer.tasks.base import IGNORE, Ceiling, SyntheticTask, positive

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


MAJORITY_WEIGHT = 3.0
"""The favoured symbol's weight in a majority row (every other symbol has weight 1), as ``_majority_rows`` draws."""


def majority_posterior(
    prefix_counts: np.ndarray, remaining: int, num_symbols: int, rng: np.random.Generator, draws: int
) -> np.ndarray:
    """Monte Carlo posterior (n, S) of the majority target given a prefix's symbol counts (n, S) and ``remaining``
    tokens still to come, under ``_majority_rows``' generator (a favoured symbol f uniform; tokens i.i.d. with weight
    3 for f, 1 for the others; rows with a tied mode redrawn): P(c | prefix) is proportional to
    sum_f P(prefix | f) P_f(the completed row's unique mode is c), the second factor from ``draws`` completions."""
    n, s = prefix_counts.shape
    post = np.zeros((n, s))
    log_w = np.log(MAJORITY_WEIGHT) * prefix_counts  # P(prefix | f) up to a factor shared by every f
    weights = np.exp(log_w - log_w.max(axis=1, keepdims=True))
    for f in range(s):
        p = np.ones(s)
        p[f] = MAJORITY_WEIGHT
        suffix = rng.multinomial(remaining, p / p.sum(), size=(n, draws))  # (n, draws, S)
        total = np.sort(prefix_counts[:, None, :] + suffix, axis=2)
        unique = total[:, :, -1] > total[:, :, -2]
        mode = (prefix_counts[:, None, :] + suffix).argmax(axis=2)
        hits = np.zeros((n, s))
        np.add.at(hits, (np.repeat(np.arange(n), draws)[unique.ravel()], mode.ravel()[unique.ravel()]), 1.0)
        post += weights[:, f : f + 1] * hits / draws
    return post / np.maximum(post.sum(axis=1, keepdims=True), 1e-300)


class MajorityTask(MultisetTask):
    """``multiset`` with ``target="majority"``: every position's target is the most frequent symbol."""

    name = "majority"
    ceiling_draws: ClassVar[int] = 256
    """Completions per prefix and favoured symbol in :meth:`ceiling`'s Monte Carlo posterior."""

    def __init__(self, seq_len: int, num_symbols: int = 8):
        super().__init__(seq_len, num_symbols, target="majority")

    def ceiling(self, inputs: Tensor, targets: Tensor) -> Ceiling:
        """The Bayes predictor's accuracy on these items: at position t it predicts the most probable majority of
        the whole row given ``inputs[:t+1]`` (:func:`majority_posterior`). Two independent Monte Carlo replicates;
        ``error`` is their difference over sqrt(2), the standard error of one."""
        x, y = inputs.numpy(), targets.numpy()
        scores = []
        for replicate in range(2):
            rng = np.random.default_rng(12345 + replicate)
            right = total = 0
            for t in range(self.seq_len):
                scored = y[:, t] != IGNORE
                if not scored.any():
                    continue
                counts = np.stack([(x[scored, : t + 1] == c).sum(axis=1) for c in range(self.num_symbols)], axis=1)
                post = majority_posterior(counts, self.seq_len - t - 1, self.num_symbols, rng, self.ceiling_draws)
                right += int((post.argmax(axis=1) == y[scored, t]).sum())
                total += int(scored.sum())
            scores.append(right / max(total, 1))
        return Ceiling(
            float(np.mean(scores)),
            "monte carlo",
            float(abs(scores[0] - scores[1]) / np.sqrt(2)),
            "the majority is of the whole row; at position t the best causal guess is the posterior mode given the "
            "prefix",
        )


class DistinctTask(MultisetTask):
    """``multiset`` with ``target="distinct"``: every position's target is the number of distinct symbols."""

    name = "distinct"

    def __init__(self, seq_len: int, num_symbols: int = 8, min_distinct: int = 1):
        super().__init__(seq_len, num_symbols, target="distinct", min_distinct=min_distinct)
