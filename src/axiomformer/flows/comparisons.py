"""The paired comparisons of ``axiomformer flow`` and their verdicts (scipy, statsmodels; protocol: ``docs/flows.md``).

Every comparison is arm ``a`` minus arm ``b`` at one (theta setting, K, noise level), paired over seeds (the same seed
is the same fitted classifier, the same batches and the same noise in both arms):

* ``diff``, ``ci_low``, ``ci_high``: the mean paired difference and its 95 % Student-t interval (n - 1 degrees of
  freedom; unadjusted, one comparison at a time);
* ``p``: the two-sided paired t-test (``scipy.stats.ttest_rel``; Student 1908); ``p_holm``: Holm's step-down
  adjustment over the comparison's **family** (Holm 1979; ``statsmodels.stats.multitest.multipletests``);
* ``ci_low_adj``, ``ci_high_adj`` (in ``equivalence["rows"]``): the paired t-interval at the Bonferroni level
  1 - 0.05 / m, m the size of the family, so the m intervals hold jointly with probability >= 95 %;
* equivalence: two one-sided paired t-tests at the stated margin (TOST, Schuirmann 1987;
  ``statsmodels.stats.weightstats.ttost_paired``), Holm-adjusted over the same family (reported, not the verdict);
* the minimal detectable difference: the paired difference a paired t-test of these seeds detects with power 0.8 at
  the Bonferroni level 0.05 / m (``statsmodels.stats.power.TTestPower``), from the observed standard deviation of the
  differences.

Two families: ``main`` (every pair of :data:`PAIRS` but the A/A control) and ``aa`` (attention/tied against its A/A
copy, another initialization stream; it must never come out higher or lower).

Verdict, one symmetric rule at margin m (the study's, ``docs/study.md``): "no difference within +-m" if the Bonferroni
interval lies inside (-m, m), also where it excludes 0; otherwise "higher" if it lies above 0, "lower" if below 0,
else "inconclusive" with the minimal detectable difference.
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
    ("attention/tied", "uniform/tied", "weights from scores vs every weight 1/n (the uniform-mixing control)"),
    ("attention/classifier", "uniform/classifier", "the classifier's flow vs the same with every weight 1/n"),
    ("both/tied", "mlp", "attention beside the MLP vs the MLP alone"),
    (
        "attention/tied",
        "attention/tied (A/A)",
        "A/A control: the same arm from another initialization stream; it must never come out higher or lower",
    ),
)
AA_PAIR = ("attention/tied", "attention/tied (A/A)")
"""The A/A control's pair: its own family (``"aa"``), never part of the main family's corrections."""
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


def adjusted_interval(a: Sequence[float], b: Sequence[float], family: int) -> tuple[float | None, float | None]:
    """The paired t-interval of mean(a - b) at the Bonferroni level 1 - ALPHA / family; (None, None) for fewer than
    2 pairs; the common value for identical differences."""
    from scipy import stats

    d = np.subtract(a, b, dtype=float)
    if d.size < 2:
        return None, None
    mean = float(d.mean())
    if np.all(d == d[0]):
        return mean, mean
    low, high = stats.t.interval(1 - ALPHA / max(family, 1), d.size - 1, loc=mean, scale=stats.sem(d))
    return float(low), float(high)


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


def verdict(eq: dict, margin: float) -> str:
    """One phrase from the Bonferroni interval ``eq["ci_low_adj"], eq["ci_high_adj"]`` by the symmetric rule (module
    docstring): inside (-margin, margin) "no difference", above 0 "higher", below 0 "lower", else "inconclusive" with
    ``eq["mdd"]``."""
    low, high, mdd = eq["ci_low_adj"], eq["ci_high_adj"], eq["mdd"]
    if low is not None and high is not None:
        if -margin < low and high < margin:
            return f"no difference within +-{margin:g}"
        if low > 0:
            return "higher"
        if high < 0:
            return "lower"
    return "inconclusive" + (f": detectable only above {mdd:.3f}" if mdd is not None else "")


def _bonferroni(a: Sequence[float], b: Sequence[float], family: int, margin: float) -> dict:
    """``{"ci_low_adj", "ci_high_adj", "mdd", "verdict"}`` of a - b in a family of ``family`` comparisons."""
    low, high = adjusted_interval(a, b, family)
    eq = {
        "ci_low_adj": low,
        "ci_high_adj": high,
        "mdd": minimal_detectable(list(np.subtract(a, b, dtype=float)), family),
    }
    return eq | {"verdict": verdict(eq, margin)}


def _within_families(rows: list[dict], extra: list[dict], margin: float) -> dict[str, list[int]]:
    """Holm's adjustment, the Bonferroni interval, the detectable difference and the verdict of each comparison
    within its family (filled into ``rows`` and ``extra`` in place); returns each family's row indices."""
    families = {
        f: [i for i, e in enumerate(extra) if e["family"] == f] for f in dict.fromkeys(e["family"] for e in extra)
    }
    for idx in families.values():
        for i, ph, pt in zip(
            idx, holm([rows[i]["p"] for i in idx]), holm([extra[i]["p_tost"] for i in idx]), strict=True
        ):
            rows[i]["p_holm"], extra[i]["p_tost_holm"] = ph, pt
            xa, xb = extra[i].pop("pair")
            extra[i] |= _bonferroni(xa, xb, len(idx), margin)
    return families


