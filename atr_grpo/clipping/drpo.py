"""DRPO (arXiv 2606.09821, from DPPO's authors): DPPO-TV's hard mask replaced by a quadratic penalty on the shift.

DPPO-TV (`dppo.py`) drops a token once its probability has moved more than δ on the side its advantage pushes,
π_θ(y_t) − π_old(y_t) > δ_high (A > 0) or < −δ_low (A < 0). DRPO keeps every token and penalises the shift
instead, weighted by the advantage, so a token past the boundary is pulled back rather than left alone:

    loss_t = −w_t·A_t + |A_t|·(p − q)²/(2·δ·q),    p = π_θ(y_t), q = π_old(y_t), δ = δ_high (A > 0), δ_low (A < 0)
           = −w_t·A_t + |A_t|·q·(w_t − 1)²/(2δ)

    d loss/d log π = w_t·(−A_t + |A_t|·(p − q)/δ)

No code was found, and the paper's penalty coefficient could not be read: this project takes the one that keeps
DPPO-TV's geometry, 1/(2δ·q). The gradient is REINFORCE's −A at w = 1 and vanishes exactly on DPPO-TV's
boundary p − q = ±δ (the side A pushes), where DPPO's mask starts; beyond it, it points back. It is CFPO's
penalty (`cfpo.py`) with a per-token width ε_t = δ/π_old(y_t), the TV trust region written on the ratio. Defaults
are DPPO-TV's δ = 0.15. No token is frozen (`clip/frac` is 0); `drpo/frac_pulled_back` counts the tokens past the
boundary, whose gradient points back into it, and `drpo/penalty` is the mean penalty.
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import ClipRule, RuleTerms, TokenBatch, open_unit, ratio_from_log, register


@register
class DRPO(ClipRule):
    """−w·A + |A|·(π_θ − π_old)²/(2δ·π_old): DPPO-TV's region as a penalty whose optimum is on its boundary."""

    name = "drpo"
    family = "soft"
    act_metric = None  # freezes no token: clip/frac is 0 by construction
    params = (
        open_unit("delta_low", 0.15, "the probability drop of A < 0 tokens where the penalty's optimum lies (0.15)"),
        open_unit("delta_high", 0.15, "the probability rise of A > 0 tokens where the penalty's optimum lies (0.15)"),
    )
    summary = "−w·A + |A|·(π_θ − π_old)²/(2δ·π_old): optimal on DPPO-TV's boundary π_θ − π_old = ±δ, never frozen"
    source = (
        "DRPO (arXiv 2606.09821), DPPO's mask as an advantage-weighted quadratic penalty; no code found: the "
        "coefficient 1/(2δ·π_old), which puts the optimum on DPPO-TV's boundary, is this project's"
    )

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        adv = batch.advantages
        old_prob = torch.exp(batch.old_logp.clamp(max=0.0))
        delta = torch.where(adv > 0, self.delta_high, self.delta_low)
        penalty = adv.abs() * old_prob * (ratio - 1) ** 2 / (2 * delta)
        shift = old_prob * (ratio.detach() - 1)  # π_θ − π_old
        pulled_back = ((adv > 0) & (shift > self.delta_high)) | ((adv < 0) & (shift < -self.delta_low))
        never = torch.zeros_like(batch.mask)
        return RuleTerms(
            loss=penalty - ratio * adv,
            frozen_low=never,
            frozen_high=never,
            extra={"drpo/frac_pulled_back": pulled_back, "drpo/penalty": penalty.detach()},
        )
