"""The tiny CPU model, built locally so that nothing is downloaded: a Qwen3 of `TinyModelConfig`'s shape with a
tokenizer trained on the prompt format and the arithmetic task's vocabulary, and a short full-parameter
"pretraining" on arithmetic statements. `materialize_tiny` builds it once into the cache, keyed by its fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from atr_grpo import rundir
from atr_grpo.cache import cache_dir
from atr_grpo.config_inputs import TinyModelConfig
from atr_grpo.data.arithmetic import draw_chain
from atr_grpo.data.prompts import DEFAULT_SYSTEM_PROMPT, format_answer
from atr_grpo.training.interrupts import stage

log = logging.getLogger(__name__)

TINY_RECIPE = 3  # bump when the tokenizer corpus or the pretraining recipe changes: invalidates caches

# ChatML, the format of Qwen's chat templates (Qwen3 adds an optional <think> block, which the tiny
# model does without): <|im_start|>role\ncontent<|im_end|>\n ... then <|im_start|>assistant\n.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _tokenizer_corpus() -> list[str]:
    """Text the tiny tokenizer is trained on: the prompt format and the arithmetic task's vocabulary."""
    lines = [DEFAULT_SYSTEM_PROMPT, "system", "user", "assistant"]
    for a, b in [(12, 7), (45, 38), (90, 9), (3, 64), (71, 26)]:
        for op, value in (("+", a + b), ("-", a - b), ("*", a * b)):
            lines.append(f"What is {a} {op} {b}?")
            lines.append(format_answer(f"{a} {op} {b} = {value}.", str(value)))
    lines.append("Let me think step by step. First, then, so, therefore, because, the answer is")
    return lines * 8


def build_tiny_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer with single-digit tokens (as Qwen's) and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    # digits one by one, like Qwen's tokenizer: arithmetic is learnable digit by digit
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    hf_tok.chat_template = CHATML_TEMPLATE
    hf_tok.padding_side = "left"
    return hf_tok


def _statement(rng: random.Random, max_operand: int, operations: list[str]) -> str:
    a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(operations)
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a} {op} {b} = {value}."


def _pretraining_document(rng: random.Random, cfg: TinyModelConfig) -> str:
    """Four "sentences" of web-like text: worked questions and arithmetic statements in plain text, plus
    loose fragments of the chat markup and of the answer phrase, so that every token the task uses has a
    trained embedding. The chat format and the boxed answer are never put together with a question:
    that composition is what the SFT stage teaches."""
    parts = []
    for _ in range(4):
        kind = rng.random()
        statement = _statement(rng, cfg.pretrain_max_operand, cfg.pretrain_operations)
        if kind < 0.5 and cfg.pretrain_chain_ops > 1:
            chain = draw_chain(rng, cfg.pretrain_max_operand, cfg.pretrain_operations, (1, cfg.pretrain_chain_ops))
            parts.append(f"{chain.question} {chain.working}")
        elif kind < 0.5:
            left, op, right = statement.split(" ")[:3]
            parts.append(f"What is {left} {op} {right}? {statement}")
        elif kind < 0.7:
            parts.append(statement)
        elif kind < 0.9:
            parts.append(format_answer("", str(rng.randint(-cfg.pretrain_max_operand, 2 * cfg.pretrain_max_operand))))
        else:
            role = rng.choice(["system", "user", "assistant"])
            parts.append(f"<|im_start|>{role}\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n")
    return " ".join(parts)


def pretrain_tiny(model: Any, tokenizer: Any, cfg: TinyModelConfig) -> list[float]:
    """Full-parameter next-token training on `_pretraining_document`s; returns the loss curve.

    Deliberately short: the base model should know arithmetic only in part (like a pretrained LLM knows
    math in part), so that the SFT stage has a format to teach and GRPO has accuracy to gain.
    """
    from atr_grpo.console import LOSS_SHOWN, StageProgress

    if cfg.pretrain_steps <= 0:
        return []
    rng = random.Random(cfg.init_seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.pretrain_learning_rate, weight_decay=0.0)
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "right"
    losses = []
    model.train()
    with StageProgress("tiny model pretraining", cfg.pretrain_steps, shown=LOSS_SHOWN) as progress:
        for _ in range(cfg.pretrain_steps):
            texts = [_pretraining_document(rng, cfg) for _ in range(cfg.pretrain_batch_size)]
            batch = tokenizer(texts, return_tensors="pt", padding=True)
            labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
            loss = model(**batch, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            progress.update(metrics={"loss": losses[-1]})
    tokenizer.padding_side = padding_side
    model.eval()
    return losses


# Fields added after models were cached: at these values they build what was built before they existed, so they
# stay out of the fingerprint and older caches (and the base model named in committed runs) stay valid.
_FINGERPRINT_SILENT_DEFAULTS = {"pretrain_chain_ops": 1}


def tiny_fingerprint(cfg: TinyModelConfig) -> str:
    """The cache key of the base model: its architecture and recipe, and the kernel choice when one is set
    (`numeric_paths.kernel_choice`). Pretraining on another numeric path gives other weights, so a run on that path
    must not reuse the native path's model; on the native path the key is what it always was."""
    from atr_grpo.numeric_paths import kernel_choice

    arch = {k: v for k, v in asdict(cfg).items() if _FINGERPRINT_SILENT_DEFAULTS.get(k, object()) != v}
    fields = {"arch": arch, "recipe": TINY_RECIPE, "corpus": _tokenizer_corpus()[:40]}
    if kernel_choice():
        fields["kernels"] = kernel_choice()
    payload = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def materialize_tiny(cfg: TinyModelConfig, cache_root: str | Path | None = None) -> Path:
    """Build (once) and save the tiny base model and tokenizer; returns their directory.

    The weights are a deterministic function of the architecture and `init_seed`, so every run, the SFT
    cache and standalone evaluation agree on the same base model.
    """
    target = Path(cache_root or cache_dir("tiny")) / tiny_fingerprint(cfg)
    if (target / "config.json").exists():
        return target
    with rundir.file_lock(target.with_name(target.name + ".lock")):
        if not (target / "config.json").exists():  # built by another process while we waited
            with stage("building the tiny base model", loses="the tiny base model's pretraining so far is lost"):
                _build_tiny(cfg, target)
    return target


def _build_tiny(cfg: TinyModelConfig, target: Path) -> None:
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_tiny_tokenizer(cfg.vocab_size)
    model_cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,  # as in Qwen3-1.7B
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(cfg.init_seed)
        model = Qwen3ForCausalLM(model_cfg)
        started = time.time()
        losses = pretrain_tiny(model, tokenizer, cfg)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)  # an interrupted build of this cache entry
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {"arch": asdict(cfg), "pretrain_losses": losses, "seconds": round(time.time() - started, 1)}
    (tmp / "tiny_info.json").write_text(json.dumps(info, indent=1))
    tmp.rename(target)  # atomic: a half-written cache is never picked up
    log.info("built the tiny model in %s", target)
