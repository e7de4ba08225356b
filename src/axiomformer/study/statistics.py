"""Statistics of a study: valid intervals, paired comparisons corrected within a family, equivalence, power, verdicts.

This module is pure numbers (numpy, scipy, statsmodels): it imports nothing else of axiomformer, and every suite
builds its conclusions on it. The public API (stable):

* :func:`t_interval` ``(values, level) -> Interval``: the mean over seeds with its Student-t interval (Student 1908),
  valid at any n >= 2 for normal data (coverage simulated in ``tests/test_study_statistics.py``).
* :func:`clopper_pearson` ``(successes, trials, level) -> Interval``: the exact binomial interval of a proportion
  (Clopper & Pearson 1934; ``statsmodels.stats.proportion.proportion_confint(method="beta")``).
* :func:`cell_interval` ``(values, n_test, level) -> Interval``: a cell's mean test accuracy: the t interval over
  seeds for two or more seeds, Clopper-Pearson over its ``n_test`` scored test items for one run (never ``[x, x]``).
* :func:`tost_p` ``(diffs, margin) -> (p_lower, p_upper)``: the two one-sided paired t-tests of the equivalence test
  (TOST, Schuirmann 1987) against ``-margin`` and ``+margin``.
* :func:`mde` ``(sd, n, alpha, power) -> float``: the minimal detectable paired difference at ``power`` (two-sided
  level ``alpha``) with ``n`` seeds and seed-to-seed standard deviation ``sd`` of the differences.
* :func:`seeds_needed` ``(diff, sd, margin, alpha, power, cap) -> int | None``: the fewest seeds for which either the
  difference test or the equivalence test reaches ``power``, if the true difference and sd are the observed ones
  (``None``: more than ``cap``).
* :func:`decide` ``(ci_low, ci_high, margin, pilot) -> str``: the verdict rule, from the interval alone.
* :func:`newcombe_difference` ``(s1, n1, s2, n2, level) -> Interval``: the Newcombe hybrid score interval of a
  difference of two proportions (Newcombe 1998, method 10; ``statsmodels ... confint_proportions_2indep``).
* :class:`VerdictRule` ``(alpha, margin, power, pilot)``: the settings of the one verdict rule that every comparison
  below takes (``rule=``).
* :func:`one_comparison` ``(item, family_size, rule) -> Verdict``: one paired comparison of a family.
* :func:`solve_rate_comparison` ``(item, threshold, family_size, rule) -> Verdict``: the comparison of two solve
  rates (a run solves when its accuracy reaches ``threshold``).
* :func:`paired_family` ``(items, rule) -> list[Verdict]``: every comparison of one family (e.g. the primary
  comparisons), paired by seed, with Bonferroni-simultaneous intervals.
* :func:`agrees` ``(verdict dict) -> bool``: whether a verdict agrees with its printed interval (the check the report
  and the tests apply to every verdict).

Method (one family of m comparisons, each a model minus the standard model, paired by seed):

* interval: paired t at level ``1 - alpha / m`` (Bonferroni 1936), so the m intervals hold jointly with probability
  at least ``1 - alpha``; ``ci_method`` says so (e.g. ``"paired t, Bonferroni over 8"``), ``ci_level`` is the
  per-interval level;
* ``p_difference``: the two-sided paired t-test p-value times m (capped at 1): below ``alpha`` exactly when the
  interval excludes 0;
* ``p_equivalence``: the TOST p-value (the larger one-sided p) referred to the same level as the interval, times 2m
  (capped at 1): below ``alpha`` exactly when the interval lies inside ``(-margin, +margin)``;
* verdict (:func:`decide`, one symmetric rule): ``free`` when the interval lies inside ``(-margin, +margin)``
  (equivalent within the margin, even where it excludes 0); otherwise ``forced`` when ``ci_high < 0`` (relaxing the
  assumption costs accuracy), ``better`` when ``ci_low > 0``, ``inconclusive`` otherwise (with ``mde`` and
  ``seeds_needed``); and ``pilot`` whatever the interval when the run is a pilot (``--quick``, or fewer seeds than its
  preset's minimum): a pilot claims nothing. Convergence is reported beside the verdict (``converged``) and never
  changes it;
* ``mde``: :func:`mde` at the family's level with the observed sd of the differences; ``seeds_needed``: the current
  number of seeds for a decided verdict, else :func:`seeds_needed`.

The verdict JSON object (``Verdict.to_dict()``, one per comparison in ``axiomformer report DIR --json``)::

    {"assumption": str, "model": str, "task": str, "verdict": "forced" | "better" | "free" | "inconclusive" | "pilot",
     "diff": float, "ci_low": float | null, "ci_high": float | null, "ci_method": str, "ci_level": float,
     "margin": float, "p_difference": float, "p_equivalence": float, "n_seeds": int, "mde": float | null,
     "seeds_needed": int | null, "converged": bool, "metric": "accuracy" | "solve_rate",
     "lr_sensitive": bool | null}

``metric``: what ``diff`` is a difference of (mean test accuracy, or the share of runs that solve the task);
``lr_sensitive``: whether the verdict changes when the relaxed arm is retrained at its second-best learning rate
(``null``: not checked).

``diff``, ``ci_*``, ``margin`` and ``mde`` are in accuracy units (fractions, not percent); ``ci_*`` are ``null`` with
fewer than two paired seeds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

ALPHA = 0.05
"""Family-wise error rate of each family of comparisons."""
CONFIDENCE = 0.95
"""Level of a cell's interval."""
MARGIN = 0.02
"""Default equivalence margin (accuracy)."""
POWER = 0.80
"""Power at which ``mde`` and ``seeds_needed`` are computed."""
SEEDS_CAP = 10_000
"""``seeds_needed`` above this is reported as ``None``."""
CORRECTION = "bonferroni"
VERDICTS = ("forced", "better", "free", "inconclusive", "pilot")
VERDICT_KEYS = (
    "assumption",
    "model",
    "task",
    "verdict",
    "diff",
    "ci_low",
    "ci_high",
    "ci_method",
    "ci_level",
    "margin",
    "p_difference",
    "p_equivalence",
    "n_seeds",
    "mde",
    "seeds_needed",
    "converged",
    "metric",
    "lr_sensitive",
)
METRICS = ("accuracy", "solve_rate")


