"""MinPRO (arXiv 2601.22718): the minimum prefix ratio as each token's importance weight.

The exact off-policy weight of token t is the prefix ratio Π_{i≤t} w_i, whose variance grows with t. MinPRO
replaces it by the smallest token ratio of the prefix, a weight that sees how far off-policy the prefix has gone
and never grows with its length:

    m_t = min_{i ≤ t} w_i            (over the valid tokens of the sequence, t included)
    loss_t = −sg(m_t)·A_t·log π_θ(y_t|s_t)        gradient −m_t·A_t·∇log π

No code was found: the loss is the law of the paper's one-line rule, written as a REINFORCE loss with a
stop-gradient weight (CISPO's form, `cispo.py`), so a token's gradient is never dropped. On-policy (w ≡ 1) it is
REINFORCE. The prefix runs over the mask only (the i-th valid token of a row), so Unsloth's left-packed rows
give the same weights. A token whose weight is an earlier token's ratio (m_t < w_t) has its weight truncated:
`clip/frac_*` count it, on the side of its own ratio, as CISPO counts a truncated weight; `minpro/weight` is
the mean m_t.

Unresolved: the paper's equations could not be read. Its abstract takes "the minimum token-level ratio observed in
the preceding prefix" and CPPO (arXiv 2606.10968, appendix "Baselines") has MinPRO weigh "the sampled importance
ratio" by that minimum, which reads as sg(min_{i<t} w_i)·w_t·A: a weight that would differ from m_t above. Check
the paper before a comparison that turns on MinPRO.
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import LOG_RATIO_LIMIT, ClipRule, RuleTerms, TokenBatch, register


@register
class MinPRO(ClipRule):
    """REINFORCE weighted by the smallest token ratio of the prefix, min_{i≤t} w_i, instead of Π_{i≤t} w_i."""

    name = "minpro"
    family = "ratio"
    params = ()
    summary = "−sg(min_{i≤t} w_i)·A·log π: the prefix's smallest token ratio as the token's weight"
    source = "MinPRO (arXiv 2601.22718), minimum prefix ratio; no code found: the loss is written from its law"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        log_ratio = batch.log_ratio.detach().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        # padding at +∞ never wins the running minimum, wherever it sits in the row
        prefix_min = torch.cummin(torch.where(batch.mask, log_ratio, torch.inf), dim=-1).values
        weight = torch.where(batch.mask, torch.exp(prefix_min), 0.0)
        adv = batch.advantages
        truncated = (prefix_min < log_ratio) & (adv != 0)
        return RuleTerms(
            loss=-weight * adv * batch.logp,
            frozen_low=truncated & (log_ratio < 0),
            frozen_high=truncated & (log_ratio >= 0),
            extra={"minpro/weight": weight},
        )
