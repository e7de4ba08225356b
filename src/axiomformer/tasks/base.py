"""What every task is: a seeded generator of (inputs, targets) batches with a train/eval split.

A batch is ``inputs`` int64 (batch, seq_len) of token ids and ``targets`` int64 (batch, seq_len), where
``targets[b, t]`` is the token the model must predict *at* position t (after reading ``inputs[b, :t+1]``) and
``IGNORE = -100`` marks positions that are not scored (the ``ignore_index`` of ``torch.nn.functional.cross_entropy``).

Train and held-out examples never coincide. Synthetic tasks split by a hash of the example **(our choice)**: an input
row is held out iff ``row_hash(row) % EVAL_BUCKETS == 0``; a held-out row belongs to ``val`` when bit 32 of its hash
is 0 and to ``test`` otherwise; ``eval`` is all held-out rows (``val`` and ``test`` together). Each split keeps only
its own rows, so an example is in exactly one of train / val / test whatever the seeds. Real-data tasks (digits, text)
split their data once into train and eval; their ``val`` and ``test`` draw from the eval data with different streams
(not disjoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

IGNORE = -100
"""Target value of unscored positions."""

SPLITS = ("train", "eval", "val", "test")
EVAL_BUCKETS = 4
"""One example in ``EVAL_BUCKETS`` (by hash) belongs to the eval split."""

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_POLY = np.uint64(0x100000001B3)


def row_hash(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash per row of an integer array (n, seq_len) -> uint64 (n,).

    Polynomial hash of the tokens (wrapping uint64 arithmetic), then the SplitMix64 finalizer (Steele et al. 2014)
    so that every bit depends on every token. Equal rows have equal hashes, which is all the split needs.
    """
    x = rows.astype(np.uint64) + np.uint64(1)
    powers = np.cumprod(np.full(rows.shape[1], _POLY, dtype=np.uint64))
    h = (x * powers).sum(axis=1, dtype=np.uint64)
    h ^= h >> np.uint64(30)
    h *= _M1
    h ^= h >> np.uint64(27)
    h *= _M2
    h ^= h >> np.uint64(31)
    return h


def in_eval_split(rows: np.ndarray) -> np.ndarray:
    """bool (n,): which rows (n, seq_len) belong to the eval split of a synthetic task."""
    return row_hash(rows) % np.uint64(EVAL_BUCKETS) == 0


def held_out_part(rows: np.ndarray) -> np.ndarray:
    """str array (n,): ``"train"``, ``"val"`` or ``"test"`` for each row (n, seq_len) of a synthetic task."""
    h = row_hash(rows)
    held = h % np.uint64(EVAL_BUCKETS) == 0
    test = ((h >> np.uint64(32)) & np.uint64(1)) == 1
    return np.where(held, np.where(test, "test", "val"), "train")


def in_split(rows: np.ndarray, split: str) -> np.ndarray:
    """bool (n,): which rows belong to ``split`` (``eval`` = ``val`` or ``test``)."""
    split_code(split)
    if split == "eval":
        return in_eval_split(rows)
    return held_out_part(rows) == split


