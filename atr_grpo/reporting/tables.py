"""The paper's tables rebuilt from run directories (contracts §4), written as CSV, Markdown and LaTeX.

- table2: per model × method, "final (best)" Mean@K / Pass@K on each benchmark and their Average. Seeds of
  one (model, method) are averaged per step first. A `base` row is the step-0 evaluation (before any GRPO
  update) unless a standalone evaluation labelled `base` is among the runs.
- table3: per model × method, mean ± std over seeds of the final values; plus the paper's
  "Clip (ε ∈ {0.1, ..., 0.5})" row, `clip-tuned`: the ε whose mean final Average Mean@K is highest.
  Both give the reported value (final, mean) a bootstrap interval (`ci_low`, `ci_high`) and the seed-level
  comparison with `clip` (`cells.compare`: difference, t-interval, exact sign-flip p over seeds and its Holm
  adjustment, which decides †, the minimum detectable effect, the problem-level p as a secondary column), from
  the per-sample files (`cells`, `stats`).
- seeds: per model × method, each run's final value, their mean and IQM, and everything `compare M clip`
  prints for it (the same family and random streams, so the same numbers).
- delta (Figure 3 data): ATR by δ, mean over seeds of the final Average Mean@K / Pass@K.
- passk (Figure 4 data): Mean@K / Pass@K for K = 1..n from the per-sample files of the last evaluation.
Percent values rounded to 2 decimals. Runs with missing evaluations are listed, never silently dropped.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from atr_grpo import rundir
from atr_grpo.benchmarks import display_name, table_position
from atr_grpo.evaluation.metrics import summarize
from atr_grpo.reporting import cells, compare, stats
from atr_grpo.reporting.runs import (
    AVERAGE,
    MissingSamples,
    Run,
    drop_repeats,
    final_and_best,
    final_step,
    mean_std,
    problems,
)

PAPER_DIR = Path(__file__).resolve().parents[2] / "results" / "paper"
BASE = "base"
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
MANIFEST = ".atr_results_manifest.json"  # the files in --out that this tool wrote (and may overwrite)


class OutputError(RuntimeError):
    pass


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
    display: Callable[[Table], tuple[list[str], list[list[str]]]] | None = None  # Markdown / LaTeX grid, if not
    # the CSV's columns


def _r(value: float) -> float:
    return round(value, 2) if not math.isnan(value) else math.nan


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


def _sort_rows(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    order = _paper_order(name)
    return sorted(rows, key=lambda r: _sort_key(r["model"], r["method"], order))  # stable: benchmarks stay


def _column_order(bench: str) -> tuple[bool, tuple[float, str]]:
    """The benchmarks' columns in their specs' order (`benchmarks.table_position`), the Average last."""
    return (bench == AVERAGE, table_position(bench))


def _benchmarks_of(runs: list[Run]) -> list[str]:
    return sorted({b for run in runs for b in run.benchmarks} | {AVERAGE}, key=_column_order)


def _column_name(bench: str) -> str:
    return "Average" if bench == AVERAGE else display_name(bench)


def _prepare(runs: list[Run]) -> tuple[list[Run], list[str], list[str]]:
    """(one run per experiment point, its metric names, the missing-evaluation report)."""
    kept, repeats = drop_repeats(runs)
    k = kept[0].k if kept else 8
    return kept, [f"mean@{k}", f"pass@{k}"], problems(kept) + repeats


def _grouped(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
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
    runs, metrics, missing = _prepare(runs)
    benches, groups = _benchmarks_of(runs), _grouped(runs)
    notes = [
        "final = last evaluation step, best = maximum over evaluation steps (step 0 excluded when later steps "
        "exist); average = mean of the benchmarks at each step, so its best is the best step's average; "
        "seeds of one method are averaged per step"
    ]
    rows = []
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
                    "final": _r(start[b]),
                    "best": _r(start[b]),
                }
                for b in benches
                if b in start
            ]
        if any(r["model"] == model for r in rows):
            n_runs = sum(1 for r in starts if 0 in r.eval_steps)
            notes.append(f"{model}: base = the step-0 evaluation (before any GRPO update), mean of {n_runs} run(s)")
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
                            "final": _r(pair[0]),
                            "best": _r(pair[1]),
                        }
                    )
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

    resampling = resampling or stats.Resampling()
    notes += _with_uncertainty(rows, "final", scores_of, resampling, alpha, missing)
    columns = ["model", "method", "benchmark", "metric", "final", "best", *UNCERTAINTY_COLUMNS]
    formats = dict.fromkeys(P_COLUMNS, P_FORMAT)
    return Table("table2", columns, _sort_rows(rows, "table2"), missing, notes, formats, alpha)


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
                        "mean": _r(mean),
                        "std": _r(std),
                        "n_seeds": len(finals),
                    }
                )
    return rows


def table3(
    runs: list[Run],
    ddof: int = 0,
    tuned_eps: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5),
    resampling: stats.Resampling | None = None,
    alpha: float = ALPHA,
) -> Table:
    runs, metrics, missing = _prepare(runs)
    benches, groups = _benchmarks_of(runs), _grouped(runs)
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
                finals = [v for r in group if (v := _final(r, metrics[0], AVERAGE)) is not None]
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
    notes += _with_uncertainty(rows, "mean", scores_of, resampling, alpha, missing)
    columns = ["model", "method", "benchmark", "metric", "mean", "std", "n_seeds", *UNCERTAINTY_COLUMNS]
    formats = dict.fromkeys(P_COLUMNS, P_FORMAT)
    return Table("table3", columns, _sort_rows(rows, "table3"), missing, notes, formats, alpha)


def _with_uncertainty(
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
        row["ci_low"], row["ci_high"] = _r(low), _r(high)
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
            _r(diff.difference),
            _r(diff.ci_low),
            _r(diff.ci_high),
        )
        row["p_seeds_vs_clip"], row["p_min_vs_clip"] = diff.p_value, diff.p_floor
        row["mde_vs_clip"], row["p_problems_vs_clip"] = _r(diff.mde), diff.p_problems
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
    runs, metrics, missing = _prepare(runs)
    benches, groups = _benchmarks_of(runs), _grouped(runs)
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
                        "mean": _r(100 * float(values.mean())),
                        "iqm": _r(100 * float(stats.interquartile_mean(values))),
                    }
                )

    def scores_of(model: str, method: str, metric: str, bench: str) -> cells.Scores:
        return cells.cell_scores(groups[(model, method)], metric, bench, benches[:-1], endpoint)

    resampling = resampling or stats.Resampling()
    notes = _with_uncertainty(rows, "mean", scores_of, resampling, alpha, missing)
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
    return Table(
        "seeds" if endpoint == "final" else f"seeds_{endpoint}",
        SEED_COLUMNS,
        _sort_rows(rows, "table2"),
        missing,
        notes,
        formats,
        alpha,
        display=_seeds_display,
    )


def _seeds_display(table: Table) -> tuple[list[str], list[list[str]]]:
    """The seeds table as `compare` prints it: the same cells, the same formatting."""
    level = f"{100 * (1 - table.alpha):g}%"
    header = [
        "model",
        "method",
        "benchmark",
        "metric",
        "runs",
        "mean",
        "IQM",
        "− clip",
        "per seed",
        f"{level} CI (t, seeds)",
        "p (seeds)",
        "smallest p",
        "p (Holm)",
        "†",
        "p (paired t)",
        "MDE (80%)",
        "P(> clip)",
        f"{level} CI",
        "p (problems; these runs only)",
    ]
    body = []
    for r in table.rows:
        lead = [r["model"], r["method"], r["benchmark"], r["metric"], r["runs"], _fmt(r["mean"]), _fmt(r["iqm"])]
        diff: cells.Difference | None = r.get("difference")
        if diff is None:
            body.append(lead + ["–"] * (len(header) - len(lead)))
            continue
        robust = [
            f"{diff.improvement:.2f}",
            f"[{diff.improvement_low:.2f}, {diff.improvement_high:.2f}]",
            stats.format_p(diff.p_problems, diff.p_problems_floor),
        ]
        body.append(lead + compare.seed_level_cells(diff, r["p_holm_vs_clip"], table.alpha) + robust)
    return header, body


def delta_table(runs: list[Run]) -> Table:
    runs, metrics, missing = _prepare(runs)
    by_delta: dict[tuple[str, float], list[Run]] = defaultdict(list)
    for run in runs:
        if run.clipping.get("name") == "atr" and "delta" in run.clipping:
            by_delta[(run.model, float(run.clipping["delta"]))].append(run)
    rows = []
    for (model, delta), group in sorted(by_delta.items()):
        row: dict[str, Any] = {"model": model, "delta": delta}
        for metric in metrics:
            finals = [v for r in group if (v := _final(r, metric, AVERAGE)) is not None]
            row[metric] = _r(sum(finals) / len(finals)) if finals else math.nan
        rows.append({**row, "n_seeds": len(group)})
    notes = ["ATR runs by δ: final Average over the benchmarks, mean over seeds (Figure 3)"]
    return Table("delta", ["model", "delta", *metrics, "n_seeds"], rows, missing, notes, {"delta": "g"})


def passk_table(runs: list[Run]) -> Table:
    """Mean@K / Pass@K for K = 1..n of each run's last evaluation with the most samples (Figure 4)."""
    runs, _, missing = _prepare(runs)
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
            rows += [
                {**where, "k": k, "mean@k": _r(100 * values[f"mean@{k}"]), "pass@k": _r(100 * values[f"pass@{k}"])}
                for k in range(1, n + 1)
            ]
    columns = ["model", "method", "seed", "step", "benchmark", "k", "mean@k", "pass@k"]
    notes = ["unbiased Pass@K from all n samples per problem; Mean@K = accuracy of the first K samples"]
    return Table("passk", columns, rows, missing, notes)


