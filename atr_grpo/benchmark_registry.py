"""The benchmark registry: what each evaluation benchmark is and where its rows come from, and nothing else.

It sits below `config` (which checks `eval.benchmarks` against it) and imports only the data layer, so any
module can name a benchmark without importing `evaluation/`. Loading and checking the rows is
`evaluation.benchmarks.load_benchmark`; a training run replaces `arithmetic` with its own task there
(`evaluation.benchmarks.register_task_benchmark`).

    register_benchmark(BenchmarkSpec(name="mine", loader=lambda: [{"id": 0, "problem": "1+1?", "answer": "2"}]))

Built in: amc23, aime24, aime25 (from the hub), and `arithmetic`, the held-out problems of the synthetic task of
`conf/data/arithmetic.yaml` (`data.arithmetic.DEFAULT_TASK`), so that `python -m atr_grpo.evaluate
eval=arithmetic` works without a training run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from atr_grpo.data.arithmetic import DEFAULT_TASK, make_splits

Row = dict[str, Any]


class BenchmarkError(ValueError):
    """A benchmark cannot be loaded as asked (unknown name, wrong size, unparsable golds, bad file)."""


@dataclass(frozen=True)
class BenchmarkSpec:
    """How to load one benchmark. Only `name` and one source (hub_id or loader) are required."""

    name: str
    hub_id: str | None = None
    split: str = "test"
    hub_config: str | None = None
    loader: Callable[[], Iterable[Row]] | None = None  # rows without the hub (synthetic sets)
    num_problems: int | None = None  # expected row count, checked in strict mode
    problem_fields: tuple[str, ...] = ("problem", "question")  # the first present one is used
    answer_fields: tuple[str, ...] = ("answer",)
    boxed_answer_fields: tuple[str, ...] = ()  # fields whose last \boxed{} holds the gold
    id_field: str = "id"
    repair: Callable[[str], str] | None = None  # applied to the problem text
    description: str = ""


def repair_control_characters(text: str) -> str:
    """math-ai/aime25 stores `\\frac` as form feed + "rac" and `\\triangle`/`\\times` as TAB + "riangle"."""
    return text.replace("\x0c", "\\f").replace("\t", "\\t")


BENCHMARKS: dict[str, BenchmarkSpec] = {}


def register_benchmark(spec: BenchmarkSpec, replace: bool = False) -> BenchmarkSpec:
    """Add a spec to the registry (an existing name is an error unless replace=True)."""
    if spec.name in BENCHMARKS and not replace:
        raise BenchmarkError(f"benchmark {spec.name!r} is already registered (pass replace=True to redefine it)")
    if spec.hub_id is None and spec.loader is None:
        raise BenchmarkError(f"benchmark {spec.name!r} needs a hub_id or a loader")
    BENCHMARKS[spec.name] = spec
    return spec


register_benchmark(
    BenchmarkSpec(
        name="amc23",
        hub_id="AI-MO/aimo-validation-amc",
        split="train",
        num_problems=83,  # the paper's AMC2023 scores are multiples of 1/83
        description="AMC 12 2022-2023 (AI-MO validation set); float answers",
    )
)
register_benchmark(
    BenchmarkSpec(
        name="aime24",
        hub_id="math-ai/aime24",
        split="test",
        num_problems=30,
        boxed_answer_fields=("solution",),
        description="AIME 2024 I+II; gold in the solution's \\boxed{} (or an `answer` field)",
    )
)
register_benchmark(
    BenchmarkSpec(
        name="aime25",
        hub_id="math-ai/aime25",
        split="test",
        num_problems=30,
        repair=repair_control_characters,
        description="AIME 2025 I+II; three problems carry \\f/\\t control characters, repaired",
    )
)


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
