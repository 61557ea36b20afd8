"""DRO as verl 0.9.1 implements it (`loss_mode="dro"`): REINFORCE with a quadratic penalty on the log-ratio.

    loss_t = −(A_t·log π_θ(y_t|s_t) − ½·β·(log w_t)²),   w_t = π_θ(y_t|s_t) / π_old(y_t|s_t)

Its gradient is −(A_t − β·log w_t)·∇log π_θ: the advantage pulls a token, the penalty pulls its log-ratio back to 0
with a force that grows with the distance. No token is ever frozen; the trust region is soft.
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import ClipRule, RuleTerms, TokenBatch, positive, register


@register
class DRO(ClipRule):
    """verl's `dro` policy loss ("Direct Reward Optimization with a quadratic log-ratio penalty", its docstring).

    - Written from verl 0.9.1 `compute_policy_loss_dro`: the same expression, the log-ratio not clamped (verl does
      not clamp it), the penalty on every valid token including those whose advantage is 0 (verl's too).
    - β is verl's `policy_loss.dro_beta`, a reserved name here (the verl plugin adds each rule parameter to verl's
      `PolicyLossConfig`, which already has it): ours is `beta`, and under verl `atr_grpo.dro` reads `beta`, not
      `dro_beta`. verl has no default (it requires β > 0); 0.05 is the value of verl's own usage example
      (verl-project/verl#7245, which added the loss): a choice.
    - verl aggregates with its `loss_agg_mode` (token-mean by default); here `trainer.loss_agg`. The rule declares
      no aggregation of its own.

    `clip/frac` is always 0; `dro/penalty` is the mean penalty ½·β·(log w)² per token.
    """

    name = "dro"
    act_metric = None  # freezes no token: clip/frac is 0 by construction
    family = "soft"
    params = (positive("beta", 0.05, "weight β of the penalty ½β(log w)² (verl dro_beta; 0.05: verl's example)"),)
    summary = "−(A·log π − ½β·(log w)²): REINFORCE with a quadratic penalty on the log-ratio"
    source = 'verl 0.9.1 `dro`, "Direct Reward Optimization" (compute_policy_loss_dro, verl#7245)'

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        penalty = 0.5 * self.beta * batch.log_ratio.square()
        never = torch.zeros_like(batch.mask)
        return RuleTerms(
            loss=-(batch.logp * batch.advantages - penalty),
            frozen_low=never,
            frozen_high=never,
            extra={"dro/penalty": penalty.detach()},
        )

    def bounds_text(self) -> str:
        return f"no hard bound: the gradient −(A − β·log w) with β = {self.beta:g} pulls log w back to 0"
