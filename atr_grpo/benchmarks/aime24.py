"""AIME 2024 I and II: 30 problems, the gold in the solution's last \\boxed{} (Table 2's AIME2024)."""

from atr_grpo.benchmarks.registry import BenchmarkSpec, register_benchmark

register_benchmark(
    BenchmarkSpec(
        name="aime24",
        hub_id="math-ai/aime24",
        split="test",
        num_problems=30,
        boxed_answer_fields=("solution",),
        description="AIME 2024 I+II; gold in the solution's \\boxed{} (or an `answer` field)",
        display_name="AIME2024",
        order=2,
    )
)
