"""Per-step metrics pooled over micro-batches and processes, so that a logged value is the global one.

A micro-batch's rule metrics are token-weighted means over its valid tokens (`clip/frac`, `ratio/mean`,
...) or extremes (`ratio/min`, `ratio/max`). Averaging per-micro-batch values, as TRL's `_metrics` lists
do, weighs a short micro-batch like a long one and turns a maximum into a mean of maxima. Here each mean
is kept as (sum, count), each extreme as an extreme and each count as a total, then reduced across processes at
logging time:
`clip/frac` is the fraction of all tokens of the optimizer step, on every process, that the rule froze.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

# counts of the step (how many completions the engine ended each way): summed, never averaged
SUMMED_PREFIXES = ("completions/finish_",)


def reduction(key: str) -> str:
    """How a metric pools: `ratio/max`, `rollout/logp_abs_diff_max` → "max"; `.../min`, `..._min` → "min";
    a count (`completions/finish_length`) → "sum"; everything else is a token-weighted mean."""
    if key.startswith(SUMMED_PREFIXES):
        return "sum"
    last = key.rsplit("/", 1)[-1].rsplit("_", 1)[-1]
    return last if last in ("min", "max") else "mean"


class StepStats:
    """Accumulates metrics between two logging events."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)
        self.minima: dict[str, float] = {}
        self.maxima: dict[str, float] = {}

    def add(self, metrics: dict[str, float], weight: float) -> None:
        """Metrics of one micro-batch; means are weighted by `weight` (its number of valid tokens).

        A NaN (or None) value, or a weight of 0, contributes nothing but still registers its key, so that
        every process reduces the same keys.
        """
        for key, value in metrics.items():
            missing = value is None or math.isnan(value)
            kind = reduction(key)
            if kind == "min":
                self.minima[key] = min(math.inf if missing else value, self.minima.get(key, math.inf))
            elif kind == "max":
                self.maxima[key] = max(-math.inf if missing else value, self.maxima.get(key, -math.inf))
            elif kind == "sum":  # the count of 1 in the sums, so that the total passes through the mean below
                self.sums[key] += 0.0 if missing else value
                self.counts[key] = 1.0
            else:
                counted = 0.0 if missing or weight <= 0 else float(weight)
                self.sums[key] += value * counted if counted else 0.0
                self.counts[key] += counted

    def keys(self) -> list[str]:
        return sorted({*self.sums, *self.minima, *self.maxima})

    def reduce(self, all_reduce: Any = None) -> dict[str, float]:
        """The pooled values, then empty. `all_reduce(tensor, op)` ("sum"/"min"/"max") pools across
        processes; every process must call this with the same keys (they log the same metrics)."""
        keys = sorted({*self.sums, *self.counts})
        mins, maxs = sorted(self.minima), sorted(self.maxima)
        sums = torch.tensor([[self.sums[k], self.counts[k]] for k in keys], dtype=torch.float64).reshape(-1, 2)
        lows = torch.tensor([self.minima[k] for k in mins], dtype=torch.float64)
        highs = torch.tensor([self.maxima[k] for k in maxs], dtype=torch.float64)
        if all_reduce is not None:
            sums, lows, highs = all_reduce(sums, "sum"), all_reduce(lows, "min"), all_reduce(highs, "max")
        out = {
            k: s if reduction(k) == "sum" else (s / c if c > 0 else math.nan) for k, (s, c) in zip(keys, sums.tolist())
        }
        out.update((k, v if math.isfinite(v) else math.nan) for k, v in zip(mins, lows.tolist()))
        out.update((k, v if math.isfinite(v) else math.nan) for k, v in zip(maxs, highs.tolist()))
        self.__init__()
        return out


ROLLOUT_RATIO_BAND = 0.1  # |π_trainer/π_rollout − 1| beyond this counts as out of band


def rollout_mismatch(sampling_logp: Tensor, trainer_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the trainer's, under the same weights.

    `trainer_logp` is log π_old as the trainer computes it (the weights that generated the rollout),
    `sampling_logp` the engine's log-prob of the sampled token (NaN where it gave none). Over valid tokens:
    mean and max |Δ log p| and the fraction whose ratio π_trainer/π_rollout is outside [0.9, 1.1]. On a
    perfect engine all three are 0; a clipping rule sees this mismatch as ratio movement it did not cause.
    """
    with torch.no_grad():
        diff = trainer_logp.detach().float() - sampling_logp.float()
        valid = mask.bool() & ~torch.isnan(diff)
        count = valid.sum().clamp(min=1)
        absolute = torch.where(valid, diff.abs(), 0.0)
        ratio = torch.exp(torch.where(valid, diff, 0.0))
        outside = valid & ((ratio < 1 - ROLLOUT_RATIO_BAND) | (ratio > 1 + ROLLOUT_RATIO_BAND))
        values = torch.stack([absolute.sum() / count, absolute.max(), outside.sum() / count]).tolist()
    return {
        "rollout/logp_abs_diff_mean": values[0],
        "rollout/logp_abs_diff_max": values[1],
        "rollout/ratio_out_of_band_frac": values[2],
    }


def ratio_outside_box(rule: Any, sampling_logp: Tensor, trainer_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """The share of valid tokens whose r = π_old/π_rollout lies outside the rule's box, as
    `rollout/ratio_outside_box_frac`: the box of w the rule clips (`ratio_bounds`, or per token `old_prob_bounds`
    at π_old(y_t)); empty for a rule with neither. Under truncated sampling r carries the kept mass: this is how
    much of the batch the rule would see outside its trust region before any update (tokens the engine gave no
    log-prob count as r = 1)."""
    with torch.no_grad():
        old = trainer_logp.detach().double()
        bounds = rule.ratio_bounds()
        if bounds is None:
            bounds = rule.old_prob_bounds(old.exp())
        if bounds is None:
            return {}
        low, high = bounds
        valid = mask.bool()
        ratio = torch.exp(torch.nan_to_num(old - sampling_logp.double(), nan=0.0))
        outside = valid & ((ratio < low) | (ratio > high))
        share = float(outside.sum() / valid.sum().clamp(min=1))
    return {"rollout/ratio_outside_box_frac": share}
