"""`arithmetic`: the held-out problems of the synthetic task (`data.arithmetic`), the CPU demo's benchmark.

Registered with the task of `conf/data/arithmetic.yaml` (`DEFAULT_TASK`); a training run on another synthetic task
replaces it with its own (`evaluation.benchmarks.register_task_benchmark`).
"""

from __future__ import annotations

from atr_grpo.benchmarks.registry import BenchmarkSpec, register_benchmark
from atr_grpo.data.arithmetic import DEFAULT_TASK, make_splits


def arithmetic_benchmark(
    num_train: int,
    num_eval: int,
    max_operand: int,
    operations: list[str],
    seed: int = 0,
    chain: tuple[int, int] = (1, 1),
) -> BenchmarkSpec:
    """The benchmark `arithmetic`: the held-out problems of the synthetic task with these settings."""

    def rows() -> list[dict[str, object]]:
        _, evals = make_splits(num_train, num_eval, max_operand, operations, seed, chain)
        return [{"id": i, "problem": p.question, "answer": p.answer} for i, p in enumerate(evals)]

    chained = "" if chain[1] == 1 else f", chains of {chain[0]}-{chain[1]} operations"
    return BenchmarkSpec(
        name="arithmetic",
        loader=rows,
        num_problems=num_eval,
        description=f"synthetic {' '.join(operations)} over [0, {max_operand}]{chained}, held out from training",
    )


register_benchmark(arithmetic_benchmark(**DEFAULT_TASK))
