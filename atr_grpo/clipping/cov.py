"""Covariance-based rules of Cui et al. 2025 ("The entropy mechanism of RL for reasoning LMs").

Both rank tokens by Cov_t = (log π_t - mean log π)·(A_t - mean A), the per-token contribution to the
covariance that drives entropy collapse, computed over the valid tokens of the batch passed to the
rule (one micro-batch, as in the public code's per-GPU approximation):

- Clip-Cov detaches a random `max(⌊r·N⌋, 1)` of the tokens with cov_lb < Cov_t < cov_ub that PPO's clip
  has not already frozen (two-sided: whatever the sign of A; even on-policy).
- KL-Cov adds coef·|log w| to the `max(⌊r·N⌋, 1)` tokens of largest Cov_t, with no ratio clip at all
  (its gradient vanishes at w = 1, so it does nothing on-policy).

Selections are pure tensor code (partial top-ks under a bound known from the shape, the quota as a tensor),
so they run inside compiled losses, and they pick exactly what a stable sort of the whole batch would (ties by
position). Clip-Cov's randomness is a hash of a seed (its extra `key_seed`, drawn from a seeded stream: see
`extras`) and of each token's index among the valid tokens (`hashed_keys`), so the TRL and Unsloth paths and
verl select the same tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import (
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


def centred_products(batch: TokenBatch, count: Tensor) -> Tensor:
    """`[B, T]` (log π_t - mean log π)·(A_t - mean A) with means over the `count` valid tokens, without gradient.
    Meaningful on valid tokens only: each caller masks it with what it selects from."""
    count = count.clamp(min=1)
    logp = batch.logp.detach()  # make_batch has set logp and advantages to 0 on invalid tokens: plain sums
    return (logp - logp.sum() / count) * (batch.advantages - batch.advantages.sum() / count)


def lowest_ranked(keys: Tensor, eligible: Tensor, quota: Tensor, max_quota: int, distinct: bool = False) -> Tensor:
    """Boolean `[B, T]`: the `quota` eligible entries with the smallest keys, ties broken by position (row-major).

    `quota` is a 0-d tensor (it depends on the mask) and `max_quota` a Python bound on it from the shape, so that
    the selection is pure tensor code. This is exactly the selection of a stable sort of all keys, without sorting
    the batch. `distinct=True` promises that no two eligible keys are equal and that all are below the dtype's
    largest value (`hash_ranks` are): then two small top-ks (per row, then over the rows' winners) find
    the entries, and no pass over the batch compares keys. Otherwise one top-k finds the quota-th smallest key
    (the threshold), every key below it is taken, and the remaining places go to the first entries (in position
    order) whose key equals it.
    """
    last = torch.inf if keys.is_floating_point() else torch.iinfo(keys.dtype).max
    masked = torch.where(eligible, keys, last)
    if distinct:
        return _smallest_distinct(masked, last, quota, max_quota)
    flat = masked.flatten()
    k = min(flat.numel(), max_quota)
    smallest = torch.topk(flat, k, largest=False, sorted=True).values
    threshold = smallest.gather(0, (quota.long() - 1).clamp(0, k - 1).reshape(1))  # too few eligible: `last`
    below = eligible & (keys < threshold)
    tied = eligible & (keys == threshold)
    places_left = quota - below.sum()
    tie_rank = torch.cumsum(tied.flatten().int(), 0).view_as(keys)  # 1, 2, ... along the tied entries
    return below | (tied & (tie_rank <= places_left))


def _smallest_distinct(masked: Tensor, last: float | int, quota: Tensor, max_quota: int) -> Tensor:
    """`lowest_ranked` for distinct keys (ineligible entries already set to the largest value): each row's
    `max_quota` smallest, then the `quota` smallest of those, marked by position (the winners of a row top-k
    contain the batch's `max_quota` smallest). Entries past the eligible ones hold `last` and are dropped."""
    rows = masked.reshape(-1, masked.shape[-1])
    row_values, row_index = torch.topk(rows, min(rows.shape[1], max_quota), dim=1, largest=False, sorted=False)
    offsets = torch.arange(rows.shape[0], device=rows.device).unsqueeze(1) * rows.shape[1]
    k = min(row_values.numel(), max_quota)
    values, order = torch.topk(row_values.flatten(), k, largest=False, sorted=True)
    positions = (row_index + offsets).flatten()[order]
    take = (torch.arange(k, device=rows.device) < quota) & (values < last)
    chosen = torch.zeros(masked.numel(), dtype=torch.bool, device=rows.device)
    return chosen.scatter_(0, positions, take).view_as(masked)


_MASK32 = 0xFFFFFFFF


def _as_int32(value: int) -> int:
    """A constant in [0, 2³²) as the int32 with the same bits (int32 products wrap modulo 2³²)."""
    return value - (1 << 32) if value >= 1 << 31 else value


def _murmur32(seed: Tensor, mask: Tensor, salt: Tensor | None = None) -> Tensor:
    """`[B, T]` int32 whose bits are murmur3's 32-bit finaliser of seed·0x9E3779B1 + row·0x85EBCA77 +
    index·0xC2B2AE3D (mod 2³²), index = the token's index among its row's valid tokens; an int32 `[B, T]` `salt`
    takes the row's place. int32 arithmetic wraps like the finaliser's unsigned words; `>>` on int32 extends the
    sign, so each shift is masked to its logical value."""
    x = torch.cumsum(mask, dim=1, dtype=torch.int32)  # index among the row's valid tokens, plus one
    x *= _as_int32(0xC2B2AE3D)
    # seed·C_seed - C_index (the - C_index turns the index + 1 above into the index), plus row·C_row or salt·C_row
    offset = seed.int() * _as_int32(0x9E3779B1) - _as_int32(0xC2B2AE3D)
    if salt is None:
        rows = torch.arange(mask.shape[0], device=mask.device, dtype=torch.int32)
        x += (rows * _as_int32(0x85EBCA77) + offset).unsqueeze(1)
    else:
        x += salt * _as_int32(0x85EBCA77) + offset
    for shift, multiplier in ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None)):
        shifted = x >> shift
        shifted &= (1 << (32 - shift)) - 1
        x ^= shifted
        if multiplier is not None:
            x *= _as_int32(multiplier)
    return x


