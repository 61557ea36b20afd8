"""DRPO (Yao, Zhou, Qi et al., arXiv 2606.09821, DPPO's authors): DPPO-TV's hard mask replaced by a quadratic penalty.

DPPO-TV (`dppo.py`) drops a token once its probability has moved more than δ on the side its advantage pushes,
π_θ(y_t) − π_old(y_t) > δ_high (A > 0) or < −δ_low (A < 0). DRPO keeps every token and penalises the shift
instead, weighted by the advantage. It is SPO's penalty on the ratio, |A|·(w − 1)²/(2δ), multiplied by the
behaviour probability q = π_old(y_t), which turns it into a penalty on the absolute shift p − q:

    loss_t = −w_t·A_t + |A_t|·q·(w_t − 1)²/(2δ) = −w_t·A_t + |A_t|·(p − q)²/(2δ·q),    p = π_θ(y_t)
    d loss/d log π = −w_t·A_t·g_t,    g_t = 1 − sign(A_t)·(p − q)/δ,    δ = δ_high (A > 0), δ_low (A < 0)

g_t is the gradient weight on top of the importance-sampled one, w·A·∇log π. It is 1 at p = q, decays to 0 on
DPPO-TV's boundary when an update pushes away from π_old, turns negative (corrective) beyond it, and exceeds 1
for updates that move back toward π_old. As |p − q| ≤ 1, |g_t| ≤ 1 + 1/δ on every token, rare ones included,
where SPO's weight 1 − sign(A)·(w − 1)/δ grows with w. With q = 1 it is CFPO's penalty (`cfpo.py`).

Source. The paper's equations could not be read here: the stored copy of arXiv 2606.09821 (a markdown mirror of
its HTML) returns only its opening, up to the introduction. The law above is the abstract's ("advantage-weighted
quadratic regularizer on policy shift", "same trust-region geometry as DPPO", Binary-TV) in the form two summaries
of the paper give: SPO's quadratic penalty multiplied by μ(y_t|s_t), and a gradient weight that "decays to zero at
the boundary..., then turns corrective beyond it, and amplifies updates that move back toward the behavior
policy". No code was found, nor the paper's default δ or a KL variant: δ = 0.15 is DPPO-TV's.

No token is frozen (`clip/frac` is 0); `drpo/frac_pulled_back` counts the tokens past the boundary, whose gradient
points back into it, and `drpo/penalty` is the mean penalty.
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
        "DRPO (Yao et al. 2026, arXiv 2606.09821), DPPO-TV's mask as SPO's quadratic penalty times π_old; the "
        "paper's equations and code could not be read: law from its abstract and summaries, δ = 0.15 is DPPO-TV's"
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