BUILDERS = {
    "table2": table2,
    "table3": table3,
    "seeds": seeds_table,
    "seeds_auc": partial(seeds_table, endpoint="auc"),
    "delta": delta_table,
    "passk": passk_table,
}


# ------------------------------------------------------------------------------------------- output files
def claim_outputs(out_dir: Path, names: list[str]) -> list[Path]:
    """The paths of `names` in `out_dir`, once it is clear that writing them destroys nothing of the user's:
    `out_dir` is not inside a run directory, and every existing file among them was written by this tool
    (listed in the folder's manifest)."""
    out_dir = Path(out_dir)
    for folder in (out_dir.resolve(), *out_dir.resolve().parents):
        if (folder / rundir.CONFIG_FILE).exists() and any((folder / f).exists() for f in ("eval", "metrics.jsonl")):
            raise OutputError(f"--out {out_dir} is inside the run directory {folder}; choose a folder outside it")
    manifest = out_dir / MANIFEST
    owned = set(json.loads(manifest.read_text())) if manifest.exists() else set()
    foreign = [name for name in names if (out_dir / name).exists() and name not in owned]
    if foreign:
        raise OutputError(
            f"refusing to overwrite {', '.join(foreign)} in {out_dir}: not written by "
            "python -m atr_grpo.results (move them away or choose another --out)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    rundir.write_json(manifest, sorted(owned | set(names)))
    return [out_dir / name for name in names]


def remove_stale(out_dir: Path, prefix: str) -> list[Path]:
    """Delete this tool's earlier outputs named `<prefix>.*` / `<prefix>_*` (their runs are gone), only those."""
    manifest = Path(out_dir) / MANIFEST
    if not manifest.exists():
        return []
    owned = json.loads(manifest.read_text())
    stale = [n for n in owned if n.split(".")[0] == prefix or n.startswith(prefix + "_")]
    removed = [Path(out_dir) / n for n in stale if (Path(out_dir) / n).exists()]
    for path in removed:
        path.unlink()
    rundir.write_json(manifest, sorted(set(owned) - set(stale)))
    return removed


def _fmt(value: Any, spec: str = ".2f") -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else format(value, spec)
    return str(value)


def write_csv(table: Table, path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=table.columns)
        writer.writeheader()
        for row in table.rows:
            writer.writerow({c: _fmt(row[c], table.formats.get(c, ".2f")) for c in table.columns})


Cell = tuple[str, str]  # (text, the part of it to highlight: the paper bolds the best value of a column)


def _paper_grid(table: Table) -> tuple[list[tuple[str, str]], list[tuple[str, str, list[Cell]]]]:
    """Tables 2 and 3 as the paper lays them out: a row per (model, method), a column per benchmark × metric."""
    value = "final" if table.name == "table2" else "mean"
    keys = list(dict.fromkeys((r["benchmark"], r["metric"]) for r in table.rows))
    keys.sort(key=lambda bm: (_column_order(bm[0]), bm[1]))
    top: dict[tuple, float] = {}
    for r in table.rows:
        if r["method"] != BASE and not math.isnan(r[value]):
            column = (r["model"], r["benchmark"], r["metric"])
            top[column] = max(top.get(column, -math.inf), r[value])
    cells: dict[tuple[str, str], dict[tuple[str, str], Cell]] = defaultdict(dict)
    for r in table.rows:
        main = _fmt(r[value])
        strong = main if r["method"] != BASE and r[value] == top.get((r["model"], r["benchmark"], r["metric"])) else ""
        mark = "†" if stats.significant(r.get("p_holm_vs_clip", math.nan), table.alpha) else ""
        interval = "" if math.isnan(r.get("ci_low", math.nan)) else f" [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
        if table.name == "table2":
            best = "" if r["method"] == BASE and r["final"] == r["best"] else f" ({_fmt(r['best'])})"
            text = f"{main}{mark}{best}{interval}"
        else:
            text = f"{main}{mark} ± {'–' if math.isnan(r['std']) else _fmt(r['std'])}{interval}"
        cells[(r["model"], r["method"])][(r["benchmark"], r["metric"])] = (text, strong)
    body = [(model, method, [row.get(key, ("–", "")) for key in keys]) for (model, method), row in cells.items()]
    return keys, body


def _plain_rows(table: Table) -> tuple[list[str], list[list[str]]]:
    if table.display is not None:
        return table.display(table)
    rows = table.rows
    if table.name == "passk":  # K = 1, 2, 4, ..., n of the Average: the CSV has every K and benchmark
        last_k = max((r["k"] for r in rows), default=0)
        shown = [r for r in rows if r["benchmark"] == AVERAGE] or rows
        rows = [r for r in shown if r["k"] & (r["k"] - 1) == 0 or r["k"] == last_k]

    def shown(value: Any, column: str) -> str:
        blank = isinstance(value, float) and math.isnan(value) and column in table.nan_text
        return table.nan_text[column] if blank else _fmt(value, table.formats.get(column, ".2f"))

    return table.columns, [[shown(r[c], c) for c in table.columns] for r in rows]


def _header(bench: str, metric: str) -> str:
    return f"{_column_name(bench)} {metric[0].upper()}{metric[1:]} (%)"


def to_markdown(table: Table) -> str:
    lines = [f"# {table.name}", ""]
    if table.name in ("table2", "table3"):
        keys, body = _paper_grid(table)
        lines += ["| model | method | " + " | ".join(_header(*key) for key in keys) + " |"]
        lines += ["|---|---|" + "---:|" * len(keys)]
        for model, method, row_cells in body:
            texts = [text.replace(strong, f"**{strong}**", 1) if strong else text for text, strong in row_cells]
            lines.append(f"| {model} | {method} | " + " | ".join(texts) + " |")
    else:
        header, body_rows = _plain_rows(table)
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body_rows]
    lines += [""] + [f"_{note}_\n" for note in table.notes]
    if table.missing:
        lines += ["## Missing evaluations and set-aside runs", ""] + [f"- {m}" for m in table.missing] + [""]
    return "\n".join(lines)


