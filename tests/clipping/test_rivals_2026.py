"""The 2026 rivals (issue 45): MinPRO, DRPO, CPPO, DPPO's top-K estimates, NSR and ERC, each against the law of its
paper, written again here in float64. Each test names the equation it restates; where a paper could not be read,
the rule's `source` says so and the test states the law as the rule reads it."""

from __future__ import annotations

import math

import pytest
import torch

from atr_grpo.clipping import build_rule

TOL = {"rtol": 1e-5, "atol": 1e-6}


def probs_batch(seed: int = 0, batch: int = 8, steps: int = 30, spread: float = 0.5):
    """π_old from 0.005 to 0.995 and log-ratios of both signs (π_θ ≤ 1), advantages of both signs and a zero one,
    masked tokens."""
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
    return advantages[:, None].expand_as(like).clone()


# ------------------------------------------------------------------------------------------------ MinPRO
# The paper's equations could not be read (minpro.py says why): these tests state the law as the rule reads the
# abstract and CPPO's description of it, m_t = min_{i<t} w_i (1 for a row's first token), gradient −m_t·w_t·A·∇log π.
def test_minpro_weighs_each_token_ratio_by_the_smallest_ratio_before_it():
    """MinPRO's law, as read: loss −m_t·w_t·A, gradient −m_t·w_t·A (a loop over each row's valid tokens)."""
    logp, old, advantages, mask = probs_batch()
    loss, grad, metrics = run("minpro", {}, logp, old, advantages, mask)
    w, a = torch.exp(logp - old), broadcast(advantages, logp)
    prefix = torch.ones_like(w)
    for row in range(w.shape[0]):
        smallest = math.inf
        for t in range(w.shape[1]):
            if mask[row, t]:
                prefix[row, t] = 1.0 if smallest == math.inf else smallest  # the first token: an empty prefix
                smallest = min(smallest, float(w[row, t]))
    torch.testing.assert_close(grad, torch.where(mask, -prefix * w * a, 0.0), **TOL)
    torch.testing.assert_close(loss, torch.where(mask, -prefix * w * a, 0.0), **TOL)
    down, up = mask & (prefix < 1) & (a != 0), mask & (prefix > 1) & (a != 0)
    assert 0 < down.sum() and 0 < up.sum() and (down | up).sum() < mask.sum()
    assert metrics["clip/frac_low"] == pytest.approx(float(down.sum() / mask.sum()), abs=1e-6)
    assert metrics["clip/frac_high"] == pytest.approx(float(up.sum() / mask.sum()), abs=1e-6)
    assert metrics["minpro/weight"] == pytest.approx(float(prefix[mask].mean()), rel=1e-5)


def test_minpro_is_neither_the_prefix_product_nor_the_inclusive_minimum_and_ignores_padding():
    """A row of ratios (2, 0.5, 4): MinPRO's gradient weights are 1·2, 2·0.5, 0.5·4 = (2, 1, 2); the prefix product
    would give (2, 1, 4) and min_{i≤t} w_i (2, 0.5, 0.5). Padding before or after the row changes nothing."""
    ratios = torch.tensor([2.0, 0.5, 4.0], dtype=torch.float64)
    for pad_left, pad_right in ((0, 0), (2, 0), (0, 3), (1, 1)):
        old = torch.full((1, pad_left + 3 + pad_right), -3.0, dtype=torch.float64)
        logp = old.clone()
        logp[0, pad_left : pad_left + 3] += torch.log(ratios)
        logp[0, :pad_left] = -50.0  # junk under the padding, far below the row's ratios
        mask = torch.zeros_like(old, dtype=torch.bool)
        mask[0, pad_left : pad_left + 3] = True
        _, grad, _ = run("minpro", {}, logp, old, torch.tensor([1.0], dtype=torch.float64), mask)
        expected = -torch.tensor([2.0, 1.0, 2.0], dtype=torch.float64)
        torch.testing.assert_close(grad[0, pad_left : pad_left + 3], expected)


