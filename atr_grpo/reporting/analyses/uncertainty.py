"""Each cell's bootstrap interval and its seed-level comparison with `clip`, for tables 2, 3 and seeds.

`add_uncertainty` gives a row of reported values (final or mean) its bootstrap interval (`ci_low`, `ci_high`) and
the seed-level comparison with clip (`cells.compare`: difference, t-interval, exact sign-flip p over seeds and its
Holm adjustment, which decides †, the minimum detectable effect, the problem-level p as a secondary column), from
the per-sample files (`cells`, `stats`), with the same family and random streams as `compare M clip`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses import compare
from atr_grpo.reporting.runs import two_decimals

BASE = "base"  # the model before any GRPO update (a step-0 row): it gets an interval, never a test
BASELINE = "clip"  # the method every other is tested against in tables 2 and 3
ALPHA = 0.05
UNCERTAINTY_COLUMNS = [
    "ci_low",
    "ci_high",
    "diff_vs_clip",
    "diff_ci_low",
    "diff_ci_high",
    "p_seeds_vs_clip",
    "p_min_vs_clip",
    "p_holm_vs_clip",
    "mde_vs_clip",
    "power_vs_clip",
    "p_problems_vs_clip",
]
P_COLUMNS = ["p_seeds_vs_clip", "p_min_vs_clip", "p_holm_vs_clip", "p_problems_vs_clip"]
P_FORMAT = ".4g"
# a cell's scores by (model, method, metric, benchmark), or why they cannot be read
ScoresOrReason = Callable[[str, str, str, str], "cells.Scores | str"]


def add_uncertainty(
    rows: list[dict[str, Any]],
    value: str,
    scores_of: Callable[[str, str, str, str], cells.Scores],
    resampling: stats.Resampling,
    alpha: float,
    missing: list[str],
) -> list[str]:
    """Add each row's interval and its seed-level comparison with BASELINE (`cells.compare`, the Difference kept
    in row["difference"]; Holm within each model × benchmark × metric column, as `compare M clip`; the unrounded
    (MDE, power) in row["detectable"], which the seeds table prints); cells whose per-sample files are missing or
    disagree with the summaries get nan, and the reason goes to `missing`.
    Returns the notes that state the methods."""
    get = _memoised(scores_of)
    reasons: set[str] = set()
    families: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    methods = {(r["model"], r["method"]) for r in rows}
    seed_counts = []
    for row in rows:
        row.update(dict.fromkeys(UNCERTAINTY_COLUMNS, math.nan))
        scores = _add_interval(row, value, get, resampling, reasons)
        if scores is None or row["method"] in (BASE, BASELINE) or (row["model"], BASELINE) not in methods:
            continue
        diff = _add_comparison(row, scores, get, resampling, reasons)
        if diff is not None:
            seed_counts.append(len(diff.seeds))
            families[(row["model"], row["benchmark"], row["metric"])].append(row)
    _add_holm(families, alpha)
    missing += sorted(reasons)
    return uncertainty_notes(value, resampling, alpha, seed_counts)


def _memoised(scores_of: Callable[[str, str, str, str], cells.Scores]) -> ScoresOrReason:
    """`scores_of`, each cell read once; a cell that cannot be read gives the reason instead of its scores."""
    found: dict[tuple[str, str, str, str], cells.Scores | str] = {}

    def get(model: str, method: str, metric: str, bench: str) -> cells.Scores | str:
        key = (model, method, metric, bench)
        if key not in found:
            try:
                found[key] = scores_of(*key)
            except cells.ScoreError as err:
                found[key] = str(err)
        return found[key]

    return get


def _add_interval(
    row: dict[str, Any], value: str, get: ScoresOrReason, resampling: stats.Resampling, reasons: set[str]
) -> cells.Scores | None:
    """The row's bootstrap interval (`ci_low`, `ci_high`) and its scores; None, with the reason, when its
    per-sample files are missing or disagree with the summaries."""
    where = (row["model"], row["method"], row["metric"], row["benchmark"])
    scores = get(*where)
    if isinstance(scores, str):
        reasons.add(f"{scores}: no interval or test for the cells that need it")
        return None
    label = "interval|" + "|".join(where) + ("" if scores.endpoint == "final" else f"|{scores.endpoint}")
    estimate, low, high = cells.cell_interval(scores, resampling, label)
    if abs(estimate - row[value]) > 0.0051:  # the table's value is rounded to 2 decimals
        reasons.add(
            f"{' '.join(where)}: the per-sample files give {estimate:.2f}, the summaries "
            f"{row[value]:.2f}: no interval or test"
        )
        return None
    row["ci_low"], row["ci_high"] = two_decimals(low), two_decimals(high)
    return scores


def _add_comparison(
    row: dict[str, Any], scores: cells.Scores, get: ScoresOrReason, resampling: stats.Resampling, reasons: set[str]
) -> cells.Difference | None:
    """The row's seed-level comparison with BASELINE in its `*_vs_clip` columns; None when there is none (the
    baseline's missing files are reported with its own row, a failed comparison here)."""
    baseline = get(row["model"], BASELINE, row["metric"], row["benchmark"])
    if isinstance(baseline, str):
        return None
    key = cells.comparison_key(
        scores.experiment, row["model"], scores.method, BASELINE, row["metric"], row["benchmark"], scores.endpoint
    )
    try:
        diff = cells.compare(scores, baseline, resampling, key, (row["method"], BASELINE))
    except cells.ScoreError as err:
        reasons.add(f"{row['model']} {row['method']} vs {BASELINE}: {err}: no test")
        return None
    row["difference"] = diff
    row["diff_vs_clip"], row["diff_ci_low"], row["diff_ci_high"] = (
        two_decimals(diff.difference),
        two_decimals(diff.ci_low),
        two_decimals(diff.ci_high),
    )
    row["p_seeds_vs_clip"], row["p_min_vs_clip"] = diff.p_value, diff.p_floor
    row["p_problems_vs_clip"] = diff.p_problems
    row["runs_identity"] = tuple(scores.runs)
    return diff


