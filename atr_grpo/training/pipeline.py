"""One training run, top to bottom: run directory → SFT format stage → GRPO with the rule → evaluation.

prepare_run_dir   refuse to overwrite; on resume=true check the config matches and find the checkpoint
ensure_sft_adapter the cached format-stage adapter all methods of a model start from
build the trainer TRL path (CPU, or GPU without Unsloth) or Unsloth path (GPU, vLLM rollouts)
train             checkpoints every save_steps, metrics.jsonl every step, evaluation every every_steps
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.clipping import RULES, build_rule
from atr_grpo.config import ConfigError, TrainConfig

log = logging.getLogger(__name__)

# keys that may change when a run is resumed (they do not change what the run computes)
RESUMABLE_CHANGES = ("resume", "logger")


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (it would overwrite or mix runs)."""


@dataclass
class RunState:
    run_dir: Path
    resume_from: Path | None  # the newest checkpoint when resuming
    finished: bool  # the run already reached its last step


# ------------------------------------------------------------------------------------------ run dir
def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ, ignoring keys a resume may change."""
    a, b = _flatten(saved), _flatten(current)
    keys = sorted(set(a) | set(b))
    return [k for k in keys if a.get(k) != b.get(k) and not k.startswith(RESUMABLE_CHANGES)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    folder = run_dir / rundir.CHECKPOINT_DIR
    found = [p for p in folder.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()] if folder.exists() else []
    return max(found, key=lambda p: int(p.name.split("-")[-1])) if found else None


def prepare_run_dir(cfg: TrainConfig, config_yaml: str) -> RunState:
    """Create a fresh run directory, or continue the run already in it. Never overwrites a run."""
    run_dir = Path(cfg.run_dir)
    config_path = run_dir / rundir.CONFIG_FILE
    if not config_path.exists():
        if cfg.resume:
            raise RunDirError(f"resume=true but {run_dir} holds no run to continue (no {rundir.CONFIG_FILE})")
        if (run_dir / rundir.CHECKPOINT_DIR).exists() or (run_dir / rundir.METRICS_FILE).exists():
            raise RunDirError(f"{run_dir} holds checkpoints or metrics but no config.yaml; refusing to write into it")
        rundir.write_text(config_path, config_yaml, overwrite=False)
        rundir.write_json(run_dir / rundir.ENV_FILE, rundir.environment(), overwrite=False)
        return RunState(run_dir, None, False)
    # A re-launch of the same config (resume=true, a requeued cluster job, the same command again) continues
    # the run; any other config is refused, so one directory never mixes two runs.
    saved = OmegaConf.to_container(OmegaConf.load(config_path), resolve=True)
    current = OmegaConf.to_container(OmegaConf.create(config_yaml), resolve=True)
    diff = config_differences(saved, current)  # type: ignore[arg-type]
    if diff:
        raise RunDirError(
            f"{run_dir} already holds a run started with a different config (differing keys: {', '.join(diff)}); "
            "choose another run_dir (e.g. another seed or experiment). Nothing was changed."
        )
    env_path = run_dir / rundir.ENV_FILE
    env = rundir.read_json(env_path) if env_path.exists() else {}
    env.setdefault("resumes", []).append(rundir.environment())
    rundir.write_json(env_path, env)
    if (run_dir / rundir.DONE_FILE).exists():
        return RunState(run_dir, None, True)
    return RunState(run_dir, latest_checkpoint(run_dir), False)


# ------------------------------------------------------------------------------------------ checks
def clipping_can_act(cfg: TrainConfig) -> bool:
    return RULES[cfg.clipping.name].acts_on_policy or cfg.optimizer_steps_per_rollout > 1


def warn_if_on_policy(cfg: TrainConfig) -> str | None:
    """The warning of a run whose clipping rule cannot change a single gradient (printed to stderr)."""
    if clipping_can_act(cfg):
        return None
    message = (
        f"WARNING: every update of this run is on-policy (rollout.steps_per_generation = "
        f"trainer.gradient_accumulation_steps = {cfg.trainer.gradient_accumulation_steps} and "
        f"rollout.num_iterations = 1), so w ≡ 1 and the clipping rule {cfg.clipping.name!r} cannot act: every "
        "ratio-based rule gives the same gradient. Use rollout=reuse2 or raise rollout.num_iterations."
    )
    print(message, file=sys.stderr)
    log.warning(message)
    return message


def choose_backend(cfg: TrainConfig) -> str:
    if cfg.trainer.backend == "trl":
        return "trl"
    cuda = torch.cuda.is_available()
    unsloth_ok = cuda and _importable("unsloth")
    if cfg.trainer.backend == "unsloth" and not unsloth_ok:
        raise ConfigError("invalid config: trainer.backend='unsloth' needs a CUDA GPU and `pip install -e .[gpu]`")
    return "unsloth" if unsloth_ok else "trl"


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# ------------------------------------------------------------------------------------------ the run
def filter_long_prompts(dataset: Any, tokenizer: Any, cfg: TrainConfig) -> Any:
    """Drop prompts longer than trainer.max_prompt_length tokens (TRL 1.15 does not truncate prompts)."""
    limit = cfg.trainer.max_prompt_length

    def fits(example: dict[str, Any]) -> bool:
        text = tokenizer.apply_chat_template(
            example["prompt"],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=cfg.prompt.enable_thinking,
        )
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= limit

    kept = dataset.filter(fits)
    if len(kept) < len(dataset):
        log.info("kept %d of %d prompts within %d tokens", len(kept), len(dataset), limit)
    if len(kept) == 0:
        raise ConfigError(f"invalid config: no training prompt fits trainer.max_prompt_length={limit}")
    return kept


def run_training(cfg: TrainConfig, config_yaml: str, callbacks: Sequence[Any] = ()) -> Path:
    """Run (or resume, or skip when finished) one training run; returns its run directory.

    `callbacks`: extra transformers `TrainerCallback`s (e.g. a user's probe), added after ours.
    """
    backend = choose_backend(cfg)
    if backend == "unsloth":
        import unsloth  # noqa: F401  (first: it patches transformers and rewrites trl's GRPOTrainer)
    from transformers import set_seed

    from atr_grpo.data.datasets import grpo_dataset
    from atr_grpo.training.eval_hook import build_eval_callback
    from atr_grpo.training.logging import MetricsCallback, RunLogger, truncate_metrics
    from atr_grpo.training.sft import ensure_sft_adapter

    rule = build_rule(cfg.clipping.name, **cfg.clipping.params())
    state = prepare_run_dir(cfg, config_yaml)
    if state.finished:
        print(f"{state.run_dir}: already finished; nothing to do")
        return state.run_dir
    warn_if_on_policy(cfg)
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    set_seed(cfg.seed)
    started = time.time()

    adapter = ensure_sft_adapter(cfg) if cfg.sft.enabled else None
    if state.resume_from is not None:
        moved = truncate_metrics(state.run_dir, int(state.resume_from.name.split("-")[-1]))
        log.info("resuming from %s (%d metric lines set aside)", state.resume_from, moved)
    logger = RunLogger(cfg, state.run_dir)
    try:
        if backend == "unsloth":
            from atr_grpo.training.unsloth_backend import build_unsloth_trainer

            trainer, tokenizer = build_unsloth_trainer(cfg, rule, adapter, state.run_dir)
        else:
            trainer, tokenizer = build_trl_trainer(cfg, rule, adapter, state.run_dir, grpo_dataset)
        trainer.add_callback(MetricsCallback(logger))
        if cfg.eval.enabled:
            trainer.add_callback(build_eval_callback(cfg, trainer, tokenizer, state.run_dir, logger, backend))
        for callback in callbacks:
            trainer.add_callback(callback)
        trainer.train(resume_from_checkpoint=str(state.resume_from) if state.resume_from else None)
        final = state.run_dir / "final_adapter"
        if not final.exists():
            trainer.model.save_pretrained(str(final))
        rundir.write_json(
            state.run_dir / rundir.DONE_FILE,
            {
                "step": trainer.state.global_step,
                "seconds": round(time.time() - started, 1),
                "backend": backend,
            },
        )
    finally:
        logger.finish()
    return state.run_dir


def build_trl_trainer(cfg: TrainConfig, rule: Any, adapter: Path | None, run_dir: Path, dataset_fn: Any) -> tuple:
    """TRL path: transformers + peft model (the SFT adapter, trainable) and the rule's GRPOTrainer."""
    from atr_grpo.models import load_model_and_tokenizer
    from atr_grpo.rewards import math_verify_reward
    from atr_grpo.training.grpo import RuleGRPOTrainer, grpo_args

    model, tokenizer = load_model_and_tokenizer(cfg.model, adapter_path=adapter, for_training=True)
    dataset = filter_long_prompts(dataset_fn(cfg.data, cfg.prompt), tokenizer, cfg)
    trainer = RuleGRPOTrainer(
        model=model,
        reward_funcs=[math_verify_reward],
        args=grpo_args(cfg, run_dir / rundir.CHECKPOINT_DIR),
        train_dataset=dataset,
        processing_class=tokenizer,
        rule=rule,
        loss_agg=cfg.trainer.loss_agg,
        kl_estimator=cfg.trainer.kl_estimator,
        kl_importance_weight=cfg.trainer.kl_importance_weight,
    )
    return trainer, tokenizer
