"""The statistics: the bootstrap has the variance of a mean, resamples seeds when there are several, is seeded per
key; the seed-level sign-flip test enumerates every pattern and cannot go below 2^(1−S); the paired t, its
interval and the MDE follow their formulas; IQM and P(A > B) are rliable's; Holm's adjustment; and, over
simulated experiments with a known truth (≥ 1,000 per regime), the mark gives identical methods no more than
α + 2 Monte Carlo SE even when run-to-run variance is AIME-like, and finds a 1-SD difference with 10 seeds."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as scipy_stats

from atr_grpo.reporting import stats
from atr_grpo.reporting.analyses.calibration import Scenario, calibrate, regime

FAST = stats.Resampling(resamples=1000, seed=0, confidence=0.95)


def test_bootstrap_variance_of_a_mean_is_the_plug_in_variance_over_problems():
    """Resampling P problems: Var*(mean) = σ̂² / P with σ̂² the population variance of the scores."""
    scores = np.random.default_rng(3).random((1, 40))
    replicates = stats.replicates([scores], stats.Resampling(40_000), "variance")
    assert replicates.mean() == pytest.approx(scores.mean(), abs=2e-3)
    assert replicates.var() == pytest.approx(scores.var() / 40, rel=0.03)


def test_seeds_are_resampled_when_a_cell_has_several():
    """Every problem of seed s scores c_s: only the seed draw varies, Var* = var(c) / S; with one seed, none."""
    levels = np.array([0.2, 0.5, 0.6, 0.9])
    scores = np.repeat(levels[:, None], 30, axis=1)  # [S = 4, P = 30]
    replicates = stats.replicates([scores], stats.Resampling(40_000), "seeds")
    assert replicates.var() == pytest.approx(levels.var() / 4, rel=0.03)
    assert np.ptp(stats.replicates([scores[:1]], FAST, "one seed")) == pytest.approx(0.0, abs=1e-12)


def test_the_average_resamples_each_benchmark_and_averages_them():
    rng = np.random.default_rng(0)
    a, b = rng.random((2, 30)), rng.random((2, 40))
    assert stats.estimate([a, b]) == pytest.approx((a.mean() + b.mean()) / 2)
    replicates = stats.replicates([a, b], FAST, "average")
    assert replicates.shape == (1000,) and replicates.mean() == pytest.approx(stats.estimate([a, b]), abs=0.01)
    with pytest.raises(ValueError, match="same seeds"):
        stats.replicates([a, b[:1]], FAST, "x")


def test_resampling_is_seeded_by_key():
    scores = [np.random.default_rng(1).random((3, 30))]
    same = [stats.interval(scores, FAST, "cell a") for _ in range(2)]
    assert same[0] == same[1]
    assert stats.interval(scores, FAST, "cell b") != same[0]
    assert stats.interval(scores, stats.Resampling(1000, seed=1), "cell a") != same[0]


def test_problem_level_sign_flip_p_value_at_its_extremes():
    """No difference: p = 1. The same gain on every problem: only the 2 all-same-sign patterns of 2^30 are as
    extreme, so no flip of R reaches it and p = 1 / (R + 1), the Monte Carlo floor, shown as "< 1/R"."""
    assert stats.sign_flip_pvalue([np.zeros((2, 30))], FAST, "zero") == 1.0
    assert stats.sign_flip_pvalue([np.full((1, 30), 0.25)], FAST, "gain") == pytest.approx(1 / 1001)
    assert stats.sign_flip_pvalue([np.full((1, 30), -0.25)], FAST, "loss") == pytest.approx(1 / 1001)
    assert stats.format_p(1 / 10_001, 1 / 10_001) == "< 1e-4" and stats.format_p(1 / 1001, 1 / 1001) == "< 1e-3"
    assert stats.format_p(0.25) == "0.25" and stats.format_p(0.0371234) == "0.0371" and stats.format_p(np.nan) == "–"


def _brute_force_seed_p(per_seed):
    observed = abs(np.mean(per_seed))
    flips = [abs(np.mean(np.array(signs) * per_seed)) for signs in itertools.product((1, -1), repeat=len(per_seed))]
    return np.mean([f >= observed - 1e-12 for f in flips])


@pytest.mark.parametrize("n_seeds", [1, 3, 5, 8])
def test_seed_sign_flip_enumerates_every_pattern(n_seeds):
    """The p of the exact test is the share of the 2^S sign patterns of the per-seed differences whose |mean|
    reaches the observed one (brute force over itertools.product), for a stack of data sets at once."""
    per_seed = np.random.default_rng(n_seeds).normal(0.3, 1.0, (20, n_seeds))
    expected = [_brute_force_seed_p(row) for row in per_seed]
    assert stats.seed_sign_flip_pvalue(per_seed, FAST, "x") == pytest.approx(expected)


def test_the_smallest_seed_level_p_is_two_patterns_of_two_to_the_s():
    """Every seed pair favours A: only the identity and the full flip are as extreme, p = 2 / 2^S: 0.25 with 3
    seeds (so nothing is marked at α = 0.05), 2/1024 with 10; above 16 seeds, R random patterns: 1 / (R + 1)."""
    for n_seeds in (1, 3, 10, 16):
        gain = np.linspace(1.0, 2.0, n_seeds)
        floor = stats.smallest_seed_pvalue(n_seeds, FAST)
        assert floor == 2.0 ** (1 - n_seeds) == stats.seed_sign_flip_pvalue(gain, FAST, "gain")
    assert stats.smallest_seed_pvalue(3, FAST) == 0.25 and not stats.significant(0.25, 0.05)
    assert stats.seed_sign_flip_pvalue(np.linspace(1.0, 2.0, 20), FAST, "gain") == stats.smallest_seed_pvalue(20, FAST)
    assert stats.smallest_seed_pvalue(20, FAST) == pytest.approx(1 / 1001) and not stats.seed_test_is_exact(20)
    mixed = np.random.default_rng(0).normal(0.3, 1.0, 18)  # Monte Carlo against the exact share of 2^18 patterns
    signs = 1.0 - 2.0 * ((np.arange(2**18)[:, None] >> np.arange(18)) & 1)
    exact = np.mean(np.abs(signs @ mixed) >= abs(mixed.sum()) - 1e-9)
    assert stats.seed_sign_flip_pvalue(mixed, FAST, "a") == stats.seed_sign_flip_pvalue(mixed, FAST, "a")
    assert stats.seed_sign_flip_pvalue(mixed, FAST, "a") == pytest.approx(exact, abs=3 * np.sqrt(exact / 1000))


def test_paired_t_and_its_interval_are_scipys():
    per_seed = np.array([-0.39, -1.66, -3.61, 0.8])
    found = stats.seed_t(per_seed, 0.95)
    assert found.p_value == pytest.approx(scipy_stats.ttest_1samp(per_seed, 0.0).pvalue)
    low, high = scipy_stats.t.interval(0.95, 3, loc=per_seed.mean(), scale=scipy_stats.sem(per_seed))
    assert (found.low, found.high) == pytest.approx((low, high))
    assert found.sd == pytest.approx(np.std(per_seed, ddof=1))
    same = stats.seed_t(np.full(3, 0.25), 0.95)  # no spread: t = ±inf, the interval a point
    assert (same.p_value, same.low, same.high) == (0.0, 0.25, 0.25)
    assert stats.seed_t(np.zeros(3), 0.95).p_value == 1.0 and np.isnan(stats.seed_t(np.ones(1), 0.95).p_value)


def test_minimum_detectable_effect_is_the_paired_t_formula():
    """(t_.975 + t_.80) · SD / √S with df = S − 1: 0.995 SD at 10 seeds, 3.10 SD at 3;
    at that effect a paired t-test has about 80% power (non-central t)."""
    ten, three = (2.262157 + 0.883404) / np.sqrt(10), (4.302653 + 1.060660) * 1.29 / np.sqrt(3)
    assert stats.minimum_detectable_effect(1.0, 10, 0.05) == pytest.approx(ten, rel=1e-5)
    assert stats.minimum_detectable_effect(1.29, 3, 0.05) == pytest.approx(three, rel=1e-5)
    assert np.isnan(stats.minimum_detectable_effect(1.0, 1, 0.05))
    for n_seeds in (3, 10):
        effect, df = stats.minimum_detectable_effect(1.0, n_seeds, 0.05), n_seeds - 1
        critical = scipy_stats.t.ppf(0.975, df)
        power = scipy_stats.nct.sf(critical, df, effect * np.sqrt(n_seeds))
        assert 0.75 <= power <= 0.85


def test_interquartile_mean_is_rliables():
    """rliable's IQM is scipy.stats.trim_mean(scores, 0.25): the mean of the middle half; with 3 runs, the mean."""
    runs = np.array([5.0, 1.0, 9.0, 3.0, 100.0, 4.0, 6.0, 7.0])
    assert stats.interquartile_mean(runs) == pytest.approx(np.mean(sorted(runs)[2:6]))  # 8 runs: 2 cut each side
    assert stats.interquartile_mean(np.array([1.0, 2.0, 30.0])) == pytest.approx(11.0)


