"""The run as the unit: the `seeds` table (each run's final value) and `seeds_auc` (each run's AUC, the mean of
its evaluations after step 0), per model × method: the runs' values, their mean and IQM, and everything `compare M
clip [--endpoint auc]` prints for them (the same Holm family and random streams, so the same numbers)."""

from __future__ import annotations

import math

from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses.tables import Table, benchmarks_of, grouped, prepare, sort_rows
from atr_grpo.reporting.analyses.uncertainty import ALPHA, P_COLUMNS, P_FORMAT, add_uncertainty
from atr_grpo.reporting.runs import Run, two_decimals

SEED_COLUMNS = [
    "model",
    "method",
    "benchmark",
    "metric",
    "n_seeds",
    "runs",
    "mean",
    "iqm",
    "ci_low",
    "ci_high",
    "diff_vs_clip",
    "diff_per_seed",
    "diff_ci_low",
    "diff_ci_high",
    "p_seeds_vs_clip",
    "p_min_vs_clip",
    "p_holm_vs_clip",
    "p_t_vs_clip",
    "mde_vs_clip",
    "power_vs_clip",
    "p_improve",
    "p_improve_low",
    "p_improve_high",
    "p_problems_vs_clip",
]


def seeds_table(
    runs: list[Run], resampling: stats.Resampling | None = None, alpha: float = ALPHA, endpoint: str = "final"
) -> Table:
    """The run as the unit: per model × method, each run's value at `endpoint` (`runs`, seed order: its final
    evaluation, or for `auc` the mean of its evaluations after step 0), their mean and rliable's IQM, and the
    seed-level comparison with clip, exactly as `compare M clip [--endpoint auc]` prints it. Named `seeds`, or
    `seeds_auc` for the AUC."""
    runs, metrics, missing = prepare(runs)
    benches, groups = benchmarks_of(runs), grouped(runs)
    rows = []
    for (model, method), group in groups.items():
        for metric in metrics:
            for bench in benches:
                try:
                    values = cells.cell_scores(group, metric, bench, benches[:-1], endpoint).run_values()
                except cells.ScoreError as err:
                    missing.append(f"{model} {method} {bench} {metric}: {err}")
                    continue
                rows.append(
                    {
                        "model": model,
                        "method": method,
                        "benchmark": bench,
                        "metric": metric,
                        "n_seeds": len(values),
                        "runs": " ".join(f"{100 * v:.2f}" for v in values),
                        "mean": two_decimals(100 * float(values.mean())),
                        "iqm": two_decimals(100 * float(stats.interquartile_mean(values))),
                    }
                )

    def scores_of(model: str, method: str, metric: str, bench: str) -> cells.Scores:
        return cells.cell_scores(groups[(model, method)], metric, bench, benches[:-1], endpoint)

    resampling = resampling or stats.Resampling()
    notes = add_uncertainty(rows, "mean", scores_of, resampling, alpha, missing)
    for row in rows:
        diff: cells.Difference | None = row.get("difference")
        row.update(dict.fromkeys(["p_t_vs_clip", "p_improve", "p_improve_low", "p_improve_high"], math.nan))
        row["diff_per_seed"] = ""
        if diff is not None:
            row.update(
                diff_per_seed=" ".join(f"{x:+.2f}" for x in diff.per_seed),
                p_t_vs_clip=diff.p_t,
                p_improve=diff.improvement,
                p_improve_low=diff.improvement_low,
                p_improve_high=diff.improvement_high,
            )
    notes += [
        f"runs: each run's {'AUC (the mean of its evaluations after step 0)' if endpoint == 'auc' else 'final value'} "
        "in seed order; iqm: rliable's interquartile mean of the runs (the mean "
        "when there are fewer than 4); p_improve: rliable's probability of improvement P(method > clip) over "
        "every pair of runs (½ for ties), averaged over the benchmarks, with a bootstrap interval over the "
        "runs of each method; p_t_vs_clip: the paired t-test over the seed differences (diff_per_seed)"
    ]
    formats = dict.fromkeys([*P_COLUMNS, "p_t_vs_clip"], P_FORMAT)
    name = "seeds" if endpoint == "final" else f"seeds_{endpoint}"
    return Table(name, SEED_COLUMNS, sort_rows(rows, "table2"), missing, notes, formats, alpha)
