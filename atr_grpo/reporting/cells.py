"""The per-problem scores behind a table cell, its interval, and the paired comparison of two cells.

A cell is one (model, method) on one benchmark, or on the Average of several, for one metric (mean@K or
pass@K). Its scores are an [S, P] array per benchmark: a row per run (seed), a column per problem, each entry
the problem's score at the evaluation step the table reports (`evaluation.metrics` applied to that problem's
samples). Problems are matched by id, never by position. Nothing is assumed: a run without the per-sample
file, or runs that do not share their problems or seeds, raise ScoreError saying what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from atr_grpo.reporting import stats
from atr_grpo.reporting.runs import AVERAGE, MissingSamples, Run


class ScoreError(ValueError):
    """The scores of a cell (or of a pair of cells) cannot be assembled; the message says what is missing."""


@dataclass
class Scores:
    """Per-problem scores of one cell: `values[b]` is [S, P_b], rows in `seeds` order, columns `problems[b]`."""

    seeds: list[int]
    problems: dict[str, list[str]]
    values: dict[str, np.ndarray]
    steps: list[int]  # the evaluation step read for each run (row)

    def arrays(self) -> list[np.ndarray]:
        return [self.values[b] for b in self.problems]

    @property
    def n_problems(self) -> int:
        return sum(len(p) for p in self.problems.values())


def _shown(items: list[str], limit: int = 5) -> str:
    return ", ".join(items[:limit]) + (f", … ({len(items)} in all)" if len(items) > limit else "")


def _missing(have: set[str], want: set[str]) -> str:
    return _shown(sorted(want - have, key=lambda pid: (len(pid), pid)))


def cell_scores(runs: list[Run], metric: str, key: str, benchmarks: list[str],
                step_of: Callable[[Run], int | None] | None = None) -> Scores:  # fmt: skip
    """The scores of `runs` (the seeds of one cell) for `key`, a benchmark or AVERAGE (every benchmark).

    step_of(run): the step to read; by default each run's final evaluation of `key` (Run.final_eval_step).
    """
    benches = list(benchmarks) if key == AVERAGE else [key]
    runs = sorted(runs, key=lambda r: r.seed)
    steps, rows = [], []
    for run in runs:
        step = step_of(run) if step_of is not None else run.final_eval_step(key)
        if step is None:
            raise ScoreError(f"{run.path}: no evaluation of {key} {metric}")
        try:
            rows.append({b: run.problem_scores(step, b, metric) for b in benches})
        except MissingSamples as err:
            raise ScoreError(str(err)) from None
        steps.append(step)
    problems, values = {}, {}
    for b in benches:
        ids = sorted(rows[0][b], key=lambda pid: (len(pid), pid))  # numeric ids in numeric order
        for run, row in zip(runs[1:], rows[1:]):
            if set(row[b]) != set(ids):
                raise ScoreError(f"{run.path}: {b} problems differ from {runs[0].path}'s (missing here: "
                                 f"{_missing(set(row[b]), set(ids)) or '–'}; extra: "
                                 f"{_missing(set(ids), set(row[b])) or '–'})")  # fmt: skip
        problems[b] = ids
        values[b] = np.array([[row[b][pid] for pid in ids] for row in rows])
    return Scores([r.seed for r in runs], problems, values, steps)


def cell_interval(scores: Scores, resampling: stats.Resampling, key: str) -> tuple[float, float, float]:
    """(estimate, interval low, interval high) in percent."""
    arrays = scores.arrays()
    low, high = stats.interval(arrays, resampling, key)
    return 100 * float(stats.estimate(arrays)), 100 * float(low), 100 * float(high)


@dataclass(frozen=True)
class Difference:
    """A − B in percent, with its paired bootstrap interval and sign-flip p-value."""

    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    seeds: list[int]
    problems: int
    per_seed: list[float]  # A − B of each seed pair alone, in `seeds` order


def paired(a: Scores, b: Scores, names: tuple[str, str] = ("A", "B")) -> list[np.ndarray]:
    """The differences A − B, [S, P] per benchmark, matched by seed and problem id; ScoreError on a mismatch."""
    if len(set(a.seeds)) != len(a.seeds) or len(set(b.seeds)) != len(b.seeds):
        raise ScoreError("pairing needs one run per seed on each side")
    if set(a.seeds) != set(b.seeds):
        raise ScoreError(f"pairing needs the same seeds: {names[0]} has {sorted(a.seeds)}, {names[1]} has "
                         f"{sorted(b.seeds)}")  # fmt: skip
    if set(a.problems) != set(b.problems):
        raise ScoreError(f"pairing needs the same benchmarks: {names[0]} has {sorted(a.problems)}, {names[1]} has "
                         f"{sorted(b.problems)}")  # fmt: skip
    rows = [b.seeds.index(seed) for seed in a.seeds]
    differences = []
    for bench, ids in a.problems.items():
        if set(ids) != set(b.problems[bench]):
            raise ScoreError(f"pairing needs the same problems: on {bench}, {names[1]} lacks "
                             f"{_missing(set(b.problems[bench]), set(ids)) or '–'} and {names[0]} lacks "
                             f"{_missing(set(ids), set(b.problems[bench])) or '–'}")  # fmt: skip
        columns = [b.problems[bench].index(pid) for pid in ids]
        differences.append(a.values[bench] - b.values[bench][np.ix_(rows, columns)])
    return differences


def compare(a: Scores, b: Scores, resampling: stats.Resampling, key: str,
            names: tuple[str, str] = ("A", "B")) -> Difference:  # fmt: skip
    """The paired comparison A − B: crossed bootstrap interval (seeds × problems) and sign-flip p-value."""
    differences = paired(a, b, names)
    low, high = stats.interval(differences, resampling, f"difference|{key}")
    p_value = stats.sign_flip_pvalue(differences, resampling, f"sign-flip|{key}")
    per_seed = [100 * float(stats.estimate([d[i : i + 1] for d in differences])) for i in range(len(a.seeds))]
    return Difference(100 * float(stats.estimate(differences)), 100 * float(low), 100 * float(high),
                      float(p_value), list(a.seeds), a.n_problems, per_seed)  # fmt: skip