def _tex(text: str) -> str:
    replaced = text.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$").replace("–", "--")
    for symbol, command in (("†", r"$^\dagger$"), ("−", "$-$"), ("<", "$<$"), (">", "$>$")):
        replaced = replaced.replace(symbol, command)
    return replaced


def to_latex(table: Table) -> str:
    if table.name not in ("table2", "table3"):
        header, body_rows = _plain_rows(table)
        lines = [r"\begin{tabular}{" + "l" * 2 + "r" * (len(header) - 2) + "}", r"\toprule"]
        lines += [" & ".join(_tex(h) for h in header) + r" \\", r"\midrule"]
        lines += [" & ".join(_tex(c) for c in row) + r" \\" for row in body_rows]
        return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"]) + "\n"
    keys, body = _paper_grid(table)
    benches = list(dict.fromkeys(b for b, _ in keys))
    spans = [sum(1 for b, _ in keys if b == bench) for bench in benches]
    lines = [r"\begin{tabular}{l" + "r" * len(keys) + "}", r"\toprule"]
    lines.append(
        " & ".join(
            ["Method"] + [rf"\multicolumn{{{n}}}{{c}}{{{_tex(_column_name(b))}}}" for b, n in zip(benches, spans)]
        )
        + r" \\"
    )
    start, rules = 2, []
    for n in spans:
        rules.append(rf"\cmidrule(lr){{{start}-{start + n - 1}}}")
        start += n
    lines.append(" ".join(rules))
    lines.append(" & ".join([""] + [_tex(f"{m[0].upper()}{m[1:]} (%)") for _, m in keys]) + r" \\")
    model_now = None
    for model, method, row_cells in body:
        if model != model_now:
            lines += [r"\midrule", rf"\multicolumn{{{len(keys) + 1}}}{{l}}{{\textit{{{_tex(model)}}}}} \\"]
            model_now = model
        texts = [_tex(t.replace(s, rf"\textbf{{{s}}}", 1) if s else t) for t, s in row_cells]
        lines.append(" & ".join([_tex(method), *texts]) + r" \\")
    return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"]) + "\n"


