"""Covariance-based rules of Cui et al. 2025 ("The entropy mechanism of RL for reasoning LMs").

Both rank tokens by Cov_t = (log π_t - mean log π)·(A_t - mean A), the per-token contribution to the
covariance that drives entropy collapse, computed over the valid tokens of the batch passed to the
rule (one micro-batch, as in the public code's per-GPU approximation):

- Clip-Cov detaches a random `max(⌊r·N⌋, 1)` of the tokens with cov_lb < Cov_t < cov_ub that PPO's clip
  has not already frozen (two-sided: whatever the sign of A; even on-policy).
- KL-Cov adds coef·|log w| to the `max(⌊r·N⌋, 1)` tokens of largest Cov_t, with no ratio clip at all
  (its gradient vanishes at w = 1, so it does nothing on-policy).

Selections are pure tensor code (one partial top-k under a bound known from the shape, the quota as a tensor),
so they run inside compiled losses, and they pick exactly what a stable sort of the whole batch would (ties by
position). Clip-Cov's randomness is a hash of a seed (drawn from a `torch.Generator` when called) and of each
token's index among the valid tokens (`hashed_keys`), so the TRL and Unsloth paths select the same tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import (
    ClipOutput,
    ClipRule,
    RuleTerms,
    TokenBatch,
    fraction,
    number,
    positive,
    ratio_from_log,
    register,
)
from atr_grpo.clipping.ratio import ClipRangeRule, ppo_clip_terms


def token_covariance(batch: TokenBatch) -> Tensor:
    """`[B, T]` centred cross-products over valid tokens (0 elsewhere), without gradient."""
    valid = batch.mask
    count = valid.sum().clamp(min=1)
    logp = batch.logp.detach()  # make_batch has set logp and advantages to 0 on invalid tokens: plain sums
    centred = (logp - logp.sum() / count) * (batch.advantages - batch.advantages.sum() / count)
    return torch.where(valid, centred, 0.0)


def lowest_ranked(keys: Tensor, eligible: Tensor, quota: Tensor, max_quota: int, distinct: bool = False) -> Tensor:
    """Boolean `[B, T]`: the `quota` eligible entries with the smallest keys, ties broken by position (row-major).

    `quota` is a 0-d tensor (it depends on the mask) and `max_quota` a Python bound on it from the shape: one
    partial top-k finds the quota-th smallest key (the threshold), every key below it is taken, and the remaining
    places go to the first entries (in position order) whose key equals it. This is exactly the selection of a
    stable sort of all keys, without sorting the batch. `distinct=True` promises that no two keys are equal,
    which skips the tie handling.
    """
    last = torch.inf if keys.is_floating_point() else torch.iinfo(keys.dtype).max
    flat = torch.where(eligible, keys, last).flatten()
    k = min(flat.numel(), max_quota)
    smallest = torch.topk(flat, k, largest=False, sorted=True).values
    threshold = smallest.gather(0, (quota.long() - 1).clamp(0, k - 1).reshape(1))  # too few eligible: `last`
    if distinct:
        return eligible & (keys <= threshold)
    below = eligible & (keys < threshold)
    tied = eligible & (keys == threshold)
    places_left = quota - below.sum()
    tie_rank = torch.cumsum(tied.flatten().int(), 0).view_as(keys)  # 1, 2, ... along the tied entries
    return below | (tied & (tie_rank <= places_left))


_MASK32 = 0xFFFFFFFF


def hashed_keys(seed: Tensor, mask: Tensor) -> Tensor:
    """`[B, T]` int64 pseudo-random keys in [0, 2³²) from (seed, row, index of the token among its row's valid tokens).

    A counter-based hash (murmur3's 32-bit finaliser) instead of a random-number generator: pure integer
    tensor ops, so it runs inside torch.compile, and keyed by each token's position among the valid tokens,
    so it is the same whether a batch is left- or right-padded (Unsloth repacks padding before its loss).
    The ops are in place on one buffer: this runs on every token of every Clip-Cov call.
    """
    x = torch.cumsum(mask, dim=1, dtype=torch.int64).sub_(1).mul_(0xC2B2AE3D)  # index among the row's valid tokens
    x += torch.arange(mask.shape[0], device=mask.device).unsqueeze(1) * 0x85EBCA77 + seed.long() * 0x9E3779B1
    x &= _MASK32
    for shift, multiplier in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        x ^= x >> shift
        x *= multiplier
        x &= _MASK32
    x ^= x >> 16
    return x


def with_position(keys: Tensor) -> Tensor:
    """Keys in [0, 2³²) combined with their row-major position into distinct int64 keys of the same order, ties
    broken by position: key · 2³¹ + position (positions < 2³¹)."""
    combined = keys << 31
    combined |= torch.arange(keys.numel(), device=keys.device).view_as(keys)
    return combined


def hashed_uniform(seed: Tensor, mask: Tensor) -> Tensor:
    """`hashed_keys` as float64 numbers in [0, 1) (exact: the same order as the keys)."""
    return hashed_keys(seed, mask).double() / 2.0**32


def key_seed_from(generator: torch.Generator) -> Tensor:
    """The 0-d seed of `hashed_uniform`, drawn from a generator (how a seeded call becomes a tensor input)."""
    return torch.randint(0, 2**31 - 1, (), generator=generator, device=generator.device)


def token_quota(batch: TokenBatch, fraction: float) -> tuple[Tensor, int]:
    """max(⌊fraction · N⌋, 1) as a tensor (N = number of valid tokens), and a bound on it from the shape alone."""
    quota = torch.clamp(torch.floor(fraction * batch.mask.sum()), min=1)
    return quota, int(fraction * batch.mask.numel()) + 2  # + 2: float rounding of fraction · N


@register
class ClipCov(ClipRangeRule):
    """PPO clip plus random detachment of covariance-selected tokens.

    The clip band defaults to 1.0/1.0: the Clip-Cov recipe loosens PPO's clip to 1 so that it only
    filters extreme tokens and the covariance selection does the work; (0.2, 0.28) is one override away.
    """

    name = "clip_cov"
    family = "covariance"
    acts_on_policy = True  # the covariance selection is detached whatever w is
    needs = ("generator",)  # or `key_seed` / `random_keys` directly (see check_extras)
    params = (
        fraction("eps_low", 1.0, "lower clip range (Clip-Cov recipe: 1.0)"),
        positive("eps_high", 1.0, "upper clip range (Clip-Cov recipe: 1.0)"),
        fraction("ratio", 2e-4, "fraction r of tokens to detach (Clip-Cov recipe: 2e-4)"),
        number("cov_lb", 1.0, "a finite number", lambda v: True, "lower covariance bound ω_low"),
        number("cov_ub", 5.0, "a finite number", lambda v: True, "upper covariance bound ω_high"),
    )
    summary = "clip, plus detaching a random fraction r of the tokens whose covariance lies in (cov_lb, cov_ub)"
    source = "Clip-Cov (Cui et al. 2025)"

    def validate(self) -> None:
        if not self.cov_ub > self.cov_lb:
            raise ValueError(
                f"clipping rule 'clip_cov': parameter 'cov_ub' must be > cov_lb = {self.cov_lb}, got {self.cov_ub}"
            )

    def check_extras(self, extras: dict[str, Any]) -> None:
        if all(extras.get(k) is None for k in ("generator", "key_seed", "random_keys")):
            raise ValueError(
                "clipping rule 'clip_cov' needs the extra 'generator' (a torch.Generator), 'key_seed' or 'random_keys'"
            )

    def __call__(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, **extras: Any) -> ClipOutput:
        generator = extras.pop("generator", None)
        if generator is not None and extras.get("random_keys") is None and extras.get("key_seed") is None:
            extras["key_seed"] = key_seed_from(generator)
        return super().__call__(logp, old_logp, advantages, mask, **extras)

    def terms(
        self, batch: TokenBatch, random_keys: Tensor | None = None, key_seed: Tensor | None = None, **_: Any
    ) -> RuleTerms:
        distinct = random_keys is None
        if distinct:  # hashed_uniform's order, made distinct by the position (a stable sort's tie-break)
            random_keys = with_position(hashed_keys(key_seed.to(batch.mask.device), batch.mask))
        clipped = ppo_clip_terms(batch, 1 - self.eps_low, 1 + self.eps_high)
        cov = token_covariance(batch)
        ppo_frozen = clipped.frozen_low | clipped.frozen_high
        candidates = batch.mask & ~ppo_frozen & (cov > self.cov_lb) & (cov < self.cov_ub)
        detached = lowest_ranked(random_keys, candidates, *token_quota(batch, self.ratio), distinct)
        return RuleTerms(
            loss=torch.where(detached, 0.0, clipped.loss),
            frozen_low=clipped.frozen_low,
            frozen_high=clipped.frozen_high,
            frozen_other=detached,
            extra={"clip/frac_cov": detached},
        )


@register
class KLCov(ClipRule):
    """No ratio clip; a coef·|log w| penalty on the top-r tokens by covariance."""

    name = "kl_cov"
    family = "covariance"
    params = (
        fraction("ratio", 2e-3, "fraction k of tokens penalised (KL-Cov 7B recipe: 0.2%)"),
        positive("coef", 1.0, "penalty coefficient β (recipe 1)"),
    )
    summary = "−w·A, plus coef·|log w| on the top-r tokens by covariance"
    source = "KL-Cov (Cui et al. 2025)"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        cov = token_covariance(batch)
        selected = lowest_ranked(-cov, batch.mask, *token_quota(batch, self.ratio))
        penalty = torch.where(selected, self.coef * batch.log_ratio.abs(), 0.0)
        never = torch.zeros_like(batch.mask)
        return RuleTerms(
            loss=-ratio * batch.advantages + penalty,
            frozen_low=never,
            frozen_high=never,
            extra={"clip/frac_kl_penalty": selected},
        )
