"""BAPO (Xi et al. 2025, "Balanced Policy Optimization with Adaptive Clipping", arXiv 2510.18927): PPO's clip with
bounds [c_low, c_high] chosen for each batch so that the positive-advantage tokens give at least ρ₀ of the loss.

    contribution of a token (the value of PPO's min):  A > 0: A·min(w, c_high)     A < 0: |A|·max(w, c_low)
    ρ(c_low, c_high) = P / (P + N),  P, N = the contributions of the A > 0 and A < 0 tokens summed over the batch
    Algorithm 1: from (c_low, c_high) = (a⁻, a⁺), raise c_high by δ₁ up to b⁺, then c_low by δ₂ up to b⁻, and stop
                 at the first pair with ρ ≥ ρ₀ (the last pair when none reaches it)
    J = Σ_t min(w_t A_t, clip(w_t, c_low, c_high) A_t)

`balanced_bounds` evaluates ρ at every pair of the walk at once, from the sums of the batch's tokens in the buckets
between grid points (pure tensor code: the pair is a tensor, never a Python value).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import (
    LOG_RATIO_LIMIT,
    ClipRule,
    RuleTerms,
    TokenBatch,
    fraction,
    number,
    positive,
    register,
)
from atr_grpo.clipping.ratio import ppo_clip_terms

# steps that land within this of a range's end reach it: (3.0 − 1.2) / 0.05 is 35.99999999999999 in floats
GRID_TOLERANCE = 1e-9


def bound_grid(start: float, end: float, step: float) -> list[float]:
    """start, start + step, …, up to `end` (reached, exactly, when a whole number of steps gets there)."""
    steps = math.floor((end - start) / step + GRID_TOLERANCE)
    grid = [start + k * step for k in range(steps + 1)]
    return [end if abs(end - value) <= GRID_TOLERANCE * step else value for value in grid]


def contributions(
    batch: TokenBatch, low_grid: Tensor, low_step: float, high_grid: Tensor, high_step: float
) -> tuple[Tensor, Tensor]:
    """float64 P at each c_high of `high_grid` and N at each c_low of `low_grid` (evenly spaced by their steps):
    P = Σ_{A>0} A·min(w, c_high) and N = Σ_{A<0} |A|·max(w, c_low) over the valid tokens, with w the value the loss
    uses (log w clamped to ±LOG_RATIO_LIMIT).

    Each token falls in a bucket between two grid points, found by arithmetic on the grid (no sort, no search); with
    the sums per bucket, P = Σ_{w ≤ c} A·w + c·Σ_{w > c} A and N = c·Σ_{w ≤ c} |A| + Σ_{w > c} |A|·w are prefix sums
    over the buckets. A token at a grid point counts the same on either side (min(w, c) = max(w, c) = c), so rounding
    at the edges of a bucket changes nothing. A token with A > 0 counts in P only and one with A < 0 in N only, so
    one scatter fills both sets of buckets: P's first, then N's."""
    ratio = torch.exp(batch.log_ratio.detach().float().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)).flatten()
    advantages = batch.advantages.flatten()  # 0 off the mask (make_batch): those tokens add nothing
    highs, lows = high_grid.numel(), low_grid.numel()

    def bucket(grid: Tensor, step: float) -> Tensor:  # w ≤ c_k ⇔ bucket ≤ k
        return torch.ceil((ratio - grid[0]) / step).clamp(0, grid.numel())

    # each token's bucket picked by a 0/1 weight: lerp returns one end bit for bit, at a fraction of torch.where's cost
    rising = (advantages > 0).to(ratio.dtype)
    buckets = torch.lerp(bucket(low_grid, low_step).add_(highs + 1), bucket(high_grid, high_step), rising)
    weight = advantages.abs()
    values = torch.stack([weight * ratio, weight]).double()  # [2, tokens]
    sums = values.new_zeros(2, highs + 1 + lows + 1).index_add_(1, buckets.long(), values)

    def up_to(part: Tensor) -> tuple[Tensor, Tensor]:
        """At each grid point c_k: (Σ |A|·w, Σ |A|) over the part's tokens with w ≤ c_k; and the part's totals."""
        return part.cumsum(1)[:, :-1], part.sum(1)

    below, positive_total = up_to(sums[:, : highs + 1])
    positive = below[0] + high_grid * (positive_total[1] - below[1])
    below, negative_total = up_to(sums[:, highs + 1 :])
    negative = low_grid * below[1] + (negative_total[0] - below[0])
    return positive, negative


@register
class BAPO(ClipRule):
    """PPO's clip with [c_low, c_high] chosen per batch: c_high raised first, then c_low, until the positive-advantage
    tokens give ≥ ρ₀ of the loss.

    Read from the paper (Eq. 8, Algorithm 1 and §5's settings: ρ₀ = 0.4, [a⁻, b⁻] = [0.6, 0.9], [a⁺, b⁺] = [1.2, 3.0],
    δ₁ = 0.05, δ₂ = 0.02) and the authors' verl code (WooooDyy/BAPO), written from the formulas. Where they leave a
    choice open:

    - *ρ₀.* The paper's experiments use 0.4 (§5, implementation details, in the paper.pdf of WooooDyy/BAPO at
      602d517, with [0.6, 0.9], [1.2, 3.0], δ₁ = 0.05, δ₂ = 0.02). The repository's README (at 7287044) says 0.5;
      its config's default target is P/N ≥ 1 (ρ ≥ 0.5) and its example script's P/N ≥ 0.5 (ρ ≥ 1/3). The default
      is the paper's 0.4; `clipping.rho0=0.5` is the README's.
    - *ρ.* Eq. 8 weighs each token by π_rollout(y_t) inside the expectation over sampled tokens; over a batch of
      samples that is the plain sum over its tokens, and the contributions are magnitudes: ρ = P / (P + N), the
      positive share of the batch's loss (the authors' code compares P / N with a target, the same test). An empty
      batch, or one with no advantage, has ρ = 1: nothing to rebalance.
    - *Raising c_low cannot raise ρ* under Eq. 8 (a negative token's contribution |A|·max(w, c_low) grows with
      c_low), so when c_high = b⁺ falls short Algorithm 1 raises c_low to b⁻: the most low-probability negative tokens
      frozen. The walk is evaluated as written all the same. The authors' code (recipe/bapo/policy_loss.py at
      7287044) walks the other way: c_low first ("adjust lower clip range first"), then c_high. Under its own
      P / N that first walk can only lower the ratio, so it ends at b⁻ whenever the start falls short; the order
      here is the paper's.
    - *The grid* is a + k·δ for whole k, reaching the end of a range within 1e-9 (so 3.0 is reached by 0.05 steps);
      Algorithm 1's loop also stops when c_low cannot step, which leaves c_high at a⁺ if b⁻ < a⁻ + δ₂: here c_high
      still walks its range then.
    - *No dual clip.* Algorithm 1's objective is PPO's min alone; the authors' verl code adds verl's dual clip
      (c = 3) for A < 0, which `dual_clip` has.
    - *Bounds from the loss's own ratios,* for each update (Algorithm 1 adjusts inside the loop over updates), not a
      controller across steps: the adaptive-δ machinery (`adaptive_delta`, `training.delta_control`) moves a
      threshold between optimizer steps from the previous step's pooled measurement, a step late, which is not BAPO.

    *The batch* is the optimizer step's (`whole_batch`): P and N are sums, but the pair must be chosen before any
    micro-batch's loss and depends on every micro-batch's ratios under the step's θ, which exist only after each
    one's forward pass. Exact bounds under gradient accumulation or N processes would take a second forward pass
    over the whole step and a sum across processes (the authors' code sums across data-parallel ranks but not across
    micro-batches). The run refuses trainer.gradient_accumulation_steps > 1 and several processes instead, before any
    model loads, and the verl plugin refuses the rule.
    """

    name = "bapo"
    family = "ratio"
    batch_statistic = True  # the bounds depend on the contributions summed over the batch
    whole_batch = True  # ...which the source takes over the step's batch: refused where a run splits it
    params = (
        fraction("rho0", 0.4, "ρ₀, the positive tokens' share of the loss to reach (BAPO §5: 0.4; its README: 0.5)"),
        number("c_high_start", 1.2, "a number ≥ 1", lambda v: v >= 1, "a⁺, where c_high starts (BAPO: 1.2)"),
        number("c_high_max", 3.0, "a number ≥ 1", lambda v: v >= 1, "b⁺, the largest c_high (BAPO: 3.0)"),
        positive("c_high_step", 0.05, "δ₁, c_high's step (BAPO: 0.05)"),
        fraction("c_low_start", 0.6, "a⁻, where c_low starts (BAPO: 0.6)"),
        fraction("c_low_max", 0.9, "b⁻, the largest c_low (BAPO: 0.9)"),
        positive("c_low_step", 0.02, "δ₂, c_low's step (BAPO: 0.02)"),
    )
    summary = "w ∈ [c_low, c_high] per batch: c_high, then c_low, raised until the A > 0 tokens give ≥ ρ₀ of the loss"
    source = "BAPO (Xi et al. 2025, arXiv 2510.18927): Eq. 8 and Algorithm 1; ρ₀ = 0.4, [0.6, 0.9], [1.2, 3.0]"

    def validate(self) -> None:
        for start, end in (("c_low_start", "c_low_max"), ("c_high_start", "c_high_max")):
            if not getattr(self, start) <= getattr(self, end):
                raise ValueError(
                    f"clipping rule 'bapo': parameter {end!r} must be ≥ {start} = {getattr(self, start)}, "
                    f"got {getattr(self, end)}"
                )
        self._low_grid = bound_grid(self.c_low_start, self.c_low_max, self.c_low_step)
        self._high_grid = bound_grid(self.c_high_start, self.c_high_max, self.c_high_step)

    def balanced_bounds(self, batch: TokenBatch) -> tuple[Tensor, Tensor, Tensor]:
        """(c_low, c_high, ρ) chosen for `batch`: 0-d float64 tensors. The walk's pairs, in order: c_high up its grid
        at c_low's start, then c_low up its grid at c_high's end."""
        device = batch.log_ratio.device
        low_grid = torch.tensor(self._low_grid, dtype=torch.float64, device=device)
        high_grid = torch.tensor(self._high_grid, dtype=torch.float64, device=device)
        positive, negative = contributions(batch, low_grid, self.c_low_step, high_grid, self.c_high_step)
        more_lows, more_highs = len(self._low_grid) - 1, len(self._high_grid)
        lows = torch.cat([low_grid[:1].expand(more_highs), low_grid[1:]])
        highs = torch.cat([high_grid, high_grid[-1:].expand(more_lows)])
        positive = torch.cat([positive, positive[-1:].expand(more_lows)])
        negative = torch.cat([negative[:1].expand(more_highs), negative[1:]])
        reached = positive * (1.0 - self.rho0) >= self.rho0 * negative  # ρ ≥ ρ₀, with ρ = 1 when P + N = 0
        last = torch.tensor(lows.numel() - 1, device=device)
        chosen = torch.where(reached.any(), torch.argmax(reached.int()), last).reshape(1)  # the first pair reaching ρ₀

        def pick(values: Tensor) -> Tensor:  # a gather, not values[chosen]: no integer leaves the graph
            return values.gather(0, chosen).squeeze(0)

        total = pick(positive) + pick(negative)
        rho = torch.where(total > 0, pick(positive) / total.clamp(min=1e-300), 1.0)
        return pick(lows), pick(highs), rho

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        low, high, rho = self.balanced_bounds(batch)
        clipped = ppo_clip_terms(batch, low.float(), high.float())
        clipped.extra = {"bapo/c_low": low.float(), "bapo/c_high": high.float(), "bapo/rho": rho.float()}  # the batch's
        return clipped

    def bounds_text(self) -> str:
        return (
            f"w ∈ [c_low, c_high]: c_high ∈ [{self.c_high_start:g}, {self.c_high_max:g}] by {self.c_high_step:g}, "
            f"then c_low ∈ [{self.c_low_start:g}, {self.c_low_max:g}] by {self.c_low_step:g}, until ρ ≥ {self.rho0:g}"
        )