def _add_holm(families: dict[tuple[str, str, str], list[dict[str, Any]]], alpha: float) -> None:
    """`p_holm_vs_clip`: Holm's adjustment within each model × benchmark × metric column (`compare.holm_family`,
    its members named by their runs); then the MDE and the power to detect the observed difference at the level
    that test uses, Holm's first step α / m (`compare.detectable`)."""
    for rows in families.values():
        family = compare.holm_family(((r["runs_identity"], r["p_seeds_vs_clip"]) for r in rows), alpha)
        for row in rows:
            row["p_holm_vs_clip"] = family.adjusted[row.pop("runs_identity")]
            significant = stats.significant(row["p_holm_vs_clip"], alpha)
            row["detectable"] = compare.detectable(row["difference"], family.level, significant)
            row["mde_vs_clip"], row["power_vs_clip"] = two_decimals(row["detectable"][0]), row["detectable"][1]


def uncertainty_notes(value: str, resampling: stats.Resampling, alpha: float, seed_counts: list[int]) -> list[str]:
    """The notes under a table that state how its intervals and † were computed."""
    design = compare.seed_design_note(seed_counts, resampling, alpha) if seed_counts else "no paired seeds"
    return [
        f"[low, high]: {resampling.describe()}; for the {value} value ("
        f"{'best is chosen on the same problems and has none' if value == 'final' else 'mean over seeds'})",
        f"† = differs from {BASELINE} at α = {alpha:g}, with the run as the unit: the exact two-sided sign-flip "
        f"test over the paired seeds ({compare.SEED_TEST}; one difference per seed pair) rejects after Holm's "
        f"adjustment within each model × benchmark × metric column (the methods compared with {BASELINE}, as in "
        f"`python -m atr_grpo.results compare M {BASELINE}`); {design}. The CSV has the difference, its "
        "t-interval over the seed differences (diff_ci_low, diff_ci_high), p_seeds_vs_clip, p_min_vs_clip (the "
        "smallest p the seeds allow), p_holm_vs_clip, mde_vs_clip (the difference a paired t-test detects with "
        f"80% power at the observed seed spread, two-sided, at the level the test uses: Holm's first step "
        f"{alpha:g} / m for a column of m methods), power_vs_clip (beside a difference without †: the power of "
        f"that test to detect the observed difference; without † no difference is shown, and without an "
        f"equivalence test from a plan no equality either: 'not established') and p_problems_vs_clip (a sign-flip "
        "test over problems: whether these runs differ beyond evaluation noise, not whether the methods do; "
        f"at its floor 1/({resampling.resamples:,} + 1) no flip was as extreme)",
    ]
