"""The paper's tables rebuilt from run directories (contracts §4): their rows, which `reporting.render.writers` writes
as CSV, Markdown and LaTeX.

- table2: per model × method, "final (best)" Mean@K / Pass@K on each benchmark and their Average. Seeds of
  one (model, method) are averaged per step first. A `base` row is the step-0 evaluation (before any GRPO
  update) unless a standalone evaluation labelled `base` is among the runs.
- table3: per model × method, mean ± std over seeds of the final values; plus the paper's
  "Clip (ε ∈ {0.1, ..., 0.5})" row, `clip-tuned`: the ε whose mean final Average Mean@K is highest.
  Both give the reported value (final, mean) a bootstrap interval and the seed-level comparison with `clip`
  (`reporting.analyses.uncertainty`).
- seeds and seeds_auc: in `reporting.analyses.seeds`.
- delta (Figure 3 data): ATR by δ, mean over seeds of the final Average Mean@K / Pass@K.
- passk (Figure 4 data): Mean@K / Pass@K for K = 1..n from the per-sample files of the last evaluation.
- plan: the analysis an experiment's plan fixes (`reporting.plan`), with the plan's commit.
Percent values rounded to 2 decimals. Runs with missing evaluations are listed, never silently dropped.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atr_grpo.benchmarks import display_name, table_position
from atr_grpo.evaluation.metrics import summarize
from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses.no_effect import study_warnings
from atr_grpo.reporting.analyses.planned import PlannedResult
from atr_grpo.reporting.analyses.uncertainty import (
    ALPHA,
    BASE,
    P_COLUMNS,
    P_FORMAT,
    UNCERTAINTY_COLUMNS,
    add_uncertainty,
)
from atr_grpo.reporting.metric import defaults
from atr_grpo.reporting.plan import Plan, PlanCommit
from atr_grpo.reporting.runs import (
    AVERAGE,
    MissingSamples,
    Run,
    final_and_best,
    final_step,
    mean_std,
    problems,
    repeat_free,
    two_decimals,
)

PAPER_DIR = Path(__file__).resolve().parents[3] / "results" / "paper"


@dataclass
class Table:
    name: str
    columns: list[str]
    rows: list[dict[str, Any]]
    missing: list[str] = field(default_factory=list)  # incomplete or set-aside runs, in words
    notes: list[str] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)  # column → format spec of its floats (default .2f)
    alpha: float = ALPHA  # the level at which a difference from the baseline is marked (†)
    nan_text: dict[str, str] = field(default_factory=dict)  # column → what Markdown / LaTeX show for nan


def _paper_order(name: str) -> list[str]:
    """The methods of the paper's table `name` in its row order (results/paper/<name>.csv), `base` first."""
    order = [BASE]
    if (PAPER_DIR / f"{name}.csv").exists():
        with (PAPER_DIR / f"{name}.csv").open() as handle:
            order += [r["method"] for r in csv.DictReader(handle) if r["method"] not in order]
    return order


def _sort_key(model: str, method: str, order: list[str]) -> tuple:
    """Rows in the paper's order; a method the paper lacks (clip-eps0.1) right after its rule (clip)."""
    rule = method.split("-")[0]
    if method in order:
        return (model, order.index(method), method)
    return (model, order.index(rule) + 0.5 if rule in order else len(order), method)


