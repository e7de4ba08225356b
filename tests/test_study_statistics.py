"""The study's statistics against cases computed by hand or in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from axiomformer.study.statistics import NO_DIFFERENCE, compare, holm, mean_interval, paired_test, verdict


def test_bootstrap_interval_of_two_points_is_their_range():
    # resampled means of [0, 1] are 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4: the 2.5 % and 97.5 % points are 0, 1
    assert mean_interval([0.0, 1.0]) == (0.5, 0.0, 1.0)


def test_bootstrap_interval_degenerate_cases():
    assert mean_interval([0.7]) == (0.7, None, None)
    assert mean_interval([0.25, 0.25, 0.25]) == (0.25, 0.25, 0.25)
    with pytest.raises(ValueError, match="at least one"):
        mean_interval([])


def test_bootstrap_interval_matches_the_normal_closed_form_for_a_large_sample():
    data = np.random.default_rng(1).normal(0.6, 0.1, size=400)
    mean, low, high = mean_interval(data)
    half = 1.959964 * data.std(ddof=1) / math.sqrt(len(data))
    assert low == pytest.approx(mean - half, abs=0.15 * half) and high == pytest.approx(mean + half, abs=0.15 * half)


def test_paired_t_test_against_a_hand_computation():
    # d = [0.4, 0.2, 0.1]: mean 7/30, sd sqrt(7/300), t = sqrt(7) exactly; Student t with 2 dof has
    # F(t) = 1/2 + t / (2 sqrt(2 + t^2)) = 1/2 + sqrt(7)/6, so p = 2 (1 - F) = 1 - sqrt(7)/3.
    p = paired_test([0.9, 0.8, 0.7], [0.5, 0.6, 0.6])
    assert p == pytest.approx(1 - math.sqrt(7) / 3, rel=1e-9)
    # an unpaired test on the same numbers is a different (wrong here) answer: the check can tell them apart
    from scipy.stats import ttest_ind

    assert abs(ttest_ind([0.9, 0.8, 0.7], [0.5, 0.6, 0.6]).pvalue - p) > 0.05


def test_paired_test_edge_cases():
    assert paired_test([0.5, 0.5], [0.5, 0.5]) == 1.0          # no difference at all
    assert paired_test([0.9], [0.1]) == 1.0                    # one pair: no test
    with pytest.raises(ValueError, match="equal lengths"):
        paired_test([1.0, 2.0], [1.0])


def test_holm_against_a_hand_computation():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # 0.5 x 2 = 1.0; 0.9 x 1 lifted to the running max 1.0
    assert holm([]) == []
    # Bonferroni (x4 for all) would say 0.04, 0.16, 0.12, 0.02: a different answer the test rejects
    assert holm([0.01, 0.04, 0.03, 0.005])[1] != pytest.approx(0.16)


def test_compare_corrects_over_the_table_and_states_no_difference_when_not_significant():
    strong = ([0.9, 0.91, 0.92, 0.93, 0.94], [0.5, 0.52, 0.5, 0.51, 0.5])
    noise = ([0.5, 0.6, 0.4, 0.55, 0.45], [0.52, 0.5, 0.5, 0.5, 0.5])
    comps = compare({("a", "t"): strong, ("b", "t"): noise})
    raw = [paired_test(*strong), paired_test(*noise)]
    assert [c.p for c in comps] == pytest.approx(raw)
    assert [c.p_holm for c in comps] == pytest.approx(holm(raw))
    assert comps[0].significant and comps[0].diff == pytest.approx(0.414)
    assert comps[0].ci_low <= comps[0].diff <= comps[0].ci_high
    assert not comps[1].significant and verdict(comps[1]) == NO_DIFFERENCE
    assert verdict(comps[0]).startswith("better than standard by 0.414")
