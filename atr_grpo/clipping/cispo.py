"""CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance-sampling weight, never the token's gradient.

    loss_t = −sg(clip(w_t, 1 − ε_low, 1 + ε_high))·A_t·log π_θ(y_t|s_t)

(the CISPO objective of MiniMax-M1, with ε^IS_low / ε^IS_high). The gradient is −clip(w)·A·∇log π: every token
keeps a gradient, a token outside the interval only has its weight truncated (which is what `clip/frac_*` count
here, whatever the sign of A, as verl's `pg_clipfrac` does). MiniMax-M1 imposes no lower bound ("setting
ε^IS_low to a large value"): `eps_low = 1` is exactly that (w > 0 always). It tunes ε^IS_high without stating a
value; the default 4 (a cap w ≤ 5) is ScaleRL's ε_max = 5 (arXiv 2510.13786), which TRL recommends for its
`loss_type="cispo"` (TRL's `epsilon_high=5.0` is the cap itself, ours is 1 + eps_high). verl's `cispo` clamps
with its PPO keys, 0.2 / 0.2 unless set: `clipping.eps_low=0.2 clipping.eps_high=0.2` reproduces it.
"""

from __future__ import annotations

from typing import Any

from atr_grpo.clipping.base import RuleTerms, TokenBatch, fraction, positive, ratio_from_log, register
from atr_grpo.clipping.ratio import ClipRangeRule


@register
class CISPO(ClipRangeRule):
    """Clipped IS-weight policy optimisation: REINFORCE with a truncated, stop-gradient importance weight."""

    name = "cispo"
    family = "ratio"
    params = (
        fraction("eps_low", 1.0, "weight floor 1 - eps_low; 1 means none (MiniMax-M1: no lower bound)"),
        positive("eps_high", 4.0, "weight cap w ≤ 1 + eps_high (4: the cap of 5 of ScaleRL, as TRL recommends)"),
    )
    summary = "−sg(clip(w, 1−ε_low, 1+ε_high))·A·log π: the weight is truncated, the gradient never dropped"
    source = "CISPO (MiniMax-M1, MiniMax 2025); cap from ScaleRL (Khatri et al. 2025)"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio).detach()
        low, high = self.ratio_bounds()
        weight = ratio.clamp(low, high)
        acts = batch.advantages != 0
        return RuleTerms(
            loss=-weight * batch.advantages * batch.logp,
            frozen_low=acts & (ratio < low),
            frozen_high=acts & (ratio > high),
        )
