"""The paired comparisons of ``axiomformer flow`` and their verdicts (scipy, statsmodels; protocol: ``docs/flows.md``).

Every comparison is arm ``a`` minus arm ``b`` at one (theta setting, K, noise level), paired over seeds (the same seed
is the same fitted classifier, the same batches and the same noise in both arms):

* ``diff``, ``ci_low``, ``ci_high``: the mean paired difference and its 95 % Student-t interval (n - 1 degrees of
  freedom; unadjusted, one comparison at a time);
* ``p``: the two-sided paired t-test (``scipy.stats.ttest_rel``; Student 1908); ``p_holm``: Holm's step-down
  adjustment over the **whole family** of the run (Holm 1979; ``statsmodels.stats.multitest.multipletests``);
* equivalence: two one-sided paired t-tests at the stated margin (TOST, Schuirmann 1987;
  ``statsmodels.stats.weightstats.ttost_paired``), Holm-adjusted over the same family;
* the minimal detectable difference: the paired difference a paired t-test of these seeds detects with power 0.8 at
  the Bonferroni level 0.05 / m (a conservative bound for Holm; ``statsmodels.stats.power.TTestPower``), from the
  observed standard deviation of the differences.

Verdict: an effect only where ``p_holm`` < 0.05; "no difference" only where the Holm-adjusted equivalence test
rejects at the margin; otherwise "inconclusive", with the minimal detectable difference.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

ALPHA = 0.05
POWER = 0.8
#: The comparisons the report states (a, b, what it asks); only those whose two arms are in the run are made.
PAIRS = (
    ("attention/tied", "neither", "attention step vs no flow step (the earlier headline)"),
    ("attention/tied", "token_mlp", "token mixing vs a token-wise MLP of the same parameter count"),
    ("attention/tied", "shuffled/tied", "weights from the image's own tokens vs from another image's"),
    ("attention/classifier", "neither", "the classifier's own flow vs no flow (both train only the embedding)"),
    ("attention/classifier", "shuffled/classifier", "the classifier's flow vs the same with another image's weights"),
    ("both/tied", "mlp", "attention beside the MLP vs the MLP alone"),
    (
        "attention/tied",
        "attention/tied (A/A)",
        "A/A control: the same arm from another initialization stream; it must never come out higher or lower",
    ),
)
COMPARISON_KEYS = ("a", "b", "theta", "K", "noise", "diff", "ci_low", "ci_high", "p", "p_holm")


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values over the whole list (statsmodels ``multipletests(method="holm")``)."""
    if len(pvalues) == 0:
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(list(pvalues), alpha=ALPHA, method="holm")[1]]


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float | None, float | None, float]:
    """(mean of a - b, 95 % t-interval low, high, two-sided paired t-test p) over paired seeds.

    Fewer than 2 pairs: no interval, p = 1. All differences equal: the interval is that value; p = 1 if it is 0,
    else 0 (scipy's limit of an infinite t).

    Raises:
        ValueError: ``a`` and ``b`` of different lengths.
    """
    from scipy import stats

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired samples must have equal lengths, got {x.shape} and {y.shape}")
    d = x - y
    mean = float(d.mean())
    if d.size < 2:
        return mean, None, None, 1.0
    if np.all(d == d[0]):
        return mean, mean, mean, 1.0 if mean == 0 else 0.0
    low, high = stats.t.interval(0.95, d.size - 1, loc=mean, scale=stats.sem(d))
    return mean, float(low), float(high), float(stats.ttest_rel(x, y).pvalue)


def tost(a: Sequence[float], b: Sequence[float], margin: float) -> float:
    """p-value of the paired equivalence test H0: |mean(a - b)| >= margin (statsmodels ``ttost_paired``); 1 for
    fewer than 2 pairs; for identical differences 0 if inside the margin, else 1."""
    from statsmodels.stats.weightstats import ttost_paired

    d = np.subtract(a, b, dtype=float)
    if d.size < 2:
        return 1.0
    if np.all(d == d[0]):
        return 0.0 if abs(d[0]) < margin else 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(ttost_paired(np.asarray(a, float), np.asarray(b, float), -margin, margin)[0])
    return 1.0 if math.isnan(p) else p


