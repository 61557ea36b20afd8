"""`python -m atr_grpo.results compare --eval DIR_A DIR_B`: this model against that model on these problems.

Each folder holds evaluations (`eval/summary.jsonl` and the per-sample files): a standalone evaluation
(`python -m atr_grpo.evaluate`) or a training run. One evaluation step of each is read (`--step-a`, `--step-b`;
default: the folder's last). For each benchmark and metric the two models' per-problem scores (a problem's Mean@K,
or its unbiased Pass@K) are paired by problem id, and A − B gets
- a percentile bootstrap interval over problems (`stats.interval`), and
- a two-sided sign-flip test over problems (`stats.sign_flip_pvalue`): under "A and B score alike on these
  problems", each problem's difference is as likely to be +d as −d.
The Average over benchmarks is stratified by benchmark, as in the tables. Holm adjusts the p-values of the rows
printed.

What it is: a claim about these two models (these adapters, these samples) on these problems. What it is not: a
claim about training methods, since one training run per side says nothing about the spread over training seeds
(`python -m atr_grpo.results compare A B` is that test).

Refused, naming the folder: a folder without evaluations or config.yaml, an absent step, different k, a
benchmark one side lacks, different problem ids or benchmark contents. Different sampling settings are allowed
and named in a note, since they are part of what is compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from atr_grpo import rundir
from atr_grpo.reporting import stats
from atr_grpo.reporting.metric import EXPECTED, Metric, defaults
from atr_grpo.reporting.runs import AVERAGE, MissingSamples, Run
from atr_grpo.rundir import layout


class EvalCompareError(ValueError):
    pass


@dataclass(frozen=True)
class Side:
    label: str  # "A" or "B"
    run: Run
    step: int


@dataclass(frozen=True)
class EvalRow:
    benchmark: str
    metric: str
    problems: int
    mean_a: float  # percent
    mean_b: float
    difference: float
    low: float
    high: float
    p_value: float
    p_holm: float = float("nan")


def open_side(label: str, folder: Path, step: int | None) -> Side:
    """The folder's evaluations at `step` (default: its last evaluated step)."""
    if not layout.summary_path(folder).is_file():
        raise EvalCompareError(f"{label}: {folder} holds no evaluations (no {layout.summary_path('')})")
    if not (folder / rundir.CONFIG_FILE).is_file():
        raise EvalCompareError(f"{label}: {folder} has no {rundir.CONFIG_FILE} (its k is unknown)")
    run = Run(folder, rundir.load_config(folder / rundir.CONFIG_FILE))
    steps = run.eval_steps
    if step is None:
        step = steps[-1]
    if step not in steps:
        raise EvalCompareError(f"{label}: {folder} has no evaluation at step {step}; its steps: {steps}")
    return Side(label, run, step)


def _benchmarks(a: Side, b: Side, wanted: list[str] | None) -> list[str]:
    """The benchmarks to compare: `wanted`, or every one A evaluated at its step; each must be on both sides."""
    evaluated = {side.label: [name for step, name in side.run.summary if step == side.step] for side in (a, b)}
    names = wanted or evaluated["A"]
    for side in (a, b):
        missing = [name for name in names if name not in evaluated[side.label]]
        if missing:
            raise EvalCompareError(
                f"{side.label}: {side.run.path} has no evaluation of {', '.join(missing)} at step {side.step}; "
                f"it has {', '.join(evaluated[side.label]) or 'none'}"
            )
    return names


def _check_same_problems(a: Side, b: Side, benchmark: str, ids_a: set[str], ids_b: set[str]) -> None:
    where = f"{benchmark}: {a.run.path} (A, step {a.step}) and {b.run.path} (B, step {b.step})"
    if ids_a != ids_b:
        only_a, only_b = sorted(ids_a - ids_b)[:3], sorted(ids_b - ids_a)[:3]
        raise EvalCompareError(
            f"{where} evaluated different problems ({len(ids_a)} and {len(ids_b)}; only in A: {only_a or 'none'}, "
            f"only in B: {only_b or 'none'}): a paired test needs the same problems"
        )
    hashes = [side.run.summary[(side.step, benchmark)].get("content_hash") for side in (a, b)]
    if None not in hashes and hashes[0] != hashes[1]:
        raise EvalCompareError(f"{where} have the same problem ids but different contents (content_hash)")


def differences(a: Side, b: Side, benchmark: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(A's, B's) per-problem scores [P] in percent, ordered by problem id; refused when the problems differ."""
    try:
        scores = [side.run.problem_scores(side.step, benchmark, metric) for side in (a, b)]
    except MissingSamples as err:
        raise EvalCompareError(str(err)) from None
    _check_same_problems(a, b, benchmark, set(scores[0]), set(scores[1]))
    ids = sorted(scores[0])
    score_a, score_b = (100.0 * np.array([side_scores[i] for i in ids]) for side_scores in scores)
    return score_a, score_b


def _row(name: str, metric: str, pairs: list[tuple[np.ndarray, np.ndarray]], resampling: stats.Resampling) -> EvalRow:
    """A − B over the benchmarks in `pairs` (one: that benchmark; several: their Average), a seed axis of 1."""
    diffs = [(score_a - score_b)[None, :] for score_a, score_b in pairs]
    key = f"compare-eval/{name}/{metric}"
    low, high = stats.interval(diffs, resampling, key)
    return EvalRow(
        benchmark=name,
        metric=metric,
        problems=sum(len(score_a) for score_a, _ in pairs),
        mean_a=float(np.mean([score_a.mean() for score_a, _ in pairs])),
        mean_b=float(np.mean([score_b.mean() for _, score_b in pairs])),
        difference=float(stats.estimate(diffs)),
        low=float(low),
        high=float(high),
        p_value=float(stats.sign_flip_pvalue(diffs, resampling, key)),
    )


def compare_folders(
    a: Side,
    b: Side,
    resampling: stats.Resampling,
    benchmarks: list[str] | None = None,
    metrics: list[str] | None = None,
) -> list[EvalRow]:
    """A − B for each benchmark (and their Average, with several) and metric (default mean@k, pass@k)."""
    if a.run.k != b.run.k:
        raise EvalCompareError(f"k differs: {a.run.k} in {a.run.path} (A), {b.run.k} in {b.run.path} (B)")
    for metric in metrics or []:
        if not Metric.is_name(metric):
            raise EvalCompareError(f"--metric {metric!r}: expected {EXPECTED}")
    names = _benchmarks(a, b, [name for name in benchmarks or [] if name != AVERAGE] or None)
    rows = []
    for metric in metrics or defaults(a.run.k):
        pairs = {name: differences(a, b, name, metric) for name in names}
        rows += [_row(name, metric, [pair], resampling) for name, pair in pairs.items()]
        if len(pairs) > 1:
            rows.append(_row(AVERAGE, metric, list(pairs.values()), resampling))
    adjusted = stats.holm([row.p_value for row in rows])
    return [EvalRow(**{**row.__dict__, "p_holm": p}) for row, p in zip(rows, adjusted)]
