"""TOPR (Tapered Off-Policy REINFORCE, Le Roux et al. 2025, arXiv 2503.14286): SFT on positives, truncated IS on
negatives.

TOPR's gradient (its Eq. for ∇J_TOPR) treats a sample by the sign of its reward, here its advantage:

    A ≥ 0:  −A·∇log π(y)                        plain SFT (REINFORCE) whatever the ratio: no importance weight
    A < 0:  −A·[π(y)/μ(y)]₀¹·∇log π(y)          truncated IS: the ratio capped at 1, as a stop-gradient weight

so a negative sample whose probability has already fallen (ratio < 1) fades out instead of being pushed to −∞, and
a positive one is learned at full strength however unlikely it has become. As a per-token loss,

    loss_t = −sg(ρ)·A_t·log π_θ(y_t),   ρ = 1 if A_t ≥ 0,   ρ = min(1, π_θ(y)/π_old(y)) if A_t < 0

(π_old, the policy that sampled the batch, is the paper's μ). With `ratio_level="sequence"` (the paper's) the
ratio is the sequence's, exp(Σ_t log w_t) over its valid tokens, and log π(y) = Σ_t log π(y_t) spreads over the
tokens; `ratio_level="token"` caps each token's own ratio instead (a choice the paper does not make, offered for
long sequences, where the sequence ratio is a product of many token ratios). The paper's baseline c (R − c) is the
advantage here (GRPO's group baseline). Its objective sums log π over a sequence's tokens: the default `dr_grpo`
aggregation (a token sum with a constant normaliser) is that objective up to a constant.

Negative tokens whose ratio is truncated (ratio > 1) count in `clip/frac_high`; `topr/weight` is the mean weight ρ.
On-policy (ratio 1) every weight is 1: REINFORCE.
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import ClipRule, RuleTerms, TokenBatch, choice, register


@register
class TOPR(ClipRule):
    """Tapered off-policy REINFORCE: weight 1 for A ≥ 0, the truncated ratio min(1, π/μ) (detached) for A < 0."""

    name = "topr"
    family = "ratio"
    params = (
        choice(
            "ratio_level",
            "sequence",
            ("sequence", "token"),
            "the ratio truncated for A < 0: the sequence's, exp(Σ_t log w_t) (TOPR paper), or each token's own",
        ),
    )
    summary = "−sg(ρ)·A·log π: ρ = 1 for A ≥ 0 (SFT), ρ = min(1, π_θ/π_old) of the sequence for A < 0 (tapered IS)"
    source = "TOPR (Le Roux et al. 2025, arXiv 2503.14286), the TOPR gradient (§3)"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        log_ratio = batch.log_ratio.detach()
        if self.ratio_level == "sequence":  # a parameter, not a tensor value: the branch is fixed per rule
            log_ratio = torch.where(batch.mask, log_ratio, 0.0).sum(dim=-1, keepdim=True).expand_as(log_ratio)
        negative = batch.advantages < 0
        weight = torch.where(negative, torch.exp(log_ratio.clamp(max=0.0)), 1.0)  # min(1, e^s) = e^min(s, 0)
        never = torch.zeros_like(batch.mask)
        return RuleTerms(
            loss=-weight * batch.advantages * batch.logp,
            frozen_low=never,
            frozen_high=negative & (log_ratio > 0),
            extra={"topr/weight": weight},
        )
