"""ATR at sequence level: the KL3 trust region decided once per completion (the paper's §6.5 future work).

The constraint of sequence i is D_i ≤ δ, with D_i one of three reductions of the token log-ratios s_t = log w_t
over the sequence's valid tokens (the mask only, never positions, so left-packed rows give the same result):

    reduction   D_i                          δ ⇔ interval                                      δ = 0.07
    mean        mean_t KL3(w_t)              no per-token interval: every w_t ∈ [l_δ, u_δ]      w_t ∈ [0.671, 1.422]
                                             suffices; one token alone may reach KL3 = n_i·δ    suffices
    geo         KL3(s_i), s_i = exp(mean s)  s_i ∈ [l_δ, u_δ] (the geometric-mean ratio)        s_i ∈ [0.671, 1.422]
    max         max_t KL3(w_t)               every w_t of the sequence ∈ [l_δ, u_δ]             w_t ∈ [0.671, 1.422]

with [l_δ, u_δ] the Lambert-W interval of token-level ATR (Eq. 10). `mean` keeps δ's token-level meaning (an
average KL3 per token along the completion), `max` is Trust Region Masking (arXiv 2512.23075) with the KL3
estimator, and `geo` is GSPO's sequence ratio under the asymmetric KL3 interval (GSPO's ε = 3e-4 / 4e-4
corresponds to δ ≈ ε²/2 ≈ 8e-8).

The loss is the general operator (Eq. 5) with the sequence's constraint on each of its tokens: J_t =
min(w_t·A_t, clip_general(w_t, C_i)·A_t) under `semantics="min"` (a token of a violating sequence loses its
gradient on the side its advantage pushes), or the operator alone under `"mask"` (every token of a violating
sequence is frozen, TRM's exclusion). Only the constraint differs from `atr`, which it equals exactly, in loss and
gradient, on one-token sequences; the aggregation stays the configured one (no native aggregation).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from atr_grpo.clipping.base import TokenBatch, choice, format_interval, register
from atr_grpo.clipping.base import semantics_param as _semantics
from atr_grpo.clipping.bounds import kl3_ratio_bounds
from atr_grpo.clipping.kl import DivergenceRule, clamped_log_ratio, delta_param, k3
from atr_grpo.clipping.sequence import sequence_mean

REDUCTIONS = ("mean", "geo", "max")


@register
class ATRSeq(DivergenceRule):
    """KL3 ≤ δ per sequence: the mean token KL3, the KL3 of the geometric-mean ratio, or the largest token KL3."""

    name = "atr_seq"
    params = (
        delta_param(),
        _semantics(),
        choice("reduction", "mean", REDUCTIONS, "how token KL3s make the sequence's divergence (see the module)"),
    )
    summary = "per sequence: mean_t KL3(w_t) ≤ δ (`reduction=geo`: KL3(s_i); `max`: max_t KL3(w_t))"
    source = "this repository: ATR (Eq. 5–6) per sequence, the paper's §6.5 future work; `max` is TRM (2512.23075)"

    def estimate(self, batch: TokenBatch, **_: Any) -> Tensor:
        s = clamped_log_ratio(batch)
        if self.reduction == "mean":
            divergence = sequence_mean(k3(s), batch.mask)
        elif self.reduction == "geo":
            divergence = k3(sequence_mean(s, batch.mask))
        else:  # k3 ≥ 0, so padding at 0 never wins the max
            divergence = k3(s).where(batch.mask, 0.0).amax(dim=-1, keepdim=True)
        return divergence.expand_as(s)

    def bounds_text(self) -> str:
        interval = format_interval(*kl3_ratio_bounds(self.delta), "s_i" if self.reduction == "geo" else "w_t")
        meaning = {
            "mean": f"mean token KL3 ≤ {self.delta:g}; every {interval} suffices",
            "geo": f"δ = {self.delta:g} ⇔ {interval} (the sequence's geometric-mean ratio)",
            "max": f"δ = {self.delta:g} ⇔ every {interval} in the sequence",
        }
        return meaning[self.reduction]
