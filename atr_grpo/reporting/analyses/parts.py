"""What a Mean@K difference is made of: `compare`'s secondary endpoints and the split of the difference.

Mean@K is the answered rate times the accuracy given an answer (`evaluation.outcomes`), at every evaluation and on
every benchmark. `compare A B` tests each part as it tests Mean@K (`compare.compare_methods` on the part's name:
the seed-level test, interval, MDE and Holm family of its column), as secondary endpoints beside the Mean@K rows,
with the truncated share beside them.

`split` then says how much of A − B's Mean@K is the answered rate and how much the accuracy. The split of a
product depends on the order of its factors, so both orders are given (`outcomes.split_gain`). It is taken where
the product is exact, for one seed pair at one evaluation on one benchmark (B's answered rate and accuracy going to
A's), and averaged as the value is: over the benchmarks of the Average, the AUC's steps (paired in order) and the
seed pairs. So each order's two parts add up to the Mean@K difference `compare` prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from atr_grpo.evaluation.outcomes import split_gain
from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses import compare
from atr_grpo.reporting.metric import Metric, parts
from atr_grpo.reporting.runs import AVERAGE, Run


@dataclass(frozen=True)
class Split:
    """A − B's Mean@K in points and its two parts in each order (`outcomes.GainSplit`), averaged as the value."""

    experiment: str  # the study
    model: str
    benchmark: str
    metric: str  # the mean@K split
    difference: float
    answered_first: tuple[float, float]  # (the answered rate's part, then the accuracy's)
    accuracy_first: tuple[float, float]  # (the accuracy's part, then the answered rate's)


def part_metrics(runs: list[Run], method_a: str, metrics: list[str] | None) -> list[str]:
    """The parts of every mean@K asked for (of the runs' K when no metric is), less those asked for by name."""
    if metrics is None:
        ks = sorted({run.k for run in runs if run.method == method_a})
    else:
        ks = sorted({Metric.parse(m).k for m in metrics if Metric.parse(m).kind == "mean"})
    return [name for k in ks for name in parts(k) if name not in (metrics or [])]


def part_rows(
    runs: list[Run],
    method_a: str,
    method_b: str,
    resampling: stats.Resampling,
    benchmarks: list[str] | None = None,
    metrics: list[str] | None = None,
    step: int | None = None,
    endpoint: str = "final",
) -> list[compare.Row]:
    """`compare_methods` on the parts of the mean@K rows of the same request (`part_metrics`); empty without one."""
    names = part_metrics(runs, method_a, metrics)
    if not names:
        return []
    return compare.compare_methods(runs, method_a, method_b, resampling, benchmarks, names, step, endpoint)


def splits(rows: list[compare.Row], runs: list[Run], method_a: str, method_b: str) -> list[Split]:
    """The split of every mean@K row among `rows` (`compare_methods`' rows of the same runs)."""
    groups = compare._paired_groups(runs, method_a, method_b)
    found = []
    for row in rows:
        metric = Metric.parse(row.metric)
        if metric.kind != "mean":
            continue
        methods = groups[(row.experiment, row.model)]
        configured = list(dict.fromkeys(b for r in methods[method_a] + methods[method_b] for b in r.benchmarks))
        benches = configured if row.benchmark == AVERAGE else [row.benchmark]
        pairs = cells.seed_pairs(methods[method_a], methods[method_b])
        parts_of_pairs = [
            _pair_parts(a, b, steps_a, steps_b, benches, metric.k)
            for (a, b), steps_a, steps_b in zip(pairs, row.steps_a, _partner_steps(row, pairs))
        ]
        answered_first = tuple(100 * _mean([p[0][i] for p in parts_of_pairs]) for i in (0, 1))
        accuracy_first = tuple(100 * _mean([p[1][i] for p in parts_of_pairs]) for i in (0, 1))
        found.append(
            Split(
                row.experiment,
                row.model,
                row.benchmark,
                row.metric,
                row.difference.difference,
                answered_first,  # type: ignore[arg-type]
                accuracy_first,  # type: ignore[arg-type]
            )
        )
    return found


def _partner_steps(row: compare.Row, pairs: list[tuple[Run, Run]]) -> list[tuple[int, ...]]:
    """B's steps read for each seed pair, in the pairs' order (row.steps_b is in B's own seed order)."""
    by_seed = dict(zip(sorted(b.seed for _, b in pairs), row.steps_b))
    return [by_seed[b.seed] for _, b in pairs]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _pair_parts(
    a: Run, b: Run, steps_a: tuple[int, ...], steps_b: tuple[int, ...], benchmarks: list[str], k: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """One seed pair's split in both orders (fractions), averaged over the paired steps and the benchmarks; nan
    when the two runs read different numbers of steps or an accuracy is undefined (no answered sample)."""
    if len(steps_a) != len(steps_b):
        return (math.nan, math.nan), (math.nan, math.nan)
    answered, accuracy = str(Metric("answered", k)), str(Metric("acc_given_answer", k))
    found = []
    for step_a, step_b in zip(steps_a, steps_b):
        for bench in benchmarks:
            gain = split_gain(
                b.sample_value(step_b, bench, answered),
                b.sample_value(step_b, bench, accuracy),
                a.sample_value(step_a, bench, answered),
                a.sample_value(step_a, bench, accuracy),
            )
            found.append((gain.answered_first, gain.accuracy_first))
    return (
        (_mean([f[0][0] for f in found]), _mean([f[0][1] for f in found])),
        (_mean([f[1][0] for f in found]), _mean([f[1][1] for f in found])),
    )
