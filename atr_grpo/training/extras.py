"""How our trainer provides each extra a rule needs (`clipping.extras` declares the extras themselves).

A provider turns a `TrainerBatch`, what the trainer knows when it computes a micro-batch's loss, into the extra's
value. A provider may run the model (π_old's full-vocabulary KL does), which is why this side lives with the
trainer and not in `clipping/`. Every registered extra needs one here: `register_trainer_extra` adds one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.extras import TOPK_K, describe, key_seed_from
from atr_grpo.training.token_entropy import entropy_ratio, token_entropy
from atr_grpo.training.topk_divergence import topk_divergence
from atr_grpo.training.vocab_kl import full_vocab_kl


@dataclass(frozen=True)
class TrainerBatch:
    """What our trainer knows when it computes a micro-batch's loss (T = the completion tokens)."""

    like: Tensor  # [B, T] in the layout (and on the device) of the rule's inputs
    on_policy: bool  # no π_old log-probs for this update: π_old = π_θ
    # the micro-batch's own random stream, a function of (seed, optimizer step, micro-batch, process) only: a
    # resumed run draws what an uninterrupted one would
    random: Callable[[], torch.Generator]
    model: Any  # π_θ (unwrapped)
    old_weights: dict[str, Tensor] | None  # π_old's trainable weights, kept at rollout when an extra asks for them
    input_ids: Tensor  # [B, prompt + T]
    attention_mask: Tensor  # [B, prompt + T]
    logits_to_keep: int  # T
    temperature: float  # the sampling temperature the log-probs are computed at
    # π_θ's entropy per completion token when the trainer's own forward pass computed it (TRL's path): no second pass
    entropy: Tensor | None = None


@dataclass(frozen=True)
class TrainerProvider:
    compute: Callable[[TrainerBatch], Any]
    old_weights: bool = False  # `compute` reads π_old's weights: the trainer keeps them at each rollout
    runs_model: bool = False  # `compute` runs a forward pass of the model (tests without a model stand in for it)


TRAINER_PROVIDERS: dict[str, TrainerProvider] = {}


def register_trainer_extra(
    name: str, compute: Callable[[TrainerBatch], Any], old_weights: bool = False, runs_model: bool = False
) -> None:
    """How the trainer provides the extra `name` (registered in `clipping.extras`)."""
    if name in TRAINER_PROVIDERS:
        raise ValueError(f"the trainer's provider of the extra {name!r} is registered twice")
    TRAINER_PROVIDERS[name] = TrainerProvider(compute, old_weights, runs_model or old_weights)


def provider(name: str) -> TrainerProvider:
    """The trainer's provider of `name`; ValueError naming the extra when there is none."""
    if name not in TRAINER_PROVIDERS:
        raise ValueError(
            f"the trainer cannot provide the extra {describe(name)}: no provider is registered (add one with "
            "training.extras.register_trainer_extra)"
        )
    return TRAINER_PROVIDERS[name]


def trainer_extras(needs: Iterable[str], batch: TrainerBatch) -> dict[str, Any]:
    """The extras `needs` names, as our trainer provides them for `batch`."""
    return {name: provider(name).compute(batch) for name in needs}


def keeps_old_weights(needs: Iterable[str]) -> bool:
    """Whether the trainer must keep π_old's weights at each rollout for these extras (ValueError, naming it, for an
    extra the trainer cannot provide)."""
    return any([provider(name).old_weights for name in needs])


# ------------------------------------------------------------------------------------------- the providers
def full_kl_from_trainer(batch: TrainerBatch) -> Tensor:
    """The exact KL from π_old's kept weights; 0 on-policy (π_old = π_θ)."""
    if batch.on_policy or batch.old_weights is None:
        return torch.zeros_like(batch.like, dtype=torch.float32)
    return full_vocab_kl(
        batch.model, batch.old_weights, batch.input_ids, batch.attention_mask, batch.logits_to_keep, batch.temperature
    )


def token_entropy_from_trainer(batch: TrainerBatch) -> Tensor:
    """π_θ's entropy at each completion token: the trainer's own, or else from one more no-grad forward."""
    if batch.entropy is not None:
        return batch.entropy.detach()
    return token_entropy(batch.model, batch.input_ids, batch.attention_mask, batch.logits_to_keep, batch.temperature)


def entropy_ratio_from_trainer(batch: TrainerBatch) -> Tensor:
    """H(π_θ)/H(π_old) at each completion token from π_old's kept weights; 1 on-policy (π_old = π_θ)."""
    if batch.on_policy or batch.old_weights is None:
        return torch.ones_like(batch.like, dtype=torch.float32)
    return entropy_ratio(
        batch.model, batch.old_weights, batch.input_ids, batch.attention_mask, batch.logits_to_keep, batch.temperature
    )


def topk_from_trainer(which: int) -> Callable[[TrainerBatch], Tensor]:
    """DPPO's top-K TV (`which` 0) or KL (1) from π_old's kept weights; 0 on-policy (π_old = π_θ)."""

    def compute(batch: TrainerBatch) -> Tensor:
        if batch.on_policy or batch.old_weights is None:
            return torch.zeros_like(batch.like, dtype=torch.float32)
        return topk_divergence(
            batch.model,
            batch.old_weights,
            batch.input_ids,
            batch.attention_mask,
            batch.logits_to_keep,
            batch.temperature,
            TOPK_K,
        )[which]

    return compute


register_trainer_extra("key_seed", lambda batch: key_seed_from(batch.random()))
register_trainer_extra("token_entropy", token_entropy_from_trainer, runs_model=True)
register_trainer_extra("full_kl", full_kl_from_trainer, old_weights=True)
register_trainer_extra("entropy_ratio", entropy_ratio_from_trainer, old_weights=True)
register_trainer_extra("topk_tv", topk_from_trainer(0), old_weights=True)
register_trainer_extra("topk_kl", topk_from_trainer(1), old_weights=True)