def compare_arms(acc: dict[tuple, list[float]], margin: float) -> tuple[list[dict], dict]:
    """The family of paired comparisons of one run.

    Args:
        acc: ``{(theta, arm, K, noise): per-seed accuracies}`` (seeds in the same order in every entry).
        margin: the equivalence margin (accuracy, absolute).

    Returns:
        ``(comparisons, equivalence)``: the rows ``{"a", "b", "theta", "K", "noise", "diff", "ci_low", "ci_high",
        "p", "p_holm"}`` for every pair of :data:`PAIRS` whose arms are both present, every theta, K > 0 and noise
        level, Holm within its family; and ``{"margin", "alpha", "power", "rule", "families": {family: size},
        "rows": [{"a", "b", "theta", "K", "noise", "family", "ci_low_adj", "ci_high_adj", "p_tost", "p_tost_holm",
        "mdd", "verdict", "question"}]}`` in the same order.
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
                    "family": "aa" if (a, b) == AA_PAIR else "main",
                    "p_tost": tost(xa, xb, margin),
                    "pair": (xa, xb),
                    "question": question,
                }
            )
    families = _within_families(rows, extra, margin)
    rule = (
        f"no difference if the Bonferroni interval (level 1 - {ALPHA:g}/m, m the family's size) lies inside "
        f"(-{margin:g}, {margin:g}); else higher if above 0, lower if below 0; else inconclusive"
    )
    sizes = {f: len(idx) for f, idx in families.items()}
    return rows, {"margin": margin, "alpha": ALPHA, "power": POWER, "rule": rule, "families": sizes, "rows": extra}


def lr_check(
    chosen: dict[tuple, list[float]], second: dict[tuple, list[float]], equivalence: dict
) -> list[dict[str, object]]:
    """The learning-rate check of every comparison that ``second`` has both arms of (the study's ``lr_check``).

    Each verdict is recomputed twice, by the same rule at the same Bonferroni level (its family's size): with arm a at
    its second-best rate and b at its chosen one (``a_second``), and the other way round (``b_second``). A verdict
    that changes either way is ``lr_sensitive``: it rests on the rates the selection picked.

    Args:
        chosen: ``{(theta, arm, K, noise): per-seed accuracies}`` at the chosen rates (the run's store).
        second: the same cells trained at their second-best rates (a run with ``FlowConfig.lr_rank = 2``, the same
            seeds in the same order).
        equivalence: :func:`compare_arms`'s second return value for ``chosen`` (its rows, families and margin).

    Returns:
        ``[{"a", "b", "theta", "K", "noise", "family", "verdict", "a_second", "b_second", "lr_sensitive"}]`` in the
        order of ``equivalence["rows"]``.
    """
    margin, sizes, out = equivalence["margin"], equivalence["families"], []
    for row in equivalence["rows"]:
        cell_a = (row["theta"], row["a"], row["K"], row["noise"])
        cell_b = (row["theta"], row["b"], row["K"], row["noise"])
        if cell_a not in second or cell_b not in second:
            continue
        m = sizes[row["family"]]
        a_second = _bonferroni(second[cell_a], chosen[cell_b], m, margin)["verdict"]
        b_second = _bonferroni(chosen[cell_a], second[cell_b], m, margin)["verdict"]
        kinds = {v.split(":")[0] for v in (row["verdict"], a_second, b_second)}
        keys = ("a", "b", "theta", "K", "noise", "family", "verdict")
        out.append(
            {k: row[k] for k in keys} | {"a_second": a_second, "b_second": b_second, "lr_sensitive": len(kinds) > 1}
        )
    return out


__all__ = [
    "AA_PAIR",
    "ALPHA",
    "COMPARISON_KEYS",
    "PAIRS",
    "adjusted_interval",
    "compare_arms",
    "holm",
    "lr_check",
    "minimal_detectable",
    "paired",
    "tost",
    "verdict",
]
