"""Per-seed differences that are all equal have no spread, and float rounding does not make a spread: within
`cells.SPREAD_TOLERANCE` points they count as equal, so the comparison has no t-interval, no paired t-test and no
MDE, and the seed-level columns print "–" for each (a p of 0 would read as infinite certainty)."""

from __future__ import annotations

import math

import numpy as np

from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses.compare import detectable
from atr_grpo.reporting.render.compare_text import seed_level_cells

RESAMPLING = stats.Resampling(resamples=200)


def _scores(per_seed: list[float]) -> cells.Scores:
    """Three runs with one problem each, scored `per_seed` (fractions)."""
    values = np.array(per_seed, dtype=float)[:, None]
    return cells.Scores([0, 1, 2], {"aime24": ["0"]}, {"aime24": values}, [(100,)] * 3, metric="mean@8")


def _columns(difference: cells.Difference) -> dict[str, str]:
    shown = seed_level_cells(difference, 0.5, 0.05, detectable(difference, 0.025, False))
    return dict(zip(["difference", "per seed", "CI", "p", "smallest p", "p (Holm)", "†", "p (t)", "MDE"], shown))


def test_equal_differences_print_no_interval_t_test_or_mde():
    difference = cells.compare(_scores([0.5, 0.5, 0.5]), _scores([0.25, 0.25, 0.25]), RESAMPLING, "equal")
    assert difference.per_seed == [25.0, 25.0, 25.0] and difference.no_spread
    assert math.isnan(difference.p_t) and math.isnan(difference.ci_low) and math.isnan(difference.ci_high)
    shown = _columns(difference)
    assert (shown["CI"], shown["p (t)"], shown["MDE"]) == ("–", "–", "–")
    assert (shown["difference"], shown["p"]) == ("+25.00", "0.25")  # the sign-flip test is still shown


def test_differences_apart_by_rounding_alone_have_no_spread():
    """25 points in each seed pair, apart by about 1e-13 points: before the tolerance the t-test called this
    p ≈ 0 and printed a zero-width interval."""
    noisy = [0.5, 0.5 + 1e-15, 0.5 + 2e-15]
    difference = cells.compare(_scores(noisy), _scores([0.25, 0.25, 0.25]), RESAMPLING, "noisy")
    assert len(set(difference.per_seed)) == 3 and difference.no_spread
    assert stats.seed_t(np.array(noisy) - 0.25, 0.95).p_value < 1e-6  # what the t-test alone says
    assert math.isnan(difference.p_t) and _columns(difference)["p (t)"] == "–"


def test_differences_apart_by_more_than_the_tolerance_keep_their_t_test():
    spread = [0.5, 0.5 + 1e-8, 0.5 + 2e-8]  # 1e-6 points apart
    difference = cells.compare(_scores(spread), _scores([0.25, 0.25, 0.25]), RESAMPLING, "spread")
    assert not difference.no_spread and difference.p_t < 1e-6
    assert difference.ci_low < 25.0 < difference.ci_high
    assert cells.no_spread([25.0, 25.0 + cells.SPREAD_TOLERANCE / 2]) and not cells.no_spread([25.0, 25.000001])
