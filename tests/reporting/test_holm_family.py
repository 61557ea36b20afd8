"""One Holm family, built by one function (`compare.holm_family`) for `compare A B` and the tables: the family is
every method of the study and model compared with the reference in one benchmark × metric column, each set of runs
once; its adjusted p's are Holm's step-down p's of the members' seed-level p's, and its level is α / m. Each
member's MDE and power are computed once, with its family, and printed as computed."""

from __future__ import annotations

import pytest
from helpers.sampled_runs import method_matrices, sampled_run

from atr_grpo.reporting import stats
from atr_grpo.reporting.analyses import compare, seeds
from atr_grpo.reporting.render import compare_text, writers
from atr_grpo.reporting.runs import find_runs

RESAMPLES = 200
ALPHA = 0.05


def hand_holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm by hand: the i-th smallest p times (m − i + 1), made non-decreasing, capped at 1."""
    ordered = sorted(p_values, key=p_values.get)
    adjusted, running = {}, 0.0
    for i, name in enumerate(ordered):
        running = max(running, min(1.0, (len(ordered) - i) * p_values[name]))
        adjusted[name] = running
    return adjusted


def test_the_family_adjusts_each_member_by_holm_at_the_level_of_its_first_step():
    family = compare.holm_family([("a", 0.01), ("b", 0.04), ("c", 0.03)], ALPHA)
    assert family.adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert family.adjusted == pytest.approx(hand_holm({"a": 0.01, "b": 0.04, "c": 0.03}))
    assert family.level == ALPHA / 3


def test_a_member_given_twice_is_one_member():
    family = compare.holm_family([("runs", 0.02), ("runs", 0.02), ("other", 0.5)], ALPHA)
    assert family.adjusted == pytest.approx({"runs": 0.04, "other": 0.5})
    assert family.level == ALPHA / 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """3 seeds: atr gains in every seed pair (p 0.25), sapo in two of three (p 0.5), kl1 never (p 1)."""
    root = tmp_path_factory.mktemp("family") / "runs"
    for seed in range(3):
        sampled_run(root, "table3", "clip", seed, method_matrices(0, seed))
        sampled_run(root, "table3", "atr", seed, method_matrices(2, seed))
        sampled_run(root, "table3", "kl1", seed, method_matrices(0, seed))
        sampled_run(root, "table3", "sapo", seed, method_matrices(0 if seed == 2 else 2, seed))
    return find_runs(root)


def test_compare_and_the_seeds_table_adjust_over_the_same_family(runs):
    """Every method compared with clip in the column: the seed-level p's 0.25, 0.5, 1 become Holm's 0.75, 1, 1, in
    `compare M clip` and in the seeds table alike."""
    resampling = stats.Resampling(RESAMPLES)
    p_seeds, p_compare = {}, {}
    for method in ("atr", "kl1", "sapo"):
        (row,) = compare.compare_methods(runs, method, "clip", resampling, ["amc23"], ["mean@8"])
        assert row.family == ["atr", "kl1", "sapo"] and row.level == pytest.approx(ALPHA / 3)
        p_seeds[method], p_compare[method] = row.difference.p_value, row.p_holm
    assert p_seeds == pytest.approx({"atr": 0.25, "sapo": 0.5, "kl1": 1.0})
    assert p_compare == pytest.approx(hand_holm(p_seeds)) == {"atr": 0.75, "sapo": 1.0, "kl1": 1.0}
    table = seeds.seeds_table(runs, resampling, ALPHA)
    in_table = {
        r["method"]: r["p_holm_vs_clip"]
        for r in table.rows
        if (r["benchmark"], r["metric"]) == ("amc23", "mean@8") and r["method"] != "clip"
    }
    assert in_table == pytest.approx(p_compare)


def test_each_comparison_s_mde_and_power_are_computed_once_and_printed_as_computed(runs, monkeypatch):
    """`detectable` runs once per row, when the row's family is built; `compare`'s text and the seeds table print
    the pair it gave, not a second computation."""
    calls = []

    def counted(*args):
        calls.append(args)
        return (1.234, 0.5678)

    monkeypatch.setattr(compare, "detectable", counted)
    resampling = stats.Resampling(RESAMPLES)
    rows = compare.compare_methods(runs, "atr", "clip", resampling, metrics=["mean@8"])
    text = compare_text.format_rows(rows, "atr", "clip", resampling)
    assert len(calls) == len(rows) == 4  # 3 benchmarks and their average
    assert text.count("| 1.23 | 0.57 |") == len(rows)
    calls.clear()
    table = seeds.seeds_table(runs, resampling, ALPHA)
    compared = [r for r in table.rows if "difference" in r]
    markdown = writers.to_markdown(table)
    assert len(calls) == len(compared) == 3 * 4 * 2  # atr, kl1, sapo × 4 columns × mean@8, pass@8
    assert markdown.count("| 1.23 | 0.57 |") == len(compared)
