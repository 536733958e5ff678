"""Winners that survive noise: the robust score, the 1 % tie rule, separability, the baseline margin."""

from __future__ import annotations

import math

import pytest

from orchestrator.tune.robust import MAD_TO_SD, Entry, pick, rank, robust_score


def test_robust_score_is_median_minus_scaled_mad_and_ignores_one_outlier():
    assert robust_score([10.0, 10.0, 10.0]) == 10.0
    # median 10, deviations 0, 1, 90 -> MAD 1
    assert robust_score([9.0, 10.0, 100.0]) == pytest.approx(10.0 - MAD_TO_SD * 1.0)
    with pytest.raises(ValueError):
        robust_score([])


def test_a_lucky_single_fast_repeat_does_not_win():
    steady = Entry("a", "a", 5, (100.0, 101.0, 99.0))
    lucky = Entry("b", "b", 5, (90.0, 150.0, 91.0))  # one fast repeat: its mean (110) beats a's, its median not
    assert pick([steady, lucky], 0.01).winner.key == "a"


def test_ties_within_one_percent_go_to_fewer_draft_tokens():
    big = Entry("big", "steps=6", 7, (100.0, 100.0, 100.0))
    small = Entry("small", "steps=2", 3, (99.5, 99.5, 99.5))  # 0.5 % slower
    ranked, tied = rank([big, small], 0.01)
    assert ranked[0].key == "small" and set(tied) == {"big", "small"}
    far = Entry("far", "steps=1", 2, (95.0, 95.0, 95.0))  # 5 % slower: outside the band
    assert rank([big, far], 0.01)[0][0].key == "big"


def test_separable_uses_the_pooled_log_spread():
    a = Entry("a", "a", 5, (100.0, 104.0, 96.0))
    b = Entry("b", "b", 5, (99.0, 103.0, 95.0))  # 1 % apart, spread 4 %: not separable
    p = pick([a, b], 0.0)
    assert p.runner_up is not None and not p.runner_up.separable
    assert p.noise is not None and p.noise.df == 4
    c = Entry("c", "c", 5, (150.0, 151.0, 149.0))  # far above both
    p = pick([a, b, c], 0.0)
    assert p.winner.key == "c" and p.runner_up is not None and p.runner_up.separable


def test_margin_over_no_speculation_is_reported_against_the_best_baseline():
    spec = Entry("s", "ngram", 5, (120.0, 121.0, 119.0))
    none1 = Entry("n1", "", 0, (100.0, 100.5, 99.5))
    none2 = Entry("n2", "", 0, (90.0, 90.5, 89.5))
    p = pick([spec, none1, none2], 0.01)
    assert p.baseline is not None and p.baseline.key == "n1"
    assert p.over_baseline is not None and p.over_baseline.separable
    assert p.over_baseline.rel == pytest.approx((spec.score - none1.score) / none1.score)
    only_base = pick([none1], 0.01)
    assert only_base.winner is only_base.baseline and only_base.over_baseline is None


def test_identical_repeats_have_no_spread_and_any_difference_is_real():
    a = Entry("a", "a", 2, (10.0, 10.0, 10.0))
    b = Entry("b", "b", 2, (9.0, 9.0, 9.0))
    p = pick([a, b], 0.0)
    assert p.noise is not None and p.noise.sd == 0 and p.runner_up is not None and p.runner_up.separable
    assert math.isclose(p.runner_up.rel, 1 / 9)
