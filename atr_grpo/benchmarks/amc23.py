"""AMC 12 2022-2023, the AI-MO validation set: 83 problems with float answers (Table 2's AMC2023)."""

from atr_grpo.benchmarks.registry import BenchmarkSpec, register_benchmark

register_benchmark(
    BenchmarkSpec(
        name="amc23",
        hub_id="AI-MO/aimo-validation-amc",
        split="train",
        num_problems=83,  # the paper's AMC2023 scores are multiples of 1/83
        description="AMC 12 2022-2023 (AI-MO validation set); float answers",
        display_name="AMC2023",
        order=1,
    )
)
