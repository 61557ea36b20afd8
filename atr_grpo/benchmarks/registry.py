"""The benchmark registry: what each evaluation benchmark is, where its rows come from and how the tables name it.

It sits below `config` (which checks `eval.benchmarks` against it) and imports nothing of the package, so any
module can name a benchmark without importing `evaluation/`. Loading and checking the rows is
`evaluation.benchmarks.load_benchmark`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]


class BenchmarkError(ValueError):
    """A benchmark cannot be loaded as asked (unknown name, wrong size, unparsable golds, bad file)."""


@dataclass(frozen=True)
class BenchmarkSpec:
    """One benchmark. Only `name` and one source (hub_id or loader) are required.

    Rows come from `eval.paths.<name>` (a local file) when given, else from `loader`, else from the hub. The answer
    format: the gold is the first present `answer_fields`, else the last `\\boxed{}` of a `boxed_answer_fields`.
    """

    name: str  # what `eval.benchmarks` lists
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
    display_name: str = ""  # its column heading in the tables (Table 2's "AMC2023"); empty: the name
    order: float | None = None  # its column's place in the tables (ascending); None: after the ordered ones


BENCHMARKS: dict[str, BenchmarkSpec] = {}


def register_benchmark(spec: BenchmarkSpec, replace: bool = False) -> BenchmarkSpec:
    """Add a spec to the registry (an existing name is an error unless replace=True)."""
    if spec.name in BENCHMARKS and not replace:
        raise BenchmarkError(f"benchmark {spec.name!r} is already registered (pass replace=True to redefine it)")
    if spec.hub_id is None and spec.loader is None:
        raise BenchmarkError(f"benchmark {spec.name!r} needs a hub_id or a loader")
    BENCHMARKS[spec.name] = spec
    return spec


def display_name(name: str) -> str:
    """The column heading of a benchmark in the tables (the name itself for one not registered here)."""
    spec = BENCHMARKS.get(name)
    return (spec.display_name or name) if spec is not None else name


def table_position(name: str) -> tuple[float, str]:
    """The sort key of a benchmark's columns: its spec's `order`, then its name (unordered or unregistered: last)."""
    spec = BENCHMARKS.get(name)
    order = spec.order if spec is not None and spec.order is not None else math.inf
    return (order, name)
