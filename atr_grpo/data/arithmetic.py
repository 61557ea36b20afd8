"""A synthetic arithmetic task in the boxed-answer format: the CPU demo's data, generated, never downloaded.

Problems are `What is a + b?` style questions over integers in [0, max_operand]. The evaluation set is
drawn first from a fixed stream and excluded from the training pool, so the demo's before/after numbers
are measured on problems the model never trained on (neither in SFT nor in GRPO).

With `chain = (lo, hi)`, hi > 1, a problem is a chain of lo to hi operations, `What is 12 + 7 - 5 + 30?`,
solved one operation at a time with every intermediate result written out (`12 + 7 = 19. 19 - 5 = 14. ...`):
multi-step working before the boxed answer, as in the paper's reasoning chains. Every operand and every
intermediate result stays in [0, max_operand], the range the tiny base model was pretrained on.

The held-out problems are also the evaluation benchmark `arithmetic` (`benchmarks.arithmetic`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from atr_grpo.data.prompts import format_answer

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


@dataclass(frozen=True)
class ChainProblem:
    """`start op1 x1 op2 x2 ...`, evaluated left to right (only + and - chain: no precedence to explain)."""

    start: int
    steps: tuple[tuple[str, int], ...]

    @property
    def question(self) -> str:
        return "What is " + " ".join([str(self.start), *(f"{op} {x}" for op, x in self.steps)]) + "?"

    def _lines(self) -> list[str]:
        lines, value = [], self.start
        for op, operand in self.steps:
            result = _APPLY[op](value, operand)
            lines.append(f"{value} {op} {operand} = {result}.")
            value = result
        return lines

    @property
    def answer(self) -> str:
        value = self.start
        for op, operand in self.steps:
            value = _APPLY[op](value, operand)
        return str(value)

    @property
    def working(self) -> str:
        """One statement per operation, each starting from the previous result."""
        return " ".join(self._lines())

    @property
    def worked_solution(self) -> str:
        return format_answer(self.working, self.answer)


CHAIN_OPERATIONS = ("+", "-")


def _stream(max_operand: int, operations: list[str], seed: int) -> random.Random:
    if not operations:
        raise ValueError(f"data.operations must name at least one of {', '.join(map(repr, OPERATIONS))}")
    if max_operand < 1:
        raise ValueError(f"data.max_operand must be >= 1, got {max_operand}")
    return random.Random(seed)


def _draw(rng: random.Random, max_operand: int, operations: list[str]) -> ArithmeticProblem:
    return ArithmeticProblem(rng.randint(0, max_operand), rng.choice(operations), rng.randint(0, max_operand))


def draw_chain(rng: random.Random, max_operand: int, operations: list[str], chain: tuple[int, int]) -> ChainProblem:
    """lo..hi operations; each operand is drawn so that the running value stays in [0, max_operand]."""
    value = start = rng.randint(0, max_operand)
    steps = []
    for _ in range(rng.randint(*chain)):
        op = rng.choice(operations)
        operand = rng.randint(0, max_operand - value) if op == "+" else rng.randint(0, value)
        value = _APPLY[op](value, operand)
        steps.append((op, operand))
    return ChainProblem(start, tuple(steps))


def _check_chain(chain: tuple[int, int], operations: list[str]) -> None:
    lo, hi = chain
    if not 1 <= lo <= hi:
        raise ValueError(f"data.chain_min and data.chain_max must satisfy 1 <= chain_min <= chain_max, got {lo}, {hi}")
    if hi > 1 and set(operations) - set(CHAIN_OPERATIONS):
        raise ValueError(
            f"data.operations of a chain (data.chain_max > 1) must be among {', '.join(map(repr, CHAIN_OPERATIONS))}, "
            f"got {operations}"
        )


Problem = ArithmeticProblem | ChainProblem


def make_splits(
    num_train: int,
    num_eval: int,
    max_operand: int,
    operations: list[str],
    seed: int = 0,
    chain: tuple[int, int] = (1, 1),
) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) problem lists, disjoint, deterministic in their arguments.

    Training problems are drawn with replacement from the problems outside the evaluation set. `chain`: the
    range of operations per problem; (1, 1) is the single-operation task (the same stream as ever).
    """
    rng = _stream(max_operand, operations, seed)
    _check_chain(chain, operations)
    if chain[1] == 1:
        draw = lambda: _draw(rng, max_operand, operations)  # noqa: E731
        space = (max_operand + 1) ** 2 * len(set(operations))
        if num_eval >= space:  # training needs at least one problem outside the evaluation set
            raise ValueError(
                f"data.num_eval = {num_eval} leaves no training problem among the {space} distinct problems "
                f"with max_operand={max_operand} and operations={operations}"
            )
    else:
        draw = lambda: draw_chain(rng, max_operand, operations, chain)  # noqa: E731
    eval_set: list[Problem] = []
    seen: set[Problem] = set()
    attempts = 0
    while len(eval_set) < num_eval:
        problem = draw()
        attempts += 1
        if problem not in seen:
            seen.add(problem)
            eval_set.append(problem)
        elif attempts > 100 * num_eval:  # chains: too few distinct problems for the evaluation set
            raise ValueError(
                f"data.num_eval = {num_eval}: only {len(eval_set)} distinct chains found with "
                f"max_operand={max_operand}, operations={operations}, chain={chain}"
            )
    train: list[Problem] = []
    while len(train) < num_train:
        problem = draw()
        if problem not in seen:  # disjoint from evaluation; repeats inside training are fine
            train.append(problem)
    return train, eval_set


def task_settings(data: Any) -> tuple[int, int, int, list[str], int, tuple[int, int]]:
    """`make_splits`'s arguments from a data config of the synthetic task (`conf/data/arithmetic*.yaml`)."""
    return (
        data.num_train,
        data.num_eval,
        data.max_operand,
        data.operations,
        data.generator_seed,
        (data.chain_min, data.chain_max),
    )


def task_splits(data: Any) -> tuple[list[Problem], list[Problem]]:
    """make_splits for a data config of the synthetic task."""
    return make_splits(*task_settings(data))


# The task of conf/data/arithmetic.yaml (tests/config/test_config.py checks that the two agree).
DEFAULT_TASK = {"num_train": 4000, "num_eval": 128, "max_operand": 49, "operations": ["+", "-"], "seed": 0}