def test_probability_of_improvement_is_rliables():
    """P(A > B) = mean over benchmarks of the share of (A run, B run) pairs where A is higher, ties counting ½."""
    runs_a = np.array([[0.5, 0.1], [0.2, 0.3], [0.4, 0.3]])  # [S_a = 3, 2 benchmarks]
    runs_b = np.array([[0.3, 0.3], [0.1, 0.2]])
    pairs = [[(x > y) + 0.5 * (x == y) for x in runs_a[:, bench] for y in runs_b[:, bench]] for bench in range(2)]
    assert stats.probability_of_improvement(runs_a, runs_b) == pytest.approx(np.mean([np.mean(p) for p in pairs]))
    assert stats.probability_of_improvement(runs_b, runs_b) == pytest.approx(0.5)
    low, high = stats.improvement_interval(runs_a, runs_b, FAST, "improvement")
    assert 0 <= low <= stats.probability_of_improvement(runs_a, runs_b) <= high <= 1
    assert (low, high) == stats.improvement_interval(runs_a, runs_b, FAST, "improvement")


def test_holm_adjustment():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])  # 3·0.01, max(2·0.03, 0.04)
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.holm([]) == []


def test_the_mark_is_the_adjusted_seed_level_p_below_alpha():
    assert stats.significant(0.01, 0.05) and not stats.significant(0.05, 0.05)
    assert not stats.significant(float("nan"), 0.05)