@dataclass(frozen=True)
class Interval:
    """An estimate with its interval: ``low``/``high`` ``None`` when there is none (``method`` says why)."""

    estimate: float
    low: float | None
    high: float | None
    method: str
    level: float
    n: int


def fmt_signed(x: float) -> str:
    """A signed difference or bound to 3 decimals, or in scientific notation where 3 decimals would print a nonzero
    value as 0.000 (an interval printed as [+0.000, ...] beside `better` would read as touching 0)."""
    return f"{x:+.1e}" if x != 0 and abs(x) < 5e-4 else f"{x:+.3f}"


def _clean(values: Sequence[float | None] | np.ndarray) -> np.ndarray:
    data = np.asarray([float(v) for v in values if v is not None], dtype=float)
    return data[np.isfinite(data)]


def t_interval(values: Sequence[float | None] | np.ndarray, level: float = CONFIDENCE) -> Interval:
    """The mean of ``values`` and its two-sided Student-t interval at ``level``.

    Zero spread gives the zero-width interval ``[mean, mean]`` (what the data say); fewer than two values give no
    interval. Non-finite values and ``None`` are dropped.

    Raises:
        ValueError: no finite value, or ``level`` outside (0, 1).
    """
    from scipy.stats import t

    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    data = _clean(values)
    if data.size == 0:
        raise ValueError("t_interval needs at least one finite value")
    mean = float(data.mean())
    if data.size < 2:
        return Interval(mean, None, None, "none (one value)", level, 1)
    half = float(t.ppf(0.5 + level / 2, data.size - 1)) * float(data.std(ddof=1)) / math.sqrt(data.size)
    return Interval(mean, mean - half, mean + half, "t", level, int(data.size))


def clopper_pearson(successes: int, trials: int, level: float = CONFIDENCE) -> Interval:
    """The proportion ``successes / trials`` with its exact (Clopper-Pearson) binomial interval at ``level``.

    Raises:
        ValueError: ``trials < 1`` or ``successes`` outside ``0 .. trials``.
    """
    from statsmodels.stats.proportion import proportion_confint

    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes} of {trials}")
    low, high = proportion_confint(int(successes), int(trials), alpha=1 - level, method="beta")
    return Interval(successes / trials, float(low), float(high), "Clopper-Pearson", level, 1)


