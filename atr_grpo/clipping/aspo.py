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
`compute_policy_loss_archer`, called from `verl/workers/actor/dp_actor.py`), with its defaults:

- *ε depends on the token's entropy.* Within each sequence, a token whose entropy under π_θ (over the vocabulary,
  detached; the extra `token_entropy`) is above the sequence's `entropy_quantile` (0.8; `torch.nanquantile` over
  the valid tokens, linear interpolation) gets `high_entropy_eps_low` / `high_entropy_eps_high` (0.4 each); the
  others get `eps_low` / `eps_high` (0.2 each). The code applies this whatever its `use_dynamic_clip` flag says
  (the flag is accepted and unused). Set the high-entropy ε equal to the others for one ε per side.
- c = 3 on both sides.
- *A soft-dual-clipped token's value* is −A·c (continuous with the inside branch at w = c and w = 1/c) where the
  code writes −A·c·log π; the gradient is the same.

The entropy needs one more no-grad forward per micro-batch on our trainer (`training/token_entropy.py`); verl's
policy-loss API passes no entropy, so the verl plugin refuses this rule.

`clip/frac_*` count the clipped and the dual-clipped tokens (weight truncated at c), `clip/frac_dual` the latter.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import (
    ClipRule,
    RuleTerms,
    TokenBatch,
    fraction,
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
        open_unit("eps_low", 0.2, "A < 0 frozen below w = 1 - eps_low, lower-entropy tokens (Archer2.0: 0.2)"),
        positive("eps_high", 0.2, "A > 0 frozen above w = 1 + eps_high, lower-entropy tokens (Archer2.0: 0.2)"),
        fraction("entropy_quantile", 0.8, "tokens above this quantile of their sequence's entropy (Archer2.0: 0.8)"),
        open_unit("high_entropy_eps_low", 0.4, "eps_low of the high-entropy tokens (Archer2.0: 0.4)"),
        positive("high_entropy_eps_high", 0.4, "eps_high of the high-entropy tokens (Archer2.0: 0.4)"),
        number(
            "c",
            3.0,
            "a number > 1",
            lambda v: v > 1,
            "soft dual clip: the weight w (A < 0) or 1/w (A > 0) held at c with its gradient kept (Archer2.0 code: 3)",
        ),
    )
    needs = ("token_entropy",)
    summary = (
        "A > 0: weight 1/w (flipped ratio), A < 0: w; PPO's clip, wider for each sequence's high-entropy tokens, and "
        "weights above c held at c (soft dual clip)"
    )
    source = "ASPO (Wang et al. 2025, arXiv 2510.06062); wizard-III/Archer2.0 `compute_policy_loss_archer`"

    def high_entropy(self, entropy: Tensor, mask: Tensor) -> Tensor:
        """`[B, T]` bool: the tokens above their sequence's `entropy_quantile` of entropy over its valid tokens.

        The quantile is `torch.nanquantile`'s (linear interpolation between the order statistics at ranks
        ⌊q(n−1)⌋ and ⌈q(n−1)⌉ of a sequence's n valid tokens), read from a partial top-k: both ranks lie within
        the k = T − ⌊q(T−1)⌋ largest values, a bound known from the shape. No full sort.
        """
        values = torch.where(mask, entropy.detach().float(), -torch.inf)
        steps = values.shape[-1]
        count = mask.sum(dim=-1, keepdim=True)
        rank = self.entropy_quantile * (count - 1).clamp(min=0).float()
        low, high = rank.floor(), rank.ceil()
        k = min(steps, steps - math.floor(self.entropy_quantile * (steps - 1)))
        top = torch.topk(values, k, dim=-1).values  # descending: the value of ascending rank r is top[n - 1 - r]
        below = top.gather(-1, (count - 1 - low.long()).clamp(min=0, max=k - 1))
        above = top.gather(-1, (count - 1 - high.long()).clamp(min=0, max=k - 1))
        threshold = torch.lerp(below, above, rank - low)
        return (values > threshold) & mask

    def terms(self, batch: TokenBatch, token_entropy: Tensor, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        adv = batch.advantages
        positive_adv, negative_adv = adv > 0, adv < 0
        wide = self.high_entropy(token_entropy, batch.mask)
        widen = wide.to(ratio.dtype)  # a product, not torch.where: the same values, cheaper on CPUs
        low = 1 - self.eps_low - widen * (self.high_entropy_eps_low - self.eps_low)
        high = 1 + self.eps_high + widen * (self.high_entropy_eps_high - self.eps_high)
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
            extra={"clip/frac_dual": dual_low | dual_high, "clip/frac_high_entropy": wide},
        )

    def bounds_text(self) -> str:
        low, high = 1 - self.eps_low, 1 + self.eps_high
        wide_low, wide_high = 1 - self.high_entropy_eps_low, 1 + self.high_entropy_eps_high
        return (
            f"A > 0: weight 1/w on w ∈ [{1 / self.c:.3f}, {high:.3f}]; A < 0: weight w on w ∈ [{low:.3f}, {self.c:g}]; "
            f"tokens above their sequence's {self.entropy_quantile:g} entropy quantile: {wide_high:.3f} and "
            f"{wide_low:.3f}; weights held at c = {self.c:g} beyond, frozen past the clip"
        )