def split_code(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
    return SPLITS.index(split)


def make_rng(seed: int, split: str) -> np.random.Generator:
    """The generator of one batch: independent streams for each (seed, split) pair."""
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    return np.random.default_rng([int(seed), split_code(split), 0x41F0])


def positive(name: str, value: int, minimum: int = 1) -> int:
    if int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def tuned_budget(*, steps: int, target_accuracy: float | None, **fields: Any) -> dict[str, Any]:
    """A task's ``budget_defaults`` (see :class:`Task`): ``steps`` and ``target_accuracy`` (None: no early stopping on
    it) at the batch size they were tuned at, 32, plus any other ``TrainConfig`` budget ``fields`` (``lr``,
    ``eval_every``, ``eval_batches``, ...)."""
    return {"steps": steps, "batch_size": 32, "target_accuracy": target_accuracy, **fields}


@dataclass(frozen=True)
class Ceiling:
    """The best accuracy any causal model can reach on given test items (each position scored after its prefix).

    Attributes:
        value: that accuracy, in [0, 1].
        method: how it was computed: ``"exact"`` (every scored target is a function of the tokens up to it), or
            ``"monte carlo"`` (the Bayes predictor's posterior estimated by sampling completions of each prefix).
        error: the Monte Carlo standard error of ``value`` (0.0 for an exact ceiling).
        note: one sentence on why (what the best causal predictor is).
    """

    value: float
    method: str
    error: float
    note: str


EXACT_NOTE = "every scored target is a token of its own prefix, so a causal model can reach every item"


class Task:
    """A task: ``vocab_size``, ``seq_len`` and ``batch(batch_size, seed, split)``.

    Attributes:
        name: registry name.
        vocab_size: number of token ids the inputs and targets use (ids are ``0 .. vocab_size - 1``).
        seq_len: length T of every sequence.
        chance: accuracy of guessing uniformly among the possible answers at a scored position.
    """

    name: ClassVar[str] = "task"
    prefix_determined: ClassVar[bool] = False
    """True when the target at every scored position is a function of ``inputs[:t+1]`` (the ceiling is 1, exact)."""
    budget_defaults: ClassVar[dict[str, Any]] = {}
    """The training budget tuned for this task: values of ``TrainConfig`` fields (``steps``, ``batch_size``, ``lr``,
    ``warmup``, ``eval_every``, ``eval_batches``, ``target_accuracy``, ``patience``) that a run leaves unset; the rest
    come from ``axiomformer.train.GENERIC_DEFAULTS``. Tuned so that ``experiments/long_range.py`` meets issue 4's
    acceptance; :func:`tuned_budget` writes one."""
    vocab_size: int
    seq_len: int
    chance: float

    def ceiling(self, inputs: Tensor, targets: Tensor) -> Ceiling | None:
        """The ceiling on these test items (int64 (n, seq_len) each, ``IGNORE`` = unscored), or ``None`` when this
        task cannot compute it (then a study never counts the task as able to decide anything)."""
        if not self.prefix_determined:
            return None
        return Ceiling(1.0, "exact", 0.0, EXACT_NOTE)

    def batch(self, batch_size: int, seed: int, split: str = "train") -> tuple[Tensor, Tensor]:
        """(inputs int64 (batch_size, seq_len), targets int64 (batch_size, seq_len), -100 = unscored).

        Deterministic in (batch_size, seed, split). Raises ValueError on an unknown split or a negative seed.
        """
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name}(seq_len={self.seq_len}, vocab_size={self.vocab_size})"


class SyntheticTask(Task):
    """A task drawn from a random generator ``sample(rng, n)``; splits by :func:`in_eval_split`."""

    max_rounds: ClassVar[int] = 64

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n fresh examples: (inputs int64 (n, T), targets int64 (n, T)), targets a function of inputs."""
        raise NotImplementedError

    def batch(self, batch_size: int, seed: int, split: str = "train") -> tuple[Tensor, Tensor]:
        positive("batch_size", batch_size)
        rng = make_rng(seed, split)
        # Over-draw so that one round usually suffices: a row is held out with probability 1/EVAL_BUCKETS.
        factor = {"train": 2, "eval": EVAL_BUCKETS + 1}.get(split, 2 * EVAL_BUCKETS + 2)
        got_x, got_y, have = [], [], 0
        for _ in range(self.max_rounds):
            x, y = self.sample(rng, factor * (batch_size - have) + 4)
            keep = in_split(x, split)
            got_x.append(x[keep])
            got_y.append(y[keep])
            have += int(keep.sum())
            if have >= batch_size:
                inputs = np.concatenate(got_x)[:batch_size]
                targets = np.concatenate(got_y)[:batch_size]
                return torch.from_numpy(inputs).long(), torch.from_numpy(targets).long()
        raise RuntimeError(
            f"{self.describe()}: could not draw {batch_size} {split} examples; the example space is "
            f"too small to split (raise seq_len or the vocabulary)"
        )

    def special_tokens(self, data_tokens: int, count: int) -> tuple[int, ...]:
        """The ids of ``count`` special tokens (separator, noise, padding, trigger) after the ``data_tokens`` data
        ids ``0 .. data_tokens - 1``; sets ``vocab_size`` to cover both."""
        self.vocab_size = data_tokens + count
        return tuple(range(data_tokens, self.vocab_size))


def left_pad(rows: np.ndarray, seq_len: int, pad: int) -> np.ndarray:
    """Prepend ``pad`` tokens to (n, L) rows so they have length ``seq_len`` >= L."""
    n, length = rows.shape
    if length == seq_len:
        return rows
    out = np.full((n, seq_len), pad, dtype=np.int64)
    out[:, seq_len - length :] = rows
    return out
