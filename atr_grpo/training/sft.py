"""The SFT "format" stage (App. B): teach the answer format before GRPO, once per model.

Every clipping method and seed of one model must start GRPO from the same adapter, so the adapter is
cached under a hash of everything that determines it (model, LoRA, SFT settings, prompt, the data
generator for the synthetic task, and the trainer that trains it) and reused; a file lock keeps concurrent
runs on a cluster from training it twice, and the cache entry appears atomically (trained in a temporary
folder, then renamed).

The stage always runs in a process of its own (`atr_grpo.training.stages sft`), through TRL's own
`SFTTrainer`: on a GPU the training process has imported Unsloth, which replaces TRL's trainers with its
generated ones, so training the adapter in that process would make it depend on the machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from atr_grpo import rundir
from atr_grpo.compat import install_trl_logprob_fallback
from atr_grpo.config import TrainConfig
from atr_grpo.config_hydra import config_to_yaml
from atr_grpo.data.datasets import sft_dataset
from atr_grpo.models import load_model_and_tokenizer
from atr_grpo.tiny_model import tiny_fingerprint
from atr_grpo.training.checkpoints import SFT_INFO
from atr_grpo.training.stage_process import RUN_CONFIG, run_stage

log = logging.getLogger(__name__)

ADAPTER_MARKER = "adapter_config.json"
# Bumped when the same config starts to train a different adapter, so that no older cached one is reused.
# 2: the LoRA weights are initialised after seeding (before, their initialisation was unseeded).
SFT_RECIPE = 2


def sft_fingerprint(cfg: TrainConfig) -> dict[str, Any]:
    """What the SFT adapter depends on (and nothing else: not the clipping rule, not the run seed)."""
    sft = {k: v for k, v in asdict(cfg.sft).items() if k != "cache_dir"}
    key: dict[str, Any] = {
        "model": asdict(cfg.model),
        "sft": sft,
        "prompt": asdict(cfg.prompt),
        "trainer": sft_trainer_identity(),
        "recipe": SFT_RECIPE,
    }
    if cfg.model.tiny is not None:  # the locally built base changes with its recipe, not only its config
        key["tiny_base"] = tiny_fingerprint(cfg.model.tiny)
    if cfg.sft.source == "arithmetic":  # the examples come from the task generator
        data = asdict(cfg.data)
        key["data"] = {k: data[k] for k in ("num_train", "num_eval", "max_operand", "operations", "generator_seed")}
        if cfg.data.chain_max > 1:  # (absent for the single-operation task: its adapters keep their keys)
            key["data"]["chain"] = [cfg.data.chain_min, cfg.data.chain_max]
    return key


def sft_trainer_identity() -> str:
    """The trainer that trains the adapter: TRL's own SFTTrainer, at the installed TRL version."""
    from importlib.metadata import version

    return f"trl.SFTTrainer=={version('trl')}"


def sft_cache_key(cfg: TrainConfig) -> str:
    payload = json.dumps(sft_fingerprint(cfg), sort_keys=True, default=str)
    return f"{cfg.model.name}-{cfg.sft.name}-{hashlib.sha256(payload.encode()).hexdigest()[:12]}"


def ensure_sft_adapter(cfg: TrainConfig) -> Path:
    """The cached SFT adapter for this model and SFT config, trained on first use."""
    root = Path(cfg.sft.cache_dir)
    key = sft_cache_key(cfg)
    target = root / key
    if (target / ADAPTER_MARKER).exists():
        log.info("SFT stage: reusing the cached adapter %s", target)
        return target
    with rundir.file_lock(root / f"{key}.lock"):
        if (target / ADAPTER_MARKER).exists():  # another process finished it while we waited
            return target
        staging = root / f"{key}.partial"
        if staging.exists():
            shutil.rmtree(staging)  # leftovers of an interrupted SFT run: ours to remove, never a user file
        staging.mkdir(parents=True)
        (staging / RUN_CONFIG).write_text(config_to_yaml(cfg))
        install_trl_logprob_fallback()  # its line said here, before the stage process, which says it no more
        run_stage("sft", staging)  # a process of its own: pristine TRL on every machine
        (staging / RUN_CONFIG).unlink()
        staging.rename(target)
    return target


def train_sft(cfg: TrainConfig, out_dir: Path) -> None:
    """Train a fresh LoRA adapter on the format data with TRL's SFTTrainer and save it to `out_dir`."""
    import sys

    from transformers import set_seed
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    if "unsloth" in sys.modules:  # its patched SFTTrainer would train a machine-dependent adapter
        raise RuntimeError("the SFT stage must run in a process that has not imported unsloth (stages sft)")

    from atr_grpo.console import LOSS_SHOWN
    from atr_grpo.training.progress import attach_progress

    install_trl_logprob_fallback()  # TRL's fused LM head needs Triton; a no-op where it is present
    sft, cuda = cfg.sft, torch.cuda.is_available()
    started = time.time()
    set_seed(sft.seed)  # before the LoRA weights are initialised: the Trainer seeds only once the model exists
    model, tokenizer = load_model_and_tokenizer(cfg.model, for_training=True)
    dataset = sft_dataset(sft, cfg.data, cfg.prompt, tokenizer, cfg.model.max_seq_length)
    dataset = dataset.add_column(
        "chat_template_kwargs", [{"enable_thinking": cfg.prompt.enable_thinking}] * len(dataset)
    )
    args = TRLSFTConfig(
        output_dir=str(out_dir / "trainer"),
        num_train_epochs=sft.num_epochs,
        learning_rate=sft.learning_rate,
        per_device_train_batch_size=sft.per_device_train_batch_size,
        gradient_accumulation_steps=sft.gradient_accumulation_steps,
        weight_decay=sft.weight_decay,
        warmup_steps=sft.warmup_steps,
        lr_scheduler_type=sft.lr_scheduler_type,
        optim="adamw_torch",
        seed=sft.seed,
        max_length=cfg.model.max_seq_length,
        completion_only_loss=True,  # learn the answer format, not the prompt
        bf16=cuda,
        use_cpu=not cuda,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    attach_progress(trainer, "SFT", LOSS_SHOWN)  # every logged loss is kept in sft_info.json's log_history
    result = trainer.train()
    model.save_pretrained(str(out_dir))
    shutil.rmtree(out_dir / "trainer", ignore_errors=True)
    rundir.write_json(
        out_dir / SFT_INFO,
        {
            "fingerprint": sft_fingerprint(cfg),
            "examples": len(dataset),
            "train_loss": result.training_loss,
            "steps": result.global_step,
            "seconds": round(time.time() - started, 1),
            "log_history": trainer.state.log_history,
        },
    )
    log.info("SFT stage: %d examples, loss %.4f, %.0f s", len(dataset), result.training_loss, time.time() - started)
