"""MinPRO (Lei, Cheng, Tao, arXiv 2601.22718): the token's ratio times the smallest ratio of its preceding prefix.

The exact off-policy weight of token t is the prefix ratio Π_{i≤t} w_i = (Π_{i<t} w_i)·w_t. Its first factor, the
correction for how far off-policy the prefix already is, has a variance that grows with t. The token-level ratio w_t
drops it. MinPRO keeps it, but replaces the product over the preceding tokens by their minimum, which never grows
with the prefix's length:

    m_t = min_{i<t} w_i          (over the sequence's valid tokens before t; m_t = 1 for its first token)
    loss_t = −sg(m_t)·w_t·A_t     gradient −m_t·w_t·A_t·∇log π

On-policy (w ≡ 1) it is REINFORCE. A prefix with one small ratio weighs every later token down. The prefix runs
over the mask only (the i-th valid token of a row), so Unsloth's left-packed rows give the same weights.

Source. The paper's equations could not be read here: the stored copies of arXiv 2601.22718 (arxiv.org/html and
its markdown mirrors) end at Figure 1's caption. This law is read from three descriptions that agree: the
abstract ("the minimum token-level ratio observed in the preceding prefix", so i < t), CPPO's "Baselines"
appendix (arXiv 2606.10968: MinPRO weighs "the sampled importance ratio" by that minimum) and a topic summary of
the paper (a "minimum-based product" in place of the prefix product). Not confirmed: the stop-gradient on m_t
(this project's: a gradient through it would reach earlier tokens) and whether the paper clips w_t on top (here
it does not). Until the paper is read, do not draw a conclusion that turns on these two points.

Metrics: `clip/frac_low` counts the tokens whose prefix weighs them down (m_t < 1), `clip/frac_high` those it
weighs up (m_t > 1), both where A ≠ 0; `minpro/weight` is the mean m_t.
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import LOG_RATIO_LIMIT, ClipRule, RuleTerms, TokenBatch, ratio_from_log, register


def preceding_min_log(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[B, T]` log m_t = min over the valid tokens before t of log w_i, and 0 where there is none."""
    # padding at +∞ never wins the running minimum, wherever it sits in the row
    running = torch.cummin(torch.where(mask, log_ratio, torch.inf), dim=-1).values
    before = torch.cat([torch.full_like(running[:, :1], torch.inf), running[:, :-1]], dim=-1)
    return torch.where(torch.isinf(before), 0.0, before)


@register
class MinPRO(ClipRule):
    """The token ratio w_t weighted by sg(min_{i<t} w_i), the smallest ratio of the preceding prefix."""

    name = "minpro"
    family = "ratio"
    params = ()
    summary = "−sg(min_{i<t} w_i)·w_t·A: the token's ratio times the smallest ratio of its preceding prefix"
    source = (
        "MinPRO (Lei et al. 2026, arXiv 2601.22718); the paper's equations could not be read: the law is the "
        "abstract's and CPPO's (arXiv 2606.10968) description, the stop-gradient on the minimum is this project's"
    )

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        log_ratio = batch.log_ratio.detach().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        prefix_log = preceding_min_log(log_ratio, batch.mask)
        prefix_weight = torch.exp(prefix_log)
        acts = batch.advantages != 0
        return RuleTerms(
            loss=-prefix_weight * ratio_from_log(batch.log_ratio) * batch.advantages,
            frozen_low=acts & (prefix_log < 0),
            frozen_high=acts & (prefix_log > 0),
            extra={"minpro/weight": torch.where(batch.mask, prefix_weight, 0.0)},
        )
