"""Training data for the two stages, as `datasets.Dataset`s in TRL's conversational formats.

GRPO: columns `prompt` (the chat of `prompts.build_messages`), `answer` (the gold answer string the
reward compares with) and `prompt_id` (a hash of the problem's text, which the trainer records:
`training.prompts_seen`). SFT: columns `prompt` and `completion` (the assistant turn of `prompts.format_answer`),
so that the SFT loss covers the completion only.

Where the rows come from is the config's `source`: a hub dataset, a local file, or the package's arithmetic
generator; `name` is only a label.
"""

from __future__ import annotations

import hashlib
import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atr_grpo.data.arithmetic import task_splits
from atr_grpo.data.prompts import build_messages, format_answer
from atr_grpo.errors import ConfigError

if TYPE_CHECKING:
    from atr_grpo.config_inputs import DataConfig, PromptConfig, SFTConfig

log = logging.getLogger(__name__)

PROMPT_ID = "prompt_id"  # the GRPO dataset's column of prompt ids


def get_field(row: dict[str, Any], dotted: str) -> Any:
    """`row["a"]["b"][0]` for `a.b.0`: reach nested columns such as verl's `prompt.0.content`."""
    value: Any = row
    for part in dotted.split("."):
        if isinstance(value, (list, tuple)):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(f"field {dotted!r} not found (missing {part!r}); row has keys {sorted(row)}")
    return value


def load_rows(hub_id: str | None, hub_config: str | None, split: str, path: str | None) -> Any:
    """A local .jsonl/.json/.parquet file when `path` is set, else the hub dataset."""
    from datasets import load_dataset

    if path is not None:
        suffix = Path(path).suffix.lower()
        kinds = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
        if suffix not in kinds:
            raise ValueError(f"data path {path!r}: expected one of {sorted(kinds)}, got {suffix!r}")
        if not Path(path).exists():
            raise FileNotFoundError(f"data path {path!r} does not exist")
        return load_dataset(kinds[suffix], data_files=str(path), split="train")
    if hub_id is None:
        raise ValueError("neither a local path nor a hub id was given")
    return load_dataset(hub_id, hub_config, split=split)


def _clean_answer(value: Any) -> str:
    """Gold answers as strings; integral floats (27.0) become integers (27)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def prompt_id(question: str) -> str:
    """A training prompt's id: the first 16 hex digits of the sha256 of its problem text, so that the same problem
    has the same id in every run, wherever it sits in the data, and repeated rows count once."""
    return hashlib.sha256(question.encode()).hexdigest()[:16]


def grpo_dataset(data: DataConfig, prompt: PromptConfig) -> Any:
    """The GRPO training prompts and their gold answers."""
    from datasets import Dataset

    if data.source == "arithmetic":
        train, _ = task_splits(data)
        problems = [(p.question, p.answer) for p in train]
    else:
        rows = load_rows(data.hub_id, data.hub_config, data.split, data.path)
        problems = [
            (str(get_field(r, data.problem_field)), _clean_answer(get_field(r, data.answer_field))) for r in rows
        ]
    if data.max_examples is not None:
        problems = problems[: data.max_examples]
    return Dataset.from_dict(
        {
            "prompt": [build_messages(q, prompt.system) for q, _ in problems],
            "answer": [a for _, a in problems],
            PROMPT_ID: [prompt_id(q) for q, _ in problems],
        }
    )


def chat_length(tokenizer: Any, messages: list[dict[str, str]], enable_thinking: bool, **template: Any) -> int:
    """Number of tokens of `messages` rendered with the chat template.

    transformers 5 returns a `BatchEncoding` from `apply_chat_template(..., tokenize=True)`, whose `len()` is its
    number of keys, not of tokens; rendering to text and tokenizing it counts what the trainer will see.
    """
    text = tokenizer.apply_chat_template(messages, tokenize=False, enable_thinking=enable_thinking, **template)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def filter_long_prompts(dataset: Any, tokenizer: Any, limit: int, enable_thinking: bool) -> Any:
    """Drop GRPO prompts longer than `limit` tokens (trainer.max_prompt_length; TRL 1.15 does not truncate)."""

    def fits(example: dict[str, Any]) -> bool:
        return chat_length(tokenizer, example["prompt"], enable_thinking, add_generation_prompt=True) <= limit

    kept = dataset.filter(fits)
    if len(kept) < len(dataset):
        log.info("kept %d of %d prompts within %d tokens", len(kept), len(dataset), limit)
    if len(kept) == 0:
        raise ConfigError(f"invalid config: no training prompt fits trainer.max_prompt_length={limit} tokens")
    return kept


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def sft_kept_note(kept: int, read: int, total: int, limit: int) -> str:
    """What the SFT stage trains on: `kept` examples of the `read` first of `total` (the rest were never read when
    sft.max_examples stopped the reading), those longer than `limit` tokens left out."""
    if read < total:
        return (
            f"SFT stage: {kept} examples (sft.max_examples), the first {read} of {total} read, "
            f"{read - kept} of them longer than {limit} tokens"
        )
    return f"SFT stage: {kept} of {total} examples fit in {limit} tokens"


def sft_dataset(sft: SFTConfig, data: DataConfig, prompt: PromptConfig, tokenizer: Any, max_seq_length: int) -> Any:
    """Worked solutions in the exact format GRPO rewards, filtered as in Unsloth's notebook."""
    from datasets import Dataset

    if sft.source == "arithmetic":
        train, _ = task_splits(data)
        rng = random.Random(sft.seed)
        pairs = [(p.question, p.working if rng.random() < sft.unboxed_fraction else p.worked_solution) for p in train]
    else:
        rows = load_rows(sft.hub_id, None, sft.split, sft.path)
        pairs = []
        for row in rows:
            answer = _clean_answer(get_field(row, sft.answer_field))
            if sft.numeric_answers_only and not _is_number(answer):
                continue
            reasoning = str(get_field(row, sft.solution_field)).replace("<think>", "").replace("</think>", "")
            pairs.append((str(get_field(row, sft.problem_field)), format_answer(reasoning, answer)))
    limit = int(sft.max_length_fraction * max_seq_length)
    kept, read = [], 0
    for question, solution in pairs:
        read += 1
        messages = build_messages(question, prompt.system) + [{"role": "assistant", "content": solution}]
        if chat_length(tokenizer, messages, prompt.enable_thinking) <= limit:
            kept.append((question, solution))
        if sft.max_examples is not None and len(kept) >= sft.max_examples:
            break
    if not kept:
        raise ValueError(
            "the SFT stage kept no example: none fits in "
            f"sft.max_length_fraction × model.max_seq_length = {limit} tokens"
        )
    log.info(sft_kept_note(len(kept), read, len(pairs), limit))
    return Dataset.from_dict(
        {
            "prompt": [build_messages(q, prompt.system) for q, _ in kept],
            "completion": [[{"role": "assistant", "content": s}] for _, s in kept],
        }
    )
