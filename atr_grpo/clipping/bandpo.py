"""BandPO (arXiv 2603.04918): an f-divergence trust region projected to per-token ratio bounds inside PPO's min.

The Band operator asks how far a token's ratio r = π_θ(y_t)/π_old(y_t) may move when the rest of the distribution
is rescaled to absorb the change, and keeps the f-divergence D_f(π_θ ‖ π_old) of that move within the radius δ.
With q = π_old(y_t|s_t) the move costs

    g_f(q, r) = q·f(r) + (1 − q)·f((1 − q·r)/(1 − q)),    r ∈ [0, 1/q]

which is convex in r with g_f(q, 1) = 0, so {g_f ≤ δ} is an interval [l_f(q), u_f(q)] around 1, saturated at 0 or
1/q where the whole simplex fits. It replaces PPO's [1 − ε_low, 1 + ε_high]:

    loss_t = −min(w·A, clip(w, l_f(q), min(u_f(q), ratio_cap))·A),   and −c·A for A < 0 above w = c (dual clip)

- KL, f(u) = u − 1 − log u: g is the Bernoulli KL(Bern(q) ‖ Bern(q·r)), with no closed form. Here Newton's method
  in y = −log(1 − p) (p = q·r beyond q; the lower bound is the same problem for 1 − q), where g is convex and
  increasing, from the smaller of a point known to lie beyond the root and the χ² approximation: four steps reach
  float64's precision for every δ in [1e-3, 5] and π_old in [1e-12, 1 − 1e-6]
  (tests/clipping/test_rivals_papers.py). The rule's own float32 pass starts instead from a table of the root made
  once per δ, and one step reaches 1e-9, where three from the closed-form start reached 4e-8
  (tests/clipping/test_kl_band_start.py).
- TV, f(u) = |u − 1|/2: g = q·|r − 1| = |π_θ − π_old|, so [max(1 − δ/q, 0), min(1 + δ/q, 1/q)].
- Pearson χ², f(u) = (u − 1)²: g = q·(r − 1)²/(1 − q), so 1 ± sqrt(δ·(1 − q)/q), within [0, 1/q].

The KL and TV trust regions are DPPO-Binary's (`dppo_kl`, `dppo_tv`, arXiv 2602.04879) with δ_low = δ_high = δ:
DPPO keeps a token while the same divergence stays within δ on the side its advantage pushes, and its kept tokens
have the same gradient −A·w·∇log π. So while w stays below DPPO's truncation c and this rule's ratio_cap and dual
clip c, `bandpo_kl` (`bandpo_tv`) has exactly the gradient of `dppo_kl` (`dppo_tv`) at that δ; only the loss value
differs (PPO's clipped value here, DPPO's −A·sg(w)·log π there) and DPPO's 1e-8 smoothing inside its KL's log.
tests/clipping/test_rivals_papers.py proves it.

Defaults are the authors' recipe (OpenMOSS/BandPO `baselinescripts`, bandkl005 / bandtv005 / bandchi2005): δ = 0.05,
upper_bound_max = 10 (ratio_cap), dual clip on with c = 10, and does_relax_high_p_bound off (the relaxed variant,
which widens every band to at least DAPO's [0.8, 1.28], is an ablation there and not offered here). Choices: the
bounds are computed at π_old held in [e^−60, 1 − 1e-6], where the authors' code substitutes the limits below 1e-6
(lower 0, upper 1/q) and above 1 − 1e-6 (upper 1, lower the p → 1 limit). Above 1 − 1e-6 the two agree to about
1e-6 on the upper bounds and 5e-8 on TV's lower bound, but not on the KL lower bound (off by 1.03e-5) nor the χ² one
(2.24e-4): at π_old = 0.9999998, w = 0.9999, A = −1, χ²'s band here is [0.999776, 1.000001], the code's [1, 1], so
the token keeps a gradient of +0.9999 here and 0 there. The effect is small (∂log π/∂logits ∝ 1 − π_old ≤ 1e-6).
Tokens frozen by the band or the dual clip count in `clip/frac_*`, the dual clip also in `clip/frac_dual`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import ClipRule, Param, RuleTerms, TokenBatch, number, open_unit, positive, register
from atr_grpo.clipping.ratio import ppo_clip_terms

# π_old is held in [e^-60, 1 - 1e-6] to compute the bounds: 1/q and 1/(1 - q) stay finite in float32
_LOG_Q_MIN = -60.0
_LOG_Q_MAX = math.log1p(-1e-6)
KL_NEWTON_STEPS = 4
# The rule's start table (`kl_start_table`): the KL root on an even grid of logit q = log q − log(1 − q)
START_LOGITS = (-60.0, 60.0)
START_POINTS = 4096


def _log_probs(old_logp: Tensor) -> tuple[Tensor, Tensor]:
    """(log q, log(1 − q)) of π_old, held in the range above, without gradient."""
    log_q = old_logp.detach().clamp(_LOG_Q_MIN, _LOG_Q_MAX)
    return log_q, torch.log1p(-torch.exp(log_q))


def kl_band_root(
    log_q: Tensor, log_not_q: Tensor, delta: float, steps: int = KL_NEWTON_STEPS, start_table: Tensor | None = None
) -> Tensor:
    """y = −log(1 − p) for the root p > q of KL(Bern(q) ‖ Bern(p)) = δ, from log q and log(1 − q) (elementwise).

    In y the divergence q·log q + (1 − q)·log(1 − q) − q·log p + (1 − q)·y is convex and increasing beyond p = q,
    so Newton's method converges from any start there, monotonically from one beyond the root. (δ + H(q))/(1 − q) is
    beyond the root, since −q·log p ≥ 0. Without `start_table` the start is the smaller of that point and y at the
    χ² approximation of the root, p = q + sqrt(2δ·q·(1 − q)), which is close to it. With the table of
    `kl_start_table(delta)` it is that point times the table's ratio at logit q, within 2e-5 of the root."""
    q, not_q = torch.exp(log_q), torch.exp(log_not_q)
    # In place, in the order the formulas are written: the same floats, with fewer [B, T] buffers
    offset = (q * log_q).add_(not_q * log_not_q).sub_(delta)  # KL − δ = offset − q·log p + (1 − q)·y
    beyond = offset.neg().div_(not_q)  # (δ + H(q))/(1 − q)
    if start_table is None:
        chi2 = torch.mul(q, 2 * delta).mul_(not_q).sqrt_().add_(q)  # q + sqrt(2δ·q·(1 − q))
        # χ² beyond 1: y = inf, not a candidate
        y = torch.minimum(beyond, chi2.clamp_(max=1.0).neg_().log1p_().neg_())
    else:
        y = beyond.mul_(_interpolate(start_table.to(log_q), log_q - log_not_q))
    for _ in range(steps):
        minus_p = torch.neg(y).expm1_()
        excess = torch.neg(minus_p).log_().mul_(q).neg_().add_(offset).add_(not_q * y)
        slope = (minus_p + 1).mul_(q).div_(minus_p).add_(not_q)  # (1 − q) − q/(e^y − 1)
        y = y.sub_(excess.div_(slope))
    return y


