"""TRL's own loss computation on given per-token log-probs: a trainer's `_compute_loss` with its model pass replaced
by the log-probs, so that a rule can be compared with TRL's implementation in value, gradient and logged metrics."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import torch


def trl_compute_loss(trainer_class, logp, old, advantages, mask, inputs=None, **settings):
    """(loss, gradient to `logp`, the metrics TRL logged) of `trainer_class._compute_loss` on one batch.

    `settings`: the trainer attributes the loss reads (`loss_type`, `epsilon_low`, ...), on top of a trainer that
    trains on one process without accumulation, entropy masking or KL. `inputs`: extra batch inputs (a vLLM
    rollout's `sampling_per_token_logps`, ...)."""
    leaf = logp.clone().requires_grad_()
    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (leaf, torch.zeros_like(leaf), None),
        top_entropy_quantile=1.0,
        beta=0.0,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        _metrics=metrics,
        accelerator=SimpleNamespace(reduce=lambda x, reduction: x, gather=lambda x: x, num_processes=1),
        **settings,
    )
    batch = {
        "prompt_ids": torch.zeros(logp.shape[0], 1, dtype=torch.long),
        "prompt_mask": torch.ones(logp.shape[0], 1, dtype=torch.long),
        "completion_ids": torch.zeros(mask.shape, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old,
        **(inputs or {}),
    }
    loss = trainer_class._compute_loss(trainer, None, batch)
    loss.backward()
    return loss.detach(), leaf.grad, {key: values[-1] for key, values in metrics["train"].items()}


def grpo_settings(logp, loss_type, level="token", epsilon_low=0.2, epsilon_high=0.2, **more):
    """What `GRPOTrainer._compute_loss` reads beyond `trl_compute_loss`'s trainer, for a run without vLLM."""
    return {
        "off_policy_mask_threshold": None,
        "importance_sampling_level": level,
        "loss_type": loss_type,
        "epsilon_low": epsilon_low,
        "epsilon_high": epsilon_high,
        "args": SimpleNamespace(delta=None, steps_per_generation=1),
        "use_vllm": False,
        "vllm_importance_sampling_correction": False,
        "max_completion_length": logp.shape[1],
        "_entropy_bonus_enabled": False,
        "aux_loss_enabled": False,
        **more,
    }
