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

from atr_grpo.reporting import cells, compare, stats
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
    "p_problems_vs_clip",
]
P_COLUMNS = ["p_seeds_vs_clip", "p_min_vs_clip", "p_holm_vs_clip", "p_problems_vs_clip"]
P_FORMAT = ".4g"


def add_uncertainty(
    rows: list[dict[str, Any]],
    value: str,
    scores_of: Callable[[str, str, str, str], cells.Scores],
    resampling: stats.Resampling,
    alpha: float,
    missing: list[str],
) -> list[str]:
    """Add each row's interval and its seed-level comparison with BASELINE (`cells.compare`, the Difference kept
    in row["difference"]; Holm within each model × benchmark × metric column, as `compare M clip`); cells whose
    per-sample files are missing or disagree with the summaries get nan, and the reason goes to `missing`.
    Returns the notes that state the methods."""
    found: dict[tuple[str, str, str, str], cells.Scores | str] = {}

    def get(model: str, method: str, metric: str, bench: str) -> cells.Scores | str:
        key = (model, method, metric, bench)
        if key not in found:
            try:
                found[key] = scores_of(*key)
            except cells.ScoreError as err:
                found[key] = str(err)
        return found[key]

    reasons: set[str] = set()
    families: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    methods = {(r["model"], r["method"]) for r in rows}
    seed_counts = []
    for row in rows:
        row.update(dict.fromkeys(UNCERTAINTY_COLUMNS, math.nan))
        where = (row["model"], row["method"], row["metric"], row["benchmark"])
        scores = get(*where)
        if isinstance(scores, str):
            reasons.add(f"{scores}: no interval or test for the cells that need it")
            continue
        label = "interval|" + "|".join(where) + ("" if scores.endpoint == "final" else f"|{scores.endpoint}")
        estimate, low, high = cells.cell_interval(scores, resampling, label)
        if abs(estimate - row[value]) > 0.0051:  # the table's value is rounded to 2 decimals
            reasons.add(
                f"{' '.join(where)}: the per-sample files give {estimate:.2f}, the summaries "
                f"{row[value]:.2f}: no interval or test"
            )
            continue
        row["ci_low"], row["ci_high"] = two_decimals(low), two_decimals(high)
        if row["method"] in (BASE, BASELINE) or (row["model"], BASELINE) not in methods:
            continue
        baseline = get(row["model"], BASELINE, row["metric"], row["benchmark"])
        if isinstance(baseline, str):
            continue  # its reason is reported with the baseline's own row
        key = cells.comparison_key(
            scores.experiment, row["model"], scores.method, BASELINE, row["metric"], row["benchmark"], scores.endpoint
        )
        try:
            diff = cells.compare(scores, baseline, resampling, key, (row["method"], BASELINE))
        except cells.ScoreError as err:
            reasons.add(f"{row['model']} {row['method']} vs {BASELINE}: {err}: no test")
            continue
        row["difference"] = diff
        row["diff_vs_clip"], row["diff_ci_low"], row["diff_ci_high"] = (
            two_decimals(diff.difference),
            two_decimals(diff.ci_low),
            two_decimals(diff.ci_high),
        )
        row["p_seeds_vs_clip"], row["p_min_vs_clip"] = diff.p_value, diff.p_floor
        row["mde_vs_clip"], row["p_problems_vs_clip"] = two_decimals(diff.mde), diff.p_problems
        row["runs_identity"] = tuple(scores.runs)
        seed_counts.append(len(diff.seeds))
        families[(row["model"], row["benchmark"], row["metric"])].append(row)
    for family in families.values():  # a row that repeats another's runs (clip-tuned) is one member, not two
        members = {r["runs_identity"]: r["p_seeds_vs_clip"] for r in family}
        adjusted = dict(zip(members, stats.holm(list(members.values()))))
        for row in family:
            row["p_holm_vs_clip"] = adjusted[row.pop("runs_identity")]
    missing += sorted(reasons)
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
        f"80% power at the observed seed spread, two-sided α = {alpha:g}) and p_problems_vs_clip (a sign-flip "
        "test over problems: whether these runs differ beyond evaluation noise, not whether the methods do; "
        f"at its floor 1/({resampling.resamples:,} + 1) no flip was as extreme)",
    ]