def cell_interval(values: Sequence[float | None], n_test: int | None = None, level: float = CONFIDENCE) -> Interval:
    """A cell's mean test accuracy over seeds with a valid interval.

    Two or more seeds that differ: :func:`t_interval` (``method`` ``"t over seeds"``). One run, or seeds that all
    give the same value: :func:`clopper_pearson` over the ``n_test`` scored test items of one run (``"Clopper-Pearson
    over test items"``), never a zero-width ``[x, x]``; no interval when ``n_test`` is unknown.

    Raises:
        ValueError: no finite value.
    """
    data = _clean(values)
    if data.size >= 2 and (float(data.std(ddof=1)) > 0 or not n_test):
        out = t_interval(data, level)
        return Interval(out.estimate, out.low, out.high, "t over seeds", level, out.n)
    if n_test and data.size >= 1:
        # one run, or every seed the same (a zero-width t interval would claim certainty): the exact interval over
        # the test items of one run
        out = clopper_pearson(round(float(data[0]) * n_test), int(n_test), level)
        method = "Clopper-Pearson over test items" + (" (every seed equal)" if data.size > 1 else "")
        return Interval(float(data[0]), out.low, out.high, method, level, int(data.size))
    return t_interval(data, level)


def tost_p(diffs: Sequence[float] | np.ndarray, margin: float) -> tuple[float, float]:
    """One-sided p-values ``(p_lower, p_upper)`` of the paired TOST: H0 ``mean <= -margin`` and H0
    ``mean >= +margin`` (Schuirmann 1987). Zero spread gives 0 or 1 by the side the mean is on.

    Raises:
        ValueError: fewer than two differences or ``margin <= 0``.
    """
    from scipy.stats import t

    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    data = _clean(diffs)
    if data.size < 2:
        raise ValueError("the equivalence test needs at least two paired differences")
    mean, n = float(data.mean()), data.size
    se = float(data.std(ddof=1)) / math.sqrt(n)
    if se == 0.0:
        return (0.0 if mean > -margin else 1.0), (0.0 if mean < margin else 1.0)
    return float(t.sf((mean + margin) / se, n - 1)), float(t.cdf((mean - margin) / se, n - 1))


def _power_difference(effect: float, n: np.ndarray, alpha: float) -> np.ndarray:
    from scipy.stats import nct, t

    df = n - 1
    crit = t.ppf(1 - alpha / 2, df)
    ncp = effect * np.sqrt(n)
    # scipy's noncentral t gives NaN far in the tail, where the power is 1
    return np.nan_to_num(nct.sf(crit, df, ncp) + nct.cdf(-crit, df, ncp), nan=1.0)


def _power_equivalence(diff: float, sd: float, margin: float, n: np.ndarray, alpha: float) -> np.ndarray:
    """A lower bound (Bonferroni inequality) on the TOST's power at the interval's level ``1 - alpha``."""
    from scipy.stats import nct, t

    if abs(diff) >= margin:
        return np.zeros_like(n, dtype=float)
    df = n - 1
    crit = t.ppf(1 - alpha / 2, df)
    # NaN far in the tail, where a one-sided test cannot fail
    fail_low = np.nan_to_num(nct.cdf(crit, df, (diff + margin) / sd * np.sqrt(n)), nan=0.0)
    fail_high = np.nan_to_num(nct.sf(-crit, df, (diff - margin) / sd * np.sqrt(n)), nan=0.0)
    return np.clip(1 - fail_low - fail_high, 0.0, 1.0)


