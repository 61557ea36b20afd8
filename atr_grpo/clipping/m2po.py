"""M2PO (Zheng et al. 2025, "Prosperity before Collapse", arXiv 2510.01161): a trust region on the batch's second
moment of log w, kept by masking tokens, with the plain ratio on the tokens left.

    M̂₂ = mean over the trust-region tokens of (log w_t)²                           (the paper's M̂₂)
    Algorithm 1: while M̂₂ of the tokens left > τ_M2, mask the token of largest (log w_t)²
    J = Σ_t M_t · w_t · A_t   (no clip; normalised by `losses.py`, token_mean in the paper)

The mask removes the fewest tokens that bring the mean under τ, and they are the largest: removing the largest
(log w)² never raises the mean of the rest, so the loop stops at the first k for which the k largest are gone and
the mean of the others is ≤ τ. `largest_until_mean_at_most` finds that k with one sort and a suffix sum instead of
the loop (pure tensor code: no `.item()`, no shape that depends on values).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import ClipRule, RuleTerms, TokenBatch, choice, positive, ratio_from_log, register

# which tokens the second moment is taken over and masked from (`m2_scope`)
M2_SCOPES = ("trust_region", "all")


def largest_until_mean_at_most(values: Tensor, eligible: Tensor, bound: float) -> Tensor:
    """Boolean like `values`: Algorithm 1 of M2PO on the `eligible` entries of `values` (float32, all ≥ 0). While the
    mean of the eligible entries not yet taken is > `bound`, take the largest (the first in row-major order among
    equal ones, as argmax does); an empty remainder ends the loop.

    Sorted in decreasing order, v₀ ≥ … ≥ v_{n−1}, the loop takes v_j exactly when mean(v_j, …, v_{n−1}) > bound, and
    these means do not increase with j: the count of such j is the number taken. The sort is of the values' bits as
    int32 (a float ≥ 0 orders like its bits; an integer sort is a radix sort, ten times a float sort's speed on a
    CPU), in increasing order, so that a running sum adds the smallest values first (in float64) and its i-th entry
    is the sum of all but the n − 1 − i largest. The sort is stable and of the entries in reverse order: equal values
    sort last-first, so the `taken` last of the sort are the largest, the first in row-major order among ties.

    The ineligible entries enter the sort as 0: they sort before every positive value, among the eligible zeros, and
    add 0 to every sum. A zero is never taken (the mean of a remainder of zeros is not > bound > 0), so the entries
    taken are those a sort of the eligible entries alone gives, with the same sums."""
    flat = values.flatten() * eligible.flatten()  # ineligible: 0 (a product, far cheaper than torch.where on a CPU)
    keys, order = torch.sort(flat.view(torch.int32).flip(0), stable=True)  # the smallest first, ties last-first
    below = keys.view(torch.float32).double().cumsum(0)  # below[i] = v_{n−1} + … + v_{n−1−i} (no gather, no flip)
    count = torch.count_nonzero(eligible)
    rank = torch.arange(flat.numel(), dtype=torch.float64, device=flat.device)  # whole numbers, exact
    left = rank + (count - (flat.numel() - 1))  # from the (n − 1 − i)-th largest to the last eligible (≤ 0: never over)
    taken = torch.count_nonzero(below > bound * left.clamp(min=0.5))
    chosen = torch.zeros_like(eligible.flatten())
    return chosen.scatter(0, order, rank >= flat.numel() - taken).flip(0).view_as(values)


def trust_region_tokens(batch: TokenBatch) -> Tensor:
    """The tokens whose update moves w away from 1 in the direction its advantage pushes (A > 0, w > 1 or A < 0,
    w < 1): those a PPO clip can freeze."""
    same_sign = torch.sign(batch.advantages) * torch.sign(batch.log_ratio.detach()) > 0  # 4 passes where 7 were
    return batch.mask & same_sign


@register
class M2PO(ClipRule):
    """−M·w·A: the tokens of largest (log w)² masked until the mean (log w)² of the trust-region tokens left is ≤ τ_M2.

    Read from the paper (M̂₂, Algorithm 1 and the objective J_M2PO), written from the formulas. Where
    the paper leaves a choice open:

    - *Trust-region tokens* (Algorithm 1's 𝒯): the tokens with A > 0, w > 1 or A < 0, w < 1, the paper's set.
      The authors' released code (Infini-AI-Lab/M2PO) takes the second moment over the same "trust-region tokens",
      but only to choose its cap τ (below); it masks none of them. `m2_scope=all` takes
      every valid token instead, as AReaL's implementation does (`actor.m2_threshold`); a token outside the set is
      never masked.
    - *The second moment* is of log w with the current π_θ against π_old, the log-probs the loss uses (the paper's
      π_behav; a rollout correction, if set, weighs the loss after the rule). It selects tokens and carries no
      gradient.
    - *Equal values* are masked in row-major order of the valid tokens (argmax's first index), which is the same
      order in the right-padded and the left-packed layout.
    - *The stopping test* is the paper's: masking goes on while the mean is > τ (AReaL stops at the first mean < τ:
      they differ only at equality). A remainder that empties ends it: if even the smallest (log w)² exceeds τ, every
      trust-region token is masked (AReaL keeps the smallest one).
    - *The ratio* is the token's w_t, as in the paper's normalised token sum with A_{i,t} and AReaL; no clip.
    - The authors' released verl code does something else than Algorithm 1: it caps |log w| of the trust-region
      tokens at one τ chosen so that their capped second moment meets the budget, and clips w to [e^−τ, e^τ] inside
      PPO's min. This rule is Algorithm 1 (masking), as in the paper and AReaL.

    *The batch* is the optimizer step's (`whole_batch`): masking on a part of it would mask other tokens. Giving the
    same mask under gradient accumulation or N processes would take every micro-batch's log-probs under the step's
    θ before the first one's loss, i.e. a second forward pass over the whole step (or every micro-batch's graph
    held at once) and a gather across processes. The run refuses trainer.gradient_accumulation_steps > 1 and
    several processes instead, before any model loads (raise per_device_train_batch_size to keep the batch), and
    the verl plugin refuses the rule (verl calls a policy loss on each micro-batch of each rank).
    """

    name = "m2po"
    family = "divergence"
    batch_statistic = True  # the mask depends on every token's (log w)² in the batch
    whole_batch = True  # ...which the source takes over the step's batch: refused where a run splits it
    params = (
        positive("tau_m2", 0.04, "τ_M2, the bound on the mean (log w)² of the tokens left (M2PO: 0.04 in every run)"),
        choice(
            "m2_scope",
            "trust_region",
            M2_SCOPES,
            "the tokens the second moment is over and masked from: 'trust_region' (A > 0, w > 1 or A < 0, w < 1; the "
            "paper's Algorithm 1) or 'all' valid tokens (AReaL)",
        ),
    )
    summary = "−w·A on the tokens left after masking the largest (log w)² until their mean is ≤ τ_M2"
    source = "M2PO (Zheng et al. 2025, arXiv 2510.01161): M̂₂, Algorithm 1 and J_M2PO; τ_M2 = 0.04"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        log_ratio = batch.log_ratio
        eligible = trust_region_tokens(batch) if self.m2_scope == "trust_region" else batch.mask
        second_moment = log_ratio.detach().float().square()
        masked = largest_until_mean_at_most(second_moment, eligible, self.tau_m2)
        ratio = ratio_from_log(log_ratio)
        kept = (~masked).to(ratio.dtype)  # −w·A times 1 or 0: a product, far cheaper than torch.where on a CPU
        return RuleTerms(
            loss=ratio * batch.advantages * kept.neg_(),
            frozen_low=masked & (log_ratio < 0),
            frozen_high=masked & (log_ratio >= 0),
            # logged: the batch's mean (log w)² over its valid tokens (log w is 0 on the others: the sum over all is
            # theirs, the same float as a mean of per-token values), and the fraction of them the mask chooses from
            extra={"m2po/m2": second_moment.sum() / batch.mask.sum().clamp(min=1).float(), "m2po/eligible": eligible},
        )

    def bounds_text(self) -> str:
        tokens = "trust-region tokens" if self.m2_scope == "trust_region" else "tokens"
        return f"mean (log w)² ≤ {self.tau_m2:g} over the {tokens} left, the largest masked first"
