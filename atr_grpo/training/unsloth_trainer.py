"""The Unsloth path on a GPU: Unsloth's model (with its colocated vLLM engine for rollouts), its generated
`GRPOTrainer`, the rule installed into its compiled loss (`unsloth_loss`), and the same settings as the
TRL path. Unsloth's config class silently rewrites some values: they are set back before the trainer is
built and checked after it exists, so that the two paths cannot train differently without an error.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from atr_grpo.clipping import ClipRule
from atr_grpo.config import TrainConfig
from atr_grpo.errors import ConfigError
from atr_grpo.training import interrupts

log = logging.getLogger(__name__)

# Unsloth switches that replace the loss normaliser or π_old: the two paths would no longer train alike
UNSUPPORTED_ENV = (
    "UNSLOTH_GRPO_ZERO_VARIANCE_EXCLUDE",
    "UNSLOTH_GRPO_LOSS_AGGREGATION",
    "UNSLOTH_GRPO_ROLLOUT_LOGPROBS_AS_OLD",
)
# TRL's own rollout correction, switched on only so that Unsloth hands the engine's log-probs to the loss
UNUSED_TRL_CORRECTION = {
    "vllm_importance_sampling_mode": "token_truncate",
    "vllm_importance_sampling_clip_min": None,
    "vllm_importance_sampling_clip_max": 2.0,
}
# Attributes GRPOTrainer copies from its args in __init__ (same names); checked after construction
TRAINER_ATTRIBUTES = (
    "beta",
    "loss_type",
    "scale_rewards",
    "mask_truncated_completions",  # off: `RuleTrainerMixin.apply_truncation` masks
    "max_completion_length",
    "num_generations",
    "temperature",
)
# Args that Unsloth's trainer may rewrite inside __init__, after `neutralise_overrides` ran
ARGS_CHECKED_AFTER_INIT = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "bf16",
    "fp16",
    "vllm_mode",  # Unsloth sets colocate whenever the model carries its engine
)


def neutralise_overrides(args: Any, wanted: dict[str, Any]) -> list[str]:
    """Set back every value Unsloth's config class changed; returns "key: theirs -> ours" for each.

    transformers' own normalisations (`report_to="none"` → `[]`) are not Unsloth's and are left alone.
    """
    changed = []
    for key, value in wanted.items():
        current = getattr(args, key, None)
        if key == "report_to" and value == "none" and current in ([], "none", None):
            continue
        if current != value:
            changed.append(f"{key}: {current!r} -> {value!r}")
            setattr(args, key, value)
    return changed


def check_trainer_settings(trainer: Any, wanted: dict[str, Any]) -> None:
    """After `__init__`, the trainer must still train with our settings (it copies some, rewrites others)."""
    for attribute in TRAINER_ATTRIBUTES:
        found = getattr(trainer, attribute, wanted.get(attribute))
        if attribute in wanted and found != wanted[attribute]:
            raise RuntimeError(
                f"the Unsloth trainer changed {attribute} from {wanted[attribute]!r} to {found!r}; "
                "the two training paths would differ (use trainer.backend=trl)"
            )
    for key in ARGS_CHECKED_AFTER_INIT:
        if key in wanted and getattr(trainer.args, key) != wanted[key]:
            found = getattr(trainer.args, key)
            hint = {
                "bf16": " (set trainer.bf16=true, or use trainer.backend=trl)",
                "fp16": " (set trainer.bf16=true, or use trainer.backend=trl)",
                "vllm_mode": " (rollout.vllm.mode=server needs trainer.backend=trl)",
            }.get(key, "")
            raise RuntimeError(f"the Unsloth trainer changed {key} from {wanted[key]!r} to {found!r}{hint}")


def sampling_logprob_values(rollout_engine: str | None) -> dict[str, Any]:
    """TRL's importance-sampling switches for Unsloth's trainer: with vLLM rollouts the correction must be on,
    since Unsloth keeps the engine's log-probs of the sampled tokens for the loss only then.

    What TRL computes with it is never used: its weight would apply in a loss that ours replaces (`unsloth_loss`,
    which weighs with `rollout.correction`), and its `sampling/*` metrics are not recorded (`run_logger`). So TRL
    gets one setting its config accepts, whatever `rollout.correction*` is: some valid settings (correction=none
    with both thresholds null, correction_min = correction_max = 1) would make `GRPOConfig` raise.
    """
    if rollout_engine != "vllm":
        return {"vllm_importance_sampling_correction": False}
    return {"vllm_importance_sampling_correction": True, **UNUSED_TRL_CORRECTION}


def check_environment() -> None:
    set_vars = [name for name in UNSUPPORTED_ENV if os.environ.get(name)]
    if set_vars:
        raise ConfigError(
            f"unset {', '.join(set_vars)}: they change Unsloth's loss normaliser or π_old, so the Unsloth path "
            "would no longer train like the TRL path"
        )


def load_adapter_weights(model: Any, adapter: Path) -> None:
    """Copy a saved LoRA adapter (the SFT stage's) into the model's fresh adapter of the same shape.

    Every LoRA weight of the model must come from the file and every tensor of the file must land: a
    missing or unexpected key is an error (peft would leave the fresh random weights in place).
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(adapter) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, state)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    missing = [key for key in (getattr(result, "missing_keys", []) or []) if "lora_" in key]
    if unexpected or missing:
        raise RuntimeError(
            f"adapter {adapter} does not match the model's LoRA: "
            f"{len(missing)} missing keys {missing[:3]}, {len(unexpected)} unexpected keys {unexpected[:3]}"
        )


