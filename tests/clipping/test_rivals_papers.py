"""The 2025–26 paper rules that no installed engine implements (GPPO, CE-GPPO, ASPO, TOPR, CFPO, BandPO), each
against the defining law of its paper on a constructed batch, with float64 oracles written from the papers'
equations; and BandPO's KL and TV forms against DPPO's rules, whose trust regions they are."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from atr_grpo.clipping import build_rule
from atr_grpo.clipping.bandpo import kl_band_root

TOL = {"rtol": 1e-5, "atol": 1e-6}


# ---------------------------------------------------------------------------------------------- inputs
def probs_batch(seed: int = 0, batch: int = 8, steps: int = 30, spread: float = 0.5):
    """π_old from 0.005 to 0.995 and log-ratios of both signs, far enough to cross every box, with π_θ ≤ 1 (a real
    probability), advantages of both signs and a zero one, and masked tokens."""
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(batch, steps, generator=g, dtype=torch.float64) * 0.99 + 0.005)
    logp = (old + torch.randn(batch, steps, generator=g, dtype=torch.float64) * spread).clamp(max=-1e-6)
    advantages = torch.randn(batch, generator=g, dtype=torch.float64)
    advantages[0] = 0.0
    mask = torch.rand(batch, steps, generator=g) > 0.15
    return logp, old, advantages, mask


def run(name, params, logp, old, advantages, mask, **extras):
    """The rule's per-token loss, its gradient with respect to log π, and its metrics."""
    leaf = logp.clone().requires_grad_()
    out = build_rule(name, **params)(leaf, old, advantages, mask, **extras)
    out.loss.sum().backward()
    return out.loss.detach().double(), leaf.grad.double(), out.metrics


def broadcast(advantages, like):
    return advantages[:, None].expand_as(like)


# ----------------------------------------------------------------------------------------- GPPO, CE-GPPO
def ce_gppo_oracle(w, a, eps_low, eps_high, beta_low, beta_high, c):
    """CE-GPPO's loss (the general β₁/β₂ objective with verl's dual clip) and d loss/d log π, written from the paper:
    outside the box on the side A pushes, value and gradient of −β·bound·A·w/sg(w); else PPO's −w·A."""
    below = (a < 0) & (w < 1 - eps_low)
    above = (a > 0) & (w > 1 + eps_high)
    dual = (a < 0) & (w > c)
    kept = torch.where(below, beta_low * (1 - eps_low), beta_high * (1 + eps_high))
    loss = torch.where(below | above, -kept * a, torch.where(dual, -c * a, -w * a))
    grad = torch.where(below | above, -kept * a, torch.where(dual, 0.0, -w * a))
    return loss, grad, below, above, dual


@pytest.mark.parametrize(
    "name,params",
    [("gppo", {}), ("ce_gppo", {}), ("ce_gppo", {"beta_low": 0.5, "beta_high": 1.5, "c": 2.0})],
)
def test_gppo_keeps_a_scaled_gradient_outside_the_box(name, params):
    """GPPO / CE-GPPO: outside [1 − ε_low, 1 + ε_high] on the side the advantage pushes, the gradient is not zero but
    exactly −β₁(1 − ε_low)·A (below) or −β₂(1 + ε_high)·A (above), the gradient of a token on the bound scaled by β,
    whatever w; inside, PPO's −w·A; the dual clip freezes A < 0 above c."""
    logp, old, advantages, mask = probs_batch(1, spread=0.8)
    rule = build_rule(name, **params)
    beta_low, beta_high = (1.0, 1.0) if name == "gppo" else (rule.beta_low, rule.beta_high)
    loss, grad, metrics = run(name, params, logp, old, advantages, mask)
    w, a = torch.exp(logp - old), broadcast(advantages, logp)
    want_loss, want_grad, below, above, dual = ce_gppo_oracle(
        w, a, rule.eps_low, rule.eps_high, beta_low, beta_high, rule.c
    )
    torch.testing.assert_close(loss, torch.where(mask, want_loss, 0.0), **TOL)
    torch.testing.assert_close(grad, torch.where(mask, want_grad, 0.0), **TOL)
    below, above = below & mask, above & mask
    assert below.sum() > 3 and above.sum() > 3 and (dual & mask).any() == (rule.c < 3)
    assert (grad[below | above] != 0).all()  # the law: no clipped token loses its gradient
    # and its size does not depend on how far out the token is: it is the bound's, scaled by β
    torch.testing.assert_close(grad[below] / -a[below], torch.full_like(grad[below], beta_low * (1 - rule.eps_low)))
    torch.testing.assert_close(grad[above] / -a[above], torch.full_like(grad[above], beta_high * (1 + rule.eps_high)))
    frozen = below | above | (dual & mask)
    assert metrics["clip/frac"] == pytest.approx(float(frozen.sum() / mask.sum()))


