"""Evaluation: benchmarks, generation backends, grading, Mean@K / Pass@K, and the run-directory files.

Public functions: `grade`, `grade_many`, `pass_at_k`, `mean_at_k`, `run_evaluation`. Backends and the callback
import their heavy dependencies (vLLM, Unsloth, transformers) only when used.
"""

from atr_grpo.benchmarks import BENCHMARKS, BenchmarkError, BenchmarkSpec, register_benchmark
from atr_grpo.evaluation.backends import (
    Generator,
    HFGenerator,
    Sample,
    UnslothVLLMGenerator,
    VLLMGenerator,
)
from atr_grpo.evaluation.benchmarks import Benchmark, Problem, load_benchmark
from atr_grpo.evaluation.gold import GoldParseError
from atr_grpo.evaluation.grader import (
    STATUSES,
    GradeResult,
    grade,
    grade_many,
    grade_sample,
    grade_samples,
    last_boxed,
    status_counts,
)
from atr_grpo.evaluation.metrics import average, mean_at_k, pass_at_k, summarize
from atr_grpo.evaluation.outputs import read_summary
from atr_grpo.evaluation.runner import flat_metrics, run_evaluation
from atr_grpo.evaluation.sampling import SamplingConfig

__all__ = [
    "BENCHMARKS",
    "STATUSES",
    "Benchmark",
    "BenchmarkError",
    "BenchmarkSpec",
    "Generator",
    "GoldParseError",
    "GradeResult",
    "HFGenerator",
    "Problem",
    "Sample",
    "SamplingConfig",
    "UnslothVLLMGenerator",
    "VLLMGenerator",
    "average",
    "flat_metrics",
    "grade",
    "grade_many",
    "grade_sample",
    "grade_samples",
    "last_boxed",
    "load_benchmark",
    "mean_at_k",
    "pass_at_k",
    "read_summary",
    "register_benchmark",
    "run_evaluation",
    "status_counts",
    "summarize",
]