def test_minpro_on_policy_is_reinforce():
    """w ≡ 1: every m_t = 1, the gradient is −A and no token is counted."""
    _, old, advantages, mask = probs_batch()
    _, grad, metrics = run("minpro", {}, old.clone(), old, advantages, mask)
    torch.testing.assert_close(grad, torch.where(mask, -broadcast(advantages, old), 0.0), **TOL)
    assert metrics["clip/frac"] == 0


# -------------------------------------------------------------------------------------------------- DRPO
# The paper's equations could not be read (drpo.py says why): these tests state the law of its abstract and two
# summaries, SPO's penalty |A|·(w − 1)²/(2δ) times q = π_old, and the three regimes of its gradient weight.
@pytest.mark.parametrize("params", [{}, {"delta_low": 0.05, "delta_high": 0.3}])
def test_drpo_has_the_penalised_loss_and_its_gradient(params):
    """DRPO's law, as read: loss −w·A + |A|·q·(w − 1)²/(2δ), gradient w·(−A + |A|·(p − q)/δ)."""
    logp, old, advantages, mask = probs_batch(spread=0.8)
    loss, grad, metrics = run("drpo", params, logp, old, advantages, mask)
    low, high = params.get("delta_low", 0.15), params.get("delta_high", 0.15)
    p, q, a = torch.exp(logp), torch.exp(old), broadcast(advantages, logp)
    w, delta = p / q, torch.where(a > 0, high, low)
    torch.testing.assert_close(loss, torch.where(mask, -w * a + a.abs() * (p - q) ** 2 / (2 * delta * q), 0.0), **TOL)
    torch.testing.assert_close(grad, torch.where(mask, w * (-a + a.abs() * (p - q) / delta), 0.0), **TOL)
    back = mask & (((a > 0) & (p - q > high)) | ((a < 0) & (p - q < -low)))
    assert 0 < back.sum() < mask.sum() and metrics["clip/frac"] == 0
    assert metrics["drpo/frac_pulled_back"] == pytest.approx(float(back.sum() / mask.sum()), abs=1e-6)
    assert metrics["drpo/penalty"] > 0


@pytest.mark.parametrize("old_prob", [0.01, 0.3, 0.8])
def test_drpos_gradient_vanishes_on_dppo_tvs_boundary_and_points_back_beyond(old_prob):
    """Same geometry as DPPO-TV: the gradient is 0 at p = q + δ (A > 0) and p = q − δ (A < 0), where DPPO-TV's mask
    starts, pushes on inside and pulls back outside."""
    delta = 0.15
    q = torch.tensor(old_prob, dtype=torch.float64)
    for sign in (1.0, -1.0):
        edge = q + sign * delta
        if not 0 < edge < 1:
            continue
        p = torch.stack([edge, q + sign * delta / 2, edge + sign * min(0.01, (1 - edge) / 2, edge / 2)])
        logp, old = torch.log(p)[None, :], torch.log(q).expand(1, 3)
        _, grad, _ = run("drpo", {}, logp, old, torch.tensor([2.0 * sign]), torch.ones(1, 3, dtype=torch.bool))
        assert grad[0, 0].abs() < 1e-6 * (edge / q)  # float32: w·|A| rounded at a few ulps
        assert grad[0, 1] * sign < 0 < grad[0, 2] * sign  # inside: still pushed on; beyond: pulled back