def test_gppo_is_ce_gppo_with_unit_betas_and_has_clip_highers_value():
    """GPPO is CE-GPPO with β₁ = β₂ = 1 (loss and gradient), and its forward value is PPO's: that of Clip-Higher with
    the same dual clip (`dual_clip`), while its gradient outside the box is not."""
    logp, old, advantages, mask = probs_batch(2, spread=0.8)
    params = {"eps_low": 0.2, "eps_high": 0.28, "c": 3.0}
    gppo = run("gppo", params, logp, old, advantages, mask)
    ce = run("ce_gppo", {**params, "beta_low": 1.0, "beta_high": 1.0}, logp, old, advantages, mask)
    torch.testing.assert_close(gppo[0], ce[0], rtol=0, atol=0)
    torch.testing.assert_close(gppo[1], ce[1], rtol=0, atol=0)
    ppo = run("dual_clip", params, logp, old, advantages, mask)
    torch.testing.assert_close(gppo[0], ppo[0], **TOL)
    differs = (gppo[1] - ppo[1]).abs() > 1e-6
    assert differs.any() and (ppo[1][differs] == 0).all()  # exactly the tokens PPO freezes, and only them


# ------------------------------------------------------------------------------------------------ ASPO
def aspo_oracle(w, a, eps_low, eps_high, c):
    """ASPO per token (Archer2.0's `compute_policy_loss_archer`; ε per token): the weight of −A·∇log π and the
    value. A > 0: 1/w inside, 0 above 1 + ε_high, c below 1/c; A < 0: w inside, 0 below 1 − ε_low, c above c."""
    pos, neg = a > 0, a < 0
    clipped = (pos & (w > 1 + eps_high)) | (neg & (w < 1 - eps_low))
    dual = (pos & (w < 1 / c)) | (neg & (w > c))
    inside = torch.where(pos, 1 / w, w)
    weight = torch.where(clipped, 0.0, torch.where(dual, c, inside))
    held = torch.where(pos, 1 / (1 + eps_high), 1 - eps_low)
    value = torch.where(clipped, held, torch.where(dual, c, inside))
    return -value * a, -weight * a, clipped, dual


def high_entropy_tokens(entropy, mask, quantile):
    """Per sequence, the valid tokens whose entropy is above the linear-interpolation `quantile` of the sequence's
    valid entropies (numpy's percentile, as `torch.nanquantile` computes it)."""
    wide = torch.zeros_like(mask)
    for row in range(mask.shape[0]):
        values = entropy[row][mask[row]].double().numpy()
        wide[row] = mask[row] & (entropy[row].double() > float(np.quantile(values, quantile)))
    return wide