def kl_start_table(delta: float) -> Tensor:
    """float64 [START_POINTS]: the KL root over the start beyond it, y / ((δ + H(q))/(1 − q)), on an even grid of
    logit q over START_LOGITS, solved to float64's precision. The ratio lies in (0, 1], is smooth in logit q and
    tends to 1 at both ends, where that start is the root: beyond the grid the ends hold."""
    logit = torch.linspace(*START_LOGITS, START_POINTS, dtype=torch.float64)
    log_q, log_not_q = -torch.nn.functional.softplus(-logit), -torch.nn.functional.softplus(logit)
    q, not_q = torch.exp(log_q), torch.exp(log_not_q)
    beyond = (delta - q * log_q - not_q * log_not_q) / not_q
    return kl_band_root(log_q, log_not_q, delta, steps=2 * KL_NEWTON_STEPS) / beyond


def _interpolate(table: Tensor, logit: Tensor) -> Tensor:
    """The start table at each `logit`: linear between grid points, the ends beyond them (two gathers, no search)."""
    low, high = START_LOGITS
    last = table.numel() - 1
    position = (logit - low).mul_(last / (high - low)).clamp_(0, last)
    index = position.floor().clamp_(max=last - 1)
    fraction = position.sub_(index)
    index = index.long()
    return torch.lerp(table.take(index), table[1:].take(index), fraction)


