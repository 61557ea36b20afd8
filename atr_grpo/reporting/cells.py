"""The per-problem scores behind a table cell, its interval, and the paired comparison of two cells.

A cell is one (model, method) on one benchmark, or on the Average of several, for one metric
(`reporting.metric`: mean@K, pass@K or a part of Mean@K), at one endpoint. Its scores are an [S, P] array per
benchmark: a row per run (seed), a column per problem, each entry the problem's score at the endpoint
(`evaluation.metrics` applied to that problem's samples): `final`, the run's final evaluation (or a step chosen
by the caller), or `auc`, the mean of the problem's scores over the run's evaluations after step 0, whose mean
over problems is the run's AUC (`endpoints.run_endpoints`). Problems are matched by id, never by position.
Nothing is assumed: a run without the per-sample file, or runs that do not share their problems or seeds, raise
ScoreError saying what is missing.

The accuracy given an answer is a ratio over problems: an entry is the problem's share of it
(`runs.Run.problem_scores`), so a run's value (the mean over problems; over the AUC's steps, the mean of each
step's ratio) is exact, and the seed-level tests read it as any other; the problem-level interval and test do not
(`reads_problems`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from atr_grpo.reporting import stats
from atr_grpo.reporting.metric import Metric
from atr_grpo.reporting.runs import AVERAGE, MissingSamples, Run


class ScoreError(ValueError):
    """The scores of a cell (or of a pair of cells) cannot be assembled; the message says what is missing."""


@dataclass
class Scores:
    """Per-problem scores of one cell: `values[b]` is [S, P_b], rows in `seeds` order, columns `problems[b]`."""

    seeds: list[int]
    problems: dict[str, list[str]]
    values: dict[str, np.ndarray]
    steps: list[tuple[int, ...]]  # the evaluation steps read for each run (row): one, or the AUC's
    runs: list[str] = field(default_factory=list)  # the run directories, in `seeds` order
    method: str = ""  # of those runs (`comparison_key` names the comparison by it)
    experiment: str = ""
    endpoint: str = "final"
    metric: str = ""  # the metric the values are scores of (`runs.Run.problem_scores`)

    def run_values(self) -> np.ndarray:
        """[S]: each run's value (the mean over problems; for the Average, the mean over its benchmarks)."""
        return _run_values(self, list(range(len(self.seeds)))).mean(axis=-1)

    def arrays(self) -> list[np.ndarray]:
        return [self.values[b] for b in self.problems]

    def rows(self, seeds: list[int]) -> list[int]:
        """The row of each of `seeds`, in their order: how another cell's runs find their partners here."""
        return [self.seeds.index(seed) for seed in seeds]

    @property
    def n_problems(self) -> int:
        return sum(len(p) for p in self.problems.values())


def _shown(items: list[str], limit: int = 5) -> str:
    return ", ".join(items[:limit]) + (f", … ({len(items)} in all)" if len(items) > limit else "")


def _missing(have: set[str], want: set[str]) -> str:
    return _shown(sorted(want - have, key=lambda pid: (len(pid), pid)))


ENDPOINTS = ("final", "auc")


def endpoint_steps(run: Run, key: str, endpoint: str = "final", step: int | None = None) -> tuple[int, ...]:
    """The evaluation steps of `run` whose scores make its value of `key` at `endpoint` (empty when none):
    `step` when given, else the final evaluation, or for `auc` every evaluation after step 0."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint {endpoint!r}: expected one of {', '.join(ENDPOINTS)}")
    if step is not None:
        return (step,)
    if endpoint == "auc":
        return tuple(run.later_eval_steps(key))
    final = run.final_eval_step(key)
    return () if final is None else (final,)


def cell_scores(
    runs: list[Run],
    metric: str,
    key: str,
    benchmarks: list[str],
    endpoint: str = "final",
    step: int | None = None,
) -> Scores:
    """The scores of `runs` (the seeds of one cell) for `key`, a benchmark or AVERAGE (every benchmark), at
    `endpoint` (see `endpoint_steps`; `step` overrides it)."""
    benches = list(benchmarks) if key == AVERAGE else [key]
    runs = sorted(runs, key=lambda r: r.seed)
    steps, rows = [], []
    for run in runs:
        read = endpoint_steps(run, key, endpoint, step)
        if not read:
            after = " after step 0" if endpoint == "auc" and step is None else ""
            raise ScoreError(f"{run.path}: no evaluation of {key} {metric}{after}")
        try:
            rows.append({b: _mean_over_steps(run, read, b, metric) for b in benches})
        except MissingSamples as err:
            raise ScoreError(str(err)) from None
        steps.append(read)
    problems, values = {}, {}
    for b in benches:
        ids = sorted(rows[0][b], key=lambda pid: (len(pid), pid))  # numeric ids in numeric order
        for run, row in zip(runs[1:], rows[1:]):
            if set(row[b]) != set(ids):
                raise ScoreError(
                    f"{run.path}: {b} problems differ from {runs[0].path}'s (missing here: "
                    f"{_missing(set(row[b]), set(ids)) or '–'}; extra: "
                    f"{_missing(set(ids), set(row[b])) or '–'})"
                )
        problems[b] = ids
        values[b] = np.array([[row[b][pid] for pid in ids] for row in rows])
    first = runs[0] if runs else None
    return Scores(
        [r.seed for r in runs],
        problems,
        values,
        steps,
        [str(r.path) for r in runs],
        first.method if first else "",
        first.experiment if first else "",
        endpoint if step is None else "final",
        metric,
    )


def _mean_over_steps(run: Run, steps: tuple[int, ...], benchmark: str, metric: str) -> dict[str, float]:
    """Each problem's score averaged over `steps`; ScoreError if the steps did not evaluate the same problems."""
    per_step = [run.problem_scores(s, benchmark, metric) for s in steps]
    for s, scores in zip(steps[1:], per_step[1:]):
        if set(scores) != set(per_step[0]):
            raise ScoreError(
                f"{run.path}: {benchmark} problems at step {s} differ from step {steps[0]}'s (missing: "
                f"{_missing(set(scores), set(per_step[0])) or '–'}; extra: "
                f"{_missing(set(per_step[0]), set(scores)) or '–'})"
            )
    return {pid: sum(scores[pid] for scores in per_step) / len(per_step) for pid in per_step[0]}


