"""The study's statistics against hand calculations, closed forms, a reference library and simulation.

Every rule here can fail: each test plants the wrong answer next to the right one (a percentile bootstrap that
undercovers, an unpaired test, a one-sided level, Holm instead of Bonferroni) and shows the check tells them apart.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from axiomformer.study.statistics import (
    VERDICT_KEYS,
    PairedItem,
    VerdictRule,
    agrees,
    cell_interval,
    clopper_pearson,
    decide,
    mde,
    one_comparison,
    paired_family,
    seeds_needed,
    t_interval,
    tost_p,
)


# ---------------------------------------------------------------------------------------------------- intervals
def test_t_interval_against_a_hand_calculation():
    # [0.4, 0.2, 0.1]: mean 7/30, sd sqrt(7/300); t_{0.975, 2} = 4.302652729911275 (tables)
    out = t_interval([0.4, 0.2, 0.1])
    half = 4.302652729911275 * math.sqrt(7 / 300) / math.sqrt(3)
    assert (out.estimate, out.low, out.high) == pytest.approx((7 / 30, 7 / 30 - half, 7 / 30 + half))
    assert out.method == "t" and out.n == 3
    assert t_interval([0.7]).low is None
    with pytest.raises(ValueError, match="at least one"):
        t_interval([])


def _coverage(n: int, interval, reps: int = 3000, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(reps):
        low, high = interval(rng.normal(0.5, 0.1, size=n))
        hits += low <= 0.5 <= high
    return hits / reps


@pytest.mark.parametrize("n", [3, 10])
def test_t_interval_covers_at_least_93_percent_by_simulation(n):
    def t(data):
        out = t_interval(data)
        return out.low, out.high

    assert _coverage(n, t) >= 0.93


def test_the_percentile_bootstrap_of_three_values_would_fail_the_same_coverage_check():
    # the planted wrong method: what the study used before; the simulation catches it (about 73 %)
    from scipy.stats import bootstrap

    def percentile(data):
        res = bootstrap(
            (data,),
            np.mean,
            method="percentile",
            n_resamples=500,
            random_state=np.random.default_rng(0),
            vectorized=True,
        )
        return res.confidence_interval.low, res.confidence_interval.high

    assert _coverage(3, percentile, reps=400) < 0.85


def test_family_intervals_are_bonferroni_t_intervals():
    rng = np.random.default_rng(4)
    items = [PairedItem("A", f"m{i}", "t", rng.normal(0.5, 0.05, 6), rng.normal(0.5, 0.05, 6)) for i in range(8)]
    for item, v in zip(items, paired_family(items)):
        ref = t_interval(np.subtract(item.values, item.reference), 1 - 0.05 / 8)
        assert (v.ci_low, v.ci_high, v.ci_level) == pytest.approx((ref.low, ref.high, 1 - 0.05 / 8))
        assert v.ci_method == "paired t, Bonferroni over 8"


@pytest.mark.parametrize("n", [3, 10])
def test_family_intervals_cover_jointly_by_simulation(n):
    # 8 comparisons with Bonferroni (the family's intervals, as paired_family computes them): all 8 cover together
    # >= 93 % of the time; unadjusted 95 % intervals (the planted error) cover jointly only about 0.95 ** 8 = 66 %.
    rng = np.random.default_rng(3)
    joint = unadjusted = 0
    for _ in range(500):
        diffs = [rng.normal(0.5, 0.05, n) - rng.normal(0.5, 0.05, n) for _ in range(8)]
        joint += all((ci := t_interval(d, 1 - 0.05 / 8)).low <= 0 <= ci.high for d in diffs)
        unadjusted += all((ci := t_interval(d)).low <= 0 <= ci.high for d in diffs)
    assert joint / 500 >= 0.93
    assert unadjusted / 500 < 0.8


def test_clopper_pearson_against_closed_forms():
    # 0 of n: upper bound 1 - (alpha/2)^(1/n); n of n: lower bound (alpha/2)^(1/n)
    out = clopper_pearson(0, 20)
    assert out.low == 0.0 and out.high == pytest.approx(1 - 0.025 ** (1 / 20))
    out = clopper_pearson(10, 10)
    assert out.low == pytest.approx(0.025 ** (1 / 10)) and out.high == 1.0
    # the beta-quantile form for 7 of 10
    from scipy.stats import beta

    out = clopper_pearson(7, 10)
    assert (out.low, out.high) == pytest.approx((beta.ppf(0.025, 7, 4), beta.ppf(0.975, 8, 3)))
    with pytest.raises(ValueError):
        clopper_pearson(11, 10)


def test_a_one_run_cell_gets_an_exact_binomial_interval_never_a_point():
    out = cell_interval([1.0], n_test=1024)
    assert out.method == "Clopper-Pearson over test items"
    assert out.low == pytest.approx(0.025 ** (1 / 1024)) and out.high == 1.0 and out.low < 1.0
    many = cell_interval([0.5, 0.6, 0.7], n_test=1024)
    assert many.method == "t over seeds" and many.low < 0.6 < many.high
    same = cell_interval([1.0, 1.0, 1.0], n_test=128)  # three seeds at 128/128: not the point [1, 1]
    assert same.method.startswith("Clopper-Pearson") and same.low == pytest.approx(0.025 ** (1 / 128))


# ---------------------------------------------------------------------------------------------------- TOST, power
def test_tost_against_a_hand_calculation_and_statsmodels():
    d = np.array([0.01, -0.005, 0.0, 0.004, -0.002, 0.006])
    margin = 0.02
    n, mean, sd = d.size, d.mean(), d.std(ddof=1)
    se = sd / math.sqrt(n)
    from scipy.stats import t

    p_low = t.sf((mean + margin) / se, n - 1)  # H0: mean <= -margin
    p_high = t.cdf((mean - margin) / se, n - 1)  # H0: mean >= +margin
    assert tost_p(d, margin) == pytest.approx((p_low, p_high), rel=1e-10)
    from statsmodels.stats.weightstats import ttost_paired

    ref = ttost_paired(d, np.zeros_like(d), -margin, margin)
    assert max(tost_p(d, margin)) == pytest.approx(ref[0], rel=1e-8)
    with pytest.raises(ValueError, match="margin"):
        tost_p(d, 0.0)


def test_mde_matches_statsmodels_power():
    from statsmodels.stats.power import TTestPower

    for n, alpha in ((10, 0.05), (10, 0.05 / 8), (30, 0.01)):
        effect = TTestPower().solve_power(nobs=n, alpha=alpha, power=0.8, alternative="two-sided")
        assert mde(0.03, n, alpha) == pytest.approx(0.03 * effect, rel=1e-4)
    assert mde(0.03, 1) is None and mde(0.0, 5) == 0.0


def test_seeds_needed_against_statsmodels_and_its_limits():
    from statsmodels.stats.power import TTestPower

    # a large difference: the difference test decides first; statsmodels gives the fractional n
    need = seeds_needed(0.05, 0.04, margin=0.02, alpha=0.05)
    exact = TTestPower().solve_power(effect_size=0.05 / 0.04, alpha=0.05, power=0.8, alternative="two-sided")
    assert need == math.ceil(exact)
    # a tiny true difference in very noisy data: neither test decides within the cap
    assert seeds_needed(0.001, 0.5, margin=0.02, cap=500) is None
    # no difference: equivalence decides, needing more seeds the noisier the data
    assert seeds_needed(0.0, 0.01, 0.02) < seeds_needed(0.0, 0.03, 0.02)


# ---------------------------------------------------------------------------------------------------- verdicts
def test_decide_rules():
    assert decide(-0.1, -0.01, 0.02) == "forced"
    assert decide(0.01, 0.1, 0.02) == "better"
    assert decide(-0.01, 0.015, 0.02) == "free"
    # one symmetric rule: inside the margin is free even where the interval excludes 0 (either side)
    assert decide(-0.017, -0.005, 0.02) == "free"
    assert decide(0.005, 0.017, 0.02) == "free"
    assert decide(-0.03, -0.005, 0.02) == "forced" and decide(0.005, 0.03, 0.02) == "better"
    assert decide(-0.03, 0.01, 0.02) == "inconclusive"
    with pytest.raises(ValueError, match="margin"):
        decide(-0.01, 0.01, 0.0)
    assert decide(-0.1, -0.01, 0.02, pilot=True) == "pilot"
    assert decide(None, None, 0.02) == "inconclusive"


def _item(values, reference, converged=True):
    return PairedItem("A4", "A4=cosine", "mqar@64", list(values), list(reference), converged)


def test_planted_true_difference_is_forced():
    rng = np.random.default_rng(0)
    ref = rng.normal(0.80, 0.02, 10)
    v = one_comparison(_item(ref - 0.10 + rng.normal(0, 0.01, 10), ref), family_size=8)
    assert v.verdict == "forced" and v.ci_high < 0 and v.p_difference < 0.05 and agrees(v.to_dict())


def test_planted_true_equivalence_is_free():
    rng = np.random.default_rng(1)
    ref = rng.normal(0.80, 0.02, 10)
    v = one_comparison(_item(ref + rng.normal(0, 0.004, 10), ref), family_size=8)
    assert v.verdict == "free" and -0.02 < v.ci_low and v.ci_high < 0.02 and v.p_equivalence < 0.05
    assert agrees(v.to_dict())
    # convergence is reported beside the verdict and never overrides it
    not_converged = one_comparison(_item(ref + rng.normal(0, 0.004, 10), ref, converged=False), family_size=8)
    assert not_converged.verdict == "free" and not not_converged.converged


def test_planted_too_noisy_case_is_inconclusive_with_what_a_decision_would_take():
    rng = np.random.default_rng(2)
    ref = rng.normal(0.80, 0.02, 10)
    v = one_comparison(_item(ref - 0.02 + rng.normal(0, 0.08, 10), ref), family_size=8)
    assert v.verdict == "inconclusive" and v.ci_low < 0 < v.ci_high
    assert v.mde > 0.05 and (v.seeds_needed is None or v.seeds_needed > 10)
    assert agrees(v.to_dict())


def test_verdicts_agree_with_their_intervals_and_p_values_on_random_families():
    rng = np.random.default_rng(5)
    for _ in range(40):
        n = int(rng.integers(2, 15))
        items = [
            _item(rng.normal(0.8 + rng.normal(0, 0.03), rng.uniform(0.001, 0.05), n), rng.normal(0.8, 0.02, n))
            for _ in range(int(rng.integers(1, 9)))
        ]
        for v in paired_family(items, rule=VerdictRule(margin=0.02)):
            d = v.to_dict()
            assert tuple(d) == VERDICT_KEYS and agrees(d)
            assert (v.p_difference < 0.05) == (v.ci_high < 0 or v.ci_low > 0)
            assert (v.p_equivalence < 0.05) == (-0.02 < v.ci_low and v.ci_high < 0.02)


def test_agrees_catches_a_verdict_that_contradicts_its_interval():
    v = one_comparison(_item([0.5, 0.52, 0.51], [0.7, 0.71, 0.69])).to_dict()
    assert v["verdict"] == "forced" and agrees(v)
    assert not agrees(v | {"verdict": "free"}) and not agrees(v | {"verdict": "inconclusive"})
    assert agrees(v | {"verdict": "pilot"})


def test_pilot_claims_nothing_whatever_the_data():
    v = one_comparison(_item([0.5, 0.52, 0.51], [0.7, 0.71, 0.69]), rule=VerdictRule(pilot=True))
    assert v.verdict == "pilot" and v.ci_high < 0  # the interval is still printed


def test_bad_pairs_and_margins_are_rejected():
    with pytest.raises(ValueError, match="equal lengths"):
        one_comparison(_item([0.5, 0.6], [0.5]))
    with pytest.raises(ValueError, match="margin"):
        one_comparison(_item([0.5, 0.6], [0.5, 0.6]), rule=VerdictRule(margin=0.0))


def test_one_pair_gives_no_interval_and_no_claim():
    v = one_comparison(_item([0.9], [0.1]))
    assert v.ci_low is None and v.verdict == "inconclusive" and v.n_seeds == 1


def test_a_bound_that_three_decimals_would_print_as_zero_is_printed_in_full():
    from axiomformer.study.statistics import fmt_signed

    assert fmt_signed(5.667e-05) == "+5.7e-05" and fmt_signed(-2e-4) == "-2.0e-04"
    assert fmt_signed(0.0) == "+0.000" and fmt_signed(0.0123) == "+0.012" and fmt_signed(-0.0005) == "-0.001"


def test_mean_interval_is_never_zero_width_at_the_boundaries():
    # zero-width-intervals.py; the Wilson score interval from statsmodels, and the closed form of Wilson 1927:
    # (p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)
    import math as _math

    from scipy.stats import norm as _norm

    from axiomformer.study.statistics import mean_interval as _mean_interval

    z = float(_norm.ppf(0.975))
    for k, n in ((10, 10), (0, 10), (0, 50), (3, 10)):
        mean, low, high = _mean_interval([1.0] * k + [0.0] * (n - k))
        p = k / n
        centre, half = p + z * z / (2 * n), z * _math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        assert mean == p and high > low
        assert (
            abs(low - (centre - half) / (1 + z * z / n)) < 1e-9 and abs(high - (centre + half) / (1 + z * z / n)) < 1e-9
        )
    assert _mean_interval([0.5, 0.5, 0.5])[1:] == (None, None)  # no spread, not 0/1: no interval


def test_seeds_needed_for_equal_solve_rates_is_where_the_newcombe_interval_fits_the_margin():
    """8/8 against 8/8 (difference 0, inside ±0.25): the seeds a side a `free` would take are the fewest n at which
    statsmodels' Newcombe interval of n/n against n/n, at the family's level, lies inside ±0.25 — found here by a
    plain scan (29 at a family of 24); no longer 'no difference to detect'."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    from axiomformer.study.statistics import PairedItem, VerdictRule, solve_rate_comparison

    level = 1 - 0.05 / 24
    scan = next(
        n
        for n in range(2, 200)
        if max(map(abs, confint_proportions_2indep(n, n, n, n, method="newcomb", compare="diff", alpha=1 - level)))
        < 0.25
    )
    item = PairedItem("A2", "A2=joint", "induction@32", [1.0] * 8, [1.0] * 8, True)
    verdict = solve_rate_comparison(item, threshold=0.9, family_size=24, rule=VerdictRule(margin=0.25))
    assert verdict.verdict == "inconclusive" and verdict.seeds_needed == scan == 29
