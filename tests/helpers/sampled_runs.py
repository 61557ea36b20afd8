"""Run directories with per-sample files, for the tests of intervals, comparisons and regrading.

Problem i of every benchmark has the gold answer str(100 + i); a correct sample boxes it, a wrong one boxes 7,
so the current grader agrees with every recorded verdict. A matrix may hold grader statuses instead of verdicts
(`status_matrix`): a sample with no answer ends without a box, a truncated one runs out of tokens. Summaries are
computed from the same verdicts, here (not by the product's `summarize`): with K = n, Mean@K is the share of
correct samples and Pass@K the share of problems with one. Files are written where and as the product writes
them (`rundir.layout`, `rundir.records`).
"""

from __future__ import annotations

import gzip

from atr_grpo.rundir import files, layout
from atr_grpo.rundir.records import SampleRecord
from helpers.run_trees import BENCHES, make_run

PROBLEMS, SAMPLES = 30, 8


def counts_matrix(counts: list[int]) -> list[list[bool]]:
    """A problems × samples verdict matrix whose problem i has its first counts[i] samples correct."""
    return [[j < c for j in range(SAMPLES)] for c in counts]


def status_matrix(answered: list[int], correct: list[int], truncated: list[int] | None = None) -> list[list[str]]:
    """A problems × samples matrix of grader statuses: problem i has correct[i] correct samples, then wrong ones up
    to answered[i] answered, then truncated[i] truncated ones, then samples with no answer."""
    truncated = truncated or [0] * len(answered)
    return [
        ["correct"] * c + ["wrong"] * (a - c) + ["truncated"] * t + ["no_answer"] * (SAMPLES - a - t)
        for a, c, t in zip(answered, correct, truncated)
    ]


def verdicts_of(matrix: list[list]) -> list[list[bool]]:
    """The verdicts of a matrix of verdicts or of statuses."""
    return [[x == "correct" if isinstance(x, str) else bool(x) for x in row] for row in matrix]


def record(problem: int, sample: int, outcome: bool | str) -> SampleRecord:
    """A sample's record from its verdict, or from its grader status."""
    status = outcome if isinstance(outcome, str) else "correct" if outcome else "wrong"
    gold = str(100 + problem)
    answer = {"correct": gold, "wrong": "7"}.get(status)
    fields = {
        "completion": "So the answer is" if answer is None else f"So the answer is \\boxed{{{answer}}}.",
        "extracted": answer,
        "gold": gold,
        "status": status,
        "finish_reason": "length" if status == "truncated" else "stop",
        "num_tokens": 12,
    }
    return SampleRecord(problem, sample, status == "correct", fields)


def write_sample_file(path, matrix, compress=False):
    """A per-sample file at `path` (its packed `.gz` copy with `compress`) of a problems × samples matrix."""
    records = [record(p, s, c).to_dict() for p, row in enumerate(matrix) for s, c in enumerate(row)]
    files.write_jsonl(path, records)
    if compress:
        packed = layout.packed(path)
        packed.write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()


def mean_and_pass(matrix: list[list]) -> tuple[float, float]:
    """(Mean@n, Pass@n) of a problems × n matrix: the share of correct samples, the share of solved problems."""
    matrix = verdicts_of(matrix)
    samples = sum(len(row) for row in matrix)
    return sum(map(sum, matrix)) / samples, sum(any(row) for row in matrix) / len(matrix)


def sampled_run(
    root, experiment, method, seed, matrices, model="qwen3-1.7b", compress=False, name=None, benchmarks=BENCHES
):
    """A run evaluated at every step of `matrices` ({step: {bench: matrix}}), with its per-sample files; its config
    names `benchmarks`."""
    evals = {step: {b: mean_and_pass(m) for b, m in per_bench.items()} for step, per_bench in matrices.items()}
    path = make_run(
        root,
        experiment,
        model,
        method,
        {"name": method.split("-")[0]},
        seed,
        evals,
        max_steps=max(matrices),
        name=name,
        benchmarks=benchmarks,
    )
    for step, per_bench in matrices.items():
        for bench, matrix in per_bench.items():
            write_sample_file(layout.sample_file(path, step, bench), matrix, compress)
    return path


def method_matrices(extra: int, seed: int, steps=(50, 100)) -> dict:
    """Problem i has (i + seed) % 5 + extra correct samples at the final step (one fewer before it)."""
    final = counts_matrix([min((i + seed) % 5 + extra, SAMPLES) for i in range(PROBLEMS)])
    early = counts_matrix([max(min((i + seed) % 5 + extra, SAMPLES) - 1, 0) for i in range(PROBLEMS)])
    return {step: dict.fromkeys(BENCHES, final if step == steps[-1] else early) for step in steps}