def minimal_detectable(diffs: Sequence[float], family: int, power: float = POWER) -> float | None:
    """The paired difference detected with ``power`` at the two-sided level ALPHA / family by a paired t-test of
    len(diffs) seeds, with the observed standard deviation of ``diffs``; None for fewer than 2 seeds."""
    from statsmodels.stats.power import TTestPower

    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return None
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return 0.0
    effect = TTestPower().solve_power(
        effect_size=None, nobs=d.size, alpha=ALPHA / max(family, 1), power=power, alternative="two-sided"
    )
    return float(effect) * sd


def verdict(row: dict, eq: dict, margin: float) -> str:
    """One phrase that agrees with the row's numbers (see the module docstring)."""
    if row["p_holm"] < ALPHA:
        return f"{'higher' if row['diff'] > 0 else 'lower'} (Holm p = {row['p_holm']:.2g})"
    if eq["p_tost_holm"] < ALPHA:
        return f"no difference within +-{margin:g} (equivalence, Holm p = {eq['p_tost_holm']:.2g})"
    mdd = eq["mdd"]
    return "inconclusive" + (f": detectable only above {mdd:.3f}" if mdd is not None else "")


def compare_arms(acc: dict[tuple, list[float]], margin: float) -> tuple[list[dict], dict]:
    """The family of paired comparisons of one run.

    Args:
        acc: ``{(theta, arm, K, noise): per-seed accuracies}`` (seeds in the same order in every entry).
        margin: the equivalence margin (accuracy, absolute).

    Returns:
        ``(comparisons, equivalence)``: the rows ``{"a", "b", "theta", "K", "noise", "diff", "ci_low", "ci_high",
        "p", "p_holm"}`` for every pair of :data:`PAIRS` whose arms are both present, every theta, K > 0 and noise
        level, Holm over all of them; and ``{"margin", "alpha", "power", "rows": [{"a", "b", "theta", "K", "noise",
        "p_tost", "p_tost_holm", "mdd", "verdict", "question"}]}`` in the same order.
    """
    keys = sorted({(t, k, s) for (t, _, k, s) in acc if k > 0}, key=lambda x: (x[0], x[1], x[2]))
    rows, extra = [], []
    for a, b, question in PAIRS:
        for theta, K, sigma in keys:
            if (theta, a, K, sigma) not in acc or (theta, b, K, sigma) not in acc:
                continue
            xa, xb = acc[(theta, a, K, sigma)], acc[(theta, b, K, sigma)]
            diff, low, high, p = paired(xa, xb)
            rows.append(
                {
                    "a": a,
                    "b": b,
                    "theta": theta,
                    "K": K,
                    "noise": sigma,
                    "diff": diff,
                    "ci_low": low,
                    "ci_high": high,
                    "p": p,
                    "p_holm": 1.0,
                }
            )
            extra.append(
                {
                    "a": a,
                    "b": b,
                    "theta": theta,
                    "K": K,
                    "noise": sigma,
                    "p_tost": tost(xa, xb, margin),
                    "diffs": np.subtract(xa, xb, dtype=float),
                    "question": question,
                }
            )
    for row, ph in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = ph
    for eq, ph in zip(extra, holm([e["p_tost"] for e in extra])):
        eq["p_tost_holm"] = ph
        eq["mdd"] = minimal_detectable(eq.pop("diffs"), len(rows))
    for row, eq in zip(rows, extra):
        eq["verdict"] = verdict(row, eq, margin)
    return rows, {"margin": margin, "alpha": ALPHA, "power": POWER, "rows": extra}


__all__ = [
    "ALPHA",
    "COMPARISON_KEYS",
    "PAIRS",
    "compare_arms",
    "holm",
    "minimal_detectable",
    "paired",
    "tost",
    "verdict",
]
