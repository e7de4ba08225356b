"""``sort`` and ``reverse``: a target that depends on the order of the tokens (the counterpart of ``multiset``).

A bidirectional encoder without positions is permutation equivariant, so it cannot solve this task beyond chance
**(a consequence of A0; measured, not assumed, by the positions suite)**. Every position t is scored:

    reverse    target_t = x_{T-1-t}           (depends on where each token sits)
    sort       target_t = the t-th smallest token of the row (depends on the multiset and on t)

Tokens ``0 .. num_symbols-1``, drawn uniformly and independently.

``sort_causal`` is sort for a causal model: read the row, then write it sorted, as next-token prediction in
``copy``'s layout (``x_1 .. x_n SEP y_1 .. y_n`` before the final token is dropped, n = seq_len // 2, one PAD in
front when seq_len is odd; y the sorted row; the target at SEP is y_1 and at y_j it is y_{j+1}; the first half is not
scored). Every scored target is then a function of its own prefix (ceiling 1, exact): of the row's multiset and of
how many tokens have been written, so the input order does not matter, and a bag of the prefix holds both (the
positions suite measures that uniform mixing solves it).
"""

from __future__ import annotations

import numpy as np

from axiomformer.tasks.base import SyntheticTask, positive
from axiomformer.tasks.copy import CopyTask

KINDS = ("reverse", "sort")


class OrderTask(SyntheticTask):
    """An order task: reverse or sort the input.

    Args:
        seq_len: sequence length T >= 2.
        num_symbols: S symbols (default 16; chance about 1/S).
        kind: ``reverse`` or ``sort``.

    Raises:
        ValueError: an unknown kind (naming the choices) or non-positive sizes.
    """

    name = "order"

    def __init__(self, seq_len: int, num_symbols: int = 16, kind: str = "reverse"):
        self.seq_len = positive("seq_len", seq_len, 2)
        self.num_symbols = positive("num_symbols", num_symbols, 2)
        if kind not in KINDS:
            raise ValueError(f"unknown order kind {kind!r}; choose one of: {', '.join(KINDS)}")
        self.kind = kind
        self.vocab_size = self.num_symbols
        self.chance = 1.0 / self.num_symbols

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        rows = rng.integers(0, self.num_symbols, size=(n, self.seq_len))
        targets = rows[:, ::-1] if self.kind == "reverse" else np.sort(rows, axis=1)
        return rows.astype(np.int64), np.ascontiguousarray(targets).astype(np.int64)


class SortTask(OrderTask):
    """``order`` with ``kind="sort"``: target_t is the t-th smallest token."""

    name = "sort"

    def __init__(self, seq_len: int, num_symbols: int = 16):
        super().__init__(seq_len, num_symbols, kind="sort")


class ReverseTask(OrderTask):
    """``order`` with ``kind="reverse"``: target_t = x_{T-1-t}."""

    name = "reverse"

    def __init__(self, seq_len: int, num_symbols: int = 16):
        super().__init__(seq_len, num_symbols, kind="reverse")


class SortCausalTask(CopyTask):
    """Sort for a causal model: n = seq_len // 2 tokens, a separator, then the same tokens sorted (module docstring);
    ``copy``'s layout with the sorted row as the answer.

    Args:
        seq_len: sequence length T >= 2.
        num_symbols: S data symbols (default 16; chance about 1/S). Tokens: data ``0 .. S-1``, ``SEP = S``,
            ``PAD = S + 1``.

    Raises:
        ValueError: ``seq_len`` or ``num_symbols`` below 2.
    """

    name = "sort_causal"
    budget_defaults = SyntheticTask.budget_defaults  # not copy's: tuned on copy, not on sort

    def __init__(self, seq_len: int, num_symbols: int = 16):
        self.num_symbols = positive("num_symbols", num_symbols, 2)
        super().__init__(seq_len, vocab=num_symbols)

    def answer(self, data: np.ndarray) -> np.ndarray:
        return np.sort(data, axis=1)