def reads_problems(scores: Scores) -> bool:
    """Whether each problem's entry is a score of its own, so that a test or an interval may resample or flip
    problems; not so for a ratio (`Metric.is_ratio`), whose run values alone mean something."""
    return not (Metric.is_name(scores.metric) and Metric.parse(scores.metric).is_ratio)


def cell_interval(scores: Scores, resampling: stats.Resampling, key: str) -> tuple[float, float, float]:
    """(estimate, interval low, interval high) in percent; ScoreError for a ratio (`reads_problems`)."""
    if not reads_problems(scores):
        raise ScoreError(f"{scores.metric} is a ratio over problems: it has no problem-level interval")
    arrays = scores.arrays()
    low, high = stats.interval(arrays, resampling, key)
    return 100 * float(stats.estimate(arrays)), 100 * float(low), 100 * float(high)


def comparison_key(
    experiment: str, model: str, method_a: str, method_b: str, metric: str, key: str, endpoint: str = "final"
) -> str:
    """The name of the random streams of one comparison: the same in `compare` and in every table."""
    return f"{experiment}|{model}|{method_a}|{method_b}|{metric}|{key}" + (
        "" if endpoint == "final" else f"|{endpoint}"
    )


@dataclass(frozen=True)
class Difference:
    """A − B in points at the seed level (one difference per seed pair), with the problem-level test and
    rliable's robust summaries beside it. `p_value` decides the mark (after Holm over its family)."""

    difference: float  # mean over the seed pairs
    per_seed: list[float]  # A − B of each seed pair alone, in `seeds` order
    seeds: list[int]
    problems: int
    ci_low: float  # t-interval over the per-seed differences (nan with one seed, and with no spread: `compare`)
    ci_high: float
    p_value: float  # exact sign-flip over the seeds (Monte Carlo above stats.EXACT_SEEDS)
    p_floor: float  # the smallest p_value S seeds can give
    p_exact: bool
    p_t: float  # paired t over the seeds; nan with no spread (t is 0/0 or ±inf: a p of 0 would read as certain)
    sd: float  # SD of the per-seed differences (ddof 1); the MDE and power depend on the family (`compare.detectable`)
    p_problems: float  # secondary: sign-flip over problems (these runs differ beyond evaluation noise); nan for a ratio
    p_problems_floor: float  # its Monte Carlo floor 1 / (R + 1)
    runs_a: list[float]  # each run's value, in `seeds` order
    runs_b: list[float]
    iqm_a: float
    iqm_b: float
    improvement: float  # P(A > B) over pairs of runs
    improvement_low: float
    improvement_high: float

    @property
    def no_spread(self) -> bool:
        return no_spread(self.per_seed)


SPREAD_TOLERANCE = 1e-9  # points: per-seed differences closer than this are equal (float rounding, not spread)


def no_spread(per_seed: Iterable[float]) -> bool:
    """Whether two or more per-seed differences (in points) are all equal, up to SPREAD_TOLERANCE: their SD is 0
    or rounding noise, so a t-interval, a t-test or an MDE from it would read as infinitely precise."""
    values = list(per_seed)
    return len(values) > 1 and max(values) - min(values) <= SPREAD_TOLERANCE


