"""The statistics a reviewer reads beside a difference: the paired TOST over seeds, the power of the paired t-test
to detect a given difference, and the level of a Holm family member, each checked against an independent form."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate
from scipy import stats as scipy_stats

from atr_grpo.reporting import stats

PER_SEED = np.array([0.12, -0.31, 0.05, 0.22, -0.08, 0.17, -0.02, 0.09, -0.15, 0.11])


def test_tost_is_two_one_sided_t_tests_and_its_p_is_the_larger():
    """TOST(±0.25) = scipy's one-sided one-sample t-tests against −0.25 (greater) and +0.25 (less)."""
    found = stats.seed_tost(PER_SEED, 0.25, 0.05)
    lower = scipy_stats.ttest_1samp(PER_SEED, -0.25, alternative="greater").pvalue
    upper = scipy_stats.ttest_1samp(PER_SEED, 0.25, alternative="less").pvalue
    assert (found.p_lower, found.p_upper) == pytest.approx((lower, upper), rel=1e-10)
    assert found.p_value == pytest.approx(max(lower, upper), rel=1e-10)
    assert found.equivalent


def test_tost_matches_its_closed_form_on_fixed_numbers():
    """Mean 0.02, SD 0.1656 (ddof 1), S 10: t_lower = (0.02 + 0.25)/(SD/√10), t_upper = (0.02 − 0.25)/(SD/√10);
    the 90 % t-interval is the mean ± t_.95(9) · SD/√10, and it lies inside ±0.25 exactly when TOST rejects."""
    mean, sd = PER_SEED.mean(), PER_SEED.std(ddof=1)
    assert mean == pytest.approx(0.02)
    error = sd / np.sqrt(10)
    found = stats.seed_tost(PER_SEED, 0.25, 0.05)
    assert found.p_lower == pytest.approx(1 - scipy_stats.t.cdf(0.27 / error, 9), rel=1e-9)
    assert found.p_upper == pytest.approx(scipy_stats.t.cdf(-0.23 / error, 9), rel=1e-9)
    assert (found.low, found.high) == pytest.approx((0.02 - 1.833113 * error, 0.02 + 1.833113 * error), rel=1e-6)
    assert -0.25 < found.low and found.high < 0.25


def test_tost_fails_when_the_margin_is_inside_the_interval():
    """A margin of 0.1 is narrower than the 90 % interval: equivalence is not shown."""
    found = stats.seed_tost(PER_SEED, 0.1, 0.05)
    assert found.low < -0.1 or found.high > 0.1
    assert found.p_value > 0.05 and not found.equivalent


def test_tost_without_spread_or_with_one_seed():
    """No spread: each one-sided test rejects exactly when the mean is strictly inside the margin."""
    assert stats.seed_tost(np.full(4, 0.1), 0.25, 0.05).p_value == 0.0
    assert stats.seed_tost(np.full(4, 0.3), 0.25, 0.05).p_value == 1.0
    assert np.isnan(stats.seed_tost(np.array([0.1]), 0.25, 0.05).p_value)
    assert not stats.seed_tost(np.array([0.1]), 0.25, 0.05).equivalent


@pytest.mark.parametrize("margin", [0.0, -0.5, float("nan")])
def test_tost_refuses_a_margin_that_is_not_positive(margin):
    with pytest.raises(ValueError, match="margin must be > 0"):
        stats.seed_tost(PER_SEED, margin, 0.05)


def test_paired_t_power_is_the_known_value():
    """G*Power's textbook case: a paired t-test, d_z = 0.5, n = 34, two-sided α 0.05, has power 0.8077775.
    The review's case: the observed atr − clip −0.868 at SD_d 1.099 over 10 seeds has power 0.61 at α 0.05 and
    0.39 at α/3."""
    assert stats.paired_t_power(0.5, 1.0, 34, 0.05) == pytest.approx(0.8077775, abs=1e-6)
    assert round(stats.paired_t_power(-0.868, 1.099, 10, 0.05), 2) == 0.61
    assert round(stats.paired_t_power(-0.868, 1.099, 10, 0.05 / 3), 2) == 0.39


def test_paired_t_power_is_the_integral_over_the_sample_variance():
    """T = (Z + λ)/√(V/df), V ~ χ²(df): power = ∫ [Φ(λ − c√(v/df)) + Φ(−λ − c√(v/df))] χ²(v; df) dv."""
    effect, sd, n_seeds, alpha = 0.7, 0.9, 6, 0.05
    df, shift = n_seeds - 1, effect * np.sqrt(n_seeds) / sd
    critical = scipy_stats.t.ppf(1 - alpha / 2, df)

    def density(v):
        scale = critical * np.sqrt(v / df)
        norm = scipy_stats.norm.cdf
        return (norm(shift - scale) + norm(-shift - scale)) * scipy_stats.chi2.pdf(v, df)

    expected, _ = integrate.quad(density, 0, np.inf)
    assert stats.paired_t_power(effect, sd, n_seeds, alpha) == pytest.approx(expected, rel=1e-7)


def test_paired_t_power_at_the_mde_is_about_eighty_percent_and_at_zero_is_alpha():
    mde = float(stats.minimum_detectable_effect(1.0, 10, 0.05))
    assert stats.paired_t_power(mde, 1.0, 10, 0.05) == pytest.approx(0.799, abs=0.001)
    assert stats.paired_t_power(0.0, 1.0, 10, 0.05) == pytest.approx(0.05, rel=1e-9)
    assert np.isnan(stats.paired_t_power(1.0, 1.0, 1, 0.05))
    assert np.isnan(stats.paired_t_power(1.0, 0.0, 10, 0.05))


def test_the_mde_at_the_holm_level_is_the_reviews_value():
    """atr − clip in the power experiment: SD_d 1.099, 10 seeds, a Holm family of 3: α/3 gives an MDE of 1.33
    (1.09 at α alone)."""
    assert stats.holm_level(0.05, 3) == pytest.approx(0.05 / 3)
    assert round(float(stats.minimum_detectable_effect(1.099, 10, stats.holm_level(0.05, 3))), 2) == 1.33
    assert round(float(stats.minimum_detectable_effect(1.099, 10, 0.05)), 2) == 1.09
    with pytest.raises(ValueError, match="needs >= 1 test"):
        stats.holm_level(0.05, 0)