def test_drpos_gradient_weight_amplifies_a_return_toward_pi_old_and_stays_bounded_on_rare_tokens():
    """g = grad / (−w·A) = 1 − sign(A)·(p − q)/δ: above 1 where the shift is against A's push (back toward π_old),
    and within 1 ± 1/δ for a rare token whose ratio is 50, where SPO's weight 1 − sign(A)·(w − 1)/δ (CFPO's rule at
    ε = δ) is beyond ±300."""
    delta = 0.15
    q = torch.tensor([0.3, 0.3, 0.002, 0.002], dtype=torch.float64)
    p = torch.tensor([0.2, 0.4, 0.1, 0.1], dtype=torch.float64)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    logp, old, mask = torch.log(p)[:, None], torch.log(q)[:, None], torch.ones(4, 1, dtype=torch.bool)
    w = p / q
    _, grad, _ = run("drpo", {}, logp, old, advantages, mask)
    weight = grad[:, 0] / (-w * advantages)
    torch.testing.assert_close(weight, 1 - torch.sign(advantages) * (p - q) / delta, **TOL)
    assert weight[0] > 1 and weight[1] > 1  # A > 0 with p < q, A < 0 with p > q: pulled back harder toward q
    assert weight[2:].abs().max() <= 1 + 1 / delta
    _, spo_grad, _ = run("cfpo", {"eps": delta}, logp, old, advantages, mask)
    assert (spo_grad[2:, 0] / (-w[2:] * advantages[2:])).abs().min() > 300


# -------------------------------------------------------------------------------------------------- CPPO
def cppo_oracle(logp, old, advantages, mask, divergence, delta, w_min, budget, budget_mode):
    """CPPO's Algorithm 1, token by token over each row's valid tokens: w_t = 1 − (1 − w_min)(t − 1)/(T − 1) (Eq. 9),
    Z_t = w_t·D_t, keep when A_t(ρ_t − 1) ≤ 0 or Z_t ≤ min(δ, δ + δ_b·W_{t−1} − S_{t−1}) (Eq. 8, 10), then
    S_t = S_{t−1} + Z_t and W_t = W_{t−1} + w_t whatever the decision (step 9). p90: δ_b = clamp(P90(D), δ_b, 2δ_b)
    per row (Eq. 22)."""
    p, q = torch.exp(logp), torch.exp(old)
    kept = torch.zeros_like(mask)
    for row in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[row, t]]
        a, length = float(advantages[row]), len(valid)
        d = []
        for t in valid:
            pt, qt = float(p[row, t]), float(q[row, t])
            if divergence == "tv":
                d.append(abs(pt - qt))
            else:
                d.append(qt * math.log(qt / pt) + (1 - qt) * math.log((1 - qt + 1e-8) / (1 - pt + 1e-8)))
        row_budget = budget
        if budget_mode == "p90" and d:
            row_budget = min(2 * budget, max(budget, float(torch.quantile(torch.tensor(d), 0.9))))
        spent = mass = 0.0
        for i, t in enumerate(valid):
            w = 1 - (1 - w_min) * i / max(length - 1, 1)
            z = w * d[i]
            toward_one = a * (float(p[row, t]) - float(q[row, t])) <= 0
            kept[row, t] = toward_one or z <= min(delta, delta + row_budget * mass - spent)
            spent, mass = spent + z, mass + w
    return kept


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"divergence": "kl", "delta": 0.1, "budget": 0.002},
        {"budget_mode": "p90", "budget": 0.02},
        {"w_min": 0.5, "budget": 0.05},
    ],
)
def test_cppo_keeps_the_tokens_of_algorithm_1_with_the_ratio_advantage_loss(params):
    """CPPO's mask (Algorithm 1, a loop) with the surrogate of Eq. 11: loss −M·ρ·A, gradient −M·A·ρ."""
    settings = {"divergence": "tv", "delta": 0.15, "w_min": 0.8, "budget": 0.015, "budget_mode": "fixed", **params}
    logp, old, advantages, mask = probs_batch(spread=0.3)
    loss, grad, metrics = run("cppo", params, logp, old, advantages, mask)
    kept = mask & cppo_oracle(logp, old, advantages, mask, **settings)
    a, w = broadcast(advantages, logp), torch.exp(logp - old)
    torch.testing.assert_close(grad, torch.where(kept, -a * w, 0.0), **TOL)
    torch.testing.assert_close(loss, torch.where(kept, -a * w, 0.0), **TOL)
    dropped = mask & ~kept & (a != 0)
    assert 0 < dropped.sum() < mask.sum()
    assert metrics["clip/frac"] == pytest.approx(float(dropped.sum() / mask.sum()), abs=1e-6)