def paired(a: Scores, b: Scores, names: tuple[str, str] = ("A", "B")) -> list[np.ndarray]:
    """The differences A − B, [S, P] per benchmark, matched by seed and problem id; ScoreError on a mismatch."""
    if len(set(a.seeds)) != len(a.seeds) or len(set(b.seeds)) != len(b.seeds):
        raise ScoreError("pairing needs one run per seed on each side")
    if set(a.seeds) != set(b.seeds):
        raise ScoreError(
            f"pairing needs the same seeds: {names[0]} has {sorted(a.seeds)}, {names[1]} has {sorted(b.seeds)}"
        )
    if set(a.problems) != set(b.problems):
        raise ScoreError(
            f"pairing needs the same benchmarks: {names[0]} has {sorted(a.problems)}, {names[1]} has "
            f"{sorted(b.problems)}"
        )
    rows = b.rows(a.seeds)
    differences = []
    for bench, ids in a.problems.items():
        if set(ids) != set(b.problems[bench]):
            raise ScoreError(
                f"pairing needs the same problems: on {bench}, {names[1]} lacks "
                f"{_missing(set(b.problems[bench]), set(ids)) or '–'} and {names[0]} lacks "
                f"{_missing(set(ids), set(b.problems[bench])) or '–'}"
            )
        columns = [b.problems[bench].index(pid) for pid in ids]
        differences.append(a.values[bench] - b.values[bench][np.ix_(rows, columns)])
    return differences


def seed_pairs(runs_a: list[Run], runs_b: list[Run]) -> list[tuple[Run, Run]]:
    """Each run of A with B's run of the same seed, in seed order; a seed that B lacks is left out."""
    by_seed = {run.seed: run for run in runs_b}
    return [(run, by_seed[run.seed]) for run in sorted(runs_a, key=lambda r: r.seed) if run.seed in by_seed]


def _run_values(scores: Scores, rows: list[int]) -> np.ndarray:
    """[S, B]: each run's value (mean over problems) on each benchmark, rows in the order `rows`."""
    return np.stack([v[rows].mean(axis=-1) for v in scores.arrays()], axis=-1)


def seed_pvalue(differences: list[np.ndarray], resampling: stats.Resampling, key: str) -> float:
    """The seed-level p of paired differences (`paired`); `key` is `comparison_key`, so that every place that
    tests this comparison draws the same random patterns when there are more than stats.EXACT_SEEDS seeds."""
    return float(stats.seed_sign_flip_pvalue(stats.seed_means(differences), resampling, f"seed-flip|{key}"))


def compare(
    a: Scores, b: Scores, resampling: stats.Resampling, key: str, names: tuple[str, str] = ("A", "B")
) -> Difference:
    """The paired comparison A − B of the runs matched by seed; `key` is `comparison_key`. Equal per-seed
    differences (no spread, as identical evaluations give) get no t-interval and no t-test: a point or a p of 0
    would read as exact."""
    differences = paired(a, b, names)
    per_seed = stats.seed_means(differences)
    n_seeds = len(per_seed)
    t_test = stats.seed_t(per_seed, resampling.confidence)
    spread = not no_spread(100 * per_seed)
    runs_a, runs_b = _run_values(a, list(range(n_seeds))), _run_values(b, b.rows(a.seeds))
    value_a, value_b = runs_a.mean(axis=-1), runs_b.mean(axis=-1)  # as Scores.run_values
    low, high = stats.improvement_interval(runs_a, runs_b, resampling, f"improvement|{key}")
    return Difference(
        difference=100 * float(per_seed.mean()),
        per_seed=[100 * float(x) for x in per_seed],
        seeds=list(a.seeds),
        problems=a.n_problems,
        ci_low=100 * float(t_test.low) if spread else math.nan,
        ci_high=100 * float(t_test.high) if spread else math.nan,
        p_value=seed_pvalue(differences, resampling, key),
        p_floor=stats.smallest_seed_pvalue(n_seeds, resampling),
        p_exact=stats.seed_test_is_exact(n_seeds),
        p_t=float(t_test.p_value) if spread else math.nan,
        sd=100 * float(t_test.sd),
        p_problems=float(stats.sign_flip_pvalue(differences, resampling, f"sign-flip|{key}"))
        if reads_problems(a)
        else math.nan,
        p_problems_floor=1.0 / (resampling.resamples + 1),
        runs_a=[100 * float(x) for x in value_a],
        runs_b=[100 * float(x) for x in value_b],
        iqm_a=100 * float(stats.interquartile_mean(value_a)),
        iqm_b=100 * float(stats.interquartile_mean(value_b)),
        improvement=float(stats.probability_of_improvement(runs_a, runs_b)),
        improvement_low=low,
        improvement_high=high,
    )
