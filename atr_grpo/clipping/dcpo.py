"""Dynamic clipping (DCPO, Yang et al. 2025b): ratio bounds that widen for tokens π_old found unlikely.

DCPO bounds the probability change |(p/q - 1)·p| ≤ ε with q = π_old(y_t|s_t), which gives (paper Table 1)

    r_low(q)  = 0.5 + 0.5·sqrt(max(1 - 4 ε_low / q, 0))
    r_high(q) = 0.5 + 0.5·sqrt(1 + 4 ε_high / q)

used inside PPO's min, plus the dual clip c·A for negative advantages. For q = 0.9 and (0.16, 0.2) the
interval is [0.7687, 1.1872]; rare tokens get up to sqrt(ε/q) more room upwards and a floor of 0.5 below.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import RuleTerms, TokenBatch, register
from atr_grpo.clipping.ratio import DualClipRule, dual_clip_params, ppo_clip_terms

# 4ε/q is evaluated as 4ε·exp(-log q); beyond exp(80) the bound is capped at c anyway
_MAX_NEG_LOGQ = 80.0


def dcpo_ratio_bounds(old_logp: Tensor, eps_low: float, eps_high: float, c: float) -> tuple[Tensor, Tensor]:
    """Per-token (r_low, r_high) from log π_old, computed in log space (q → 0 never divides by zero).

    r_high is capped at c. DCPO's code caps it at max(c, 10) and runs with c = 10; capping at c itself
    keeps the upper bound consistent with the dual clip, which freezes every A < 0 token above c anyway
    (with the default c = 10 the two readings coincide).
    """
    inv_q = torch.exp((-old_logp.detach().float()).clamp(max=_MAX_NEG_LOGQ))
    low = 0.5 + 0.5 * torch.sqrt(torch.clamp(1 - 4 * eps_low * inv_q, min=0.0))
    high = 0.5 + 0.5 * torch.sqrt(1 + 4 * eps_high * inv_q)
    return low, torch.clamp(high, max=c)


@register
class DCPO(DualClipRule):
    """DCPO's dynamic-adaptive ratio bounds (from π_old of each token) inside PPO's min, with dual clip."""

    name = "dcpo"
    family = "ratio"
    params = dual_clip_params(0.16, 0.2, 10.0, "DCPO §4.1 and recipe")
    summary = "per-token bounds from π_old, plus dual clip"
    source = "DCPO (Yang et al. 2025b), Table 1"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        low, high = dcpo_ratio_bounds(batch.old_logp, self.eps_low, self.eps_high, self.c)
        return ppo_clip_terms(batch, low, high, dual_c=self.c)

    def ratio_bounds(self) -> None:
        return None  # per token: see old_prob_bounds

    def old_prob_bounds(self, old_prob: Tensor) -> tuple[Tensor, Tensor]:
        return dcpo_ratio_bounds(torch.log(old_prob), self.eps_low, self.eps_high, self.c)