@pytest.mark.parametrize("divergence,dppo,delta", [("tv", "dppo_tv", 0.15), ("kl", "dppo_kl", 0.05)])
def test_cppo_with_flat_weights_and_no_budget_keeps_dppos_tokens(divergence, dppo, delta):
    """w_min = 1 and a budget never reached: the mask is DPPO-Binary's (the same tokens get a gradient)."""
    logp, old, advantages, mask = probs_batch(spread=0.8)
    params = {"divergence": divergence, "delta": delta, "w_min": 1.0 - 1e-12, "budget": 1e9}
    _, grad, metrics = run("cppo", params, logp, old, advantages, mask)
    _, dppo_grad, dppo_metrics = run(dppo, {}, logp, old, advantages, mask)
    assert torch.equal(grad != 0, dppo_grad != 0)
    assert metrics["clip/frac"] == pytest.approx(dppo_metrics["clip/frac"]) and metrics["clip/frac"] > 0


def test_cppo_relaxes_late_tokens_and_stops_a_drifting_prefix():
    """Eq. 8-9 by hand (TV, A > 0, q = 0.5, five tokens, w_min = 0.5: w = 1, .875, .75, .625, .5). A shift of
    0.16 > δ = 0.15 is masked at t = 1 (Z = 0.16) and kept at t = 5 (Z = 0.08). With δ_b = 0.01 and shifts of 0.1, the
    prefix room δ + δ_b·W_{t−1} − S_{t−1} is 0.15, 0.06, −0.01875, ... so tokens 1 kept, 2 masked (Z = 0.0875 > 0.06,
    under δ: by the budget alone), 3-5 masked."""
    q = torch.full((1, 5), 0.5, dtype=torch.float64)
    old, mask, up = torch.log(q), torch.ones(1, 5, dtype=torch.bool), torch.tensor([1.0])
    shift = torch.tensor([[0.16, 0.0, 0.0, 0.0, 0.16]], dtype=torch.float64)
    _, grad, _ = run("cppo", {"w_min": 0.5, "budget": 1.0}, torch.log(q + shift), old, up, mask)
    assert (grad[0, [0, 4]] != 0).tolist() == [False, True]
    _, grad, metrics = run("cppo", {"w_min": 0.5, "budget": 0.01}, torch.log(q + 0.1), old, up, mask)
    assert (grad[0] != 0).tolist() == [True, False, False, False, False]
    assert metrics["cppo/frac_over_budget"] == pytest.approx(0.8)


def test_cppo_never_masks_a_token_moving_its_ratio_back_to_one():
    """Eq. 10's first clause: A·(ρ − 1) ≤ 0 keeps the token whatever its divergence or its prefix."""
    q = torch.full((1, 4), 0.5, dtype=torch.float64)
    logp, old, mask = torch.log(q - 0.3), torch.log(q), torch.ones(1, 4, dtype=torch.bool)
    _, grad, metrics = run("cppo", {"budget": 1e-6}, logp, old, torch.tensor([1.0]), mask)
    assert (grad[0] != 0).all() and metrics["clip/frac"] == 0


# ------------------------------------------------------------------------------------------- DPPO top-K
@pytest.mark.parametrize("name,binary", [("dppo_topk_tv", "dppo_tv"), ("dppo_topk_kl", "dppo_kl")])
def test_dppo_topk_with_the_binary_estimate_is_dppo_binary(name, binary):
    """K = 0 leaves the sampled token and the rest: given the binary TV |p − q| or the Bernoulli KL as its extra, the
    top-K rule is DPPO-Binary (loss, gradient and frozen tokens), whatever the δ."""
    from atr_grpo.clipping.dppo import binary_kl

    logp, old, advantages, mask = probs_batch(spread=0.8)
    extra = (torch.exp(logp) - torch.exp(old)).abs() if binary == "dppo_tv" else binary_kl(old, logp)
    for params in ({}, {"delta_low": 0.02, "delta_high": 0.3}):
        loss, grad, metrics = run(name, params, logp, old, advantages, mask, **{name[5:]: extra})
        want_loss, want_grad, want = run(binary, params, logp, old, advantages, mask)
        torch.testing.assert_close(loss, want_loss, **TOL)
        torch.testing.assert_close(grad, want_grad, **TOL)
        assert metrics["clip/frac"] == pytest.approx(want["clip/frac"]) and 0 < metrics["clip/frac"] < 1