def test_resampling_settings_are_checked():
    with pytest.raises(ValueError, match="resamples must be >= 100"):
        stats.Resampling(resamples=10)
    with pytest.raises(ValueError, match="confidence must be in"):
        stats.Resampling(confidence=1.0)


@pytest.mark.parametrize("metric", ["mean", "pass"])
def test_interval_coverage_is_close_to_nominal(metric):
    """1,000 benchmarks of 30 problems × 8 samples drawn from a known population: the 95% interval of one run's
    Mean@8 / Pass@8 covers the population value 92-97.5% of the time (percentile bootstrap, P = 30)."""
    found = calibrate(Scenario(metric=metric), datasets=1000, resampling=FAST, alpha=0.05, cell_coverage=True)
    assert 0.92 <= found.coverage <= 0.975


CALIBRATION_DATASETS = 2000  # per regime: Monte Carlo SE of a 5% rate 0.5 points


@pytest.mark.parametrize("name", ["AIME-like", "collapse"])
@pytest.mark.parametrize("n_seeds", [3, 10])
def test_identical_methods_are_marked_at_most_alpha_under_large_run_variance(name, n_seeds):
    """Identical methods, 30 problems, run-to-run variance AIME-like (a run SD of about 8 points) or a collapse
    mixture: † (exact sign-flip over seeds) marks at most 5% + 2 Monte Carlo SE; the paired t-interval covers
    the true difference 0 about 95% of the time; the problem-level test, which is about the runs, rejects far more
    often than α (why it is not the mark). With 3 seeds the smallest p is 0.25, so nothing is marked."""
    found = calibrate(regime(name, problems=30, seeds=n_seeds), CALIBRATION_DATASETS, FAST, 0.05)
    assert found.marked_rate <= 0.05 + 2 * found.standard_error(0.05)
    assert found.marked_rate == 0.0 if n_seeds == 3 else found.marked_rate > 0.02  # exact: close to α, not 0
    assert 0.93 <= found.difference_coverage <= 0.99
    assert found.problem_rate > 0.25


def test_a_one_sd_difference_is_found_with_ten_seeds():
    """A true A − B of 1.0 SD of the per-seed differences, 10 seeds, 30 problems, AIME-like run variance: † finds it
    in at least 70% of the experiments (paired t at 80% power would need 0.99 SD), so a mark that never fires
    fails; with 3 seeds it cannot fire at all."""
    found = calibrate(regime("AIME-like", problems=30, seeds=10, effect=1.0), CALIBRATION_DATASETS, FAST, 0.05)
    assert found.marked_rate >= 0.70
    assert found.true_difference == pytest.approx(found.difference_sd, rel=1e-3)
    assert 0.92 <= found.difference_coverage <= 0.97  # the differences are skewed with the effect in place
    assert calibrate(regime("AIME-like", seeds=3, effect=1.0), 1000, FAST, 0.05).marked_rate == 0.0
