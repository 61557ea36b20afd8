"""Loading models and tokenizers: hub checkpoints or local directories, with a LoRA adapter (the tiny CPU model is
built by `atr_grpo.tiny_model`).

The GPU path (Unsloth + vLLM) lives in `atr_grpo.training.unsloth_trainer`; this module is the
transformers + peft path used on CPU, on GPUs without Unsloth, and by the HF evaluation backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from atr_grpo.config_inputs import LoraConfig, ModelConfig
from atr_grpo.tiny_model import materialize_tiny


def resolve_model_path(cfg: ModelConfig) -> str:
    """The directory or hub id to load: the tiny model is materialised in the local cache first."""
    if cfg.tiny is not None and cfg.path is None:
        return str(materialize_tiny(cfg.tiny))
    assert cfg.path is not None
    return cfg.path


def torch_dtype(cfg: ModelConfig) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, cfg.dtype)


def peft_lora_config(lora: LoraConfig) -> Any:
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def load_tokenizer(cfg: ModelConfig) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generation batches are left-padded
    return tokenizer


def load_model_and_tokenizer(
    cfg: ModelConfig, adapter_path: str | Path | None = None, for_training: bool = False
) -> tuple[Any, Any]:
    """A transformers model (wrapped with LoRA when training or when an adapter is given) and its tokenizer.

    for_training=True: the model carries a trainable LoRA adapter: `adapter_path`'s if given (the SFT
    stage's adapter, continued by GRPO), otherwise a fresh one with the configured rank.
    """
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(cfg)
    tokenizer = load_tokenizer(cfg)
    from atr_grpo.distributed import local_device

    # this process's own GPU under a launcher (every process on cuda:0 would put N copies on one GPU)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(cfg)).to(local_device())
    if adapter_path is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_path), is_trainable=for_training)
    elif for_training:
        from peft import get_peft_model

        model = get_peft_model(model, peft_lora_config(cfg.lora))
    if not for_training:
        model.eval()
    return model, tokenizer
