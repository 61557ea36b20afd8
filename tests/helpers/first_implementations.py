"""The first implementations of BandPO-KL's bounds, M2PO's selection, BAPO's sums and the dual clip, as written
before their cheaper passes (torch.where selections, a gather after the sort, out-of-place Newton steps): the
references the tests of those passes compare with."""

from __future__ import annotations

import math

import torch

from atr_grpo.clipping.bandpo import _log_probs
from atr_grpo.clipping.base import LOG_RATIO_LIMIT


def first_kl_band_root(log_q, log_not_q, delta, steps):
    q, not_q = torch.exp(log_q), torch.exp(log_not_q)
    offset = q * log_q + not_q * log_not_q - delta
    chi2 = q + torch.sqrt(2 * delta * q * not_q)
    y = torch.minimum(-offset / not_q, -torch.log1p(-chi2.clamp(max=1.0)))
    for _ in range(steps):
        minus_p = torch.expm1(-y)
        excess = offset - q * torch.log(-minus_p) + not_q * y
        slope = not_q + q * (1 + minus_p) / minus_p
        y = y - excess / slope
    return y


def first_kl_side_bound(old_logp, rising, delta):
    log_q, log_not_q = _log_probs(old_logp)
    root = first_kl_band_root(
        torch.where(rising, log_q, log_not_q), torch.where(rising, log_not_q, log_q), delta, steps=3
    )
    log_p = torch.where(rising, torch.log(-torch.expm1(-root)), -root)
    return torch.exp(log_p - log_q)


def first_dual_clip_loss(batch, ratio, low, high, dual_c):
    negative = batch.advantages < 0
    return -torch.clamp(ratio, torch.where(negative, low, 0.0), torch.where(negative, dual_c, high)) * batch.advantages


def first_largest_until_mean_at_most(values, eligible, bound):
    flat, chosen_from = values.flatten(), eligible.flatten()
    keys = torch.where(chosen_from, -flat.view(torch.int32), 1)
    order = torch.sort(keys, stable=True).indices
    count = torch.count_nonzero(chosen_from)
    position = torch.arange(flat.numel())
    ranked = torch.where(position < count, flat[order].double(), 0.0)
    suffix = ranked.flip(0).cumsum(0).flip(0)
    left = (count - position).double()
    taken = torch.count_nonzero(suffix > bound * left.clamp(min=0.5))
    return torch.zeros_like(chosen_from).scatter(0, order, position < taken).view_as(values)


def first_trust_region_tokens(batch):
    log_ratio, advantages = batch.log_ratio, batch.advantages
    return batch.mask & (((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0)))


def first_bapo_buckets(batch, low_grid, low_step, high_grid, high_step):
    ratio = torch.exp(batch.log_ratio.detach().float().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)).flatten()
    advantages = batch.advantages.flatten()

    def bucket(grid, step):
        return torch.ceil((ratio - grid[0]) / step).clamp(0, grid.numel())

    return torch.where(advantages > 0, bucket(high_grid, high_step), high_grid.numel() + 1 + bucket(low_grid, low_step))


def first_bapo_contributions(batch, low_grid, low_step, high_grid, high_step):
    ratio = torch.exp(batch.log_ratio.detach().float().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)).flatten()
    buckets = first_bapo_buckets(batch, low_grid, low_step, high_grid, high_step)
    weight = batch.advantages.flatten().abs()
    values = torch.stack([weight * ratio, weight]).double()
    highs, lows = high_grid.numel(), low_grid.numel()
    sums = values.new_zeros(2, highs + 1 + lows + 1).index_add_(1, buckets.long(), values)
    below, total = sums[:, : highs + 1].cumsum(1)[:, :-1], sums[:, : highs + 1].sum(1)
    positive = below[0] + high_grid * (total[1] - below[1])
    below, total = sums[:, highs + 1 :].cumsum(1)[:, :-1], sums[:, highs + 1 :].sum(1)
    return positive, low_grid * below[1] + (total[0] - below[0])


def edge_batch(seed, batch=8, steps=300, spread=0.4):
    """float32 log-probs with masked tokens, a fully masked row, zero advantages (a whole row and single tokens),
    π_old from 1e-12 to 1 − 1e-7, and log w spread by `spread`."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, steps, generator=g) * 6
    old[0, :8] = torch.tensor([math.log(1e-12), -40.0, -70.0, -1e-7, -1e-6, -1e-5, 0.0, -1e-3])
    logp = old + torch.randn(batch, steps, generator=g) * spread
    advantages = torch.randn(batch, steps, generator=g)
    advantages[1] = 0.0
    advantages[2, ::5] = 0.0
    mask = torch.rand(batch, steps, generator=g) > 0.15
    mask[3] = False
    return logp, old, advantages, mask
