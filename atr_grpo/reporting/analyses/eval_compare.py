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

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from atr_grpo import rundir
from atr_grpo.reporting import stats
from atr_grpo.reporting.metric import EXPECTED, Metric, defaults
from atr_grpo.reporting.runs import AVERAGE, MissingSamples, Run
from atr_grpo.rundir import layout

# summary fields that say how the samples were made and graded: a difference is named in a note
SETTINGS = ("n", "temperature", "top_p", "top_k", "max_tokens", "seed", "prompt_hash", "enable_thinking", "grader")
SAYS_WHAT = (
    "this model vs that model on these problems: a paired test over the problems both evaluated, each problem's "
    "score matched by id. It is not a claim about training methods: one run per side measures no spread over "
    "training seeds (`results compare A B` tests methods over seeds)."
)


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


def setting_notes(a: Side, b: Side) -> list[str]:
    """A note per sampling or grading setting in which the two evaluations differ."""
    notes = []
    for (step_a, name), row_a in sorted(a.run.summary.items()):
        row_b = b.run.summary.get((b.step, name))
        if step_a != a.step or row_b is None:
            continue
        for setting in SETTINGS:
            if row_a.get(setting) != row_b.get(setting):
                notes.append(f"note: {name}: {setting} differs (A {row_a.get(setting)!r}, B {row_b.get(setting)!r})")
    return notes


def describe(side: Side) -> str:
    first: dict[str, Any] = next(row for (step, _), row in side.run.summary.items() if step == side.step)
    model = first.get("model", side.run.model)
    adapter = first.get("adapter") or "no adapter"
    return f"{side.label}: {side.run.path} (step {side.step}; model {model}, {adapter})"


def format_rows(a: Side, b: Side, rows: list[EvalRow], resampling: stats.Resampling) -> str:
    level = f"{100 * resampling.confidence:g}%"
    lines = [
        describe(a),
        describe(b),
        "",
        SAYS_WHAT,
        "",
        f"| benchmark | metric | problems | A | B | A − B | {level} CI (problems) | p (sign flip, problems) "
        "| p (Holm) |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    floor = 1.0 / (resampling.resamples + 1)
    for r in rows:
        lines.append(
            f"| {r.benchmark} | {r.metric} | {r.problems} | {r.mean_a:.2f} | {r.mean_b:.2f} | {r.difference:+.2f} | "
            f"[{r.low:+.2f}, {r.high:+.2f}] | {stats.format_p(r.p_value, floor)} | {stats.format_p(r.p_holm, floor)} |"
        )
    lines += [
        "",
        f"Scores in percent. Interval: {resampling.describe()}. p: two-sided sign-flip test of the per-problem "
        f"differences, {resampling.resamples:,} random sign patterns; Holm over the rows above.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """The command line; 2 with the reason on stderr when the comparison is refused."""
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.results compare --eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--eval", nargs=2, type=Path, required=True, metavar=("DIR_A", "DIR_B"), dest="folders")
    parser.add_argument("--step-a", type=int, default=None, help="A's evaluation step (default: its last)")
    parser.add_argument("--step-b", type=int, default=None, help="B's evaluation step (default: its last)")
    parser.add_argument("--benchmark", default=None, help="comma-separated benchmarks (default: every one of A's)")
    parser.add_argument("--metric", default=None, help="comma-separated, e.g. mean@8,pass@8 (default mean@k,pass@k)")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples and sign flips (>= 100)")
    parser.add_argument("--bootstrap-seed", type=int, default=0, help="seed of every resampling (default 0)")
    parser.add_argument("--alpha", type=float, default=0.05, help="intervals are (1 − alpha) (default 0.05)")
    opts = parser.parse_args(argv)
    try:
        resampling = stats.Resampling(opts.resamples, opts.bootstrap_seed, 1.0 - opts.alpha)
    except ValueError as err:
        parser.error(f"--resamples or --alpha: {err}")
    split = lambda text: text.split(",") if text else None  # noqa: E731
    try:
        a = open_side("A", opts.folders[0], opts.step_a)
        b = open_side("B", opts.folders[1], opts.step_b)
        rows = compare_folders(a, b, resampling, split(opts.benchmark), split(opts.metric))
    except EvalCompareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in setting_notes(a, b):
        print(line, file=sys.stderr)
    print(format_rows(a, b, rows, resampling), end="")
    return 0
