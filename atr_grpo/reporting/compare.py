"""`python -m atr_grpo.results compare A B`: method A against method B, paired on problems and seeds.

Within each (experiment, model) that has runs of both methods, every benchmark (and their Average) and every
metric gets A − B in points, the paired bootstrap interval and the sign-flip p-value of `cells.compare`, plus
Holm-adjusted p-values over all the rows printed. Runs are paired by seed and problems by id; a seed or a
problem that one side lacks stops the comparison with an error that names it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.runs import AVERAGE, Run, drop_repeats

METRIC_PATTERN = re.compile(r"^(mean|pass)@[1-9][0-9]*$")


class CompareError(ValueError):
    pass


@dataclass
class Row:
    experiment: str
    model: str
    benchmark: str
    metric: str
    mean_a: float
    mean_b: float
    difference: cells.Difference
    steps_a: list[int]
    steps_b: list[int]
    p_holm: float = float("nan")


def _names(runs: list[Run], attribute: str) -> str:
    return ", ".join(sorted({str(getattr(r, attribute)) for r in runs})) or "none"


def compare_methods(runs: list[Run], method_a: str, method_b: str, resampling: stats.Resampling,
                    benchmarks: list[str] | None = None, metrics: list[str] | None = None,
                    step: int | None = None) -> list[Row]:  # fmt: skip
    """Every (experiment, model, benchmark or Average, metric) comparison of A with B in `runs`."""
    if method_a == method_b:
        raise CompareError(f"compare needs two different methods, got {method_a!r} twice")
    for metric in metrics or []:
        if not METRIC_PATTERN.match(metric):
            raise CompareError(f"--metric {metric!r}: expected mean@K or pass@K (e.g. mean@8)")
    kept, _ = drop_repeats(runs)
    for method in (method_a, method_b):
        if not any(r.method == method for r in kept):
            raise CompareError(f"no runs of method {method!r} (methods found: {_names(kept, 'method')})")
    groups: dict[tuple[str, str], dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for run in kept:
        if run.method in (method_a, method_b):
            groups[(run.experiment, run.model)][run.method].append(run)
    pairs = {key: sides for key, sides in sorted(groups.items()) if len(sides) == 2}
    if not pairs:
        where = {m: sorted({f"{r.experiment}/{r.model}" for r in kept if r.method == m}) for m in (method_a, method_b)}
        raise CompareError(f"{method_a} and {method_b} never share an experiment and model: {method_a} in "
                           f"{', '.join(where[method_a])}; {method_b} in {', '.join(where[method_b])}")  # fmt: skip
    rows = []
    for (experiment, model), sides in pairs.items():
        runs_a, runs_b = sides[method_a], sides[method_b]
        configured = list(dict.fromkeys(b for r in runs_a + runs_b for b in r.benchmarks))
        unknown = [b for b in benchmarks or [] if b not in configured and b != AVERAGE]
        if unknown:
            raise CompareError(f"--benchmark {', '.join(unknown)}: {experiment}/{model} evaluates "
                               f"{', '.join(configured)} (and {AVERAGE})")  # fmt: skip
        keys = configured + [AVERAGE] * (len(configured) > 1)
        keys = [k for k in keys if benchmarks is None or k in benchmarks]
        k = runs_a[0].k
        step_of = None if step is None else (lambda run: step)
        for metric in metrics or [f"mean@{k}", f"pass@{k}"]:
            for key in keys:
                try:
                    a = cells.cell_scores(runs_a, metric, key, configured, step_of)
                    b = cells.cell_scores(runs_b, metric, key, configured, step_of)
                    label = f"{experiment}|{model}|{method_a}|{method_b}|{metric}|{key}"
                    difference = cells.compare(a, b, resampling, label, (method_a, method_b))
                except cells.ScoreError as err:
                    raise CompareError(f"{experiment}/{model}, {key} {metric}: {err}") from None
                mean_a, mean_b = (100 * float(stats.estimate(s.arrays())) for s in (a, b))
                rows.append(Row(experiment, model, key, metric, mean_a, mean_b, difference, a.steps, b.steps))
    for row, adjusted in zip(rows, stats.holm([r.difference.p_value for r in rows])):
        row.p_holm = adjusted
    return rows


def format_rows(rows: list[Row], method_a: str, method_b: str, resampling: stats.Resampling) -> str:
    """Markdown: a table per (experiment, model), then how the numbers were computed."""
    level = f"{100 * resampling.confidence:g}%"
    lines = []
    for experiment, model in dict.fromkeys((r.experiment, r.model) for r in rows):
        block = [r for r in rows if (r.experiment, r.model) == (experiment, model)]
        seeds = ", ".join(map(str, block[0].difference.seeds))
        steps = sorted({s for r in block for s in r.steps_a + r.steps_b})
        lines += [f"## {method_a} − {method_b}: {experiment}, {model} (seeds {seeds}; evaluation steps "
                  f"{', '.join(map(str, steps))})", "",
                  f"| benchmark | metric | {method_a} | {method_b} | difference | {level} CI | p | p (Holm) | † "
                  "| per seed | problems |", "|---|---|---:|---:|---:|---|---:|---:|:-:|---|---:|"]  # fmt: skip
        for r in block:
            d = r.difference
            mark = "†" if stats.significant(r.p_holm, d.ci_low, d.ci_high, 1 - resampling.confidence) else ""
            seeds = ", ".join(f"{x:+.2f}" for x in d.per_seed)
            lines.append(f"| {r.benchmark} | {r.metric} | {r.mean_a:.2f} | {r.mean_b:.2f} | {d.difference:+.2f} "
                         f"| [{d.ci_low:+.2f}, {d.ci_high:+.2f}] | {d.p_value:.4g} | {r.p_holm:.4g} | {mark} "
                         f"| {seeds} | {d.problems} |")  # fmt: skip
        if any(r.steps_a != r.steps_b for r in block):
            lines.append(f"\nsteps differ between the paired runs: {method_a} {block[0].steps_a}, "
                         f"{method_b} {block[0].steps_b}")  # fmt: skip
        lines.append("")
    lines += [f"Values in points (percent). Interval: {resampling.describe()} of the paired differences "
              "(problems matched by id, runs by seed). p: two-sided paired sign-flip permutation test over problems "
              f"(each problem's difference averaged over the seeds), {resampling.resamples:,} sign flips. p (Holm): "
              f"adjusted over the {len(rows)} comparisons above. † = p (Holm) < {1 - resampling.confidence:g} and the "
              "interval excludes 0. Per seed: the difference of each seed pair alone. With one seed per method "
              "neither the interval nor the test sees the spread between training seeds, so a lucky seed counts "
              "as a difference."]  # fmt: skip
    return "\n".join(lines) + "\n"