def test_dppo_topk_drops_a_token_by_its_estimate_only_on_the_side_its_advantage_pushes():
    """The same large estimate drops a token whose probability rose under A > 0 or fell under A < 0, never one that
    moved against its advantage's push."""
    old = torch.log(torch.tensor([[0.3, 0.3, 0.3, 0.3]], dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.35, 0.25, 0.35, 0.25]], dtype=torch.float64))
    mask, estimate = torch.ones(1, 4, dtype=torch.bool), torch.full((1, 4), 0.5, dtype=torch.float64)
    for sign, dropped in ((1.0, [True, False, True, False]), (-1.0, [False, True, False, True])):
        _, grad, _ = run("dppo_topk_tv", {}, logp, old, torch.tensor([sign]), mask, topk_tv=estimate)
        assert (grad[0] == 0).tolist() == dropped


# --------------------------------------------------------------------------------------------------- NSR
# The paper's equations could not be read (nsr.py says why): the candidates are PPO's clipped tokens (both bounds,
# both signs of A), as its abstract says; the band b = 0.1 past the bound and the constant p are this project's.
def nsr_sets(logp, old, advantages, mask, low=0.8, high=1.28, band=0.1):
    """NSR's sets: clipped (A > 0 and w > high, A < 0 and w < low) and near (clipped within `band` of the bound)."""
    w, a = torch.exp(logp - old), broadcast(advantages, logp)
    clipped = mask & (((a > 0) & (w > high)) | ((a < 0) & (w < low)))
    near = clipped & (((a > 0) & (w <= high + band)) | ((a < 0) & (w >= low - band)))
    return w, a, clipped, near


@pytest.mark.parametrize("seed", [3, 11])
def test_nsr_rescues_exactly_the_near_tokens_whose_draw_is_below_p(seed):
    """NSR's law: gradient −w·A on kept and rescued tokens (near and u < p, u = key(seed, index, log π_old) / 2³²), 0
    on the other clipped tokens, DAPO's clip loss elsewhere; deep violations are never rescued."""
    from atr_grpo.clipping.cov import hashed_keys

    logp, old, advantages, mask = probs_batch(seed=seed, batch=16, steps=64, spread=0.4)
    key_seed = torch.tensor(seed * 7919)
    loss, grad, metrics = run("nsr", {}, logp, old, advantages, mask, key_seed=key_seed)
    w, a, clipped, near = nsr_sets(logp, old, advantages, mask)
    salt = old.float().view(torch.int32)
    rescued = near & (hashed_keys(key_seed, mask, salt).double() / 2**32 < 0.5)
    frozen = clipped & ~rescued
    torch.testing.assert_close(grad, torch.where(mask & ~frozen, -w * a, 0.0), **TOL)
    clip_loss = -torch.minimum(w * a, w.clamp(0.8, 1.28) * a)
    torch.testing.assert_close(loss, torch.where(mask, torch.where(rescued, -w * a, clip_loss), 0.0), **TOL)
    assert 0 < rescued.sum() < near.sum() < clipped.sum()
    assert (rescued & (a > 0)).any() and (rescued & (a < 0)).any()  # past either bound, for either sign of A
    assert metrics["nsr/frac_rescued"] == pytest.approx(float(rescued.sum() / mask.sum()), abs=1e-6)
    assert metrics["clip/frac"] == pytest.approx(float(frozen.sum() / mask.sum()), abs=1e-6)


