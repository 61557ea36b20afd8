"""Soft adaptive policy optimisation (SAPO, Gao et al. 2025): a sigmoid gate instead of a hard clip.

    f(w) = σ(τ (w - 1)) · 4 / τ,   J_t = f(w_t) A_t,   τ = τ_pos if A > 0 else τ_neg

∂J/∂log π = A · 4σ(1-σ) · w = A · sech²(τ(w-1)/2) · w: the REINFORCE gradient at w = 1, smoothly
damped on both sides of 1 for both signs of A. No token is ever hard-frozen, so `clip/frac` is 0;
`sapo/gate_mean` reports the mean damping factor 4σ(1-σ) instead.
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import ClipRule, RuleTerms, TokenBatch, positive, ratio_from_log, register


@register
class SAPO(ClipRule):
    name = "sapo"
    act_metric = None  # freezes no token: clip/frac is 0 by construction
    family = "soft"
    params = (
        positive("tau_pos", 1.0, "gate temperature for A > 0 (SAPO default 1.0)"),
        positive("tau_neg", 1.05, "gate temperature for A ≤ 0 (SAPO default 1.05)"),
    )
    summary = "soft gate σ(τ(w−1))·4/τ instead of a hard clip"
    source = "SAPO (Gao et al. 2025)"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        adv = batch.advantages
        tau = torch.where(adv > 0, self.tau_pos, self.tau_neg)
        sigma = torch.sigmoid(tau * (ratio - 1))
        never = torch.zeros_like(batch.mask)
        return RuleTerms(
            loss=-(sigma * 4 / tau) * adv,
            frozen_low=never,
            frozen_high=never,
            extra={"sapo/gate_mean": (4 * sigma * (1 - sigma)).detach()},
        )
