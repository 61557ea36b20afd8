"""The prompt and answer format: one definition used by the SFT stage, the GRPO reward and evaluation.

A problem becomes a chat with a fixed system instruction; the model is expected to reason in plain
text and finish with its answer in `\\boxed{...}`, which is exactly what the reward and the grader read.
"""

from __future__ import annotations

import hashlib
from typing import Any

# The instruction Qwen's math models are trained with (Qwen2.5-Math "qwen25-math-cot" template), also used
# by Dr.GRPO's and DeepScaleR's evaluation: it asks for the boxed final answer that math-verify extracts.
DEFAULT_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def build_messages(problem: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The conversation a problem is asked in (what TRL receives as a conversational `prompt`)."""
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": problem})
    return messages


def format_answer(reasoning: str, answer: str) -> str:
    """The assistant turn the SFT stage teaches: reasoning, then the final answer boxed."""
    reasoning = reasoning.strip()
    final = f"The final answer is $\\boxed{{{answer}}}$."
    return f"{reasoning}\n\n{final}" if reasoning else final


def render_prompt(
    tokenizer: Any,
    problem: str,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    enable_thinking: bool = False,
) -> str:
    """The exact text a model is conditioned on, through the tokenizer's own chat template.

    `enable_thinking` is forwarded to templates that know it (Qwen3's); others ignore the keyword.
    """
    return tokenizer.apply_chat_template(
        build_messages(problem, system_prompt),
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
    )


def prompt_fingerprint(
    tokenizer: Any, system_prompt: str = DEFAULT_SYSTEM_PROMPT, enable_thinking: bool = False
) -> str:
    """A short hash of the rendered template, recorded with every result so formats can be compared."""
    text = render_prompt(tokenizer, "{problem}", system_prompt, enable_thinking)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
