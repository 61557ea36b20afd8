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

Rejection (`rollout.rejection`, threshold τ = `rollout.rejection_threshold`) drops whole sequences whose divergence
from the rollout policy is too large: verl's rollout-rejection modes (`algorithm.rollout_correction.rollout_rs`,
`rollout_rs_threshold`; verl 0.9.1 `rollout_corr_helper.compute_rollout_rejection_mask`). Per valid token, with
log r clamped to ±20: k2 = ½ (log r)², k3 = r − 1 − log r (estimates of KL(π_rollout ‖ π_old) from the sampled tokens).

    rejection     a sequence is kept when                      as in
    none          always
    seq_max_k2    max_t k2_t ≤ τ                               verl rollout_rs=seq_max_k2
    seq_max_k3    max_t k3_t ≤ τ                               verl rollout_rs=seq_max_k3
    seq_mean_k3   (1/|y|) Σ_t k3_t ≤ τ                         verl rollout_rs=seq_mean_k3

A rejected sequence leaves the completion mask, as verl's rejection leaves `response_mask`: it adds nothing to the
loss, the rule's statistics or the KL term, and its tokens leave token_mean's normaliser (verl's batch_num_tokens);
seq_mean and Dr.GRPO still count it among the sequences they divide by (verl's global_batch_size, the mini-batch's
sequence count), so there it weighs 0. It composes with tis/mis as in verl: ρ is computed on the completion's
tokens as before and multiplies the kept sequences' losses. An empty sequence is kept (its max and mean are 0), and
a token the engine gave no log-prob for has log r = 0 here too (verl's NaN would reject its sequence).
The logged `rollout/rejected_frac` is the share of valid tokens in rejected sequences (verl's
`rollout_rs_masked_fraction`).

A rule may own the correction instead (`ClipRule.owns_correction`): it receives log r per token
(`sampling_log_ratio`), no ρ is applied after it, and rollout.correction and rollout.rejection must be none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from atr_grpo.clipping.base import LOG_RATIO_LIMIT

CORRECTIONS = ("none", "tis", "mis")
LEVELS = ("token", "sequence")
REJECTIONS = ("none", "seq_max_k2", "seq_max_k3", "seq_mean_k3")


@dataclass(frozen=True)
class RolloutCorrection:
    """One rollout correction (see the module); `low`/`high` are C_min/C_max (None: no bound on that side)."""

    kind: str = "none"
    level: str = "token"
    low: float | None = None
    high: float | None = 2.0
    rejection: str = "none"  # one of REJECTIONS
    rejection_threshold: float | None = None  # τ: a sequence whose statistic exceeds it is rejected

    def __post_init__(self) -> None:
        problem = correction_problem(self.kind, self.level, self.low, self.high)
        if problem is None:
            problem = rejection_problem(self.rejection, self.rejection_threshold)
        if problem is not None:
            raise ValueError(problem)

    @property
    def active(self) -> bool:
        """Whether the rollout engine's log-probs act on the loss (a weight ρ, a rejection or both)."""
        return self.weighs or self.rejects

    @property
    def weighs(self) -> bool:
        return self.kind != "none"

    @property
    def rejects(self) -> bool:
        return self.rejection != "none"

    def kept(self, old_logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> Tensor:
        """Which sequences the rejection keeps, `[B, 1]` bool (all of them without a rejection); pure tensor code."""
        valid = mask.bool()
        if not self.rejects:
            return torch.ones_like(valid[:, :1])
        log_ratio = token_log_ratio(old_logp, sampling_logp, mask).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        if self.rejection.endswith("k2"):
            divergence = 0.5 * log_ratio.square()
        else:
            divergence = torch.expm1(log_ratio) - log_ratio
        if self.rejection.startswith("seq_max"):  # divergences are >= 0: 0 off the mask leaves the maximum alone
            statistic = torch.where(valid, divergence, 0.0).amax(dim=-1, keepdim=True)
        else:
            count = valid.sum(dim=-1, keepdim=True).clamp(min=1)
            statistic = torch.where(valid, divergence, 0.0).sum(dim=-1, keepdim=True) / count
        return statistic <= self.rejection_threshold

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
        """Over the completion's valid tokens `mask` (before any rejection; a sequence's weight counts once per
        token): the weight's mean, min and max and the fraction of tokens truncated (`tis`) or masked (`mis`), and
        the share of tokens in rejected sequences (`rollout/rejected_frac`), as `rollout/*` keys. Empty for none."""
        out: dict[str, float] = {}
        if self.rejects:
            with torch.no_grad():
                valid = mask.bool()
                rejected = valid & ~self.kept(old_logp, sampling_logp, mask)
                out["rollout/rejected_frac"] = float(rejected.sum() / valid.sum().clamp(min=1))
        if not self.weighs:
            return out
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
        return out | dict(zip(keys, values))


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


def rejection_problem(rejection: str, threshold: float | None) -> str | None:
    """What is wrong with a rejection's settings, in terms of the `rollout.*` keys (None when nothing is)."""
    if rejection not in REJECTIONS:
        return f"rollout.rejection must be one of {', '.join(map(repr, REJECTIONS))}, got {rejection!r}"
    if rejection == "none":
        if threshold is not None:  # it would be accepted and never read
            return f"rollout.rejection_threshold must be null with rollout.rejection='none', got {threshold!r}"
        return None
    if threshold is None or not 0 < threshold < float("inf"):
        return (
            f"rollout.rejection_threshold must be a finite number > 0 with rollout.rejection={rejection} (the largest "
            f"divergence a kept sequence may have), got {threshold!r}"
        )
    return None