def unsloth_model_arguments(cfg: TrainConfig, rollout_engine: str | None) -> dict[str, Any]:
    """What `FastLanguageModel.from_pretrained` is given: the configured weights, exactly (and, for vLLM rollouts,
    a colocated engine).

    Without `use_exact_model_name`, Unsloth swaps a hub id for its own mirror (Qwen/Qwen3-1.7B → unsloth/Qwen3-1.7B,
    its MAP_TO_UNSLOTH_16bit), which may render prompts with another chat template: GRPO would train other weights
    than the SFT stage and the evaluation load (`provenance.loaded_models`).
    """
    from atr_grpo.models import resolve_model_path

    model_cfg = cfg.model
    return dict(
        model_name=resolve_model_path(model_cfg),
        use_exact_model_name=True,
        max_seq_length=model_cfg.max_seq_length,
        dtype=None if model_cfg.dtype == "auto" else getattr(torch, model_cfg.dtype),
        load_in_4bit=model_cfg.load_in_4bit,
        fast_inference=rollout_engine == "vllm",
        max_lora_rank=model_cfg.lora.r,
        gpu_memory_utilization=cfg.rollout.vllm.gpu_memory_utilization,
        random_state=cfg.seed,
    )


def load_unsloth_model(cfg: TrainConfig, adapter: Path | None, rollout_engine: str | None) -> tuple[Any, Any]:
    """Unsloth's model (+ colocated vLLM for vLLM rollouts) with the paper's LoRA, SFT weights loaded."""
    from unsloth import FastLanguageModel  # noqa: I001  (must precede trl/transformers use)

    from atr_grpo.training.rule_trainer import resolve_flag

    lora = cfg.model.lora
    use_vllm = rollout_engine == "vllm"
    model, tokenizer = FastLanguageModel.from_pretrained(**unsloth_model_arguments(cfg, rollout_engine))
    if use_vllm and getattr(model, "vllm_engine", None) is None:  # Unsloth drops fast_inference silently
        raise RuntimeError(
            "rollout.engine=vllm, but Unsloth loaded the model without its vLLM engine (is vllm 0.31.0 installed "
            "and importable?); use rollout.engine=hf to sample with transformers"
        )
    model = FastLanguageModel.get_peft_model(
        model,
        r=lora.r,
        target_modules=list(lora.target_modules),
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        use_gradient_checkpointing="unsloth" if resolve_flag(cfg.trainer.gradient_checkpointing, True) else False,
        random_state=cfg.seed,
    )
    if adapter is not None:
        load_adapter_weights(model, adapter)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


