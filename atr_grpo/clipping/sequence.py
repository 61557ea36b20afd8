"""Sequence-level rules: the log importance ratio (GSPO) or its clipped value (GMPO) is averaged over each completion.

A sequence-level rule still returns a `[B, T]` per-token loss, so that aggregation stays a separate axis: on
every valid token of sequence i it carries sequence i's value, and padding is 0. Under `seq_mean` (mean over
sequences of the token mean, the rules' native aggregation, `native_aggregation = "seq_mean"`) the loss is
then exactly the paper's per-sequence objective; under a token sum (`dr_grpo`, `token_mean`) each sequence is
weighted by its length (`losses.resolve_aggregation` says so). Every reduction over t uses the mask only, never
positions, so left-packed rows (Unsloth's layout) give the same loss.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import (
    LOG_RATIO_LIMIT,
    ClipRule,
    RuleTerms,
    TokenBatch,
    format_interval,
    open_unit,
    positive,
    ratio_from_log,
    register,
)
from atr_grpo.clipping.ratio import ppo_clip_terms


def sequence_mean(values: Tensor, mask: Tensor) -> Tensor:
    """`[B, 1]`: the mean of `values` `[B, T]` over each row's valid tokens (0 for a row without any)."""
    total = torch.where(mask, values, 0.0).sum(dim=-1, keepdim=True)
    return total / mask.sum(dim=-1, keepdim=True).clamp(min=1)


@register
class GSPO(ClipRule):
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071): the objective of its Eq. 5,

        −min(s_i·A_i, clip(s_i, 1 − ε_low, 1 + ε_high)·A_i),   s_i = exp(mean_t log w_{i,t}),

    s_i being the length-normalised sequence ratio (the geometric mean of the token ratios), with the clipping
    ranges the paper trains with, 3e-4 and 4e-4.

    Computed in the paper's GSPO-token form: the token ratio w̃_t = sg(s_i)·π_θ(y_t)/sg(π_θ(y_t)) inside PPO's
    min, which is verl's `gspo` loss (verl clamps log s_i at 10, here at ±20). w̃_t has the value s_i on every
    token, and its gradient at token t is s_i·∇log π(y_t). TRL's `importance_sampling_level="sequence"` instead
    broadcasts the `[B, 1]` loss −min(s_i·A_i, clip(s_i)·A_i), whose gradient flows through the mean: at token t
    it is s_i/|y_i|·∇log π(y_t), summed over the |y_i| tokens that carry the value. The two have the same value
    and, for an advantage constant over the sequence (GRPO's), the same gradient under any aggregation that
    weighs a sequence's tokens alike (all of `losses.AGGREGATIONS`); they differ only for per-token advantages.
    A clipped sequence is frozen on all its tokens: `clip/frac` is the fraction of tokens in clipped sequences.
    """

    name = "gspo"
    family = "ratio"
    native_aggregation = "seq_mean"
    params = (
        open_unit("eps_low", 3e-4, "sequence clip: s_i ≥ 1 - eps_low (GSPO paper: 3e-4)"),
        open_unit("eps_high", 4e-4, "sequence clip: s_i ≤ 1 + eps_high (GSPO paper: 4e-4)"),
    )
    summary = "PPO clip of the sequence ratio s_i = exp(mean_t log w_t) ∈ [1−ε_low, 1+ε_high]"
    source = "GSPO (Zheng et al. 2025), Eq. 5 and its GSPO-token form"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        mean_log_ratio = sequence_mean(batch.log_ratio.detach(), batch.mask).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        token_form = mean_log_ratio + batch.logp - batch.logp.detach()  # log w̃_t: value log s_i
        terms = ppo_clip_terms(batch._replace(log_ratio=token_form), 1 - self.eps_low, 1 + self.eps_high)
        terms.extra["ratio/seq_mean"] = torch.exp(mean_log_ratio).expand_as(batch.logp)
        return terms

    def bounds_text(self) -> str:
        interval = format_interval(1 - self.eps_low, 1 + self.eps_high, "s_i", digits=5)
        return f"{interval} (s_i: the sequence's geometric-mean ratio)"


@register
class GMPO(ClipRule):
    """Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv 2507.20673): the geometric mean of the token
    ratios, each clipped in log space on the side the advantage pushes (PPO's min written in log space),

        loss_i = −A_i · exp(mean_t clip_A(log w_t)),   clip_A(s) = min(s, clamp(s, −ε_low, ε_high)) if A > 0,
                                                                     max(s, clamp(s, −ε_low, ε_high)) otherwise,

    with ε = 0.4 on both sides, i.e. token ratios in (e^−0.4, e^0.4) = (0.670, 1.492), the paper's recommended
    range (verl `geo_mean`, TRL `experimental.gmpo`). A_i is the sequence's mean advantage (verl's reading; it is
    GRPO's sequence advantage). Sequence-level in value: loss_i on each valid token of sequence i, whose gradient
    flows through the mean; under seq_mean (native) the loss is verl's and TRL's plain mean over sequences. A token
    clipped on its side has no gradient: `clip/frac_*` count those tokens.
    """

    name = "gmpo"
    family = "ratio"
    native_aggregation = "seq_mean"
    params = (
        positive("eps_low", 0.4, "log-space clip: log w ≥ −eps_low on the side A < 0 pushes (GMPO: 0.4)"),
        positive("eps_high", 0.4, "log-space clip: log w ≤ eps_high on the side A > 0 pushes (GMPO: 0.4)"),
    )
    summary = "−A_i·exp(mean_t log w_t), each log w_t clipped to [−ε_low, ε_high] on the side A pushes"
    source = "GMPO (Zhao et al. 2025); verl `geo_mean`, TRL `experimental.gmpo`"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        log_ratio, adv = batch.log_ratio, batch.advantages
        # min(s, clamp(s, −ε_low, ε_high)) = min(s, ε_high) for A > 0, and max(…) = max(s, −ε_low) otherwise
        clipped = torch.where(adv > 0, log_ratio.clamp(max=self.eps_high), log_ratio.clamp(min=-self.eps_low))
        sequence_ratio = ratio_from_log(sequence_mean(clipped, batch.mask))  # [B, 1], gradient through the mean
        loss = -sequence_mean(adv, batch.mask) * sequence_ratio
        return RuleTerms(
            loss=loss.expand_as(log_ratio),
            frozen_low=(adv < 0) & (log_ratio < -self.eps_low),
            frozen_high=(adv > 0) & (log_ratio > self.eps_high),
            extra={"ratio/seq_mean": sequence_ratio.detach().expand_as(log_ratio)},
        )

    def ratio_bounds(self) -> tuple[float, float]:
        return math.exp(-self.eps_low), math.exp(self.eps_high)

    def bounds_text(self) -> str:
        return f"{format_interval(*self.ratio_bounds())} per token, inside the sequence's geometric mean"
