"""ASPO (Asymmetric Importance Sampling Policy Optimization, arXiv 2510.06062): the flipped ratio for A > 0.

PPO weights a token's gradient by its ratio w, so a positive token the policy already likes (w > 1) is pushed harder
and one it dislikes (w < 1) softer. ASPO flips the importance ratio of positive-advantage tokens, weighting them by
1/w, and keeps PPO's clip on the side the advantage pushes, with a soft dual clip: where the weight would exceed c,
the token keeps the gradient at weight c instead of losing it. Per token, with the weight of −A·∇log π:

    A > 0:   0 if w > 1 + ε_high (clipped),   1/w if 1/c ≤ w ≤ 1 + ε_high,   c if w < 1/c (soft dual clip)
    A < 0:   0 if w < 1 − ε_low (clipped),    w   if 1 − ε_low ≤ w ≤ c,      c if w > c   (soft dual clip)

Written as losses: A > 0 inside, −A·sg(1/w)·w/sg(w) (value −A/w); A < 0 inside, PPO's −A·max(w, 1 − ε_low);
a clipped token keeps its value, −A/(1 + ε_high) or −A·(1 − ε_low), without gradient; a soft-dual-clipped token
has −A·c·(1 + log π − sg(log π)), value −A·c and gradient −A·c·∇log π. On-policy (w = 1) this is REINFORCE.

From the authors' code (wizard-III/Archer2.0 at b08d963, `verl/trainer/ppo/core_algos.py`
`compute_policy_loss_archer`, called from `verl/workers/actor/dp_actor.py`) with its defaults ε = 0.2 and c = 3 on
both sides. What is implemented and what is not:

- *Not implemented: the entropy-dependent ε.* The code sets ε per token from the entropy of π_θ(·|s_t) over the
  vocabulary (the actor's forward pass, detached): within each sequence, the tokens whose entropy exceeds the
  sequence's 0.8 quantile (`torch.nanquantile` over the valid tokens, linear interpolation) get ε = 0.4 on both
  sides, the others ε = 0.2. A rule here receives per-token log-probs, advantages and a mask, not that entropy, so
  this rule has one ε per side, the code's value for the lower-entropy tokens. Adding it needs an extra carrying
  the per-token entropy (`clipping.extras`) with its trainer provider, which does not exist yet.
- *A soft-dual-clipped token's value* is −A·c (continuous with the inside branch at w = c and w = 1/c) where the
  code writes −A·c·log π; the gradient is the same.

`clip/frac_*` count the clipped and the dual-clipped tokens (weight truncated at c), `clip/frac_dual` the latter.
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import (
    ClipRule,
    RuleTerms,
    TokenBatch,
    number,
    open_unit,
    positive,
    ratio_from_log,
    register,
)


@register
class ASPO(ClipRule):
    """Flipped importance ratio 1/w for positive-advantage tokens, PPO's clip, and a soft dual clip at c."""

    name = "aspo"
    family = "ratio"
    params = (
        open_unit("eps_low", 0.2, "A < 0 frozen below w = 1 - eps_low (Archer2.0 code: 0.2)"),
        positive("eps_high", 0.2, "A > 0 frozen above w = 1 + eps_high (Archer2.0 code: 0.2)"),
        number(
            "c",
            3.0,
            "a number > 1",
            lambda v: v > 1,
            "soft dual clip: the weight w (A < 0) or 1/w (A > 0) held at c with its gradient kept (Archer2.0 code: 3)",
        ),
    )
    summary = "A > 0: weight 1/w (flipped ratio), A < 0: w; PPO's clip, and weights above c held at c (soft dual clip)"
    source = (
        "ASPO (Wang et al. 2025, arXiv 2510.06062); wizard-III/Archer2.0 `compute_policy_loss_archer` (one ε per side)"
    )

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        adv = batch.advantages
        positive_adv, negative_adv = adv > 0, adv < 0
        low, high = 1 - self.eps_low, 1 + self.eps_high
        clipped_low = negative_adv & (ratio < low)
        clipped_high = positive_adv & (ratio > high)
        dual_low = positive_adv & (ratio < 1 / self.c)  # flipped weight 1/w above c
        dual_high = negative_adv & (ratio > self.c)
        kept = 1 + batch.logp - batch.logp.detach()  # value 1, gradient ∇log π
        flipped = kept / ratio.detach()  # value 1/w, gradient (1/w)·∇log π
        inside = torch.where(positive_adv, flipped, ratio)
        held = torch.where(positive_adv, 1 / high, low)  # a clipped token's constant weight
        weight = torch.where(clipped_low | clipped_high, held, inside)
        weight = torch.where(dual_low | dual_high, self.c * kept, weight)
        return RuleTerms(
            loss=-weight * adv,
            frozen_low=clipped_low | dual_low,
            frozen_high=clipped_high | dual_high,
            extra={"clip/frac_dual": dual_low | dual_high},
        )

    def bounds_text(self) -> str:
        low, high = 1 - self.eps_low, 1 + self.eps_high
        return (
            f"A > 0: weight 1/w on w ∈ [{1 / self.c:.3f}, {high:.3f}]; A < 0: weight w on w ∈ [{low:.3f}, {self.c:g}]; "
            f"weights held at c = {self.c:g} beyond, frozen past the clip"
        )