def test_aspo_flips_the_ratio_of_positive_tokens():
    """ASPO: a positive-advantage token's gradient is weighted by 1/w (PPO's: w), a negative one's by w; past the clip
    on the side A pushes it is frozen, at 1 ± 0.4 for the tokens above their sequence's 0.8 entropy quantile and at
    1 ± 0.2 for the others; where the weight would exceed c it is held at c and keeps its gradient."""
    logp, old, advantages, mask = probs_batch(3, spread=1.2)
    entropy = torch.rand(logp.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2
    rule = build_rule("aspo")
    loss, grad, metrics = run("aspo", {}, logp, old, advantages, mask, token_entropy=entropy)
    w, a = torch.exp(logp - old), broadcast(advantages, logp)
    wide = high_entropy_tokens(entropy, mask, rule.entropy_quantile)
    eps_low = torch.where(wide, rule.high_entropy_eps_low, rule.eps_low)
    eps_high = torch.where(wide, rule.high_entropy_eps_high, rule.eps_high)
    want_loss, want_grad, clipped, dual = aspo_oracle(w, a, eps_low, eps_high, rule.c)
    torch.testing.assert_close(loss, torch.where(mask, want_loss, 0.0), **TOL)
    torch.testing.assert_close(grad, torch.where(mask, want_grad, 0.0), **TOL)
    # the entropy decides: wide tokens between the two boxes train, narrow ones there are frozen
    between = mask & (a > 0) & (w > 1 + rule.eps_high) & (w <= 1 + rule.high_entropy_eps_high)
    assert (between & wide).any() and (between & ~wide).any()
    assert (grad[between & wide] != 0).all() and (grad[between & ~wide] == 0).all()
    valid_per_row = mask.sum(-1)
    assert ((wide.sum(-1) - 0.2 * valid_per_row).abs() <= 1).all()  # the top fifth of each sequence
    flipped = mask & (a > 0) & ~clipped & ~dual
    assert flipped.sum() > 10 and (w[flipped] - 1).abs().max() > 0.1
    torch.testing.assert_close(grad[flipped] * w[flipped], -a[flipped])  # weight exactly 1/w
    soft = mask & dual
    assert ((a > 0) & soft).any() and ((a < 0) & soft).any()
    torch.testing.assert_close(grad[soft], -rule.c * a[soft])  # held at c, gradient kept
    assert (grad[mask & clipped] == 0).all()
    assert metrics["clip/frac_dual"] == pytest.approx(float(soft.sum() / mask.sum()))
    assert metrics["clip/frac"] == pytest.approx(float((mask & (clipped | dual)).sum() / mask.sum()))
    assert metrics["clip/frac_high_entropy"] == pytest.approx(float(wide.sum() / mask.sum()))


def test_aspo_reads_no_entropy_of_padding():
    """The quantile is over each sequence's valid tokens: the entropy written at padded positions changes nothing."""
    logp, old, advantages, mask = probs_batch(3, spread=1.2)
    assert (~mask).any()
    entropy = torch.rand(logp.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    junk = torch.where(mask, entropy, 100.0)
    first = run("aspo", {}, logp, old, advantages, mask, token_entropy=entropy)
    second = run("aspo", {}, logp, old, advantages, mask, token_entropy=junk)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_aspo_with_one_eps_per_side_ignores_the_entropy():
    logp, old, advantages, mask = probs_batch(3, spread=1.2)
    one_eps = {"high_entropy_eps_low": 0.2, "high_entropy_eps_high": 0.2}
    entropies = [torch.rand(logp.shape, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    first, second = (run("aspo", one_eps, logp, old, advantages, mask, token_entropy=e) for e in entropies)
    assert torch.equal(first[1], second[1])


# ------------------------------------------------------------------------------------------------ TOPR
def test_topr_gives_positive_samples_the_plain_sft_gradient():
    """TOPR: a sample with A ≥ 0 gets exactly the SFT (REINFORCE) gradient −A·∇log π whatever its ratio, i.e. the
    gradient of −A·log π; one with A < 0 gets it times min(1, π_θ(y)/π_old(y)), the sequence's ratio truncated at 1
    (the same weight on every token of the sequence), detached."""
    logp, old, advantages, mask = probs_batch(4, spread=0.3)
    advantages[1], advantages[2] = -1.0, -0.5
    logp[1] = old[1] - 0.05  # a negative sequence whose ratio has fallen (weight < 1)
    logp[2] = old[2] + 0.05  # and one whose ratio has risen (truncated at 1)
    loss, grad, metrics = run("topr", {}, logp, old, advantages, mask)
    a = broadcast(advantages, logp)
    leaf = logp.clone().requires_grad_()
    sft = torch.where(mask, -a * leaf, 0.0)
    sft.sum().backward()
    positive = mask & (a >= 0)
    assert (positive & ((logp - old).abs() > 0.3)).any()  # far-off ratios among them
    # to the bit, at the precision the rule computes in (float32, as every rule)
    assert torch.equal(grad[positive], leaf.grad[positive].float().double())
    sequence_ratio = torch.exp(torch.where(mask, logp - old, 0.0).sum(-1, keepdim=True)).expand_as(logp)
    weight = torch.where(a < 0, sequence_ratio.clamp(max=1.0), 1.0)
    torch.testing.assert_close(grad, torch.where(mask, -weight * a, 0.0), **TOL)
    torch.testing.assert_close(loss, torch.where(mask, -weight * a * logp, 0.0), **TOL)
    assert 0 < float(weight[1][mask[1]][0]) < 0.5 and (weight[2] == 1).all()
    truncated = mask & (a < 0) & (sequence_ratio > 1)
    assert truncated[2].any() and metrics["clip/frac"] == pytest.approx(float(truncated.sum() / mask.sum()))


def test_topr_at_token_level_truncates_each_tokens_ratio():
    logp, old, advantages, mask = probs_batch(5, spread=0.3)
    _, grad, _ = run("topr", {"ratio_level": "token"}, logp, old, advantages, mask)
    a = broadcast(advantages, logp)
    weight = torch.where(a < 0, torch.exp(logp - old).clamp(max=1.0), 1.0)
    torch.testing.assert_close(grad, torch.where(mask, -weight * a, 0.0), **TOL)


# ------------------------------------------------------------------------------------------------ CFPO
def test_cfpo_penalty_gradient_is_the_formulas_and_vanishes_at_the_bound():
    """CFPO: loss −(w·A − |A|/(2ε)·(w − 1)²), gradient −w·(A − |A|·(w − 1)/ε) with respect to log π; it is REINFORCE's
    at w = 1, exactly 0 at PPO's bound on the side A pushes (the objective's maximum) and reversed beyond it."""
    logp, old, advantages, mask = probs_batch(6, spread=0.5)
    eps = 0.2
    loss, grad, metrics = run("cfpo", {"eps": eps}, logp, old, advantages, mask)
    w, a = torch.exp(logp - old), broadcast(advantages, logp)
    torch.testing.assert_close(loss, torch.where(mask, -(w * a - a.abs() / (2 * eps) * (w - 1) ** 2), 0.0), **TOL)
    torch.testing.assert_close(grad, torch.where(mask, -w * (a - a.abs() * (w - 1) / eps), 0.0), **TOL)
    past = mask & (((a > 0) & (w > 1 + eps)) | ((a < 0) & (w < 1 - eps)))
    assert past.sum() > 3 and (grad[past] * -a[past] < 0).all()  # pulled back into the region
    assert metrics["cfpo/frac_pulled_back"] == pytest.approx(float(past.sum() / mask.sum()))
    assert metrics["clip/frac"] == 0.0
    # on the bound: w = 1 + ε for A > 0, 1 − ε for A < 0, the gradient vanishes; the value there is the maximum
    on_bound = torch.log(torch.tensor([[1 + eps, 1 - eps, 1.0]], dtype=torch.float64))
    old_row = torch.full_like(on_bound, -1.0)
    for adv, zero_at in ((1.0, 0), (-1.0, 1)):
        _, g, _ = run("cfpo", {"eps": eps}, old_row + on_bound, old_row, torch.tensor([adv]), torch.ones(1, 3) > 0)
        assert abs(float(g[0, zero_at])) < 1e-6 and float(g[0, 2]) == pytest.approx(-adv)
    grid = torch.linspace(0.5, 1.5, 1001, dtype=torch.float64)
    objective = grid - (grid - 1) ** 2 / (2 * eps)
    assert float(grid[objective.argmax()]) == pytest.approx(1 + eps, abs=1e-3)


# ---------------------------------------------------------------------------------------------- BandPO
F = {
    "bandpo_kl": lambda u: u - 1 - torch.log(u),
    "bandpo_tv": lambda u: 0.5 * (u - 1).abs(),
    "bandpo_chi2": lambda u: (u - 1) ** 2,
}


def band_cost(name, q, r):
    """BandPO's constraint g_f(q, r) = q·f(r) + (1 − q)·f((1 − q·r)/(1 − q)), from the generator f, in float64."""
    return q * F[name](r) + (1 - q) * F[name]((1 - q * r) / (1 - q))


@pytest.mark.parametrize("name", sorted(F))
@pytest.mark.parametrize("delta", [0.001, 0.05, 0.3])
def test_bandpo_bounds_solve_the_f_divergence_constraint_at_the_boundary(name, delta):
    """`old_prob_bounds`: at each π_old the band's ends solve g_f(q, r) = δ, or sit on the simplex (0 or 1/q) where the
    whole side fits, g_f ≤ δ there; inside, g_f < δ."""
    rule = build_rule(name, delta=delta, ratio_cap=1e30)
    q = torch.tensor([1e-3, 0.003, 0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999], dtype=torch.float64)
    low, high = rule.old_prob_bounds(q)
    for end, edge in ((low, torch.zeros_like(q)), (high, 1 / q)):
        saturated = torch.isclose(end, edge, rtol=1e-12, atol=1e-300)
        cost = band_cost(name, q, end.clamp(min=1e-300))
        if name != "bandpo_kl":
            assert (cost[saturated] <= delta * (1 + 1e-9)).all()
        else:  # the KL band never reaches the edge (its cost there is infinite), but may be within 1e-16 of it
            assert (band_cost(name, q, end * (1 - 1e-9))[saturated] < delta).all()
        torch.testing.assert_close(cost[~saturated], torch.full_like(cost[~saturated], delta), rtol=1e-9, atol=0)
    assert (low < 1).all() and (high > 1).all()
    middle = 0.5 * (low + high)
    assert (band_cost(name, q, middle.clamp(max=1 / q * (1 - 1e-12))) < delta).all()


def test_the_kl_band_root_reaches_float64_precision_in_four_steps_and_float32_in_three():
    """The Newton solver against bisection in float64, for δ from 1e-3 to 5 and π_old from 1e-12 to 1 − 1e-6, on
    both sides (the lower bound is the upper root for 1 − q); the rule's float32 pass, one root per token, against
    the float64 bounds."""
    q = torch.tensor(
        [1e-12, 1e-8, 1e-5, 1e-3, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999, 1 - 1e-6], dtype=torch.float64
    )
    log_q, log_not_q = torch.log(q), torch.log1p(-q)
    for delta in (1e-3, 1e-2, 0.05, 0.2, 1.0, 5.0):
        for lq, lnq in ((log_q, log_not_q), (log_not_q, log_q)):
            y = kl_band_root(lq, lnq, delta)
            # bisection on y between p = q and p = 1 − 1e-300, with the same Bernoulli KL written in p
            lo, hi = -lnq, torch.full_like(q, 1e15)
            for _ in range(200):
                mid = 0.5 * (lo + hi)
                p = -torch.expm1(-mid)
                kl = torch.exp(lq) * (lq - torch.log(p)) + torch.exp(lnq) * (lnq + mid)
                lo, hi = torch.where(kl <= delta, mid, lo), torch.where(kl <= delta, hi, mid)
            torch.testing.assert_close(y, 0.5 * (lo + hi), rtol=1e-10, atol=1e-12)
        rule = build_rule("bandpo_kl", delta=delta, ratio_cap=1e30)
        low, high = rule.old_prob_bounds(q)
        old = torch.log(q).float()[None, :].expand(2, -1)
        rising = torch.tensor([[True], [False]]).expand(2, len(q))
        side = rule.side_bound(old, rising).double()
        torch.testing.assert_close(side[0], high, rtol=1e-4, atol=0)
        torch.testing.assert_close(side[1], low, rtol=1e-4, atol=1e-30)


def ppo_band_oracle(w, a, low, high, c):
    """PPO's min(w·A, clip(w, l, u)·A) with the dual clip c·A for A < 0: (loss, d loss/d log π)."""
    unclipped, clipped = w * a, torch.minimum(torch.maximum(w, low), high) * a
    objective = torch.minimum(unclipped, clipped)
    grad = torch.where(unclipped <= clipped, w * a, 0.0)
    floor = (a < 0) & (c * a > objective)
    return -torch.where(floor, c * a, objective), -torch.where(floor, 0.0, grad)


@pytest.mark.parametrize("name", sorted(F))
def test_bandpo_is_ppos_clip_on_its_band(name):
    """BandPO's loss: PPO's clipped surrogate on [l(π_old), min(u(π_old), ratio_cap)] plus the dual clip, against a
    float64 oracle with the bounds from `old_prob_bounds` (the rule computes them in float32, one side per token);
    the cap and the dual clip both act on this batch."""
    logp, old, advantages, mask = probs_batch(7, spread=1.0)
    old[3, :6] = math.log(0.003)  # rare tokens pushed far up: beyond ratio_cap
    logp[3, :6] = math.log(0.05)
    advantages[3] = 1.0
    old[4, :6], logp[4, :6] = math.log(0.05), math.log(0.9)  # A < 0 beyond the dual clip c
    advantages[4] = -1.0
    params = {"ratio_cap": 5.0, "c": 6.0}
    rule = build_rule(name, **params)
    loss, grad, metrics = run(name, params, logp, old, advantages, mask)
    low, high = rule.old_prob_bounds(torch.exp(old))
    w, a = torch.exp(logp - old), broadcast(advantages, logp)
    want_loss, want_grad = ppo_band_oracle(w, a, low, high, rule.c)
    torch.testing.assert_close(loss, torch.where(mask, want_loss, 0.0), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grad, torch.where(mask, want_grad, 0.0), rtol=1e-4, atol=1e-6)
    assert (high[3, :6] == 5.0).all() and (grad[3, :6][mask[3, :6]] == 0).all()
    assert metrics["clip/frac_dual"] > 0 and (grad[4, :6][mask[4, :6]] == 0).all()
    assert 0.05 < metrics["clip/frac"] < 0.7


@pytest.mark.parametrize("band,dppo", [("bandpo_kl", "dppo_kl"), ("bandpo_tv", "dppo_tv")])
@pytest.mark.parametrize("delta", [0.02, 0.05, 0.15])
def test_bandpo_kl_and_tv_have_the_gradient_of_dppo(band, dppo, delta):
    """BandPO's KL and TV bands are DPPO-Binary's trust regions: with its cap and dual clip out of reach, bandpo_kl
    (bandpo_tv) at δ has exactly the gradient and the frozen set of dppo_kl (dppo_tv) at δ_low = δ_high = δ, and
    the same per-π_old bounds (up to DPPO's 1e-8 smoothing inside its KL); the loss values differ (PPO's clipped
    value against DPPO's −A·sg(w)·log π)."""
    logp, old, advantages, mask = probs_batch(8, batch=12, spread=0.6)
    ours = run(band, {"delta": delta, "ratio_cap": 1e6, "c": 2e6}, logp, old, advantages, mask)
    theirs = run(dppo, {"delta_low": delta, "delta_high": delta, "c": 1e4}, logp, old, advantages, mask)
    assert float(torch.exp(logp - old).max()) < 1e4
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-6, atol=1e-9)
    for key in ("clip/frac_low", "clip/frac_high", "clip/frac"):
        assert ours[2][key] == pytest.approx(theirs[2][key])
    assert 0.05 < ours[2]["clip/frac"] < 0.6
    assert not torch.allclose(ours[0], theirs[0])
    q = torch.tensor([0.001, 0.01, 0.1, 0.5, 0.9, 0.99], dtype=torch.float64)
    mine = build_rule(band, delta=delta, ratio_cap=1e6).old_prob_bounds(q)
    dppos = build_rule(dppo, delta_low=delta, delta_high=delta).old_prob_bounds(q)
    for a, b in zip(mine, dppos):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-12)


@pytest.mark.parametrize("steps", [1, 2, 7, 33, 300])
def test_aspos_entropy_quantile_is_torchs_nanquantile(steps):
    """The partial top-k gives the tokens above `torch.nanquantile` of each sequence's valid entropies, with rows of
    no valid token, of one, and of ties."""
    g = torch.Generator().manual_seed(steps)
    entropy = torch.rand(6, steps, generator=g)
    mask = torch.rand(6, steps, generator=g) > 0.3
    mask[0], mask[1] = False, False
    mask[1, 0] = True
    entropy[2] = torch.round(entropy[2] * 3) / 3  # ties
    rule = build_rule("aspo")
    valid = torch.where(mask, entropy, torch.nan)
    want = (valid > torch.nanquantile(valid, rule.entropy_quantile, dim=-1, keepdim=True)) & mask
    assert torch.equal(rule.high_entropy(entropy, mask), want)
