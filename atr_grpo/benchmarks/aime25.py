"""AIME 2025 I and II: 30 problems, three of them with control characters to repair (Table 2's AIME2025)."""

from atr_grpo.benchmarks.registry import BenchmarkSpec, register_benchmark


def repair_control_characters(text: str) -> str:
    """math-ai/aime25 stores `\\frac` as form feed + "rac" and `\\triangle`/`\\times` as TAB + "riangle"."""
    return text.replace("\x0c", "\\f").replace("\t", "\\t")


register_benchmark(
    BenchmarkSpec(
        name="aime25",
        hub_id="math-ai/aime25",
        split="test",
        num_problems=30,
        repair=repair_control_characters,
        description="AIME 2025 I+II; three problems carry \\f/\\t control characters, repaired",
        display_name="AIME2025",
        order=3,
    )
)
