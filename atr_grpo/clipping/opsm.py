"""DeepSeek-V3.2's off-policy sequence masking (DeepSeek-AI 2025, arXiv 2512.02556, Eq. 9), on PPO's clip.

A sequence whose advantage is negative and whose policy has drifted too far is left out of the update:

    M_i = 0  if  A_i < 0  and  1/|y_i| · Σ_t log(π_old(y_t|s_t) / π_θ(y_t|s_t)) > δ,   else 1
    loss_t = −M_i · min(w_t·A_t, clip(w_t, 1 − ε_low, 1 + ε_high)·A_t)

The mask is computed from detached log-probs: a kept sequence has PPO's gradient, a dropped one none. TRL applies
it with `off_policy_mask_threshold=δ` on top of any `loss_type`; here it is one rule, on TRL's clipped surrogate.
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import ClipRule, RuleTerms, TokenBatch, format_interval, positive, register
from atr_grpo.clipping.ratio import clip_range, ppo_clip_terms


@register
class OPSM(ClipRule):
    """Off-policy sequence masking (DeepSeek-V3.2 Eq. 9) on PPO's clipped surrogate, TRL 1.15's conventions.

    - The divergence is the mean over the sequence's valid tokens of log π_old − log π_θ (the k1 estimate of
      KL(π_old ‖ π_θ)), detached, not clamped, as TRL's `get_off_policy_mask` computes it; the sign test uses each
      token's advantage (A_t < 0), which for GRPO's sequence advantage is A_i's.
    - π_old here is the trainer's old policy. DeepSeek-V3.2 measures the drift from the rollout engine's sampling
      probabilities, and TRL does so when vLLM gives them (`sampling_per_token_logps`, else π_old). Ours counts the
      optimizer's drift only; the engine mismatch is the rollout correction's (`rollout.correction`, applied after
      the rule, as TRL multiplies its IS ratio after the mask). On a batch without the engine's log-probs TRL and
      this rule are the same (tests/clipping/test_rivals_trl.py).
    - The clip is TRL's default `loss_type` surrogate, ε = 0.2 on both sides (`epsilon=0.2`, `epsilon_high=None`).
      δ = 0.5 is TRL's documented example value (its default is None, i.e. off; DeepSeek-V3.2 gives none): a choice.
    - Aggregation is not the mask's: TRL applies it under any `loss_type`; with `dapo` (TRL's default) its loss is
      ours under `token_mean`.

    `clip/frac` counts the tokens PPO's clip freezes and the tokens of dropped sequences; `opsm/masked` the latter
    alone.
    """

    name = "opsm"
    family = "divergence"
    params = (
        *clip_range(0.2, 0.2, "TRL epsilon"),
        positive("threshold", 0.5, "δ: a negative-advantage sequence with mean log(π_old/π_θ) above it is dropped"),
    )
    summary = "clip, and A < 0 sequences with mean_t log(π_old/π_θ) > δ dropped"
    source = "DeepSeek-V3.2 (DeepSeek-AI 2025) Eq. 9; TRL 1.15 `off_policy_mask_threshold`"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        # mean_t log(π_old/π_θ) > δ  ⇔  Σ_t log(π_old/π_θ) > δ·|y_i| (log w is 0 off the mask; an empty row is kept)
        drift = -batch.log_ratio.detach().sum(dim=-1, keepdim=True)  # [B, 1]
        beyond = drift > self.threshold * batch.mask.sum(dim=-1, keepdim=True)
        dropped = beyond & (batch.advantages < 0)  # [B, T]
        terms = ppo_clip_terms(batch, 1 - self.eps_low, 1 + self.eps_high)
        terms.loss = torch.where(dropped, 0.0, terms.loss)
        terms.frozen_other = dropped
        terms.extra["opsm/masked"] = dropped
        return terms

    def bounds_text(self) -> str:
        interval = format_interval(1 - self.eps_low, 1 + self.eps_high)
        return f"{interval}; A < 0 sequences dropped where mean log(π_old/π_θ) > {self.threshold:g}"
