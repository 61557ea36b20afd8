"""Aggregation of per-token losses, and the optional KL-to-reference regulariser.

Aggregation is a separate axis from the clipping rule (STYLE.md §1):

    dr_grpo     Σ_tokens ℓ / (B · L_max)       Dr.GRPO (Liu et al. 2025c), the paper's backbone: a constant
                                               normaliser, so long and short answers weigh per token alike
    token_mean  Σ_tokens ℓ / Σ_tokens 1        DAPO's token-level mean ("bnpo" in TRL)
    seq_mean    mean_i (Σ_t ℓ_it / |o_i|)      GRPO's original per-sequence mean (length-biased); the objective of
                                               the sequence-level rules (GSPO, GMPO: their `native_aggregation`)
    native      the rule's own aggregation     `resolve_aggregation` turns it into one of the three above

The regulariser follows the RPG paper (Zhang et al. 2025): with samples drawn from π_old, an estimator
k(π_θ, π_ref) of KL(π_θ ‖ π_ref) is only unbiased, in value and in gradient, once multiplied by the
importance weight w = π_θ/π_old (which carries gradient). β = 0 in the paper, so it is off by default.
"""

from __future__ import annotations

import torch
from torch import Tensor

from atr_grpo.clipping.base import LOG_RATIO_LIMIT, ClipRule

AGGREGATIONS = ("dr_grpo", "token_mean", "seq_mean")
AGGREGATION_CHOICES = (*AGGREGATIONS, "native")  # what a config may ask for
DEFAULT_AGGREGATION = "dr_grpo"  # the paper's backbone; `native` for a rule that declares no aggregation
TOKEN_SUMS = ("dr_grpo", "token_mean")  # sums over tokens: a sequence weighs as much as it has tokens
KL_ESTIMATORS = ("k1", "k2", "k3")


def aggregate(
    per_token_loss: Tensor, mask: Tensor, mode: str = "dr_grpo", max_completion_length: int | None = None
) -> Tensor:
    """Scalar loss from `[B, T]` per-token losses and a `[B, T]` mask (bool or 0/1)."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; allowed: {', '.join(AGGREGATIONS)}")
    weights = mask.to(per_token_loss.dtype)
    masked = torch.where(mask.bool(), per_token_loss, 0.0)
    if mode == "dr_grpo":
        if not max_completion_length or max_completion_length <= 0:
            raise ValueError("dr_grpo aggregation needs max_completion_length > 0 (its constant normaliser)")
        return masked.sum() / (per_token_loss.shape[0] * max_completion_length)
    if mode == "token_mean":
        return masked.sum() / weights.sum().clamp(min=1.0)
    return (masked.sum(-1) / weights.sum(-1).clamp(min=1.0)).mean()


def resolve_aggregation(configured: str, rule: ClipRule | type[ClipRule]) -> tuple[str, str | None]:
    """The aggregation to use for `rule` when `configured` (one of AGGREGATION_CHOICES) is asked for, and a
    one-line notice for the user (None when there is nothing to say).

    `native` is the rule's `native_aggregation` (GSPO, GMPO: `seq_mean`), or DEFAULT_AGGREGATION for a rule that
    declares none. The notice says when a rule defined per sequence is aggregated by a token sum (TRL warns the
    same for `importance_sampling_level="sequence"` with `dr_grpo`): each sequence then weighs by its length.
    """
    if configured not in AGGREGATION_CHOICES:
        raise ValueError(f"unknown loss aggregation {configured!r}; allowed: {', '.join(AGGREGATION_CHOICES)}")
    native = rule.native_aggregation
    mode = (native or DEFAULT_AGGREGATION) if configured == "native" else configured
    if native is None or native in TOKEN_SUMS or mode not in TOKEN_SUMS:
        return mode, None
    return mode, (
        f"clipping rule {rule.name!r} is defined per sequence with {native} aggregation; {mode} sums over tokens, "
        f"so each sequence's loss is weighted by its length (set trainer.loss_agg=native or {native} for the "
        "source's objective)"
    )


def kl_penalty(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    estimator: str = "k3",
    importance_weight: Tensor | None = None,
) -> Tensor:
    """Per-token `[B, T]` estimate of KL(π_θ ‖ π_ref) to add (times β) to the per-token loss.

    With r = π_ref/π_θ: k1 = -log r, k2 = ½ (log r)², k3 = r - 1 - log r (Schulman 2020). Pass
    `importance_weight` = w = π_θ/π_old (with its gradient) when the tokens were sampled from π_old.
    Masked positions are 0.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; allowed: {', '.join(KL_ESTIMATORS)}")
    valid = mask.bool()
    log_r = torch.where(valid, ref_logp.detach().float() - logp.float(), 0.0).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    if estimator == "k1":
        value = -log_r
    elif estimator == "k2":
        value = 0.5 * log_r**2
    else:
        value = torch.expm1(log_r) - log_r
    if importance_weight is not None:
        value = value * torch.where(valid, importance_weight.float(), 0.0)
    return torch.where(valid, value, 0.0)
