"""``digits``: classify scikit-learn's handwritten digits read as a sequence of 64 pixel tokens.

Real data shipped with scikit-learn (``sklearn.datasets.load_digits``: 1797 8x8 images, UCI optical recognition of
handwritten digits). Pixel intensities 0..16 are quantized to 16 levels, ``floor(16 p / 17)``; the image is read row by
row and the class label is the target at the last pixel. Tokens: pixels ``0 .. 15``, labels ``16 .. 25``,
``PAD = 26`` (in front, when seq_len > 64). The split is fixed once: identical quantized images are grouped, and the
groups are split into three pools, stratified by label with seed 0 **(our choice)**: ``eval_fraction`` of them (a
quarter by default) held out, half of those the validation pool and half the test pool; the rest train. No image is
in two pools, so validation (which picks the learning rate and stops training) never sees a test image.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from axiomformer.tasks.base import IGNORE, Task, left_pad, make_rng, positive, tuned_budget

LEVELS = 16
PIXELS = 64
NUM_CLASSES = 10


@lru_cache(maxsize=4)
def load_split(eval_fraction: float = 0.25) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train" | "val" | "test" | "eval": (pixels int64 (n, 64) in 0..15, labels int64 (n,))}: three disjoint
    pools of distinct images; ``eval`` is ``val`` and ``test`` together."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    pixels = (data.data.astype(np.int64) * LEVELS) // 17
    labels = data.target.astype(np.int64)
    _, first, group = np.unique(pixels, axis=0, return_index=True, return_inverse=True)
    group = group.reshape(-1)
    train_groups, eval_groups = train_test_split(
        np.arange(len(first)), test_size=eval_fraction, random_state=0, stratify=labels[first]
    )
    val_groups, test_groups = train_test_split(
        eval_groups, test_size=0.5, random_state=0, stratify=labels[first][eval_groups]
    )
    pools = {
        name: np.isin(group, groups)
        for name, groups in (("train", train_groups), ("val", val_groups), ("test", test_groups), ("eval", eval_groups))
    }
    return {name: (pixels[mask], labels[mask]) for name, mask in pools.items()}


class DigitsTask(Task):
    """Digit classification from a pixel sequence.

    Args:
        seq_len: T >= 64 (the image is left-padded to T).
        eval_fraction: share of distinct images held out for evaluation (default 0.25).

    Raises:
        ValueError: seq_len < 64.
    """

    name = "digits"
    budget_defaults: ClassVar[dict[str, Any]] = tuned_budget(steps=800, target_accuracy=None, lr=1e-3, eval_batches=8)

    def __init__(self, seq_len: int = PIXELS, eval_fraction: float = 0.25):
        if seq_len < PIXELS:
            raise ValueError(f"digits needs seq_len >= {PIXELS} (one token per pixel of an 8x8 image), got {seq_len}")
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
        self.seq_len = positive("seq_len", seq_len)
        self.eval_fraction = float(eval_fraction)
        self.label_offset, self.pad = LEVELS, LEVELS + NUM_CLASSES
        self.vocab_size = LEVELS + NUM_CLASSES + 1
        self.chance = 1.0 / NUM_CLASSES

    def examples(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The split's (pixels (n, 64), labels (n,))."""
        make_rng(0, split)  # validates the split name
        return load_split(self.eval_fraction)[split]

    def batch(self, batch_size: int, seed: int, split: str = "train") -> tuple[Tensor, Tensor]:
        positive("batch_size", batch_size)
        pixels, labels = self.examples(split)
        pick = make_rng(seed, split).integers(0, len(labels), size=batch_size)
        inputs = left_pad(pixels[pick], self.seq_len, self.pad)
        targets = np.full((batch_size, self.seq_len), IGNORE, dtype=np.int64)
        targets[:, -1] = self.label_offset + labels[pick]
        return torch.from_numpy(inputs).long(), torch.from_numpy(targets).long()
