"""GPPO (Klear-Reasoner, arXiv 2508.07629) and CE-GPPO (arXiv 2509.20712): PPO's clip that keeps the gradient.

Inside [1 − ε_low, 1 + ε_high], or on the side the advantage does not push, a token's loss is PPO's, −w·A. Outside,
on the side it pushes, PPO's value is kept but the clipped ratio is written bound·w/sg(w), whose value is the bound
and whose gradient does not vanish:

    A < 0, w < 1 − ε_low:   loss = −β₁·(1 − ε_low)·A·w/sg(w)     gradient −β₁·(1 − ε_low)·A·∇log π
    A > 0, w > 1 + ε_high:  loss = −β₂·(1 + ε_high)·A·w/sg(w)    gradient −β₂·(1 + ε_high)·A·∇log π
    otherwise:              loss = −w·A                           gradient −w·A·∇log π

and, as in both papers' code (verl's dual clip), A < 0 above w = c has the constant loss −c·A and no gradient.
The gradient outside the box is that of a token sitting on the bound, scaled by β: bounded, never zero.

GPPO is the form with β₁ = β₂ = 1 (Klear-Reasoner: "empirically we set β₁ = β₂ = 1"); its code writes it as PPO's
clamp with the bounds (1 ∓ ε)/sg(w)·w, which is the same loss. CE-GPPO makes β₁, β₂ tunable to steer the entropy:
β₁ scales the gradient of negative tokens pushed below the box, β₂ that of positive tokens pushed above it.

Defaults are each paper's recipe: GPPO ε = (0.2, 0.28) and c = 10 (Klear-Reasoner `recipe/dapo`), CE-GPPO ε = (0.2,
0.2), c = 10, β₁ = 0.75, β₂ = 1 (Kwai-Klear/CE-GPPO, README loss and 7B recipe; its 1.5B recipe uses β₁ = 0.5).
Klear-Reasoner also adds an SFT loss on positive samples (coefficient 0.1); that is not a clipping rule and is not
part of `gppo`. Tokens outside the box count in `clip/frac_*` (their gradient is the bound's, not w's), as the
papers' `pg_clipfrac` counts them; `clip/frac_dual` counts the dual clip.
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import RuleTerms, TokenBatch, positive, ratio_from_log, register
from atr_grpo.clipping.ratio import DualClipRule, dual_clip_params


def gppo_terms(
    batch: TokenBatch, low: float, high: float, beta_low: float, beta_high: float, dual_c: float
) -> RuleTerms:
    """CE-GPPO's per-token loss on [low, high] with gradient scales β₁ = `beta_low`, β₂ = `beta_high` and the dual
    clip c = `dual_c` (see the module docstring)."""
    ratio = ratio_from_log(batch.log_ratio)
    adv = batch.advantages
    below = (adv < 0) & (ratio < low)
    above = (adv > 0) & (ratio > high)
    dual = (adv < 0) & (ratio > dual_c)
    # w/sg(w): value 1, gradient ∇log π (written on the log-prob, so it stays exact however far w is)
    kept = 1 + batch.logp - batch.logp.detach()
    bound = torch.where(below, beta_low * low, beta_high * high)
    weight = torch.where(below | above, bound * kept, torch.where(dual, dual_c, ratio))
    return RuleTerms(loss=-weight * adv, frozen_low=below, frozen_high=above | dual, extra={"clip/frac_dual": dual})


@register
class GPPO(DualClipRule):
    """Gradient-preserving clip (Klear-Reasoner): PPO's value, and the bound's gradient outside the box."""

    name = "gppo"
    family = "ratio"
    params = dual_clip_params(0.2, 0.28, 10.0, "Klear-Reasoner recipe")
    summary = "PPO clip, but a token outside [1−ε_low, 1+ε_high] keeps its bound's gradient, −(1∓ε)·A; dual clip"
    source = "GPPO (Su et al. 2025, Klear-Reasoner, arXiv 2508.07629), GPPO objective; Kwai-Klear code and recipe"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        return gppo_terms(batch, 1 - self.eps_low, 1 + self.eps_high, 1.0, 1.0, self.c)


@register
class CEGPPO(DualClipRule):
    """CE-GPPO: GPPO with the kept gradients scaled by β₁ (A < 0, below the box) and β₂ (A > 0, above it)."""

    name = "ce_gppo"
    family = "ratio"
    params = (
        *dual_clip_params(0.2, 0.2, 10.0, "CE-GPPO recipe"),
        positive("beta_low", 0.75, "β₁: scale of the gradient kept by A < 0 tokens below 1 − eps_low (CE-GPPO: 0.75)"),
        positive("beta_high", 1.0, "β₂: scale of the gradient kept by A > 0 tokens above 1 + eps_high (CE-GPPO: 1)"),
    )
    summary = "GPPO with the gradient kept outside the box scaled: −β₁(1−ε_low)·A below, −β₂(1+ε_high)·A above"
    source = "CE-GPPO (Su et al. 2025, arXiv 2509.20712), general β₁/β₂ objective; Kwai-Klear/CE-GPPO code and recipe"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        return gppo_terms(batch, 1 - self.eps_low, 1 + self.eps_high, self.beta_low, self.beta_high, self.c)
