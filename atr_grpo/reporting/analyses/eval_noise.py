"""How much of a seed's difference A − B is evaluation noise: the spread that drawing the samples alone gives.

A run's Mean@K on one problem is the mean of its first K verdicts, so a seed's difference on that problem is the
mean of K paired differences d_j = a_j − b_j (sample j of A against sample j of B). The K pairs are independent
draws, so the variance of their mean is estimated without bias by s²(d)/K, whether or not A and B read the same
evaluation random numbers: a shared stream makes a_j and b_j move together, and s²(d) then shrinks with them. The
seed's difference is a mean of those over problems (and over the endpoint's steps, and for the Average over
benchmarks), so its variance is the matching weighted sum.

`evaluation_sd` is the root of the mean of that variance over the seed pairs, in points. The design check of an
experiment compares it with half the seed-to-seed SD of the differences. Pass@K has no such simple form: its
evaluation noise is not computed (nan), nor is it where A and B were evaluated at different steps.
"""

from __future__ import annotations

import math

from atr_grpo.reporting.metric import Metric
from atr_grpo.reporting.runs import AVERAGE, Run


def _mean_at_k(metric: str) -> int | None:
    """K of a `mean@K` metric, None for any other."""
    if not Metric.is_name(metric):
        return None
    parsed = Metric.parse(metric)
    return parsed.k if parsed.kind == "mean" else None


def _problem_variance(a: list[bool], b: list[bool], k: int) -> float:
    """The variance over draws of one problem's Mean@K difference, s²(a_j − b_j) / K over its first K samples."""
    d = [float(x) - float(y) for x, y in zip(a[:k], b[:k])]
    mean = sum(d) / k
    return sum((x - mean) ** 2 for x in d) / (k - 1) / k


def pair_variance(a: Run, b: Run, steps: tuple[int, ...], benchmarks: list[str], k: int) -> float:
    """The variance over draws of A − B's Mean@K value (a fraction²) for one seed pair: its mean over `steps`,
    problems and `benchmarks` (several for the Average)."""
    per_benchmark = []
    for benchmark in benchmarks:
        total, problems = 0.0, 0
        for step in steps:
            verdicts_a, verdicts_b = a.verdicts(step, benchmark), b.verdicts(step, benchmark)
            problems = len(verdicts_a)
            total += sum(_problem_variance(row, verdicts_b[pid], k) for pid, row in verdicts_a.items())
        per_benchmark.append(total / (len(steps) * problems) ** 2)
    return sum(per_benchmark) / len(benchmarks) ** 2


def evaluation_sd(
    runs_a: list[Run],
    runs_b: list[Run],
    steps_a: list[tuple[int, ...]],
    steps_b: list[tuple[int, ...]],
    metric: str,
    key: str,
    benchmarks: list[str],
) -> float:
    """The evaluation noise of a seed's difference A − B in points (runs and steps in seed order, paired by
    position; `key` a benchmark or AVERAGE over `benchmarks`); nan for a metric other than Mean@K (K ≥ 2), or
    when a pair was evaluated at different steps."""
    k = _mean_at_k(metric)
    if k is None or k < 2 or not runs_a or steps_a != steps_b:
        return math.nan
    benches = list(benchmarks) if key == AVERAGE else [key]
    variances = [pair_variance(a, b, steps, benches, k) for a, b, steps in zip(runs_a, runs_b, steps_a)]
    return 100 * math.sqrt(sum(variances) / len(variances))
