"""A method's curve over its seeds, as the figures draw it: the mean per step, a band of ± 1 SD over the seeds, and
n, the number of runs behind it; and one line style per method, so that lines which coincide stay apart.

Each run is smoothed on its own before the seeds are combined, so the band is the spread of the smoothed curves.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from atr_grpo.reporting.runs import AVERAGE, MissingSamples, Run, mean_std, metric_number

Series = tuple[list[int], list[float]]  # (steps, values) of one run
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
BAND = "band: ± 1 SD over seeds"  # what every figure's band is, for its titles
Limits = tuple[float | None, float | None]  # the range a metric's values can take; None: unbounded on that side
PERCENT: Limits = (0.0, 100.0)  # evaluation scores and rates, in points
FRACTION: Limits = (0.0, 1.0)
NONNEGATIVE: Limits = (0.0, None)


@dataclass
class SeedCurve:
    steps: list[int]
    mean: list[float]
    sd: list[float]  # nan where only one run has the step
    n: int  # the runs that contributed at least one point

    def label(self, name: str) -> str:
        return f"{name} (n={self.n})"


def seed_curve(runs: list[Run], series: Callable[[Run], Series]) -> SeedCurve:
    """Per step, the mean and the sample SD (ddof 1) of the runs' values at that step."""
    by_step: dict[int, list[float]] = defaultdict(list)
    n = 0
    for run in runs:
        steps, values = series(run)
        n += bool(steps)
        for step, value in zip(steps, values):
            by_step[step].append(value)
    steps = sorted(by_step)
    pairs = [mean_std(by_step[s], ddof=1) for s in steps]
    return SeedCurve(steps, [m for m, _ in pairs], [sd for _, sd in pairs], n)


def metric_series(
    key: str, smooth: Callable[[list[float], list[int]], list[float]] | None = None, positive: bool = False
) -> Callable[[Run], Series]:
    """A run's metrics.jsonl `key` at the steps where it was logged (with `positive`, where it is > 0), smoothed by
    `smooth(values, steps)` if given."""

    def series(run: Run) -> Series:
        points = [(int(row["step"]), metric_number(row.get(key))) for row in run.metrics if "step" in row]
        points = [(s, v) for s, v in points if v is not None and (v > 0 or not positive)]
        steps, values = [s for s, _ in points], [v for _, v in points]
        return steps, smooth(values, steps) if smooth and values else values

    return series


def eval_series(metric: str, missing_ok: bool = False) -> Callable[[Run], Series]:
    """A run's Average over its benchmarks of `metric` (e.g. mean@8) at each evaluation step. With `missing_ok`, a
    run that cannot give it (a part of Mean@K its summaries lack, without the per-sample files) gives no points."""

    def series(run: Run) -> Series:
        try:
            table = run.eval_table(metric)
        except MissingSamples:
            if not missing_ok:
                raise
            return [], []
        steps = [s for s in sorted(table) if AVERAGE in table[s]]
        return steps, [table[s][AVERAGE] for s in steps]

    return series


def clipped(low: float, high: float, limits: Limits) -> tuple[float, float]:
    """The band [low, high] cut to the metric's range: a rate's band does not cross 0 or 100 %."""
    floor, ceiling = limits
    return (low if floor is None else max(low, floor)), (high if ceiling is None else min(high, ceiling))


def line_styles(names: list[str]) -> dict[str, dict[str, str]]:
    """{name: color, linestyle, marker} for the lines of a figure (methods, or models): the sorted names take the
    next of each, so two lines share neither colour nor line style nor marker while there are enough of them (8, 4,
    10 before a repeat)."""
    return {
        name: {
            "color": COLORS[i % len(COLORS)],
            "linestyle": LINESTYLES[i % len(LINESTYLES)],
            "marker": MARKERS[i % len(MARKERS)],
        }
        for i, name in enumerate(sorted(names))
    }
