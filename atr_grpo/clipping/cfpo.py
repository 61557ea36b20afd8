"""CFPO (Clipping-Free Policy Optimization, Çağatan et al. 2026, arXiv 2601.22801): a quadratic penalty, no clip.

CFPO replaces PPO's clipped surrogate with the ratio's surrogate minus a convex quadratic penalty that comes from
the total-variation trust region |w − 1| ≤ ε:

    J_t = w·A − |A|/(2ε)·(w − 1)²,    loss_t = −J_t

(the same objective as SPO, Xie et al. 2024, arXiv 2401.16025). It is differentiable everywhere and no token is ever
frozen: d J/d log π = w·(A − |A|·(w − 1)/ε), which is REINFORCE's −A at w = 1, vanishes exactly at PPO's bound on
the side the advantage pushes (w = 1 + ε for A > 0, 1 − ε for A < 0), and beyond it pulls the ratio back. Each
token's objective is maximal on that bound, which is how the penalty enforces the trust region without one.

CFPO adds no hyperparameter: ε is PPO's clip range, 0.2. `clip/frac` stays 0 (nothing is clipped);
`cfpo/frac_pulled_back` is the fraction of tokens past their optimum, whose gradient points back into the region,
and `cfpo/penalty` the mean penalty |A|/(2ε)·(w − 1)².
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import ClipRule, RuleTerms, TokenBatch, open_unit, ratio_from_log, register


@register
class CFPO(ClipRule):
    """Clipping-free policy optimisation: −(w·A − |A|/(2ε)·(w − 1)²), maximal at PPO's bound, never frozen."""

    name = "cfpo"
    act_metric = None  # freezes no token: clip/frac is 0 by construction
    family = "soft"
    params = (open_unit("eps", 0.2, "the trust region |w − 1| ≤ ε the penalty comes from (CFPO: PPO's ε, 0.2)"),)
    summary = "−(w·A − |A|/(2ε)·(w−1)²): a quadratic TV penalty instead of the clip, optimal at w = 1 ± ε"
    source = "CFPO (Çağatan et al. 2026, arXiv 2601.22801), the CFPO objective"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        adv = batch.advantages
        penalty = adv.abs() / (2 * self.eps) * (ratio - 1) ** 2
        never = torch.zeros_like(batch.mask)
        pulled_back = ((adv > 0) & (ratio > 1 + self.eps)) | ((adv < 0) & (ratio < 1 - self.eps))
        return RuleTerms(
            loss=penalty - ratio * adv,
            frozen_low=never,
            frozen_high=never,
            extra={"cfpo/frac_pulled_back": pulled_back, "cfpo/penalty": penalty.detach()},
        )
