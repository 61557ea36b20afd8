"""The GRPO loss: the rule's per-token loss, the optional KL-to-reference regulariser, and aggregation.

`grpo_loss` is the one composition both trainer paths call (TRL's `_compute_loss` and the function
injected into Unsloth's compiled loss): rule → × rollout-correction weight → + β·KL → aggregation →
÷ gradient-accumulation steps; a rollout rejection (`rollout.rejection`) first takes the rejected sequences out of
the mask, so that everything after it, the aggregation's normaliser included, sees only the kept ones. A rule that
owns the rollout correction gets the sampling log-ratio instead of the weight. It is
pure tensor code (no `.item()`, no branching on tensor values), so it also runs under `torch.compile`.

Aggregation is a separate axis from the clipping rule (the clipping rule is the unit of study; docs/framework.md):

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

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from atr_grpo.clipping.base import (
    LOG_RATIO_LIMIT,
    SAMPLING_LOG_RATIO,
    ClipRule,
    RuleTerms,
    TokenBatch,
    make_batch,
    ratio_from_log,
    rule_metrics,
)
from atr_grpo.rollout_correction import RolloutCorrection, sampling_log_ratio

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


def length_weighting(rule: ClipRule | type[ClipRule], mode: str) -> str | None:
    """What changes when `rule`, defined per sequence, is aggregated by `mode`: None, or a sentence saying that a
    token sum weighs each sequence by its length (TRL warns the same for `importance_sampling_level="sequence"`
    with `dr_grpo`). Each front end adds the setting that restores the source's objective."""
    native = rule.native_aggregation
    if native is None or native in TOKEN_SUMS or mode not in TOKEN_SUMS:
        return None
    return (
        f"clipping rule {rule.name!r} is defined per sequence with {native} aggregation; {mode} sums over tokens, "
        "so each sequence's loss is weighted by its length"
    )


def resolve_aggregation(configured: str, rule: ClipRule | type[ClipRule]) -> tuple[str, str | None]:
    """The aggregation to use for `rule` when `configured` (one of AGGREGATION_CHOICES) is asked for, and a
    one-line notice for the user (None when there is nothing to say: see `length_weighting`).

    `native` is the rule's `native_aggregation` (GSPO, GMPO: `seq_mean`), or DEFAULT_AGGREGATION for a rule that
    declares none.
    """
    if configured not in AGGREGATION_CHOICES:
        raise ValueError(f"unknown loss aggregation {configured!r}; allowed: {', '.join(AGGREGATION_CHOICES)}")
    native = rule.native_aggregation
    mode = (native or DEFAULT_AGGREGATION) if configured == "native" else configured
    notice = length_weighting(rule, mode)
    if notice is None:
        return mode, None
    return mode, f"{notice} (set trainer.loss_agg=native or {native} for the source's objective)"


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


# ------------------------------------------------------------------------------------------ the GRPO loss
@dataclass(frozen=True)
class LossSettings:
    """Everything besides the rule that shapes the loss (trainer.* keys of the config, and rollout.correction*)."""

    loss_agg: str = "dr_grpo"
    max_completion_length: int | None = None  # Dr.GRPO's constant normaliser L_max
    beta: float = 0.0  # weight of the KL to the reference policy (0 in the paper)
    kl_estimator: str = "k3"
    kl_importance_weight: bool = True
    correction: RolloutCorrection = RolloutCorrection()  # the rollout engine's mismatch (none by default)

    def __post_init__(self) -> None:
        if self.loss_agg not in AGGREGATIONS:
            raise ValueError(f"unknown loss aggregation {self.loss_agg!r}; allowed: {', '.join(AGGREGATIONS)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {self.kl_estimator!r}; allowed: {', '.join(KL_ESTIMATORS)}")


class GRPOLoss(NamedTuple):
    """The loss of one micro-batch and what it was made of (all `[B, T]` unless noted)."""

    loss: Tensor  # scalar to backpropagate, already divided by the gradient-accumulation steps
    batch: TokenBatch  # the validated inputs the rule saw
    terms: RuleTerms  # the rule's loss and frozen-token masks
    kl_ref: Tensor | None  # the per-token KL-to-reference estimate, when β > 0
    correction_weight: Tensor | None  # the rollout-correction weight ρ `[B, T]` or `[B, 1]`, when a correction is set
    # with a rollout rejection: the completion's mask before it (`batch.mask` is what it kept) and π_old's log-probs
    # on all of it (`batch.old_logp` is 0 on the rejected tokens); None without a rejection
    completion_mask: Tensor | None = None
    completion_old_logp: Tensor | None = None

    def metrics(self) -> dict[str, float]:
        """The rule's metrics (`clip/*`, `ratio/*`, `kl/kl3_mean`, ...) over valid tokens; one host sync."""
        return rule_metrics(self.batch, self.terms)