def mde(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest true mean paired difference a two-sided paired t-test at level ``alpha`` detects with
    probability ``power`` from ``n`` seeds whose differences have standard deviation ``sd`` (accuracy units):
    ``sd`` times the standardized effect of ``statsmodels.stats.power.TTestPower``. ``None`` for ``n < 2``."""
    if n < 2 or not math.isfinite(sd):
        return None
    if sd == 0.0:
        return 0.0
    from scipy.optimize import brentq

    ns = np.array([n])
    effect = brentq(lambda e: float(_power_difference(e, ns, alpha)[0]) - power, 1e-6, 1e3)
    return float(effect * sd)


def seeds_needed(
    diff: float, sd: float, margin: float, alpha: float = ALPHA, power: float = POWER, cap: int = SEEDS_CAP
) -> int | None:
    """The fewest seeds n >= 2 at which the paired design decides with probability ``power``, if the true mean
    difference is ``diff`` and the seed-to-seed sd of the differences is ``sd``: either the difference test (two-sided,
    level ``alpha``) or the equivalence test at ``±margin`` (interval at level ``1 - alpha``) succeeds. ``None``:
    more than ``cap`` (e.g. a true difference right at the margin)."""
    if not math.isfinite(sd) or not math.isfinite(diff):
        return None
    if sd == 0.0:
        return 2

    def decides(n: int) -> bool:
        ns = np.array([float(n)])
        return bool(
            _power_difference(abs(diff) / sd, ns, alpha)[0] >= power
            or _power_equivalence(diff, sd, margin, ns, alpha)[0] >= power
        )

    # both powers grow with n: double until it decides, then bisect (about 2 log2(cap) evaluations)
    high = 2
    while not decides(high):
        if high >= cap:
            return None
        high = min(2 * high, cap)
    low = high // 2 if high > 2 else 1
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if decides(mid) else (mid, high)
    return high


def decide(ci_low: float | None, ci_high: float | None, margin: float, *, pilot: bool = False) -> str:
    """The verdict from an interval of (model - standard), one symmetric rule: ``free`` iff the interval lies inside
    (-margin, margin); otherwise ``forced`` iff ``ci_high < 0``, ``better`` iff ``ci_low > 0``, else
    ``inconclusive``; ``pilot`` for a pilot. No interval: ``inconclusive`` (or ``pilot``).

    Raises:
        ValueError: ``margin <= 0``.
    """
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    if pilot:
        return "pilot"
    if ci_low is None or ci_high is None:
        return "inconclusive"
    if -margin < ci_low and ci_high < margin:
        return "free"
    if ci_high < 0:
        return "forced"
    if ci_low > 0:
        return "better"
    return "inconclusive"


def agrees(v: dict[str, Any]) -> bool:
    """Whether a verdict dict agrees with the interval printed beside it under :func:`decide`'s symmetric rule;
    ``pilot`` always agrees (it claims nothing)."""
    if v["verdict"] == "pilot":
        return True
    return v["verdict"] == decide(v["ci_low"], v["ci_high"], v["margin"])


@dataclass(frozen=True)
class Verdict:
    """One comparison of a model with the standard one (fields: the verdict JSON schema of the module docstring)."""

    assumption: str
    model: str
    task: str
    verdict: str
    diff: float
    ci_low: float | None
    ci_high: float | None
    ci_method: str
    ci_level: float
    margin: float
    p_difference: float
    p_equivalence: float
    n_seeds: int
    mde: float | None
    seeds_needed: int | None
    converged: bool
    metric: str = "accuracy"
    lr_sensitive: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PairedItem:
    """The input of one comparison: accuracies of the model and of the standard model, paired by seed (same
    order), and whether both cells converged."""

    assumption: str
    model: str
    task: str
    values: Sequence[float]
    reference: Sequence[float]
    converged: bool = True
    n_items: int | None = None
    """Scored test items per run (the same for both sides): where every seed gives the same difference, the interval
    falls back to the test items' own binomial noise."""


def _pooled_items(item: PairedItem, level: float, ci: Interval) -> tuple[Interval, str]:
    """The zero-spread fallback of :func:`one_comparison`: the Newcombe interval of the difference of the two sides'
    accuracies pooled over their runs' test items (``n_items`` each)."""
    if not item.n_items:
        return ci, "; zero spread over seeds: test-item noise not carried"
    n = int(item.n_items) * len(item.values)
    a = round(float(np.nansum(item.values)) * item.n_items)
    b = round(float(np.nansum(item.reference)) * item.n_items)
    pooled = newcombe_difference(min(a, n), n, min(b, n), n, level)
    return (
        Interval(ci.estimate, pooled.low, pooled.high, ci.method, level, ci.n),
        f"; zero spread over seeds: Newcombe interval over the {n} pooled test items of each side",
    )


def _p_difference(data: np.ndarray) -> float:
    from scipy.stats import ttest_1samp

    if data.size < 2:
        return 1.0
    if float(data.std(ddof=1)) == 0.0:
        return 1.0 if float(data.mean()) == 0.0 else 0.0
    return float(ttest_1samp(data, 0.0).pvalue)


def _paired_differences(item: PairedItem, margin: float, family_size: int) -> np.ndarray:
    """The finite per-seed differences model minus standard (a diverged seed drops its pair)."""
    if len(item.values) != len(item.reference):
        raise ValueError(f"paired samples must have equal lengths, got {len(item.values)} and {len(item.reference)}")
    if not margin > 0 or family_size < 1:
        raise ValueError(f"need margin > 0 and family_size >= 1, got {margin} and {family_size}")
    data = np.asarray(item.values, dtype=float) - np.asarray(item.reference, dtype=float)
    return data[np.isfinite(data)]


def _verdict(
    item: PairedItem,
    verdict: str,
    diff: float,
    ci: Interval,
    method: str,
    level: float,
    margin: float,
    p_diff: float,
    p_eq: float,
    n: int,
    min_effect: float | None,
    need: int | None,
    metric: str = "accuracy",
) -> Verdict:
    """The :class:`Verdict` on ``item`` of a test that found ``ci`` (its bounds are the verdict's interval)."""
    return Verdict(
        item.assumption, item.model, item.task, verdict, diff, ci.low, ci.high, method, level, margin, p_diff, p_eq,
        n, min_effect, need, item.converged, metric
    )  # fmt: skip


@dataclass(frozen=True)
class VerdictRule:
    """The settings of the one symmetric verdict rule (:func:`decide`) that every comparison of a study applies.

    Attributes:
        alpha: the family-wise error rate; each interval of a family of m is at level ``1 - alpha / m``.
        margin: the equivalence margin (accuracy units): an interval inside ``(-margin, +margin)`` is ``free``.
        power: the power at which ``mde`` and ``seeds_needed`` are computed.
        pilot: a pilot run claims nothing: every verdict is ``pilot``, whatever its interval.
    """

    alpha: float = ALPHA
    margin: float = MARGIN
    power: float = POWER
    pilot: bool = False


RULE = VerdictRule()
"""The default rule: ``alpha`` :data:`ALPHA`, ``margin`` :data:`MARGIN`, ``power`` :data:`POWER`, not a pilot."""


def one_comparison(item: PairedItem, *, family_size: int = 1, rule: VerdictRule = RULE) -> Verdict:
    """One comparison of a family of ``family_size`` (Bonferroni) under ``rule``, see :func:`paired_family`.

    Raises:
        ValueError: ``values`` and ``reference`` of different lengths, ``rule.margin <= 0`` or ``family_size < 1``.
    """
    alpha, margin, power, pilot = rule.alpha, rule.margin, rule.power, rule.pilot
    data = _paired_differences(item, margin, family_size)
    level = 1 - alpha / family_size
    method = "paired t" + (f", Bonferroni over {family_size}" if family_size > 1 else "")
    n = int(data.size)
    diff = float(data.mean()) if n else float("nan")
    if n < 2:
        verdict = decide(None, None, margin, pilot=pilot)
        return Verdict(
            item.assumption, item.model, item.task, verdict, diff, None, None, method, level, margin, 1.0, 1.0, n,
            None, None, item.converged
        )  # fmt: skip
    ci = t_interval(data, level)
    sd = float(data.std(ddof=1))
    if sd == 0.0:
        # every seed gave the same difference (e.g. both sides at ceiling): the t interval has zero width and says
        # nothing of the test items' own noise; where the item count is known, the Newcombe interval of the pooled
        # items carries it (never of zero width), else the method says it is not carried
        ci, note = _pooled_items(item, level, ci)
        method += note
    p_diff = min(1.0, _p_difference(data) * family_size)
    p_eq = min(1.0, max(tost_p(data, margin)) * 2 * family_size)
    verdict = decide(ci.low, ci.high, margin, pilot=pilot)
    decided = verdict in ("forced", "better", "free")
    need = n if decided else seeds_needed(diff, sd, margin, alpha / family_size, power)
    return _verdict(
        item, verdict, diff, ci, method, level, margin, p_diff, p_eq, n, mde(sd, n, alpha / family_size, power), need
    )


def paired_family(items: Sequence[PairedItem], *, rule: VerdictRule = RULE) -> list[Verdict]:
    """Verdicts for one family of comparisons under ``rule``, in input order, each interval Bonferroni-corrected over
    the family so that all of them hold jointly with probability at least ``1 - rule.alpha``.

    Raises:
        ValueError: see :func:`one_comparison`.
    """
    return [one_comparison(item, family_size=max(1, len(items)), rule=rule) for item in items]


def newcombe_difference(s1: int, n1: int, s2: int, n2: int, level: float = CONFIDENCE) -> Interval:
    """The difference of two proportions ``s1/n1 - s2/n2`` with its Newcombe hybrid score interval (Newcombe 1998,
    "Interval estimation for the difference between independent proportions", method 10: the Wilson intervals of
    each side combined), valid at small n and never of zero width: statsmodels'
    ``confint_proportions_2indep(method="newcomb")``.

    Raises:
        ValueError: ``n1`` or ``n2`` below 1, or successes outside ``0..n``.
    """
    from statsmodels.stats.proportion import confint_proportions_2indep

    if n1 < 1 or n2 < 1 or not (0 <= s1 <= n1 and 0 <= s2 <= n2):
        raise ValueError(f"need 0 <= successes <= trials >= 1, got {s1}/{n1} and {s2}/{n2}")
    low, high = confint_proportions_2indep(s1, n1, s2, n2, method="newcomb", compare="diff", alpha=1 - level)
    return Interval(s1 / n1 - s2 / n2, float(low), float(high), "Newcombe hybrid score", level, min(n1, n2))


def _solve_power(p_ref: float, n: int, alpha: float, power: float) -> float | None:
    """The smallest difference of solve rates (below ``p_ref``, or above it when there is no room) detected at
    ``power`` with ``n`` runs a side (Cohen's h, statsmodels' ``NormalIndPower``)."""
    from statsmodels.stats.power import NormalIndPower

    try:
        h = float(NormalIndPower().solve_power(effect_size=None, nobs1=n, alpha=alpha, power=power, ratio=1.0))
    except (ValueError, RuntimeError):
        return None
    phi = 2 * math.asin(math.sqrt(min(max(p_ref, 0.0), 1.0)))
    other = phi - h if phi - h >= 0 else phi + h
    if other > math.pi:
        return None
    return abs(math.sin(other / 2) ** 2 - p_ref)


def _solve_seeds(p_a: float, p_b: float, alpha: float, power: float, margin: float) -> int | None:
    """Runs a side a decision would take at the observed solve rates (``None``: more than :data:`SEEDS_CAP`).

    Inside the margin (|p_a - p_b| < margin) the question is equivalence: the fewest runs a side at which the
    Newcombe interval at level ``1 - alpha`` of the observed rates fits inside ``±margin`` (e.g. 8/8 against 8/8 at
    ±0.25 and level 1 - 0.05 / 24: 29). Outside it, detection: the runs a side at which the difference would be
    detected at ``power`` (Cohen's h, statsmodels' ``NormalIndPower``)."""
    from statsmodels.stats.power import NormalIndPower

    if abs(p_a - p_b) < margin:
        return _equivalence_seeds(p_a, p_b, 1 - alpha, margin)
    h = abs(2 * math.asin(math.sqrt(p_a)) - 2 * math.asin(math.sqrt(p_b)))
    n = float(NormalIndPower().solve_power(effect_size=h, nobs1=None, alpha=alpha, power=power, ratio=1.0))
    return None if n > SEEDS_CAP else max(2, math.ceil(n))


def _equivalence_seeds(p_a: float, p_b: float, level: float, margin: float) -> int | None:
    def fits(n: int) -> bool:
        ci = newcombe_difference(round(p_a * n), n, round(p_b * n), n, level)
        return ci.low is not None and ci.high is not None and -margin < ci.low and ci.high < margin

    high = 2
    while not fits(high):  # doubling, then bisection: the interval narrows as n grows (up to rounding of p n)
        if high > SEEDS_CAP:
            return None
        high *= 2
    low = high // 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return max(2, high)


def _p_equivalent_rates(s_a: int, n_a: int, s_b: int, n_b: int, margin: float, family_size: int) -> float:
    """statsmodels' TOST of two proportions against ``±margin``, referred to a two-sided interval's level and
    Bonferroni-corrected (1 where it cannot be computed)."""
    from statsmodels.stats.proportion import tost_proportions_2indep

    with warnings.catch_warnings():  # statsmodels divides by zero for rates of 0 or 1 in a term it then discards
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            p_eq_raw = float(tost_proportions_2indep(s_a, n_a, s_b, n_b, -margin, margin, compare="diff").pvalue)
        except (ValueError, ZeroDivisionError):
            p_eq_raw = 1.0
    return 1.0 if not math.isfinite(p_eq_raw) else min(1.0, p_eq_raw * 2 * family_size)


SOLVE_RULE = VerdictRule(margin=0.25)
"""The default rule of a solve-rate comparison: a difference of solve rates within ±0.25 is ``free``."""


def solve_rate_comparison(
    item: PairedItem, *, threshold: float, family_size: int = 1, rule: VerdictRule = SOLVE_RULE
) -> Verdict:
    """The difference of solve rates, model minus standard: a run solves when its value (test accuracy) reaches
    ``threshold``; a non-finite value (a diverged run) counts as not solved. Interval: :func:`newcombe_difference` at
    level ``1 - alpha / family_size`` (Bonferroni); ``p_difference``: Fisher's exact test (scipy), times the family
    size; ``p_equivalence``: statsmodels' TOST for two proportions against ``±margin``, referred to the interval's
    level; verdict: :func:`decide`.

    Raises:
        ValueError: an empty side, ``rule.margin <= 0`` or ``family_size < 1``.
    """
    from scipy.stats import fisher_exact

    alpha, margin, power, pilot = rule.alpha, rule.margin, rule.power, rule.pilot
    if not margin > 0 or family_size < 1:
        raise ValueError(f"need margin > 0 and family_size >= 1, got {margin} and {family_size}")
    solved_a = [bool(math.isfinite(x) and x >= threshold) for x in map(float, item.values)]
    solved_b = [bool(math.isfinite(x) and x >= threshold) for x in map(float, item.reference)]
    n_a, n_b = len(solved_a), len(solved_b)
    if n_a < 1 or n_b < 1:
        raise ValueError(f"a solve-rate comparison needs runs on both sides, got {n_a} and {n_b}")
    s_a, s_b = sum(solved_a), sum(solved_b)
    level = 1 - alpha / family_size
    ci = newcombe_difference(s_a, n_a, s_b, n_b, level)
    p_diff = min(1.0, float(fisher_exact([[s_a, n_a - s_a], [s_b, n_b - s_b]]).pvalue) * family_size)
    p_eq = _p_equivalent_rates(s_a, n_a, s_b, n_b, margin, family_size)
    verdict = decide(ci.low, ci.high, margin, pilot=pilot)
    decided = verdict in ("forced", "better", "free")
    method = "Newcombe hybrid score" + (f", Bonferroni over {family_size}" if family_size > 1 else "")
    n = min(n_a, n_b)
    need = n if decided else _solve_seeds(s_a / n_a, s_b / n_b, alpha / family_size, power, margin)
    min_effect = _solve_power(s_b / n_b, n, alpha / family_size, power)
    return _verdict(
        item, verdict, ci.estimate, ci, method, level, margin, p_diff, p_eq, n, min_effect, need, "solve_rate"
    )


def mean_interval(
    values: Sequence[float], *, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float | None, float | None]:
    """``(mean, low, high)`` of :func:`t_interval` (kept for callers of the earlier API; ``seed`` is unused), never
    a zero-width interval: 0/1 outcomes get the Wilson score interval (Wilson 1927; statsmodels'
    ``proportion_confint``), e.g. 10/10 -> [0.7225, 1], 0/50 -> [0, 0.0713]; other values with no spread get no
    interval (``None``, ``None``): ``[x, x]`` would claim certainty that n values cannot give.

    Raises:
        ValueError: no values.
    """
    from statsmodels.stats.proportion import proportion_confint

    data = _clean(values)
    if data.size >= 1 and bool(np.isin(data, (0.0, 1.0)).all()):
        low, high = proportion_confint(int(data.sum()), int(data.size), alpha=1 - confidence, method="wilson")
        return float(data.mean()), float(low), float(high)
    out = t_interval(values, confidence)
    if out.low is not None and out.high is not None and out.high <= out.low:
        return out.estimate, None, None
    return out.estimate, out.low, out.high


__all__ = [
    "ALPHA",
    "CONFIDENCE",
    "CORRECTION",
    "MARGIN",
    "METRICS",
    "POWER",
    "RULE",
    "SEEDS_CAP",
    "SOLVE_RULE",
    "VERDICTS",
    "VERDICT_KEYS",
    "Interval",
    "PairedItem",
    "Verdict",
    "VerdictRule",
    "agrees",
    "cell_interval",
    "clopper_pearson",
    "decide",
    "mde",
    "mean_interval",
    "newcombe_difference",
    "one_comparison",
    "paired_family",
    "seeds_needed",
    "solve_rate_comparison",
    "t_interval",
    "tost_p",
]
