"""``text``: character-level language modelling of a text file given by the user.

The vocabulary is the sorted set of characters of the whole file. The first ``1 - eval_fraction`` of the file is the
train region, the next half of the rest the validation region and the last half the test region **(our choice: a
contiguous split, so no window of one region overlaps another)**; ``eval`` windows come from validation and test.
A batch is windows at random offsets of its region; every position is scored with the next character.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from axiomformer.tasks.base import Task, make_rng, positive, tuned_budget


class TextTask(Task):
    """Character-level language modelling.

    Args:
        seq_len: window length T.
        path: a UTF-8 text file (undecodable bytes are replaced).
        eval_fraction: share of the file (its end) used for evaluation (default 0.1), half validation, half test.

    Raises:
        ValueError: no path, a missing file, or a region shorter than seq_len + 1 characters.
    """

    name = "text"
    budget_defaults: ClassVar[dict[str, Any]] = tuned_budget(steps=1000, target_accuracy=None, lr=3e-3)

    def __init__(self, seq_len: int, path: str | Path | None = None, eval_fraction: float = 0.1):
        self.seq_len = positive("seq_len", seq_len)
        if path is None:
            raise ValueError("task 'text' needs a file: pass path=FILE (CLI: --task-option path=FILE)")
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"task 'text': no such file {str(file)!r}")
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
        text = file.read_text(encoding="utf-8", errors="replace")
        self.chars = sorted(set(text))
        self.vocab_size = max(1, len(self.chars))
        self.chance = 1.0 / self.vocab_size
        lookup = {c: i for i, c in enumerate(self.chars)}
        ids = np.fromiter((lookup[c] for c in text), dtype=np.int64, count=len(text))
        cut = round(len(ids) * (1.0 - eval_fraction))
        middle = cut + (len(ids) - cut) // 2
        self.regions = {"train": ids[:cut], "val": ids[cut:middle], "test": ids[middle:]}
        for split, region in self.regions.items():
            if len(region) < self.seq_len + 1:
                raise ValueError(
                    f"task 'text': the {split} region of {str(file)!r} has {len(region)} characters, "
                    f"fewer than seq_len + 1 = {self.seq_len + 1}; use a longer file or shorter seq_len"
                )

    def decode(self, ids: Iterable[int] | Tensor) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batch(self, batch_size: int, seed: int, split: str = "train") -> tuple[Tensor, Tensor]:
        positive("batch_size", batch_size)
        rng = make_rng(seed, split)
        if split == "eval":  # both held-out regions, a window never straddling them
            val, test = self.regions["val"], self.regions["test"]
            pick = rng.integers(0, (len(val) - self.seq_len) + (len(test) - self.seq_len), size=batch_size)
            in_test = pick >= len(val) - self.seq_len
            starts = np.where(in_test, pick - (len(val) - self.seq_len), pick)
            windows = np.stack([(test if t else val)[s : s + self.seq_len + 1] for s, t in zip(starts, in_test)])
            return torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy())
        region = self.regions[split]
        starts = rng.integers(0, len(region) - self.seq_len, size=batch_size)
        index = starts[:, None] + np.arange(self.seq_len + 1)
        windows = region[index]
        return torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy())
