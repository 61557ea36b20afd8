"""A generator that returns scripted samples and a tokenizer that renders chat messages as plain tags: an
evaluation without a model."""

from __future__ import annotations

from atr_grpo.evaluation import Sample
from atr_grpo.evaluation.backends import check_samples


class FakeTokenizer:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt, enable_thinking=False):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class ScriptedGenerator:
    """Returns fixed samples per problem (found by a phrase of its text) and records its calls."""

    name = "scripted"

    def __init__(self, script):
        self.script, self.calls = script, []

    def generate(self, prompts, params):
        self.calls.append((list(prompts), params))
        rows = []
        for prompt in prompts:
            texts = next(samples for phrase, samples in self.script.items() if phrase in prompt)
            rows.append([Sample(text, reason, len(text)) for text, reason in texts[: params.n]])
        return check_samples(rows, len(prompts), params.n)
