"""Evaluation benchmarks, one module each: a module here registers its `BenchmarkSpec`, which holds everything
about the benchmark (where its rows come from, its answer format, its row count, its name and place in the tables).

    # atr_grpo/benchmarks/math500.py: all it takes for `eval.benchmarks=[math500]` and a MATH500 column in Table 2
    from atr_grpo.benchmarks.registry import BenchmarkSpec, register_benchmark

    register_benchmark(BenchmarkSpec(name="math500", hub_id="HuggingFaceH4/MATH-500", num_problems=500,
                                     display_name="MATH500", order=4))

Importing this package imports every module in it (a new module needs no edit here), then the modules other
installed packages declare under the entry-point group `atr_grpo.benchmarks` (`atr_grpo.plugins`).

Built in: amc23, aime24, aime25 (from the hub), and `arithmetic`, the held-out problems of the synthetic task of
`conf/data/arithmetic.yaml`, so that `python -m atr_grpo.evaluate eval=arithmetic` works without a training run.
"""

import importlib
import pkgutil

from atr_grpo.benchmarks.registry import (
    BENCHMARKS,
    BenchmarkError,
    BenchmarkSpec,
    Row,
    display_name,
    register_benchmark,
    table_position,
)
from atr_grpo.plugins import BENCHMARK_GROUP, load_entry_points

__all__ = [
    "BENCHMARKS",
    "BenchmarkError",
    "BenchmarkSpec",
    "Row",
    "display_name",
    "register_benchmark",
    "table_position",
]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
load_entry_points(BENCHMARK_GROUP)