def owned_correction_input(
    rule: ClipRule, settings: LossSettings, batch: TokenBatch, sampling_logp: Tensor | None
) -> Tensor:
    """The sampling log-ratio a rule that owns the rollout correction receives (log π_old − log π_sampler `[B, T]`);
    ValueError when the engine's log-probs are missing, or when a correction of ours is also set."""
    if settings.correction.active:
        raise ValueError(
            f"clipping rule {rule.name!r} applies the rollout correction itself; set rollout.correction=none and "
            f"rollout.rejection=none (got {settings.correction.kind}, {settings.correction.rejection})"
        )
    if sampling_logp is None:
        raise ValueError(
            f"clipping rule {rule.name!r} owns the rollout correction and needs the rollout engine's log-probs "
            "(sampling_logp)"
        )
    return sampling_log_ratio(batch.old_logp, sampling_logp, batch.mask)


def grpo_loss(
    rule: ClipRule,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: LossSettings,
    *,
    ref_logp: Tensor | None = None,
    sampling_logp: Tensor | None = None,
    gradient_accumulation_steps: int | Tensor = 1,
    extras: dict[str, Any] | None = None,
) -> GRPOLoss:
    """rejection → rule → × ρ (settings.correction) → + β·KL(π_θ ‖ π_ref) → aggregation → ÷ accumulation steps.

    logp `[B, T]` carries the gradient; old_logp, ref_logp, sampling_logp `[B, T]` and advantages `[B]`/`[B, T]`
    do not; mask `[B, T]` marks the completion tokens that count. `sampling_logp` is the rollout engine's log-prob
    of each sampled token, from which `settings.correction` weighs the rule's per-token loss (`rollout_correction`;
    needed only when a correction is set, or when the rule owns it: `owned_correction_input`). `extras` are the
    rule's inputs (e.g. `key_seed`, `full_kl`, `delta`): per token `[B, T]` in the layout of `logp`, per sequence
    `[B, 1]`, or 0-d.
    """
    correction = settings.correction
    if correction.active and sampling_logp is None:
        setting = (
            f"rollout.correction={correction.kind}"
            if correction.weighs
            else f"rollout.rejection={correction.rejection}"
        )
        raise ValueError(f"{setting} needs the rollout engine's log-probs (sampling_logp)")
    completion_mask = completion_old_logp = None
    if correction.rejects and sampling_logp is not None:  # verl: the rejected sequences leave the response mask
        completion_mask = mask.bool()
        mask = completion_mask & correction.kept(old_logp, sampling_logp, completion_mask)
        completion_old_logp = old_logp.detach()
    batch = make_batch(logp, old_logp, advantages, mask)
    extras = dict(extras or {})
    if rule.owns_correction:
        extras[SAMPLING_LOG_RATIO] = owned_correction_input(rule, settings, batch, sampling_logp)
    per_token, terms = rule.apply(batch, **extras)
    correction_weight = None
    if correction.weighs and sampling_logp is not None:  # ρ over the whole completion, as verl computes it
        if completion_mask is None:
            correction_weight = correction.weight(batch.old_logp, sampling_logp, batch.mask)
        else:
            correction_weight = correction.weight(old_logp, sampling_logp, completion_mask)
        per_token = per_token * torch.where(batch.mask, correction_weight, 0.0)
    kl_ref = None
    if settings.beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs the reference policy's log-probs (ref_logp)")
        weight = ratio_from_log(batch.log_ratio) if settings.kl_importance_weight else None
        kl_ref = kl_penalty(logp, ref_logp, mask, settings.kl_estimator, weight)
        per_token = per_token + settings.beta * kl_ref
    loss = aggregate(per_token, mask, settings.loss_agg, settings.max_completion_length)
    return GRPOLoss(
        loss / gradient_accumulation_steps,
        batch,
        terms,
        kl_ref,
        correction_weight,
        completion_mask,
        completion_old_logp,
    )
