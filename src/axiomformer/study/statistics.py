"""Statistics of a study (scipy, statsmodels): per-cell bootstrap intervals, paired comparisons, Holm correction.

* Per cell (model, task, length): the mean test accuracy over seeds and a 95 % bootstrap interval of the mean
  (``scipy.stats.bootstrap``, percentile method, fixed ``random_state``; Efron & Tibshirani 1993, ch. 13). With one
  seed there is no interval; with identical values the interval is that value.
* Per model and task: the paired difference to the standard model over the seeds both have (same seeds, same data,
  same test set), its 95 % bootstrap interval, and a paired t-test (``scipy.stats.ttest_rel``; Student 1908) on
  the per-seed differences; all p-values of a table are Holm-corrected (Holm 1979, via
  ``statsmodels.stats.multitest.multipletests``). A difference is *significant* when its Holm-corrected p-value is
  below ``ALPHA``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ALPHA = 0.05
CONFIDENCE = 0.95
RESAMPLES = 2000
NO_DIFFERENCE = "no detectable difference at this budget"


def mean_interval(values: Sequence[float], *, confidence: float = CONFIDENCE, seed: int = 0
                  ) -> tuple[float, float | None, float | None]:
    """``(mean, low, high)``: the mean of ``values`` and its percentile bootstrap interval.

    ``low``/``high`` are ``None`` for fewer than two values, and equal to the mean when all values are equal (every
    resample has the same mean).

    Raises:
        ValueError: no values.
    """
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("mean_interval needs at least one value")
    mean = float(data.mean())
    if data.size < 2:
        return mean, None, None
    if np.all(data == data[0]):
        return mean, mean, mean
    from scipy.stats import bootstrap

    with warnings.catch_warnings():  # a degenerate resample distribution is fine here: it is what the data say
        warnings.simplefilter("ignore", RuntimeWarning)
        res = bootstrap((data,), np.mean, confidence_level=confidence, n_resamples=RESAMPLES, method="percentile",
                        random_state=np.random.default_rng(seed), vectorized=True)
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired_test(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the paired t-test of ``a - b`` against 0 (``scipy.stats.ttest_rel``).

    All differences zero: p = 1 (no evidence of a difference). All differences equal and non-zero: p = 0 (scipy's
    limit of an infinite t; it happens when every seed gives the same pair of accuracies, so read it with the number
    of pairs). Fewer than two pairs: p = 1.

    Raises:
        ValueError: ``a`` and ``b`` of different lengths.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired samples must have equal lengths, got {x.shape} and {y.shape}")
    diff = x - y
    if diff.size < 2 or np.all(diff == 0):
        return 1.0
    from scipy.stats import ttest_rel

    with warnings.catch_warnings():  # nearly equal differences: scipy warns, the (tiny) p-value is still its answer
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(ttest_rel(x, y).pvalue)
    return 1.0 if math.isnan(p) else p


def holm(pvalues: Sequence[float], *, alpha: float = ALPHA) -> list[float]:
    """Holm-adjusted p-values (step-down, monotone, capped at 1), via statsmodels' ``multipletests``."""
    if len(pvalues) == 0:
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(list(pvalues), alpha=alpha, method="holm")[1]]


@dataclass(frozen=True)
class Comparison:
    """A model against the standard one on one task: mean paired difference, its interval and the tests."""

    model: str
    task: str
    diff: float
    ci_low: float | None
    ci_high: float | None
    p: float
    p_holm: float
    n_pairs: int

    @property
    def significant(self) -> bool:
        return self.p_holm < ALPHA


def compare(pairs: dict[tuple[str, str], tuple[list[float], list[float]]]) -> list[Comparison]:
    """Paired comparisons for a table: ``{(model, task): (model's values, standard's values)}`` paired by seed.

    Returns one :class:`Comparison` per entry, Holm-corrected over all of them, in the input order.
    """
    raw = []
    for (model, task), (a, b) in pairs.items():
        diff = [x - y for x, y in zip(a, b)]
        mean, low, high = mean_interval(diff) if diff else (float("nan"), None, None)
        raw.append((model, task, mean, low, high, paired_test(a, b), len(diff)))
    adjusted = holm([r[5] for r in raw])
    return [Comparison(m, t, d, lo, hi, p, ph, n) for (m, t, d, lo, hi, p, n), ph in zip(raw, adjusted)]


def verdict(c: Comparison) -> str:
    """One phrase: the significant direction, or :data:`NO_DIFFERENCE`."""
    if not c.significant:
        return NO_DIFFERENCE
    return f"{'better' if c.diff > 0 else 'worse'} than standard by {abs(c.diff):.3f} (Holm p = {c.p_holm:.3g})"


__all__ = ["ALPHA", "CONFIDENCE", "Comparison", "NO_DIFFERENCE", "compare", "holm", "mean_interval", "paired_test",
           "verdict"]