def kl_band(old_logp: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """(l(q), u(q)) of the KL band at π_old = exp(old_logp): the lower bound is the upper root for 1 − q."""
    log_q, log_not_q = _log_probs(old_logp)
    upper = torch.exp(torch.log(-torch.expm1(-kl_band_root(log_q, log_not_q, delta))) - log_q)
    lower = torch.exp(-kl_band_root(log_not_q, log_q, delta) - log_q)
    return lower, upper


def tv_band(old_logp: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """|π_θ − π_old| ≤ δ: [max(1 − δ/q, 0), min(1 + δ/q, 1/q)]."""
    inverse_q = torch.exp(-_log_probs(old_logp)[0])
    return (1 - delta * inverse_q).clamp(min=0.0), torch.minimum(1 + delta * inverse_q, inverse_q)


def chi2_band(old_logp: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """q·(r − 1)²/(1 − q) ≤ δ: 1 ± sqrt(δ·(1 − q)/q), within [0, 1/q]."""
    log_q = _log_probs(old_logp)[0]
    half_width = torch.sqrt(delta * torch.expm1(-log_q))
    return (1 - half_width).clamp(min=0.0), torch.minimum(1 + half_width, torch.exp(-log_q))


def _bandpo_params(divergence: str, label: str) -> tuple[Param, ...]:
    source = f"BandPO recipe band{divergence}005"
    radius = f"radius δ of the {label} trust region ({source}: 0.05)"
    return (
        # |π_θ − π_old| ≤ δ with δ ≥ 1 holds for every pair of probabilities: the TV band would constrain nothing
        open_unit("delta", 0.05, radius) if divergence == "tv" else positive("delta", 0.05, radius),
        number(
            "ratio_cap",
            10.0,
            "a number > 1",
            lambda v: v > 1,
            f"upper bounds are capped at this ratio ({source}: upper_bound_max = 10)",
        ),
        number("c", 10.0, "a number > 1", lambda v: v > 1, f"dual clip: A < 0 frozen above w = c ({source}: 10)"),
    )


class _BandPO(ClipRule):
    """PPO's clip on the per-token band [l(q), min(u(q), ratio_cap)], with the dual clip c."""

    family = "ratio"

    def band(self, old_logp: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def side_bound(self, old_logp: Tensor, rising: Tensor) -> Tensor:
        """The bound on the side each token's advantage pushes: u(q) where `rising` (A > 0), l(q) elsewhere."""
        low, high = self.band(old_logp)
        return torch.where(rising, high, low)

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        with torch.no_grad():
            rising = batch.advantages > 0
            bound = self.side_bound(batch.old_logp, rising)
        # PPO's min reads `low` only where A < 0 and `high` only where A > 0: one bound per token is enough
        return ppo_clip_terms(batch, bound, bound.clamp(max=self.ratio_cap), dual_c=self.c)

    def old_logp_bounds(self, old_logp: Tensor) -> tuple[Tensor, Tensor]:
        low, high = self.band(old_logp)
        return low, high.clamp(max=self.ratio_cap)

    def old_prob_bounds(self, old_prob: Tensor) -> tuple[Tensor, Tensor]:
        return self.old_logp_bounds(torch.log(old_prob))

    def bounds_text(self) -> str:
        return f"{super().bounds_text()}; A < 0 also frozen above w = {self.c:g}"


@register
class BandPOKL(_BandPO):
    """BandPO with the KL band: the Bernoulli KL between π_old(y_t) and π_θ(y_t) within δ (dppo_kl's region)."""

    name = "bandpo_kl"
    params = _bandpo_params("kl", "KL")
    summary = (
        "PPO clip on the per-token band KL(Bern(π_old) ‖ Bern(π_θ)) ≤ δ, capped, with dual clip: dppo_kl's region, "
        "and dppo_kl's gradient while w stays below both rules' caps"
    )
    source = "BandPO (arXiv 2603.04918), the Band operator with KL (Thm 1, Prop. 3); OpenMOSS/BandPO recipe"

    def band(self, old_logp: Tensor) -> tuple[Tensor, Tensor]:
        return kl_band(old_logp, self.delta)

    def validate(self) -> None:
        self._start_table = kl_start_table(self.delta)

    def side_bound(self, old_logp: Tensor, rising: Tensor) -> Tensor:
        """One root per token, on its side (the lower bound is the upper root for 1 − q): one Newton step from the
        start table reaches 1e-9 (`kl_band`, for float64, takes four from the closed-form start)."""
        log_q, log_not_q = _log_probs(old_logp)
        # each side picked by a 0/1 weight: lerp returns one end bit for bit, at a fraction of torch.where's cost
        pick = rising.to(log_q.dtype)
        own, other = torch.lerp(log_not_q, log_q, pick), torch.lerp(log_q, log_not_q, pick)
        root = kl_band_root(own, other, self.delta, steps=1, start_table=self._start_table)
        log_p = torch.lerp(-root, torch.log(-torch.expm1(-root)), pick)
        return torch.exp(log_p - log_q)


@register
class BandPOTV(_BandPO):
    """BandPO with the TV band: |π_θ(y_t) − π_old(y_t)| ≤ δ (dppo_tv's region)."""

    name = "bandpo_tv"
    params = _bandpo_params("tv", "TV")
    summary = (
        "PPO clip on w ∈ [1 − δ/π_old, 1 + δ/π_old] ∩ [0, 1/π_old], capped, with dual clip: dppo_tv's region, "
        "and dppo_tv's gradient while w stays below both rules' caps"
    )
    source = "BandPO (arXiv 2603.04918), the Band operator with TV, closed form (Prop. 4); OpenMOSS/BandPO recipe"

    def band(self, old_logp: Tensor) -> tuple[Tensor, Tensor]:
        return tv_band(old_logp, self.delta)


@register
class BandPOChi2(_BandPO):
    """BandPO with the Pearson χ² band: w ∈ 1 ± sqrt(δ(1 − π_old)/π_old)."""

    name = "bandpo_chi2"
    params = _bandpo_params("chi2", "Pearson χ²")
    summary = "PPO clip on w ∈ 1 ± sqrt(δ·(1 − π_old)/π_old), within [0, 1/π_old], capped; dual clip"
    source = "BandPO (arXiv 2603.04918), the Band operator with Pearson χ², closed form (Prop. 4); OpenMOSS/BandPO"

    def band(self, old_logp: Tensor) -> tuple[Tensor, Tensor]:
        return chi2_band(old_logp, self.delta)
