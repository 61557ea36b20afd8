"""A synthetic arithmetic task in the boxed-answer format: the CPU demo's data, generated, never downloaded.

Problems are `What is a + b?` style questions over integers in [0, max_operand]. The evaluation set is
drawn first from a fixed stream and excluded from the training pool, so the demo's before/after numbers
are measured on problems the model never trained on (neither in SFT nor in GRPO).

Importing this module registers the evaluation benchmark `arithmetic` (the held-out problems of
`conf/data/arithmetic.yaml`), so the name is known to config validation and to a standalone
`python -m atr_grpo.evaluate eval=arithmetic`; a training run registers it again from its own data config.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from atr_grpo.data.prompts import format_answer
from atr_grpo.evaluation.benchmarks import BenchmarkSpec, register_benchmark

_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
OPERATIONS = tuple(_APPLY)


@dataclass(frozen=True)
class ArithmeticProblem:
    left: int
    op: str
    right: int

    @property
    def question(self) -> str:
        return f"What is {self.left} {self.op} {self.right}?"

    @property
    def answer(self) -> str:
        return str(_APPLY[self.op](self.left, self.right))

    @property
    def working(self) -> str:
        return f"{self.left} {self.op} {self.right} = {self.answer}."

    @property
    def worked_solution(self) -> str:
        """The SFT target: one line of working, then the boxed answer."""
        return format_answer(self.working, self.answer)


def _stream(max_operand: int, operations: list[str], seed: int) -> random.Random:
    if not operations:
        raise ValueError(f"data.operations must name at least one of {', '.join(map(repr, OPERATIONS))}")
    if max_operand < 1:
        raise ValueError(f"data.max_operand must be >= 1, got {max_operand}")
    return random.Random(seed)


def _draw(rng: random.Random, max_operand: int, operations: list[str]) -> ArithmeticProblem:
    return ArithmeticProblem(rng.randint(0, max_operand), rng.choice(operations), rng.randint(0, max_operand))


def make_splits(
    num_train: int, num_eval: int, max_operand: int, operations: list[str], seed: int = 0
) -> tuple[list[ArithmeticProblem], list[ArithmeticProblem]]:
    """(train, eval) problem lists, disjoint, deterministic in their arguments.

    Training problems are drawn with replacement from the problems outside the evaluation set.
    """
    rng = _stream(max_operand, operations, seed)
    space = (max_operand + 1) ** 2 * len(set(operations))
    if num_eval >= space:  # training needs at least one problem outside the evaluation set
        raise ValueError(
            f"data.num_eval = {num_eval} leaves no training problem among the {space} distinct problems "
            f"with max_operand={max_operand} and operations={operations}"
        )
    eval_set: list[ArithmeticProblem] = []
    seen: set[ArithmeticProblem] = set()
    while len(eval_set) < num_eval:
        problem = _draw(rng, max_operand, operations)
        if problem not in seen:
            seen.add(problem)
            eval_set.append(problem)
    train: list[ArithmeticProblem] = []
    while len(train) < num_train:
        problem = _draw(rng, max_operand, operations)
        if problem not in seen:  # disjoint from evaluation; repeats inside training are fine
            train.append(problem)
    return train, eval_set


def register_arithmetic_benchmark(
    num_train: int, num_eval: int, max_operand: int, operations: list[str], seed: int = 0
) -> None:
    """Make the held-out problems loadable as the evaluation benchmark `arithmetic` (replacing any earlier)."""

    def rows() -> list[dict[str, object]]:
        _, evals = make_splits(num_train, num_eval, max_operand, operations, seed)
        return [{"id": i, "problem": p.question, "answer": p.answer} for i, p in enumerate(evals)]

    register_benchmark(
        BenchmarkSpec(
            name="arithmetic",
            loader=rows,
            num_problems=num_eval,
            description=f"synthetic {' '.join(operations)} over [0, {max_operand}], held out from training",
        ),
        replace=True,
    )


# The task of conf/data/arithmetic.yaml (tests/test_config.py checks that the two agree).
DEFAULT_TASK = {"num_train": 4000, "num_eval": 128, "max_operand": 49, "operations": ["+", "-"], "seed": 0}
register_arithmetic_benchmark(**DEFAULT_TASK)
