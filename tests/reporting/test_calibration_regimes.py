"""The calibration's design regimes (a shared evaluation stream, the AUC over correlated steps, Holm, unequal
spread, start points) do what they say, the mark keeps its level in each of them, and the same check flags a
test that does not: a one-sided p, a z-based p at 10 seeds, a family with no Holm step."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from atr_grpo.reporting import stats
from atr_grpo.reporting.analyses.calibration import (
    DESIGN_FEATURES,
    Scenario,
    _step_wobble,
    calibrate,
    level_held,
    monte_carlo_interval,
    regime,
    simulate,
    spread_of_differences,
)

FAST = stats.Resampling(resamples=200, seed=0, confidence=0.95)
LEVEL_DATASETS = 2000  # per regime: a level of 5 % is checked up to 5.97 %
FLAG_DATASETS = 4000  # the bad tests: a level of 5 % is checked up to 5.69 %


def one_sided_pvalue(per_seed: np.ndarray) -> np.ndarray:
    """The exact sign-flip p of the side the mean falls on: half the two-sided p (the flips are symmetric)."""
    return stats.seed_sign_flip_pvalue(per_seed, FAST, "one-sided") / 2


def z_pvalue(per_seed: np.ndarray) -> np.ndarray:
    """The paired t statistic read against the normal distribution instead of t with S − 1 df."""
    error = per_seed.std(axis=-1, ddof=1) / np.sqrt(per_seed.shape[-1])
    return 2 * scipy_stats.norm.sf(np.abs(per_seed.mean(axis=-1) / error))


def test_a_stream_per_seed_shrinks_the_per_seed_differences():
    """Common random numbers: A's and B's runs of a seed read the same draws, so their difference loses most of
    the evaluation noise (small run effects, 30 problems)."""
    independent = spread_of_differences(regime("small"), 0.0, seed=0)
    shared = spread_of_differences(regime("stream per seed"), 0.0, seed=0)
    assert shared < 0.7 * independent


def test_with_one_stream_and_no_wobble_the_auc_is_one_evaluation():
    """One stream read at every step and no step wobble: the 4 evaluations are identical, so the AUC equals a
    single evaluation (same random numbers)."""
    auc = simulate(regime("AIME-like", seeds=3, stream="all", steps=4), 50, np.random.default_rng(5))
    final = simulate(regime("AIME-like", seeds=3, stream="all"), 50, np.random.default_rng(5))
    assert auc.shape == (2, 50, 3, 30)
    np.testing.assert_array_equal(auc, final)


def test_the_step_wobble_is_a_stationary_ar1():
    """Every step has SD step_sd; consecutive steps correlate at step_rho, two apart at step_rho²."""
    scenario = Scenario(steps=3, step_sd=0.5, step_rho=0.6)
    wobble = _step_wobble(scenario, (200_000,), np.random.default_rng(0))
    assert wobble.std(axis=1) == pytest.approx([0.5] * 3, rel=0.01)
    assert np.corrcoef(wobble[0], wobble[1])[0, 1] == pytest.approx(0.6, abs=0.01)
    assert np.corrcoef(wobble[0], wobble[2])[0, 1] == pytest.approx(0.36, abs=0.01)


def test_unequal_spread_keeps_the_true_difference_at_zero():
    """A's runs spread twice B's logit SD: A's run SD is well above B's, and A's logit shift is chosen so that
    the two methods still have the same expected score."""
    scenario = regime("unequal spread", seeds=10)
    a, b = simulate(scenario, 300, np.random.default_rng(2))
    run_sd = [np.sqrt(np.var(x.mean(axis=-1), axis=-1, ddof=1).mean()) for x in (a, b)]
    assert run_sd[0] > 1.6 * run_sd[1]
    found = calibrate(scenario, 200, FAST, 0.05)
    assert found.true_difference == pytest.approx(0.0, abs=0.01)  # points


def test_pairing_by_seed_removes_the_start_point():
    """A start point per seed, shared by its methods: runs spread far more than the per-seed differences."""
    found = calibrate(regime("start points", seeds=10), 200, FAST, 0.05)
    assert found.difference_sd < 0.6 * found.run_sd


def test_a_family_has_one_method_per_comparison_and_the_reference():
    scores = simulate(regime("Holm, 3", seeds=4), 20, np.random.default_rng(0), (0.0, 0.0, 0.0))
    assert scores.shape == (4, 20, 4, 30)


@pytest.mark.parametrize("name", list(DESIGN_FEATURES))
def test_the_mark_keeps_its_level_in_every_design_regime(name):
    """No method differs, 10 seeds, 30 problems: the mark (exact sign-flip, Holm over the family) gives false
    marks at most α + 2 Monte Carlo SE, family-wise when the family has 3 comparisons."""
    found = calibrate(regime(name, seeds=10), LEVEL_DATASETS, FAST, 0.05)
    assert found.level_held(), f"{name}: false marks {found.marked_rate:.4f}"
    assert found.marked_rate > 0.01  # it can fire: the check is not passed by a mark that never does


@pytest.mark.parametrize("name", ["AIME-like", "all at once"])
@pytest.mark.parametrize("bad_test", [one_sided_pvalue, z_pvalue])
def test_the_check_flags_a_one_sided_or_a_z_based_p(name, bad_test):
    """Same simulated experiments (same seed), 10 seeds: the exact two-sided test keeps the level, while a
    one-sided p (about 2α) and a z-based p (the normal's tails are too thin at 9 df) are flagged."""
    scenario = regime(name, seeds=10)
    ours = calibrate(scenario, FLAG_DATASETS, FAST, 0.05)
    bad = calibrate(scenario, FLAG_DATASETS, FAST, 0.05, seed_test=bad_test)
    assert ours.level_held()
    assert not bad.level_held(), f"{bad_test.__name__}: false marks {bad.marked_rate:.4f}"


def test_the_check_flags_a_family_without_holm():
    """3 comparisons with one reference, no method differs: Holm keeps the family-wise error at α; marking
    every raw p < α does not."""
    found = calibrate(regime("Holm, 3", seeds=10), FLAG_DATASETS, FAST, 0.05)
    assert found.level_held()
    assert not level_held(found.unadjusted_rate, 0.05, FLAG_DATASETS)
    assert found.unadjusted_rate > 2 * found.marked_rate


def test_one_stream_for_every_run_makes_the_interval_about_that_draw():
    """A true 1-SD difference, 10 seeds: with a stream per seed the t-interval covers the population's A − B
    about 95 % of the time; with one stream read by every run the shared draw does not average out over seeds,
    the interval under-covers, and the mark still finds the difference."""
    per_seed = calibrate(regime("stream per seed", seeds=10, effect=1.0), LEVEL_DATASETS, FAST, 0.05, seed=1)
    one = calibrate(regime("one stream", seeds=10, effect=1.0), LEVEL_DATASETS, FAST, 0.05, seed=1)
    assert per_seed.difference_coverage >= 0.91
    assert one.difference_coverage < 0.90
    assert one.marked_rate >= 0.7


def test_holm_costs_power_in_a_family():
    """A 1-SD difference among 3 comparisons: Holm marks it less often than the same test alone would."""
    found = calibrate(regime("Holm, 3", seeds=10, effect=1.0), LEVEL_DATASETS, FAST, 0.05, seed=1)
    assert 0.4 <= found.marked_rate < found.unadjusted_rate


def test_the_monte_carlo_interval_is_wilson():
    """Wilson's interval: at rate 0 it runs from 0 to z² / (D + z²); at 5 % of 10,000 it is 5 % ± 1.96 SE
    up to its small shift towards ½."""
    low, high = monte_carlo_interval(0.0, 10_000)
    assert (low, high) == pytest.approx((0.0, 1.96**2 / (10_000 + 1.96**2)))
    low, high = monte_carlo_interval(0.05, 10_000)
    assert high - low == pytest.approx(2 * 1.96 * np.sqrt(0.05 * 0.95 / 10_000), rel=0.01)
    assert low < 0.05 < high


def test_the_level_check_allows_two_monte_carlo_errors():
    assert level_held(0.0543, 0.05, 10_000) and not level_held(0.0545, 0.05, 10_000)  # 5 % + 2 · 0.218 %


def test_bad_settings_name_the_key_and_the_allowed_values():
    with pytest.raises(ValueError, match="stream must be one of independent, seed, all, got 'every'"):
        Scenario(stream="every")
    with pytest.raises(ValueError, match="step_rho must be in"):
        Scenario(step_rho=1.0)
    with pytest.raises(ValueError, match="unknown calibration regime 'AIME'; the regimes are none, small"):
        regime("AIME")
