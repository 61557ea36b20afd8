"""Rollout correction: an importance weight for the gap between the rollout engine and the trainer.

The rollout engine (vLLM) samples with its own kernels and precision, so the probability it gave a sampled token,
π_rollout(y_t), differs from the trainer's π_old(y_t) under the same weights. The rule's ratio w = π_θ/π_old does
not see this gap. A correction multiplies each token's rule loss by a weight ρ (no gradient) computed from
r = π_old/π_rollout, independently of the rule (`rollout.correction`, `rollout.correction_level`, thresholds
C_min = `rollout.correction_min`, C_max = `rollout.correction_max`):

    correction  level     ρ on the tokens of sequence i                as in
    none                  1
    tis         token     clamp(r_t, C_min, C_max)                     TRL token_truncate; verl rollout_is=token
    tis         sequence  clamp(Π_t r_t, C_min, C_max)                 TRL sequence_truncate; verl rollout_is=sequence
    mis         token     r_t if C_min ≤ r_t ≤ C_max, else 0           TRL token_mask; verl IcePop "C_min_C_max"
    mis         sequence  Π_t r_t if C_min ≤ Π_t r_t ≤ C_max, else 0   TRL sequence_mask

A missing threshold (null) is no bound on that side. log r is taken over valid tokens only, a token the engine
gave no log-prob for (NaN) counts as r = 1 (TRL), and log r is clamped to ±20 before exp (verl). The thresholds
must keep r = 1 inside (C_min ≤ 1 ≤ C_max), so identical log-probs give ρ ≡ 1 exactly. A masked token (ρ = 0)
keeps its place in the aggregation's normaliser, as in TRL and verl. The β·KL term is not weighted (TRL).

A rule may own the correction instead (`ClipRule.owns_correction`): it receives log r per token
(`sampling_log_ratio`), no ρ is applied after it, and rollout.correction must be none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from atr_grpo.clipping.base import LOG_RATIO_LIMIT

CORRECTIONS = ("none", "tis", "mis")
LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class RolloutCorrection:
    """One rollout correction (see the module); `low`/`high` are C_min/C_max (None: no bound on that side)."""

    kind: str = "none"
    level: str = "token"
    low: float | None = None
    high: float | None = 2.0

    def __post_init__(self) -> None:
        problem = correction_problem(self.kind, self.level, self.low, self.high)
        if problem is not None:
            raise ValueError(problem)

    @property
    def active(self) -> bool:
        return self.kind != "none"

    def log_ratio(self, old_logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> Tensor:
        """log r: `[B, T]` per token, or `[B, 1]` per sequence (the sum over its valid tokens), clamped to ±20."""
        per_token = token_log_ratio(old_logp, sampling_logp, mask)
        if self.level == "sequence":
            per_token = per_token.sum(dim=-1, keepdim=True)
        return per_token.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)

    def weight(self, old_logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> Tensor:
        """ρ `[B, T]` (token) or `[B, 1]` (sequence), no gradient; pure tensor code (runs in compiled losses)."""
        ratio = torch.exp(self.log_ratio(old_logp, sampling_logp, mask))
        if self.kind == "tis":
            return ratio.clamp(min=self.low, max=self.high)
        if self.kind == "mis":
            return torch.where(self.outside(ratio), 0.0, ratio)
        return torch.ones_like(ratio)

    def outside(self, ratio: Tensor) -> Tensor:
        """Where r leaves [C_min, C_max]: the ratios TIS truncates and MIS masks."""
        beyond = torch.zeros_like(ratio, dtype=torch.bool)
        if self.low is not None:
            beyond = beyond | (ratio < self.low)
        if self.high is not None:
            beyond = beyond | (ratio > self.high)
        return beyond

    def metrics(self, old_logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> dict[str, float]:
        """Over valid tokens (a sequence's weight counts once per token): the weight's mean, min and max, and the
        fraction of tokens truncated (`tis`) or masked (`mis`), as `rollout/*` keys. Empty for `none`."""
        if not self.active:
            return {}
        with torch.no_grad():
            valid = mask.bool()
            ratio = torch.exp(self.log_ratio(old_logp, sampling_logp, mask)).expand(valid.shape)
            weight = self.weight(old_logp, sampling_logp, mask).expand(valid.shape)
            outside = self.outside(ratio) & valid
            count = valid.sum().clamp(min=1)
            any_valid = valid.any()
            one = weight.new_ones(())
            values = torch.stack(
                [
                    torch.where(valid, weight, 0.0).sum() / count,
                    torch.where(any_valid, torch.where(valid, weight, torch.inf).min(), one),
                    torch.where(any_valid, torch.where(valid, weight, -torch.inf).max(), one),
                    outside.sum() / count,
                ]
            ).tolist()
        fraction = "rollout/truncated_frac" if self.kind == "tis" else "rollout/masked_frac"
        keys = ("rollout/weight_mean", "rollout/weight_min", "rollout/weight_max", fraction)
        return dict(zip(keys, values))


def token_log_ratio(old_logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> Tensor:
    """log r = log π_old − log π_rollout `[B, T]`, no gradient, 0 off the mask and where the engine gave no
    log-prob (NaN); not clamped."""
    per_token = torch.where(mask.bool(), old_logp.detach().float() - sampling_logp.detach().float(), 0.0)
    return torch.nan_to_num(per_token, nan=0.0)


def sampling_log_ratio(old_logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> Tensor:
    """What a rule that owns the correction receives (`ClipRule.owns_correction`): log r per token `[B, T]`, clamped
    to ±20 like every log r here; pure tensor code."""
    return token_log_ratio(old_logp, sampling_logp, mask).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def correction_problem(kind: str, level: str, low: float | None, high: float | None) -> str | None:
    """What is wrong with a correction's settings, in terms of the `rollout.*` keys (None when nothing is)."""
    if kind not in CORRECTIONS:
        return f"rollout.correction must be one of {', '.join(map(repr, CORRECTIONS))}, got {kind!r}"
    if level not in LEVELS:
        return f"rollout.correction_level must be one of {', '.join(map(repr, LEVELS))}, got {level!r}"
    unchanged = "a ratio of 1 is never corrected"
    if low is not None and not 0 < low <= 1:
        return f"rollout.correction_min must be null or in (0, 1] ({unchanged}), got {low!r}"
    if high is not None and not 1 <= high < float("inf"):
        return f"rollout.correction_max must be null or a finite number >= 1 ({unchanged}), got {high!r}"
    if kind != "none" and low is None and high is None:
        return f"rollout.correction={kind} needs rollout.correction_min or rollout.correction_max (both are null)"
    return None
