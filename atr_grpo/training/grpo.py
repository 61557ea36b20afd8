"""The TRL path: `GRPOTrainer` with Dr.GRPO aggregation whose only varying part is the registered rule.

TRL keeps generation, rewards, advantages, the rollout buffer and old log-probs; `_compute_loss` is
replaced so that the per-token loss comes from `atr_grpo.clipping` (one call, no per-method branches)
and every rule logs the same `clip/*`, `ratio/*` and `kl/*` metrics.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from atr_grpo.clipping import ClipRule
from atr_grpo.compat import install_trl_logprob_fallback
from atr_grpo.config import TrainConfig
from atr_grpo.losses import aggregate, kl_penalty
from atr_grpo.training.full_kl import adapter_snapshot, full_vocab_kl

install_trl_logprob_fallback()  # a no-op where TRL's Triton kernel imported


def _flag(value: str, default: bool) -> bool:
    return default if value == "auto" else value == "true"


def grpo_arg_values(cfg: TrainConfig, output_dir: str | Path, use_vllm: bool = False) -> dict[str, Any]:
    """TRL's config values from ours. Everything that changes the loss or the sampler is set explicitly
    (both paths use these; Unsloth's config class changes some silently, see unsloth_backend)."""
    tr, cuda = cfg.trainer, torch.cuda.is_available()
    return dict(
        output_dir=str(output_dir),
        seed=cfg.seed,
        # batching and staleness (rollout.*): how many optimizer steps share one generation batch
        per_device_train_batch_size=tr.per_device_train_batch_size,
        gradient_accumulation_steps=tr.gradient_accumulation_steps,
        num_generations=tr.num_generations,
        steps_per_generation=cfg.steps_per_generation,
        num_iterations=cfg.rollout.num_iterations,
        # sampling
        temperature=tr.temperature,
        top_p=tr.top_p,
        top_k=0 if tr.top_k == -1 else tr.top_k,  # TRL/transformers: 0 = off
        max_completion_length=tr.max_completion_length,
        chat_template_kwargs={"enable_thinking": cfg.prompt.enable_thinking},
        # loss: our _compute_loss does the work; these keep TRL's own bookkeeping consistent with it
        loss_type="dr_grpo",
        scale_rewards=tr.scale_rewards,
        beta=tr.beta,
        mask_truncated_completions=tr.mask_truncated_completions,
        disable_dropout=True,  # stale ratios must come from the update, not from dropout masks
        vllm_importance_sampling_correction=tr.vllm_importance_sampling_correction,
        use_vllm=use_vllm,
        # optimisation
        learning_rate=tr.learning_rate,
        weight_decay=tr.weight_decay,
        optim=tr.optim,
        adam_beta1=tr.adam_beta1,
        adam_beta2=tr.adam_beta2,
        lr_scheduler_type=tr.lr_scheduler_type,
        warmup_steps=tr.warmup_ratio,  # transformers 5: a float in [0, 1) is a fraction of max_steps
        max_grad_norm=tr.max_grad_norm,
        max_steps=tr.max_steps,
        bf16=_flag(tr.bf16, cuda),
        gradient_checkpointing=_flag(tr.gradient_checkpointing, cuda),
        use_cpu=not cuda,
        # bookkeeping
        logging_steps=tr.logging_steps,
        save_strategy="steps",
        save_steps=tr.save_steps,
        save_total_limit=tr.save_total_limit,
        report_to="none",  # W&B is fed by our own callback, with the same keys as metrics.jsonl
        log_completions=tr.log_completions,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )


def grpo_args(cfg: TrainConfig, output_dir: str | Path, use_vllm: bool = False) -> GRPOConfig:
    """TRL's `GRPOConfig` for the TRL path."""
    return GRPOConfig(**grpo_arg_values(cfg, output_dir, use_vllm))


def rule_generator(seed: int, global_step: int, micro_step: int) -> torch.Generator:
    """A generator for randomised rules (Clip-Cov) that depends only on (seed, position in training),
    so a resumed run draws exactly what an uninterrupted one would."""
    digest = hashlib.sha256(f"{seed}:{global_step}:{micro_step}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


class RuleTrainerMixin:
    """What both trainer paths (TRL's GRPOTrainer and Unsloth's generated one) add for the rule: a snapshot
    of π_old's adapter at each rollout (for `full_kl`) and the per-token extras a rule needs."""

    def _setup_rule(self, rule: ClipRule, loss_agg: str, kl_estimator: str, kl_importance_weight: bool) -> None:
        self.rule = rule
        self.loss_agg = loss_agg
        self.kl_estimator = kl_estimator
        self.kl_importance_weight = kl_importance_weight
        self._old_adapter: dict[str, torch.Tensor] | None = None

    # π_old for the full-vocabulary KL: the weights that generated this rollout
    def _generate_and_score_completions(self, inputs: Any) -> Any:
        if "full_kl" in self.rule.needs:
            self._old_adapter = adapter_snapshot(self.accelerator.unwrap_model(self.model))
        return super()._generate_and_score_completions(inputs)  # type: ignore[misc]

    def rule_extras(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        like: torch.Tensor,
        has_old: bool,
    ) -> dict[str, Any]:
        """Extras in the layout of `like` ([B, logits_to_keep]): a seeded generator, the full-vocabulary KL."""
        extras: dict[str, Any] = {}
        if "generator" in self.rule.needs:
            extras["generator"] = rule_generator(self.args.seed, self.state.global_step, self._step)
        if "full_kl" in self.rule.needs:
            if not has_old or self._old_adapter is None:
                extras["full_kl"] = torch.zeros_like(like, dtype=torch.float32)  # on-policy: π_old = π_θ
            else:
                extras["full_kl"] = full_vocab_kl(
                    self.accelerator.unwrap_model(model),
                    self._old_adapter,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    self.temperature,
                )
        return extras


class RuleGRPOTrainer(RuleTrainerMixin, GRPOTrainer):
    """GRPOTrainer whose per-token loss is `rule` and whose aggregation is `loss_agg` (Dr.GRPO by default)."""

    def __init__(
        self,
        *args: Any,
        rule: ClipRule,
        loss_agg: str = "dr_grpo",
        kl_estimator: str = "k3",
        kl_importance_weight: bool = True,
        **kwargs: Any,
    ) -> None:
        self._setup_rule(rule, loss_agg, kl_estimator, kl_importance_weight)
        super().__init__(*args, **kwargs)

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
        # TRL skips the old-log-prob forward when every update is on-policy; then π_old = π_θ (w ≡ 1)
        old_logp = inputs.get("old_per_token_logps")
        old_logp = logp.detach() if old_logp is None else old_logp

        has_old = inputs.get("old_per_token_logps") is not None
        extras = self.rule_extras(model, input_ids, attention_mask, logits_to_keep, logp, has_old)
        out = self.rule(logp, old_logp, inputs["advantages"], mask, **extras)
        per_token_loss = out.loss
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        if self.beta != 0.0:
            weight = torch.exp(logp - old_logp) if self.kl_importance_weight else None
            penalty = kl_penalty(logp, inputs["ref_per_token_logps"], mask, self.kl_estimator, weight)
            per_token_loss = per_token_loss + self.beta * penalty

        loss = aggregate(per_token_loss, mask, self.loss_agg, self.max_completion_length)
        mode = "train" if self.model.training else "eval"
        if mode == "train":  # TRL scales for gradient accumulation inside the loss (loss_is_scaled_for_ga)
            loss = loss / self.current_gradient_accumulation_steps

        metrics = self._metrics[mode]
        valid = mask.bool()
        metrics["entropy"].append((entropies[valid].float().mean().item()) if valid.any() else float("nan"))
        for key, value in out.metrics.items():
            metrics[key].append(value)
        if self.beta != 0.0:
            metrics["kl_ref"].append(float((penalty * mask).sum() / mask.sum().clamp(min=1)))
        return loss
