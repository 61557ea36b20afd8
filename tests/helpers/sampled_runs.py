"""Run directories with per-sample files, for the tests of intervals, comparisons and regrading.

Problem i of every benchmark has the gold answer str(100 + i); a correct sample boxes it, a wrong one boxes 7,
so the current grader agrees with every recorded verdict. Summaries are computed from the same verdicts.
"""

from __future__ import annotations

import gzip
import json

from atr_grpo.evaluation.metrics import summarize
from helpers.run_trees import BENCHES, make_run

PROBLEMS, SAMPLES = 30, 8


def counts_matrix(counts: list[int]) -> list[list[bool]]:
    """A problems × samples verdict matrix whose problem i has its first counts[i] samples correct."""
    return [[j < c for j in range(SAMPLES)] for c in counts]


def record(problem: int, sample: int, correct: bool) -> dict:
    gold = str(100 + problem)
    answer = gold if correct else "7"
    return {
        "problem_id": problem,
        "sample": sample,
        "completion": f"So the answer is \\boxed{{{answer}}}.",
        "extracted": answer,
        "gold": gold,
        "correct": correct,
        "status": "correct" if correct else "wrong",
        "finish_reason": "stop",
        "num_tokens": 12,
    }


def write_sample_file(path, matrix, compress=False):
    lines = "".join(json.dumps(record(p, s, c)) + "\n" for p, row in enumerate(matrix) for s, c in enumerate(row))
    path.parent.mkdir(parents=True, exist_ok=True)
    if compress:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(lines.encode()))
    else:
        path.write_text(lines)


def sampled_run(root, experiment, method, seed, matrices, model="qwen3-1.7b", compress=False, name=None):
    """A run evaluated at every step of `matrices` ({step: {bench: matrix}}), with its per-sample files."""
    evals = {
        step: {
            b: tuple(summarize(m, ks=[SAMPLES])[f"{x}@{SAMPLES}"] for x in ("mean", "pass"))
            for b, m in per_bench.items()
        }
        for step, per_bench in matrices.items()
    }
    path = make_run(
        root, experiment, model, method, {"name": method.split("-")[0]}, seed, evals, max_steps=max(matrices), name=name
    )
    for step, per_bench in matrices.items():
        for bench, matrix in per_bench.items():
            write_sample_file(path / "eval" / f"step_{step:06d}" / f"{bench}.jsonl", matrix, compress)
    return path


def method_matrices(extra: int, seed: int, steps=(50, 100)) -> dict:
    """Problem i has (i + seed) % 5 + extra correct samples at the final step (one fewer before it)."""
    final = counts_matrix([min((i + seed) % 5 + extra, SAMPLES) for i in range(PROBLEMS)])
    early = counts_matrix([max(min((i + seed) % 5 + extra, SAMPLES) - 1, 0) for i in range(PROBLEMS)])
    return {step: dict.fromkeys(BENCHES, final if step == steps[-1] else early) for step in steps}