def test_nsr_keeps_a_fraction_p_of_its_near_tokens_and_is_dapo_at_p_zero():
    """E[rescued | near] = p: over ~thousands of near tokens the fraction lies within 4 binomial SDs of p; p → 0 gives
    DAPO's clip_higher exactly; the same seed draws the same tokens, another seed others."""
    logp, old, advantages, mask = probs_batch(seed=5, batch=64, steps=256, spread=0.4)
    _, _, _, near = nsr_sets(logp, old, advantages, mask)
    draws = {}
    for p, seed in ((0.3, 1), (0.3, 1), (0.3, 2)):
        _, grad, _ = run("nsr", {"rescue_prob": p}, logp, old, advantages, mask, key_seed=torch.tensor(seed))
        draws.setdefault(seed, []).append(near & (grad != 0))
    share = float(draws[1][0].sum() / near.sum())
    assert abs(share - 0.3) < 4 * (0.3 * 0.7 / float(near.sum())) ** 0.5
    assert torch.equal(draws[1][0], draws[1][1]) and not torch.equal(draws[1][0], draws[2][0])
    _, grad, _ = run("nsr", {"rescue_prob": 1e-12}, logp, old, advantages, mask, key_seed=torch.tensor(1))
    _, dapo_grad, _ = run("clip_higher", {}, logp, old, advantages, mask)
    torch.testing.assert_close(grad, dapo_grad, **TOL)


# --------------------------------------------------------------------------------------------------- ERC
@pytest.mark.parametrize(
    "base,params,rule,rule_params",
    [
        ("dapo", {}, "dual_clip", {"eps_high": 0.28, "c": 10.0}),
        ("gppo", {"eps_high": 0.2}, "gppo", {"eps_high": 0.2}),
    ],
)
def test_erc_drops_the_gradient_of_tokens_whose_entropy_ratio_leaves_its_open_interval(base, params, rule, rule_params):
    """ERC's law (authors' grpo_erc / gppo_erc): loss_t = L^base_t if 0.95 < H_θ/H_old < 1.05, else sg(L^base_t):
    the same loss values as the base everywhere, its gradient inside, 0 outside (boundaries excluded)."""
    logp, old, advantages, mask = probs_batch(spread=0.5)
    g = torch.Generator().manual_seed(1)
    ratio_h = 0.9 + 0.2 * torch.rand(logp.shape, generator=g, dtype=torch.float64)
    ratio_h[1, :4] = torch.tensor([0.95, 1.05, 0.95 + 1e-6, 1.05 - 1e-6], dtype=torch.float64)
    loss, grad, metrics = run("erc", {"base": base, **params}, logp, old, advantages, mask, entropy_ratio=ratio_h)
    base_loss, base_grad, _ = run(rule, rule_params, logp, old, advantages, mask)
    inside = (ratio_h > 0.95) & (ratio_h < 1.05)
    assert inside[1, :4].tolist() == [False, False, True, True]
    torch.testing.assert_close(loss, base_loss, **TOL)
    torch.testing.assert_close(grad, torch.where(inside, base_grad, 0.0), **TOL)
    dropped = mask & ~inside
    assert 0 < dropped.sum() < mask.sum()
    assert metrics["erc/frac_dropped"] == pytest.approx(float(dropped.sum() / mask.sum()), abs=1e-6)


def test_erc_with_an_unchanged_entropy_is_its_base():
    """H_θ = H_old (ratio 1, as on-policy): ERC is DAPO's clip with the dual clip, loss and gradient."""
    logp, old, advantages, mask = probs_batch(spread=0.8)
    ones = torch.ones_like(logp)
    loss, grad, metrics = run("erc", {}, logp, old, advantages, mask, entropy_ratio=ones)
    want_loss, want_grad, want = run("dual_clip", {"eps_high": 0.28, "c": 10.0}, logp, old, advantages, mask)
    torch.testing.assert_close(loss, want_loss, **TOL)
    torch.testing.assert_close(grad, want_grad, **TOL)
    assert metrics["clip/frac"] == pytest.approx(want["clip/frac"]) and metrics["erc/frac_dropped"] == 0