if TYPE_CHECKING:  # the mixin always stands in front of RuleTrainerMixin (imported after unsloth at run time)
    from atr_grpo.training.rule_trainer import RuleTrainerMixin as _RuleTrainer
else:
    _RuleTrainer = object


class UnslothRuleTrainerMixin(_RuleTrainer):
    """In front of `RuleTrainerMixin` and Unsloth's generated `GRPOTrainer`: the rule's constructor, and
    the entropy, which zoo computes only for `get_high_entropy_mask` (every token is kept: the loss is unchanged)."""

    def __init__(
        self, *args: Any, rule: ClipRule, settings: Any, truncation: Any, delta: Any = None, **kwargs: Any
    ) -> None:
        self._setup_rule(rule, settings, delta, truncation)
        super().__init__(*args, **kwargs)
        self.check_stop_ids()

    def get_high_entropy_mask(self, entropies: Tensor, mask: Tensor, threshold: float) -> Tensor:
        if self.model.training:
            self.record_entropy(entropies, mask)
        return mask.bool()


def build_unsloth_trainer(
    cfg: TrainConfig, rule: ClipRule, adapter: Path | None, run_dir: Path, rollout_engine: str | None
) -> tuple[Any, Any]:
    """Unsloth's generated GRPOTrainer with the rule installed, the same settings as the TRL path, sampling with
    `rollout_engine` (the run's, `machine.decide`)."""
    check_environment()
    with interrupts.stage("loading the model"):
        model, tokenizer = load_unsloth_model(cfg, adapter, rollout_engine)  # imports unsloth first: it patches trl

    import trl

    from atr_grpo import rundir
    from atr_grpo.data.datasets import filter_long_prompts, grpo_dataset
    from atr_grpo.rewards import reward_function, truncation_rule
    from atr_grpo.training.rule_trainer import RuleTrainerMixin, delta_control, grpo_arg_values, loss_settings
    from atr_grpo.training.unsloth_loss import install_rule
    from atr_grpo.truncation import stop_token_ids

    namespace = trl.GRPOTrainer.compute_loss.__globals__
    if "grpo_accumulated_loss" not in namespace:
        raise RuntimeError("trl.GRPOTrainer is not Unsloth's generated trainer: import unsloth before trl")

    # with vLLM, Unsloth reuses model.vllm_engine
    wanted = grpo_arg_values(cfg, run_dir / rundir.CHECKPOINT_DIR, rollout_engine)
    wanted.update(
        **sampling_logprob_values(rollout_engine),
        unsloth_num_chunks=-1,
        # any quantile < 1 makes zoo compute per-token entropies; `get_high_entropy_mask` records them and
        # keeps every token, so the loss is unchanged
        top_entropy_quantile=1.0 - 1e-6,
    )
    args = trl.GRPOConfig(**wanted)
    for change in neutralise_overrides(args, wanted):
        log.info("neutralised an Unsloth config override: %s", change)

    trainer_class = type("UnslothRuleTrainer", (UnslothRuleTrainerMixin, RuleTrainerMixin, trl.GRPOTrainer), {})
    with interrupts.stage("building the data"):
        dataset = grpo_dataset(cfg.data, cfg.prompt)
        dataset = filter_long_prompts(dataset, tokenizer, cfg.trainer.max_prompt_length, cfg.prompt.enable_thinking)
    settings = loss_settings(cfg)
    stop_ids = stop_token_ids(model, tokenizer)
    trainer = trainer_class(
        model=model,
        reward_funcs=[reward_function(cfg, stop_ids)],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rule=rule,
        settings=settings,
        truncation=truncation_rule(cfg, stop_ids),
        delta=delta_control(cfg),
    )
    check_trainer_settings(trainer, wanted)
    # for the life of the process (one run per process); on-policy runs keep w ≡ 1 as on the TRL path
    install_rule(namespace, rule, settings, on_policy=cfg.optimizer_steps_per_rollout == 1)
    return trainer, tokenizer