def sort_rows(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    order = _paper_order(name)
    return sorted(rows, key=lambda r: _sort_key(r["model"], r["method"], order))  # stable: benchmarks stay


def column_order(bench: str) -> tuple[bool, tuple[float, str]]:
    """The benchmarks' columns in their specs' order (`benchmarks.table_position`), the Average last."""
    return (bench == AVERAGE, table_position(bench))


def column_name(bench: str) -> str:
    return "Average" if bench == AVERAGE else display_name(bench)


def benchmarks_of(runs: list[Run]) -> list[str]:
    return sorted({b for run in runs for b in run.benchmarks} | {AVERAGE}, key=column_order)


def prepare(runs: list[Run]) -> tuple[list[Run], list[str], list[str]]:
    """(the runs, its metric names, the missing-evaluation report); RepeatedRuns when two runs repeat a point."""
    kept = repeat_free(runs)
    k = kept[0].k if kept else 8
    return kept, defaults(k), problems(kept)


def tie_notes(runs: list[Run]) -> list[str]:
    """The warnings that explain rows that tie: methods whose runs drew the same evaluation samples for every seed
    (`no_effect`), which stderr alone would leave unexplained in the table."""
    return [f"warning: {line}" for line in study_warnings(runs, ties_only=True)]


def grouped(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    groups: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in runs:
        groups[(run.model, run.method)].append(run)
    return dict(sorted(groups.items()))


def _seed_mean_table(runs: list[Run], metric: str) -> dict[int, dict[str, float]]:
    """Per step and benchmark, the mean over the runs (seeds) that have it."""
    collected: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for step, values in run.eval_table(metric).items():
            for bench, value in values.items():
                collected[step][bench].append(value)
    return {step: {b: sum(v) / len(v) for b, v in values.items()} for step, values in sorted(collected.items())}


def _final(run: Run, metric: str, bench: str) -> float | None:
    pair = final_and_best(run.eval_table(metric), bench)
    return None if pair is None else pair[0]


def table2(runs: list[Run], resampling: stats.Resampling | None = None, alpha: float = ALPHA) -> Table:
    runs, metrics, missing = prepare(runs)
    benches, groups = benchmarks_of(runs), grouped(runs)
    notes = [
        "final = last evaluation step, best = maximum over evaluation steps (step 0 excluded when later steps "
        "exist); average = mean of the benchmarks at each step, so its best is the best step's average; "
        "seeds of one method are averaged per step"
    ]
    rows, base_notes = _base_rows(groups, metrics, benches)
    notes += base_notes
    rows += _final_and_best_rows(groups, metrics, benches)
    resampling = resampling or stats.Resampling()
    notes += add_uncertainty(rows, "final", _table2_scores(groups, benches), resampling, alpha, missing)
    notes += tie_notes(runs)
    columns = ["model", "method", "benchmark", "metric", "final", "best", *UNCERTAINTY_COLUMNS]
    formats = dict.fromkeys(P_COLUMNS, P_FORMAT)
    return Table("table2", columns, sort_rows(rows, "table2"), missing, notes, formats, alpha)


def _base_rows(
    groups: dict[tuple[str, str], list[Run]], metrics: list[str], benches: list[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The `base` rows of each model without base runs: the step-0 evaluation (before any GRPO update), averaged
    over the runs that have one; and a note per model that gets them."""
    rows, notes = [], []
    for model in sorted({m for m, _ in groups}):
        if (model, BASE) in groups:
            continue
        starts = [r for (m, _), group in groups.items() if m == model for r in group if r.max_steps is not None]
        for metric in metrics:
            start = _seed_mean_table(starts, metric).get(0, {})
            rows += [
                {
                    "model": model,
                    "method": BASE,
                    "benchmark": b,
                    "metric": metric,
                    "final": two_decimals(start[b]),
                    "best": two_decimals(start[b]),
                }
                for b in benches
                if b in start
            ]
        if any(r["model"] == model for r in rows):
            n_runs = sum(1 for r in starts if 0 in r.eval_steps)
            notes.append(f"{model}: base = the step-0 evaluation (before any GRPO update), mean of {n_runs} run(s)")
    return rows, notes


def _final_and_best_rows(
    groups: dict[tuple[str, str], list[Run]], metrics: list[str], benches: list[str]
) -> list[dict[str, Any]]:
    """Each model × method's final and best value on each benchmark, over the seed means per step."""
    rows = []
    for (model, method), group in groups.items():
        for metric in metrics:
            table = _seed_mean_table(group, metric)
            for bench in benches:
                pair = final_and_best(table, bench)
                if pair is not None:
                    rows.append(
                        {
                            "model": model,
                            "method": method,
                            "benchmark": bench,
                            "metric": metric,
                            "final": two_decimals(pair[0]),
                            "best": two_decimals(pair[1]),
                        }
                    )
    return rows


def _table2_scores(
    groups: dict[tuple[str, str], list[Run]], benches: list[str]
) -> Callable[[str, str, str, str], cells.Scores]:
    """The per-sample scores behind a table-2 cell: the step whose seed mean is the final value, or step 0 for the
    base rows made from the methods' runs."""
    starts_of = {
        m: [
            r
            for (model, _), g in groups.items()
            if model == m
            for r in g
            if r.max_steps is not None and 0 in r.eval_steps
        ]
        for m, _ in groups
    }

    def scores_of(model: str, method: str, metric: str, bench: str) -> cells.Scores:
        if method == BASE and (model, BASE) not in groups:
            return cells.cell_scores(starts_of[model], metric, bench, benches[:-1], step=0)
        group = groups[(model, method)]
        step = final_step(_seed_mean_table(group, metric), bench)  # the step whose seed mean is the final
        return cells.cell_scores(group, metric, bench, benches[:-1], step=step)

    return scores_of


def _seed_rows(model: str, method: str, group: list[Run], metrics: list[str], benches: list[str], ddof: int) -> list:
    rows = []
    for metric in metrics:
        for bench in benches:
            finals = [v for run in group if (v := _final(run, metric, bench)) is not None]
            if finals:
                mean, std = mean_std(finals, ddof)
                rows.append(
                    {
                        "model": model,
                        "method": method,
                        "benchmark": bench,
                        "metric": metric,
                        "mean": two_decimals(mean),
                        "std": two_decimals(std),
                        "n_seeds": len(finals),
                    }
                )
    return rows


def table3(
    runs: list[Run],
    ddof: int = 1,
    tuned_eps: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5),
    resampling: stats.Resampling | None = None,
    alpha: float = ALPHA,
) -> Table:
    runs, metrics, missing = prepare(runs)
    benches, groups = benchmarks_of(runs), grouped(runs)
    rows = []
    for (model, method), group in groups.items():
        rows += _seed_rows(model, method, group, metrics, benches, ddof)
    notes = [f"mean ± std (ddof = {ddof}) over seeds of the final evaluation; std is nan (–) for one seed"]
    # the paper's "Clip (ε ∈ {0.1, ..., 0.5})" row: the best ε of the sweep by mean final Average Mean@K
    for model in sorted({m for m, _ in groups}):
        candidates = {}
        for (m, _method), group in groups.items():
            eps = group[0].clipping.get("eps")
            if m == model and group[0].clipping.get("name") == "clip" and eps in tuned_eps:
                finals = final_averages(group, metrics[0])
                if finals:
                    candidates[eps] = (sum(finals) / len(finals), group)
        if len(candidates) > 1:
            best_eps = max(candidates, key=lambda e: candidates[e][0])
            rows += _seed_rows(model, "clip-tuned", candidates[best_eps][1], metrics, benches, ddof)
            groups[(model, "clip-tuned")] = candidates[best_eps][1]
            tried = ", ".join(f"{e:g}" for e in sorted(candidates))
            notes.append(
                f"{model}: clip-tuned = clip with ε = {best_eps:g}, the best of ε ∈ {{{tried}}} "
                f"by mean final Average {metrics[0]}"
            )

    def scores_of(model: str, method: str, metric: str, bench: str) -> cells.Scores:
        return cells.cell_scores(groups[(model, method)], metric, bench, benches[:-1])  # each seed's final

    resampling = resampling or stats.Resampling()
    notes += add_uncertainty(rows, "mean", scores_of, resampling, alpha, missing)
    notes += tie_notes(runs)
    columns = ["model", "method", "benchmark", "metric", "mean", "std", "n_seeds", *UNCERTAINTY_COLUMNS]
    formats = dict.fromkeys(P_COLUMNS, P_FORMAT)
    return Table("table3", columns, sort_rows(rows, "table3"), missing, notes, formats, alpha)


def delta_groups(runs: list[Run]) -> dict[tuple[str, float], list[Run]]:
    """The ATR runs with a δ, by (model, δ), sorted (Figure 3's points)."""
    by_delta: dict[tuple[str, float], list[Run]] = defaultdict(list)
    for run in runs:
        if run.clipping.get("name") == "atr" and "delta" in run.clipping:
            by_delta[(run.model, float(run.clipping["delta"]))].append(run)
    return dict(sorted(by_delta.items()))


def one_delta_reason(groups: dict[tuple[str, float], list[Run]]) -> str | None:
    """Why the runs draw no δ sweep (no ATR run, or one δ per model), or None when some model has several δ."""
    if not groups:
        return "the runs have no ATR δ values"
    per_model: dict[str, list[float]] = defaultdict(list)
    for model, delta in groups:
        per_model[model].append(delta)
    if all(len(deltas) == 1 for deltas in per_model.values()):
        shown = ", ".join(f"{model} δ {deltas[0]:g}" for model, deltas in per_model.items())
        return f"one δ per model ({shown}): a δ sweep needs several"
    return None


def final_averages(group: list[Run], metric: str) -> list[float]:
    """Each run's final Average of `metric`, for the runs that have one."""
    return [v for r in group if (v := _final(r, metric, AVERAGE)) is not None]


def delta_table(runs: list[Run]) -> Table:
    runs, metrics, missing = prepare(runs)
    rows = []
    for (model, delta), group in delta_groups(runs).items():
        row: dict[str, Any] = {"model": model, "delta": delta}
        for metric in metrics:
            finals = final_averages(group, metric)
            row[metric] = two_decimals(sum(finals) / len(finals)) if finals else math.nan
        rows.append({**row, "n_seeds": len(group)})
    notes = ["ATR runs by δ: final Average over the benchmarks, mean over seeds (Figure 3)"]
    return Table("delta", ["model", "delta", *metrics, "n_seeds"], rows, missing, notes, {"delta": "g"})


def passk_table(runs: list[Run]) -> Table:
    """Mean@K / Pass@K for K = 1..n of each run's last evaluation with the most samples (Figure 4)."""
    runs, _, missing = prepare(runs)
    rows = []
    for run in runs:
        if not run.summary:
            continue
        n_max = max(int(row.get("n", 0)) for row in run.summary.values())
        step = max(s for (s, _), row in run.summary.items() if int(row.get("n", 0)) == n_max)
        per_bench: dict[str, dict[str, float]] = {}
        for bench in run.benchmarks:
            try:
                per_bench[bench] = summarize(list(run.verdicts(step, bench).values()))
            except MissingSamples as err:
                missing.append(str(err))
        if len(per_bench) == len(run.benchmarks) and per_bench:
            per_bench[AVERAGE] = {
                key: sum(v[key] for v in per_bench.values()) / len(per_bench) for key in next(iter(per_bench.values()))
            }
        for bench, values in per_bench.items():
            n = len(values) // 2
            where = {"model": run.model, "method": run.method, "seed": run.seed, "step": step, "benchmark": bench}
            for k in range(1, n + 1):
                mean, pass_at = defaults(k)
                rows.append(
                    {
                        **where,
                        "k": k,
                        "mean@k": two_decimals(100 * values[mean]),
                        "pass@k": two_decimals(100 * values[pass_at]),
                    }
                )
    columns = ["model", "method", "seed", "step", "benchmark", "k", "mean@k", "pass@k"]
    notes = ["unbiased Pass@K from all n samples per problem; Mean@K = accuracy of the first K samples"]
    return Table("passk", columns, rows, missing, notes)


PLAN_COLUMNS = [
    "model",
    "role",
    "comparison",
    "n_seeds",
    "difference",
    "ci_low",
    "ci_high",
    "p",
    "p_adjusted",
    "level",
    "mde",
    "power_observed",
    "tost_p",
    "tost_low",
    "tost_high",
    "verdict",
]


def planned_table(results: list[PlannedResult], plan: Plan, commit: PlanCommit, flagged: list[str]) -> Table:
    """The `plan` table: the analysis `plan` fixes (`reporting.analyses.planned`), one row per model × planned
    comparison, with the plan's commit and the runs made outside it in its notes."""
    rows = [
        {
            "model": r.model,
            "role": r.role,
            "comparison": r.label,
            "n_seeds": len(r.difference.seeds),
            "difference": two_decimals(r.difference.difference),
            "ci_low": two_decimals(r.difference.ci_low),
            "ci_high": two_decimals(r.difference.ci_high),
            "p": r.p_value,
            "p_adjusted": r.p_adjusted,
            "level": r.level,
            "mde": two_decimals(r.mde),
            "power_observed": r.power,
            "tost_p": r.tost.p_value,
            "tost_low": two_decimals(r.tost.low),
            "tost_high": two_decimals(r.tost.high),
            "verdict": r.describe(),
        }
        for r in results
    ]
    notes = [
        f"plan: {plan.path.name} of {plan.experiment}, git commit {commit.commit}"
        + (
            " (the file has uncommitted changes since: they are not the plan these numbers follow)" * commit.uncommitted
        ),
        f"{plan.metric} on {plan.benchmark} at the {plan.endpoint} endpoint, test {plan.test}, α {plan.alpha:g}: the "
        f"primary ({plan.primary.label}) at α alone; the secondaries by Holm among themselves, tested only if the "
        "primary rejects (serial gatekeeping: p_adjusted = max(p primary, Holm p)); level: the level each test uses, "
        "at which mde (80% power), power_observed (nan where it differs) and the TOST (margin "
        f"±{plan.equivalence_margin:g} points, (1 − 2·level) interval tost_low, tost_high) are computed",
        *(f"FLAGGED against the plan: {line}" for line in flagged),
    ]
    formats = dict.fromkeys(["p", "p_adjusted", "level", "tost_p"], P_FORMAT)
    return Table("plan", PLAN_COLUMNS, rows, [], notes, formats)