def hashed_keys(seed: Tensor, mask: Tensor, salt: Tensor | None = None) -> Tensor:
    """`[B, T]` int64 pseudo-random keys in [0, 2³²) from (seed, row, index of the token among its row's valid tokens).

    A counter-based hash (murmur3's 32-bit finaliser) instead of a random-number generator: pure integer
    tensor ops, so it runs inside torch.compile, and keyed by each token's position among the valid tokens,
    so it is the same whether a batch is left- or right-padded (Unsloth repacks padding before its loss).
    It runs on every token of every Clip-Cov call, so it works on 32-bit words in place (`_murmur32`). With an int32
    `[B, T]` `salt` (NSR: the bits of each token's log π_old) the keys depend on the salt instead of the row.
    """
    keys = _murmur32(seed, mask, salt).long()
    keys &= _MASK32
    return keys


def hashed_words(seed: Tensor, mask: Tensor, salt: Tensor | None = None) -> Tensor:
    """`hashed_keys` as the int32 words that hold them (read unsigned), without the int64 copy: for a caller that
    only compares them with a threshold (NSR)."""
    return _murmur32(seed, mask, salt)


def hash_ranks(seed: Tensor, mask: Tensor) -> Tensor:
    """`[B, T]` distinct int64 keys ordered as (`hashed_keys`, row-major position), the stable sort of the hashed
    keys: key · 2³¹ + position (positions < 2³¹), built in place on the keys' buffer."""
    ranks = hashed_keys(seed, mask)
    ranks <<= 31
    ranks |= torch.arange(ranks.numel(), device=ranks.device).view_as(ranks)
    return ranks


def token_quota(count: Tensor, size: int, fraction: float) -> tuple[Tensor, int]:
    """max(⌊fraction · N⌋, 1) as a tensor (N = `count`, the number of valid tokens), and a bound on it from the
    batch's `size` (number of entries) alone."""
    return torch.clamp(torch.floor(fraction * count), min=1), int(fraction * size) + 2  # + 2: float rounding


@register
class ClipCov(ClipRangeRule):
    """PPO clip plus random detachment of covariance-selected tokens.

    The clip band defaults to 1.0/1.0: the Clip-Cov recipe loosens PPO's clip to 1 so that it only
    filters extreme tokens and the covariance selection does the work; (0.2, 0.28) is one override away.
    """

    name = "clip_cov"
    family = "covariance"
    acts_on_policy = True  # the covariance selection is detached whatever w is
    batch_statistic = True  # the covariance's means and the quota are over the micro-batch
    needs = ("key_seed",)
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

    def terms(self, batch: TokenBatch, key_seed: Tensor, random_keys: Tensor | None = None, **_: Any) -> RuleTerms:
        """`random_keys` (`[B, T]`, tests only) replaces the keys hashed from `key_seed`."""
        distinct = random_keys is None
        if distinct:  # the hashed keys' order, made distinct by the position (a stable sort's tie-break)
            random_keys = hash_ranks(key_seed.to(batch.mask.device), batch.mask)
        clipped = ppo_clip_terms(batch, 1 - self.eps_low, 1 + self.eps_high)
        count = torch.count_nonzero(batch.mask)  # no int64 copy of the mask, as a bool sum makes
        cov = centred_products(batch, count)  # masked by `candidates`
        ppo_frozen = clipped.frozen_low | clipped.frozen_high
        candidates = batch.mask & ~ppo_frozen & (cov > self.cov_lb) & (cov < self.cov_ub)
        quota = token_quota(count, batch.mask.numel(), self.ratio)
        detached = lowest_ranked(random_keys, candidates, *quota, distinct)
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
    batch_statistic = True  # the covariance's means and the quota are over the micro-batch
    params = (
        fraction("ratio", 2e-3, "fraction k of tokens penalised (KL-Cov 7B recipe: 0.2%)"),
        positive("coef", 1.0, "penalty coefficient β (recipe 1)"),
    )
    summary = "−w·A, plus coef·|log w| on the top-r tokens by covariance"
    source = "KL-Cov (Cui et al. 2025)"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        count = torch.count_nonzero(batch.mask)
        cov = centred_products(batch, count)  # masked by `lowest_ranked`
        selected = lowest_ranked(-cov, batch.mask, *token_quota(count, batch.mask.numel(), self.ratio))
        penalty = torch.where(selected, self.coef * batch.log_ratio.abs(), 0.0)
        never = torch.zeros_like(batch.mask)
        return RuleTerms(
            loss=-ratio * batch.advantages + penalty,
            frozen_low=never,
            frozen_high=never,
            extra={"clip/frac_kl_penalty": selected},
        )
