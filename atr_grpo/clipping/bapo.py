"""BAPO (Xi et al. 2025, "Balanced Policy Optimization with Adaptive Clipping", arXiv 2510.18927): PPO's clip with
bounds [c_low, c_high] chosen for each batch so that the positive-advantage tokens give at least ρ₀ of the loss.

    contribution of a token (the value of PPO's min):  A > 0: A·min(w, c_high)     A < 0: |A|·max(w, c_low)
    ρ(c_low, c_high) = P / (P + N),  P, N = the contributions of the A > 0 and A < 0 tokens summed over the batch
    Algorithm 1: from (c_low, c_high) = (a⁻, a⁺), raise c_high by δ₁ up to b⁺, then c_low by δ₂ up to b⁻, and stop
                 at the first pair with ρ ≥ ρ₀ (the last pair when none reaches it)
    J = Σ_t min(w_t A_t, clip(w_t, c_low, c_high) A_t)

`balanced_bounds` evaluates ρ at every pair of the walk at once, from one sort of the batch's ratios and prefix
sums (pure tensor code: the pair is a tensor, never a Python value).
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


def walk(low_grid: list[float], high_grid: list[float]) -> tuple[list[float], list[float]]:
    """The (c_low, c_high) pairs Algorithm 1 visits, in order: c_high up its grid at c_low's start, then c_low up
    its grid at c_high's end."""
    lows = [low_grid[0]] * len(high_grid) + low_grid[1:]
    highs = high_grid + [high_grid[-1]] * (len(low_grid) - 1)
    return lows, highs


def contributions(batch: TokenBatch, lows: Tensor, highs: Tensor) -> tuple[Tensor, Tensor]:
    """(P, N) at each pair (`lows[k]`, `highs[k]`), float64: P = Σ_{A>0} A·min(w, c_high), N = Σ_{A<0} |A|·max(w, c_low)
    over the valid tokens, with w the value the loss uses (log w clamped to ±LOG_RATIO_LIMIT).

    After one sort of w: P = Σ_{w ≤ c} A·w + c·Σ_{w > c} A and N = c·Σ_{w < c} |A| + Σ_{w ≥ c} |A|·w, each a prefix sum
    read at the place of c among the sorted ratios."""
    ratio = torch.exp(batch.log_ratio.detach().double().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    advantages = batch.advantages.double()  # 0 off the mask (make_batch)
    order = torch.sort(torch.where(batch.mask, ratio, math.inf).flatten())  # invalid tokens last
    ranked = order.values
    finite = torch.where(batch.mask.flatten()[order.indices], ranked, 0.0)
    ranked_advantages = advantages.flatten()[order.indices]
    positive_weight = ranked_advantages.clamp(min=0.0)
    negative_weight = (-ranked_advantages).clamp(min=0.0)
    zero = ranked.new_zeros(1)

    def prefix(values: Tensor) -> Tensor:  # prefix(v)[i] = v_0 + … + v_{i−1}
        return torch.cat([zero, values.cumsum(0)])

    positive_sum, positive_ratio_sum = prefix(positive_weight), prefix(positive_weight * finite)
    negative_sum, negative_ratio_sum = prefix(negative_weight), prefix(negative_weight * finite)
    at_most = torch.searchsorted(ranked, highs, right=True)  # the tokens with w ≤ c_high come first
    below = torch.searchsorted(ranked, lows, right=False)  # the tokens with w < c_low come first
    positive = positive_ratio_sum[at_most] + highs * (positive_sum[-1] - positive_sum[at_most])
    negative = lows * negative_sum[below] + (negative_ratio_sum[-1] - negative_ratio_sum[below])
    return positive, negative


@register
class BAPO(ClipRule):
    """PPO's clip with [c_low, c_high] chosen per batch: c_high raised first, then c_low, until the positive-advantage
    tokens give ≥ ρ₀ of the loss.

    Read from the paper (Eq. 8, Algorithm 1 and §5's settings: ρ₀ = 0.4, [a⁻, b⁻] = [0.6, 0.9], [a⁺, b⁺] = [1.2, 3.0],
    δ₁ = 0.05, δ₂ = 0.02) and the authors' verl code (WooooDyy/BAPO), written from the formulas. Where they leave a
    choice open:

    - *ρ₀.* The paper trains with 0.4 (§5; 0.45 for Llama, App. A); the repository's README says 0.5 and its
      config's default (positive/negative ≥ 1) is 0.5 too. The default is the paper's 0.4; `clipping.rho0=0.5` is the
      README's.
    - *ρ.* Eq. 8 weighs each token by π_rollout(y_t) inside the expectation over sampled tokens; over a batch of
      samples that is the plain sum over its tokens, and the contributions are magnitudes: ρ = P / (P + N), the
      positive share of the batch's loss (the authors' code compares P / N with a target, the same test). An empty
      batch, or one with no advantage, has ρ = 1: nothing to rebalance.
    - *Raising c_low cannot raise ρ* under Eq. 8 (a negative token's contribution |A|·max(w, c_low) grows with
      c_low), so when c_high = b⁺ falls short Algorithm 1 raises c_low to b⁻: the most low-probability negative tokens
      frozen. The walk is evaluated as written all the same.
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
        self._lows, self._highs = walk(
            bound_grid(self.c_low_start, self.c_low_max, self.c_low_step),
            bound_grid(self.c_high_start, self.c_high_max, self.c_high_step),
        )

    def balanced_bounds(self, batch: TokenBatch) -> tuple[Tensor, Tensor, Tensor]:
        """(c_low, c_high, ρ) chosen for `batch`: 0-d float64 tensors."""
        device = batch.log_ratio.device
        lows = torch.tensor(self._lows, dtype=torch.float64, device=device)
        highs = torch.tensor(self._highs, dtype=torch.float64, device=device)
        positive, negative = contributions(batch, lows, highs)
        reached = positive * (1.0 - self.rho0) >= self.rho0 * negative  # ρ ≥ ρ₀, with ρ = 1 when P + N = 0
        last = torch.tensor(len(self._lows) - 1, device=device)
        chosen = torch.where(reached.any(), torch.argmax(reached.int()), last).reshape(1)  # the first pair reaching ρ₀

        def pick(values: Tensor) -> Tensor:  # a gather, not values[chosen]: no integer leaves the graph
            return values.gather(0, chosen).squeeze(0)

        total = pick(positive) + pick(negative)
        rho = torch.where(total > 0, pick(positive) / total.clamp(min=1e-300), 1.0)
        return pick(lows), pick(highs), rho

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        low, high, rho = self.balanced_bounds(batch)
        clipped = ppo_clip_terms(batch, low.float(), high.float())
        like = batch.log_ratio.detach()
        clipped.extra = {
            "bapo/c_low": low.float().expand_as(like),  # each logged as its value (the mean over valid tokens)
            "bapo/c_high": high.float().expand_as(like),
            "bapo/rho": rho.float().expand_as(like),
        }
        return clipped

    def bounds_text(self) -> str:
        return (
            f"w ∈ [c_low, c_high]: c_high ∈ [{self.c_high_start:g}, {self.c_high_max:g}] by {self.c_high_step:g}, "
            f"then c_low ∈ [{self.c_low_start:g}, {self.c_low_max:g}] by {self.c_low_step:g}, until ρ ≥ {self.rho0:g}"
        )
