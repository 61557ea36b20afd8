"""NSR, Near-boundary Stochastic Rescue (Yang et al. 2026, arXiv 2605.22703): DAPO's clip, except that a token
clipped only slightly past its bound keeps its gradient with probability p.

PPO's clip drops a token's gradient once its ratio passes the bound on the side its advantage pushes (`ratio.py`).
The paper finds informative tokens just past the bound and keeps each of them by a Bernoulli draw; deep
violations stay clipped. With low = 1 − ε_low, high = 1 + ε_high and b the band's width:

    near_t = (A_t > 0 and high < w_t ≤ high + b)  or  (A_t < 0 and low − b ≤ w_t < low)
    rescued_t = near_t and u_t < p,         u_t ~ U[0, 1) per token
    loss_t = −w_t·A_t if rescued_t, else −min(w_t·A_t, clip(w_t, low, high)·A_t)

In expectation a near token's gradient is p times the unclipped one; the paper reports the draw works better than
that deterministic decay. u_t comes from Clip-Cov's seeded stream (`cov.py`): the extra `key_seed` and the hashed
keys, u_t = key/2³², salted by the token's log π_old instead of its row. So a run is deterministic given its seed, a
sequence draws the same alone or in any micro-batch, and the TRL and Unsloth paths agree whatever the padding.

Source. The paper's equations could not be read here: the stored pages on arXiv 2605.22703 give its abstract and
summaries only, and no code was found. What they fix: a Bernoulli draw keeps "slightly out-of-bound tokens", the
ones hard clipping gives a zero gradient, and leaves deeper violations clipped; in expectation it is a gradient
decay, which the paper's ablation finds weaker than the draw; its baselines are DAPO and GSPO. Read from that: the
candidates are PPO's clipped tokens, so both bounds and both signs of A, each on the side its advantage pushes.
This project's, not read: the band's form (additive in w) and width b = 0.1, a constant p = 0.5 (the paper's p may
depend on the distance to the bound), and DAPO's clip (0.2, 0.28) as the base.

`nsr/frac_rescued` counts the rescued tokens, `nsr/frac_near` the candidates; `clip/frac_*` the clipped tokens that
were not rescued.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import ClipRule, RuleTerms, TokenBatch, fraction, positive, ratio_from_log, register
from atr_grpo.clipping.cov import hashed_words
from atr_grpo.clipping.ratio import clip_range


def draws_below(key_seed: Tensor, batch: TokenBatch, probability: float) -> Tensor:
    """`[B, T]` bool: u_t < `probability`, u_t = the hashed key of (seed, index among the row's valid tokens, the bits
    of the token's float32 log π_old) over 2³². Salted by log π_old, not by the row, so that a sequence draws the same
    alone as in any micro-batch. Compared as int32 words: flipping the sign bit makes signed order the unsigned one."""
    if probability >= 1:
        return torch.ones_like(batch.mask)
    words = hashed_words(key_seed.to(batch.mask.device), batch.mask, batch.old_logp.float().view(torch.int32))
    words ^= -(2**31)
    return words < int(probability * 2**32) - 2**31


@register
class NSR(ClipRule):
    """DAPO's clip; a token clipped within `band` of its bound keeps its gradient with probability `rescue_prob`."""

    name = "nsr"
    family = "ratio"
    needs = ("key_seed",)
    params = (
        *clip_range(0.2, 0.28, "DAPO, NSR's baseline"),
        positive(
            "band", 0.1, "width b of the near-boundary band in w past each bound (this project's: paper not read)"
        ),
        fraction("rescue_prob", 0.5, "probability p that a near token keeps its gradient (this project's)"),
    )
    summary = "clip w ∈ [1−ε_low, 1+ε_high]; a token clipped by at most `band` keeps −w·A with probability p"
    source = (
        "NSR (Yang et al. 2026, arXiv 2605.22703) on DAPO; the paper's equations and code could not be read: the "
        "band's form, band = 0.1 and a constant rescue_prob = 0.5 are this project's"
    )

    def terms(self, batch: TokenBatch, key_seed: Tensor, **_: Any) -> RuleTerms:
        low, high = 1 - self.eps_low, 1 + self.eps_high
        ratio, adv = ratio_from_log(batch.log_ratio), batch.advantages
        frozen_low, frozen_high = (adv < 0) & (ratio < low), (adv > 0) & (ratio > high)  # PPO's clipped tokens
        near = (frozen_high & (ratio <= high + self.band)) | (frozen_low & (ratio >= low - self.band))
        rescued = near & draws_below(key_seed, batch, self.rescue_prob)
        # PPO's min picks w·A on every token it does not clip, and the constant clip(w)·A on a clipped one
        stays_clipped = (frozen_low | frozen_high) & ~rescued
        weight = torch.where(stays_clipped, ratio.clamp(low, high), ratio)
        return RuleTerms(
            loss=-weight * adv,
            frozen_low=frozen_low & ~rescued,
            frozen_high=frozen_high & ~rescued,
            extra={"nsr/frac_rescued": rescued, "nsr/frac_near": near},
        )

    def bounds_text(self) -> str:
        low, high = 1 - self.eps_low, 1 + self.eps_high
        return (
            f"w ∈ [{low:.3g}, {high:.3g}]; rescued with probability {self.rescue_prob:g} in "
            f"[{low - self.band:.3g}, {low:.3g}) and ({high:.3g}, {high + self.band:.3g}]"
        )