# The columns that identify a cell and those compared, per table with published numbers in results/paper/
COMPARED = {
    "table2": (("model", "method", "benchmark", "metric"), ("final", "best")),
    "table3": (("model", "method", "benchmark", "metric"), ("mean", "std")),
    "passk": (("model", "method", "benchmark", "k"), ("mean@k", "pass@k")),
}


def compare_with_paper(table: Table, paper_csv: Path) -> str:
    """Markdown: our value next to the paper's and the difference (ours − paper), cell by cell."""
    if table.name not in COMPARED or not paper_csv.exists():
        return ""
    keys, values = COMPARED[table.name]
    with paper_csv.open() as handle:
        paper = {tuple(r[k] for k in keys): r for r in csv.DictReader(handle)}
    header = [*keys] + [f"{what} {v}" for v in values for what in ("ours", "paper", "Δ")]
    lines = [
        f"# {table.name}: ours vs the paper (results/paper/{paper_csv.name})",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(keys) + "---:|" * 3 * len(values),
    ]
    matched = set()
    for row in table.rows:
        key = tuple(str(row[k]) for k in keys)
        published = paper.get(key)
        if published is None or not any(published.get(v) for v in values):
            continue
        matched.add(key)
        cells = []
        for v in values:
            ours, theirs = row[v], float(published[v]) if published.get(v) else math.nan
            diff = ours - theirs
            cells += [_fmt(ours), _fmt(theirs), "–" if math.isnan(diff) else f"{diff:+.2f}"]
        lines.append("| " + " | ".join([*key, *cells]) + " |")
    lines += [
        "",
        f"_{len(matched)} of our {len(table.rows)} rows have a published counterpart; "
        f"{len(set(paper) - matched)} published rows have no run here._",
    ]
    return "\n".join(lines) + "\n"


def write_table(table: Table, out_dir: Path) -> list[Path]:
    """`<name>.csv`, `<name>.md`, `<name>.tex` and, where the paper has the table, `<name>_vs_paper.md`."""
    comparison = compare_with_paper(table, PAPER_DIR / f"{table.name}.csv")
    names = [f"{table.name}.{ext}" for ext in ("csv", "md", "tex")] + [f"{table.name}_vs_paper.md"] * bool(comparison)
    paths = claim_outputs(out_dir, names)
    write_csv(table, paths[0])
    paths[1].write_text(to_markdown(table))
    paths[2].write_text(to_latex(table))
    if comparison:
        paths[3].write_text(comparison)
    return paths
