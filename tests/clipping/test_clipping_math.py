"""The mathematics of the clipping registry: ratio bounds (Eq. 10, Thm 4.2), the equivalences the paper and the
source papers state (Thm 4.1, ATR ≡ Clip-Higher, KL2 ≡ Clip, RPG-clip ≡ Dual-Clip, on-policy ≡ REINFORCE, SAPO's
gradient, DCPO's table), every rule against an independent elementwise oracle, metrics and numerics."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO
from helpers.rule_checks import acts_at_its_declared_bounds, finite_on_extreme_inputs, reinforce_on_policy
from helpers.rule_inputs import extras_for, loss_and_grad, planted_batch

from atr_grpo.clipping import (
    RULES,
    SAMPLE_OLD_PROBS,
    build_rule,
    dcpo_ratio_bounds,
    describe_bounds,
    divergence_ratio_interval,
    kl3_ratio_bounds,
    lambert_w,
    make_batch,
)
from atr_grpo.clipping.cov import hash_ranks, hashed_keys, lowest_ranked
from atr_grpo.clipping.extras import key_seed_from
from atr_grpo.clipping.ratio import ppo_clip_terms

DELTAS = [0.01, 0.03, 0.05, 0.07, 0.09, 0.2, 0.5, 1.0]
ALL_RULES = sorted(RULES)
# every rule whose effect goes through the ratio w: on-policy (w ≡ 1) it must be plain REINFORCE
RATIO_DRIVEN = sorted(name for name, rule in RULES.items() if not rule.acts_on_policy)


# ------------------------------------------------------------------------------------------- bounds
def test_delta_007_gives_the_papers_interval():
    """δ = 0.07 ⇔ w ∈ [0.671, 1.422] (§4.2, Eq. 10)."""
    low, high = kl3_ratio_bounds(0.07)
    assert (round(low, 3), round(high, 3)) == (0.671, 1.422)
    assert describe_bounds(0.07) == "δ = 0.07 ⇔ w ∈ [0.671, 1.422]"
    for w in (low, high):
        assert w - 1 - math.log(w) == pytest.approx(0.07, abs=1e-12)


@pytest.mark.parametrize("delta", DELTAS)
def test_kl3_interval_is_asymmetric_wider_above(delta):
    """Thm 4.2: 1 − l_δ < u_δ − 1 for every δ > 0."""
    low, high = kl3_ratio_bounds(delta)
    assert 0 < low < 1 < high and 1 - low < high - 1


@pytest.mark.parametrize("delta", DELTAS)
def test_root_finding_interval_agrees_with_lambert_w(delta):
    """The generic convex-estimator interval reproduces the closed form for KL3, and KL2's is e^{±√(2δ)}."""
    low, high = divergence_ratio_interval(lambda w: w - 1 - math.log(w), delta)
    assert (low, high) == pytest.approx(kl3_ratio_bounds(delta), rel=1e-10)
    low2, high2 = divergence_ratio_interval(lambda w: 0.5 * math.log(w) ** 2, delta)
    assert (low2, high2) == pytest.approx((math.exp(-math.sqrt(2 * delta)), math.exp(math.sqrt(2 * delta))), rel=1e-10)
    low1, high1 = divergence_ratio_interval(lambda w: -math.log(w), delta)
    assert low1 == pytest.approx(math.exp(-delta), rel=1e-10) and high1 == math.inf


def test_lambert_w_matches_scipy_on_both_branches():
    scipy_special = pytest.importorskip("scipy.special")
    for x in (-1 / math.e + 1e-6, -0.3, -0.2, -1e-3, -1e-9):
        for branch in (0, -1):
            assert lambert_w(x, branch) == pytest.approx(scipy_special.lambertw(x, branch).real, rel=1e-12)
    for branch, side in ((0, 1), (-1, -1)):  # at the branch point: W e^W = x still holds, on the right side of -1
        x = -1 / math.e + 1e-13
        w = lambert_w(x, branch)
        assert w * math.exp(w) == pytest.approx(x, rel=1e-14) and side * (w + 1) > 0
    with pytest.raises(ValueError, match="branch"):
        lambert_w(-0.1, 1)
    with pytest.raises(ValueError, match="delta"):
        kl3_ratio_bounds(0.0)


def test_dcpo_bounds_reproduce_its_table():
    """DCPO (Yang et al. 2025b), ε = (0.16, 0.2): q = 0.9 → [0.7687, 1.1872]; rare tokens get more room."""
    low, high = dcpo_ratio_bounds(torch.log(torch.tensor([0.9, 0.5, 1e-30])), 0.16, 0.2, 10.0)
    assert low[0].item() == pytest.approx(0.7687, abs=1e-4) and high[0].item() == pytest.approx(1.1872, abs=1e-4)
    assert low[1] < low[0] and high[1] > high[0]
    assert low[2].item() == pytest.approx(0.5) and high[2].item() == pytest.approx(10.0)  # floor 0.5, cap c


def declares_bounds(name: str) -> bool:
    rule = build_rule(name)
    return rule.ratio_bounds() is not None or rule.old_prob_bounds(torch.tensor([0.5], dtype=torch.float64)) is not None


@pytest.mark.parametrize("name", [name for name in ALL_RULES if declares_bounds(name)])
def test_the_declared_bounds_are_where_the_rule_stops_following_w(name):
    acts_at_its_declared_bounds(name)


# ------------------------------------------------------------------------------------ equivalences
def grads(name, params, batch, **extras):
    logp, old, advantages, mask = batch
    return loss_and_grad(build_rule(name, **params), logp, old, advantages, mask, **extras)[1]


@pytest.mark.parametrize("delta", [0.03, 0.07, 0.2])
def test_atr_has_the_gradient_of_clip_higher_with_its_lambert_bounds(delta):
    """Thm 4.1 + 4.2: ATR(δ) has exactly the gradient of Clip-Higher(1 − l_δ, u_δ − 1)."""
    low, high = kl3_ratio_bounds(delta)
    batch = planted_batch(1)
    atr = grads("atr", {"delta": delta}, batch)
    ch = grads("clip_higher", {"eps_low": 1 - low, "eps_high": high - 1}, batch)
    torch.testing.assert_close(atr, ch, rtol=0, atol=1e-12)


@pytest.mark.parametrize("delta", [0.02, 0.07, 0.3])
def test_kl2_has_the_gradient_of_clip_with_exp_sqrt_2delta(delta):
    """KL2(δ) ≡ Clip with ratio bounds e^{±√(2δ)} (a log-symmetric interval; ε_low ≠ ε_high in ratio space)."""
    r = math.sqrt(2 * delta)
    batch = planted_batch(2)
    torch.testing.assert_close(
        grads("kl2", {"delta": delta}, batch),
        grads("clip_higher", {"eps_low": 1 - math.exp(-r), "eps_high": math.exp(r) - 1}, batch),
        rtol=0,
        atol=1e-12,
    )


def test_general_operator_with_the_ratio_constraint_is_ratio_clipping():
    """Thm 4.1: Eq. 5 with a ratio-interval constraint (here |log w| ≤ δ, i.e. w ∈ [e^−δ, e^δ]) inside the min has the
    gradient of PPO clipping; with the two-sided `mask` reading it does not (it also freezes the safe side)."""
    batch = planted_batch(3)
    # |log w| ≤ δ ⇔ w ∈ [e^-δ, e^δ]: compare with the ratio clip on exactly that interval
    delta = 0.2
    general = grads("kl1", {"delta": delta, "variant": "abs_log"}, batch)
    ratio = grads("clip_higher", {"eps_low": 1 - math.exp(-delta), "eps_high": math.exp(delta) - 1}, batch)
    torch.testing.assert_close(general, ratio, rtol=0, atol=1e-12)
    masked = grads("kl1", {"delta": delta, "variant": "abs_log", "semantics": "mask"}, batch)
    assert not torch.allclose(masked, ratio)


def test_rpg_clip_has_the_gradient_of_dual_clip():
    params = {"eps_low": 0.2, "eps_high": 0.28, "c": 3.0}
    batch = planted_batch(4)
    torch.testing.assert_close(grads("rpg_clip", params, batch), grads("dual_clip", params, batch), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", RATIO_DRIVEN)
def test_on_policy_every_ratio_rule_is_reinforce(name):
    reinforce_on_policy(name)


def test_clip_cov_acts_on_policy():
    """On-policy, Clip-Cov detaches exactly its selection (why it declares `acts_on_policy`)."""
    assert RULES["clip_cov"].acts_on_policy
    logp, _, advantages, mask = planted_batch(6)
    rule = build_rule("clip_cov", ratio=0.05, cov_lb=-1e9, cov_ub=1e9)
    leaf = logp.clone().requires_grad_()
    out = rule(leaf, logp.detach(), advantages, mask, key_seed=key_seed_from(torch.Generator().manual_seed(0)))
    out.loss.sum().backward()
    kept = leaf.grad != 0
    dropped = int((mask & ~kept & (advantages[:, None] != 0)).sum())
    assert dropped == math.floor(0.05 * int(mask.sum()))


def test_sapo_gradient_is_the_sech_squared_gate():
    """SAPO: ∂J/∂log π = A · sech²(τ(w−1)/2) · w, τ = τ_pos for A > 0 and τ_neg otherwise."""
    logp, old, advantages, mask = planted_batch(7)
    rule = build_rule("sapo", tau_pos=1.0, tau_neg=1.05)
    _, grad = loss_and_grad(rule, logp, old, advantages, mask)
    w = torch.exp(logp - old)
    a = advantages[:, None].expand_as(w)
    tau = torch.where(a > 0, 1.0, 1.05)
    expected = -a * w / torch.cosh(tau * (w - 1) / 2) ** 2
    torch.testing.assert_close(grad, torch.where(mask, expected, 0.0), rtol=1e-5, atol=1e-6)


# -------------------------------------------------------------------------------------------- oracles
def clipped_oracle(w, a, low, high, c=None):
    """PPO's min(w·A, clip(w)·A), with the dual-clip floor c·A for A < 0: (objective, d objective / d log π)."""
    unclipped, clipped = w * a, min(max(w, low), high) * a
    objective, grad = (unclipped, w * a) if unclipped <= clipped else (clipped, 0.0)
    if c is not None and a < 0 and c * a > objective:
        objective, grad = c * a, 0.0
    return objective, grad


def ppo_oracle(bounds, dual=False, value=None):
    """A token oracle for a ratio-interval rule; `bounds(params, q)` gives (low, high) for π_old = q."""

    def oracle(params, lp, olp, a, full_kl):
        w = math.exp(lp - olp)
        objective, grad = clipped_oracle(w, a, *bounds(params, math.exp(olp)), params["c"] if dual else None)
        loss = -objective if value is None else value(w, a, lp)
        return loss, -grad, grad == 0.0 and a != 0.0

    return oracle


def divergence_oracle(estimate):
    """The general operator inside PPO's min: frozen (value −A, no gradient) when estimate > δ and w·A > A."""

    def oracle(params, lp, olp, a, full_kl):
        s = lp - olp
        w = math.exp(s)
        frozen = estimate(s, w, params, full_kl) > params["delta"] and w * a > a
        return (-a, 0.0, True) if frozen else (-w * a, -w * a, False)

    return oracle


def sapo_oracle(params, lp, olp, a, full_kl):
    w = math.exp(lp - olp)
    tau = params["tau_pos"] if a > 0 else params["tau_neg"]
    sig = 1 / (1 + math.exp(-tau * (w - 1)))
    return -sig * 4 / tau * a, -a * 4 * sig * (1 - sig) * w, False


def dcpo_bounds(params, q):
    low = 0.5 + 0.5 * math.sqrt(max(1 - 4 * params["eps_low"] / q, 0.0))
    return low, min(0.5 + 0.5 * math.sqrt(1 + 4 * params["eps_high"] / q), params["c"])


def eps_bounds(params, q):
    return 1 - params["eps_low"], 1 + params["eps_high"]


# (loss, d loss / d log π, frozen) of one token, from the formulas of the source papers, in plain floats
TOKEN_ORACLES = {
    "no_clip": lambda params, lp, olp, a, full_kl: (-math.exp(lp - olp) * a, -math.exp(lp - olp) * a, False),
    "clip": ppo_oracle(lambda params, q: (1 - params["eps"], 1 + params["eps"])),
    "clip_higher": ppo_oracle(eps_bounds),
    "dual_clip": ppo_oracle(eps_bounds, dual=True),
    "rpg_clip": ppo_oracle(eps_bounds, dual=True, value=lambda w, a, lp: -w * a * lp),  # value −w·A·log π
    "dcpo": ppo_oracle(dcpo_bounds, dual=True),
    "sapo": sapo_oracle,
    "atr": divergence_oracle(lambda s, w, params, full_kl: w - 1 - s),
    "kl1": divergence_oracle(lambda s, w, params, full_kl: -s),
    "kl2": divergence_oracle(lambda s, w, params, full_kl: 0.5 * s * s),
    "is_kl3": divergence_oracle(lambda s, w, params, full_kl: 1 - w + w * s),
    "full_kl": divergence_oracle(lambda s, w, params, full_kl: full_kl),
}
ORACLE_PARAMS = {"clip": {"eps": 0.2}, "atr": {"delta": 0.05}, "kl2": {"delta": 0.03}, "dual_clip": {"c": 1.5}}


@pytest.mark.parametrize("name", sorted(TOKEN_ORACLES))
def test_every_rule_matches_its_elementwise_oracle(name):
    """Loss, gradient and frozen set of each rule against an independent per-token computation."""
    rule = build_rule(name, **ORACLE_PARAMS.get(name, {}))
    params = rule.config()
    logp, old, advantages, mask = planted_batch(8, steps=24)
    extras = extras_for(rule, logp)
    out, grad = loss_and_grad(rule, logp, old, advantages, mask, **extras)
    frozen_count = 0
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                assert out.loss[b, t] == 0 and grad[b, t] == 0
                continue
            fk = float(extras["full_kl"][b, t]) if "full_kl" in extras else 0.0
            token = (float(logp[b, t]), float(old[b, t]), float(advantages[b]), fk)
            loss, g, frozen = TOKEN_ORACLES[name](params, *token)
            assert float(out.loss[b, t].detach()) == pytest.approx(loss, rel=2e-6, abs=1e-6), (b, t)
            assert float(grad[b, t]) == pytest.approx(g, rel=2e-6, abs=1e-6), (b, t)
            frozen_count += frozen
    assert out.metrics["clip/frac"] == pytest.approx(frozen_count / int(mask.sum()))
    if RULES[name].family not in ("reference", "soft"):
        assert frozen_count > 0  # the planted tokens exercise the constraint


def test_kl_cov_penalises_exactly_the_top_covariance_tokens():
    logp, old, advantages, mask = planted_batch(9, steps=30)
    rule = build_rule("kl_cov", ratio=0.05, coef=2.0)
    out, grad = loss_and_grad(rule, logp, old, advantages, mask)
    valid = mask
    n = int(valid.sum())
    lp, adv = logp[valid], advantages[:, None].expand_as(logp)[valid]
    cov = (lp - lp.mean()) * (adv - adv.mean())
    top = torch.zeros(n, dtype=torch.bool)
    top[torch.argsort(cov, descending=True)[: max(math.floor(0.05 * n), 1)]] = True
    s = (logp - old)[valid]
    expected = -torch.exp(s) * adv + torch.where(top, 2.0 * s.abs(), 0.0)
    torch.testing.assert_close(out.loss[valid], expected.float(), rtol=1e-5, atol=1e-6)
    expected_grad = -torch.exp(s) * adv + torch.where(top, 2.0 * torch.sign(s), 0.0)
    torch.testing.assert_close(grad[valid], expected_grad, rtol=1e-5, atol=1e-6)


def sort_based_selection(keys, eligible, quota):
    """The reference selection (the registry's first implementation): rank every entry by a stable double argsort
    of the keys (ineligible ones last) and keep the eligible entries ranked below the quota."""
    flat = torch.where(eligible, keys, torch.inf).flatten()
    rank = torch.argsort(torch.argsort(flat, stable=True), stable=True)
    return eligible & (rank.view_as(keys) < quota)


def reference_hash(seed, mask):
    """The registry's first Clip-Cov keys: murmur3's finaliser over (seed, row, index among valid tokens) / 2³²."""
    valid_index = torch.cumsum(mask.long(), dim=1) - 1
    row = torch.arange(mask.shape[0]).unsqueeze(1)
    x = (seed * 0x9E3779B1 + row * 0x85EBCA77 + valid_index * 0xC2B2AE3D) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return (x ^ (x >> 16)).double() / 2.0**32


def reference_covariance(batch):
    """The first implementation's per-token covariance: centred cross-products over the valid tokens, 0 elsewhere."""
    valid = batch.mask
    count = valid.sum().clamp(min=1)
    logp = batch.logp.detach()
    centred = (logp - logp.sum() / count) * (batch.advantages - batch.advantages.sum() / count)
    return torch.where(valid, centred, 0.0)


def reference_cov_rule(rule, logp, old, advantages, mask, random_keys=None, key_seed=None):
    """Clip-Cov / KL-Cov's per-token loss as first implemented (sort-based selection, float keys)."""
    batch = make_batch(logp, old, advantages, mask)
    cov = reference_covariance(batch)
    quota = torch.clamp(torch.floor(rule.ratio * batch.mask.sum()), min=1)
    if rule.name == "kl_cov":
        selected = sort_based_selection(-cov, batch.mask, quota)
        penalty = torch.where(selected, rule.coef * batch.log_ratio.abs(), 0.0)
        return torch.where(batch.mask, -torch.exp(batch.log_ratio) * batch.advantages + penalty, 0.0), selected
    keys = reference_hash(int(key_seed), batch.mask) if random_keys is None else random_keys
    clipped = ppo_clip_terms(batch, 1 - rule.eps_low, 1 + rule.eps_high)
    window = (cov > rule.cov_lb) & (cov < rule.cov_ub)
    candidates = batch.mask & ~(clipped.frozen_low | clipped.frozen_high) & window
    selected = sort_based_selection(keys, candidates, quota)
    return torch.where(batch.mask, torch.where(selected, 0.0, clipped.loss), 0.0), selected


def tied_batch(seed, batch=5, steps=23):
    """Log-probs, ratios and advantages from a few discrete values, so covariances and keys tie often."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.randint(1, 4, (batch, steps), generator=g).double()
    logp = old + torch.randint(-2, 3, (batch, steps), generator=g).double() * 0.2
    advantages = torch.randint(-2, 3, (batch,), generator=g).double()
    mask = torch.rand(batch, steps, generator=g) > 0.25
    keys = torch.randint(0, 7, (batch, steps), generator=g).double() / 7  # Clip-Cov's random keys, tied
    return logp, old, advantages, mask, keys


def test_top_k_selection_equals_the_sort_based_selection():
    """`lowest_ranked` picks exactly the entries of the stable-sort reference: random and heavily tied keys,
    random eligibility, quotas from 1 to more than the eligible count; with `distinct=True` on distinct keys."""
    g = torch.Generator().manual_seed(0)
    for trial in range(400):
        rows, steps = int(torch.randint(1, 7, (), generator=g)), int(torch.randint(1, 40, (), generator=g))
        tied = trial % 2 == 0
        keys = torch.randint(0, 4, (rows, steps), generator=g) if tied else torch.randperm(rows * steps, generator=g)
        keys = keys.view(rows, steps).float() if trial % 4 < 2 else keys.view(rows, steps)  # float and int keys
        eligible = torch.rand(rows, steps, generator=g) > float(torch.rand((), generator=g))
        quota = torch.tensor(float(torch.randint(1, rows * steps + 2, (), generator=g)))
        bound = int(quota) + int(torch.randint(0, 3, (), generator=g))
        expected = sort_based_selection(keys.double(), eligible, quota)
        assert torch.equal(lowest_ranked(keys, eligible, quota, bound), expected)
        if not tied:
            assert torch.equal(lowest_ranked(keys, eligible, quota, bound, distinct=True), expected)


def test_clip_cov_keys_are_the_first_implementations_hash():
    """The 32-bit in-place hash gives the same keys as the first implementation, and `hash_ranks` keeps their order
    while breaking ties by position."""
    mask = torch.rand(7, 300, generator=torch.Generator().manual_seed(1)) > 0.3
    for seed in (0, 1, 2**31 - 2):
        keys = hashed_keys(torch.tensor(seed), mask)
        assert keys.dtype == torch.int64 and 0 <= int(keys.min()) and int(keys.max()) < 2**32
        assert torch.equal(keys.double() / 2.0**32, reference_hash(seed, mask))
        ranks = hash_ranks(torch.tensor(seed), mask)
        assert torch.equal(ranks >> 31, keys)
        assert torch.equal(ranks & (2**31 - 1), torch.arange(mask.numel()).view_as(mask))
        assert torch.equal(torch.argsort(ranks.flatten()), torch.argsort(keys.flatten(), stable=True))


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_covariance_rules_equal_their_first_implementation(name):
    """Clip-Cov (with generated keys and with given, tied keys) and KL-Cov give the first, sort-based
    implementation's selections, loss and gradient exactly, on many batches with tied covariances."""
    params = {"ratio": 0.2, "cov_lb": -1.0, "cov_ub": 1.0} if name == "clip_cov" else {"ratio": 0.1}
    rule = build_rule(name, **params)
    for seed in range(60):
        logp, old, advantages, mask, keys = tied_batch(seed)
        key_seed = torch.tensor(seed * 7919)
        runs = [{"random_keys": keys, "key_seed": key_seed}, {"key_seed": key_seed}] if name == "clip_cov" else [{}]
        for extras in runs:
            out, grad = loss_and_grad(rule, logp, old, advantages, mask, **extras)
            leaf = logp.clone().requires_grad_()
            expected, selected = reference_cov_rule(rule, leaf, old, advantages, mask, **extras)
            expected.sum().backward()
            assert torch.equal(out.loss, expected.float()) and torch.equal(grad, leaf.grad), (seed, extras.keys())
            fraction = out.metrics["clip/frac_cov" if name == "clip_cov" else "clip/frac_kl_penalty"]
            assert fraction == pytest.approx(int(selected.sum()) / int(mask.sum())) and fraction > 0


def test_clip_cov_is_deterministic_given_a_key_seed_and_respects_quota_and_window():
    logp, old, advantages, mask = planted_batch(10, steps=60)
    rule = build_rule("clip_cov", ratio=0.02, cov_lb=0.0, cov_ub=5.0)

    def run(seed):
        return rule(logp, old, advantages, mask, key_seed=key_seed_from(torch.Generator().manual_seed(seed)))

    a, b, c = run(1), run(1), run(2)
    torch.testing.assert_close(a.loss, b.loss, rtol=0, atol=0)
    assert a.metrics == b.metrics
    n = int(mask.sum())
    quota = max(math.floor(0.02 * n), 1)
    assert a.metrics["clip/frac_cov"] * n == pytest.approx(quota)
    assert not torch.equal(a.loss, c.loss)  # another seed detaches other tokens
    with pytest.raises(ValueError, match="key_seed"):
        rule(logp, old, advantages, mask)


# ------------------------------------------------------------------------------ metrics and numerics
def test_clip_frac_counts_only_the_active_side():
    """clip/frac counts w > 1+ε with A > 0 and w < 1−ε with A < 0; not w > 1+ε with A < 0 (PPO's min)."""
    log_w = torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.0, 1.1]]))
    old = torch.full_like(log_w, -1.0)
    rule = build_rule("clip", eps=0.2)
    for adv, low, high in ((1.0, 0, 2), (-1.0, 2, 0)):
        out = rule(old + log_w, old, torch.tensor([adv]), torch.ones_like(log_w, dtype=torch.bool))
        assert out.metrics["clip/frac_low"] == pytest.approx(low / 6)
        assert out.metrics["clip/frac_high"] == pytest.approx(high / 6)
        assert out.metrics["clip/frac"] == pytest.approx((low + high) / 6)
        assert out.metrics["ratio/max"] == pytest.approx(1.5) and out.metrics["ratio/min"] == pytest.approx(0.5)


@pytest.mark.parametrize("name", ALL_RULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_inputs_give_finite_losses_and_gradients(name, dtype):
    finite_on_extreme_inputs(name, dtype)


def test_gradient_reaches_logp_only():
    logp, old, advantages, mask = planted_batch(12)
    old_leaf = old.clone().requires_grad_()
    adv_leaf = advantages.clone().requires_grad_()
    out = build_rule("atr")(logp.clone().requires_grad_(), old_leaf, adv_leaf, mask)
    out.loss.sum().backward()
    assert old_leaf.grad is None and adv_leaf.grad is None


def test_bad_shapes_are_named():
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="old_logp"):
        build_rule("clip")(logp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        build_rule("clip")(logp, logp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="full_kl"):
        build_rule("full_kl")(logp, logp, torch.zeros(2), torch.ones(2, 3))


# ------------------------------------------------------------------------------------------- registry
def test_every_rule_has_exactly_one_config_and_every_config_a_rule():
    """Adding a rule is one class and one `conf/clipping/<name>.yaml`: the two sets are equal, and each YAML names
    its own rule (its schema and its `name`)."""
    conf = REPO / "conf" / "clipping"
    files = {path.stem: path for path in conf.iterdir()}
    assert all(path.suffix == ".yaml" for path in files.values())
    assert set(files) == set(RULES)
    for name, path in files.items():
        text = path.read_text()
        assert f"/schema/clipping@_here_: {name}\n" in text and f"\nname: {name}\n" in text, path


def test_the_listing_shows_every_parameter_with_its_range_and_source():
    """`python -m atr_grpo.clipping`: each rule's module, family, source, every parameter with its default, allowed
    range and meaning, and its trust region at the defaults where it has one."""
    from atr_grpo.clipping.__main__ import main
    from atr_grpo.rule_docs import rule_listing

    text = rule_listing(["atr", "dcpo"])
    assert text.startswith("atr  (atr_grpo/clipping/kl.py, family divergence)")
    assert "delta = 0.07" in text and "a finite number > 0" in text and "§6.4" in text
    assert "δ = 0.07 ⇔ w ∈ [0.671, 1.422]" in text
    assert "π_old 0.9: w ∈ [0.769, 1.187]" in text  # DCPO's Table 1 row, per token
    assert text.count("adaptive δ (clipping/adaptive_delta.py): delta_schedule = constant, delta_final = None") == 1
    for name, rule in RULES.items():
        entry = rule_listing([name])
        assert rule.source in entry and rule.summary in entry
        assert all(f"{p.name} = " in entry and p.allowed in entry and p.doc in entry for p in rule.params)
    assert main(["ppo"]) == 2


def test_source_defaults():
    cfg = {name: build_rule(name).config() for name in RULES}
    assert cfg["clip"] == {"eps": 0.2}
    assert cfg["clip_higher"] == {"eps_low": 0.2, "eps_high": 0.28}  # DAPO
    assert cfg["dual_clip"]["c"] == 3.0
    assert (cfg["dcpo"]["eps_low"], cfg["dcpo"]["eps_high"]) == (0.16, 0.2)
    assert cfg["clip_cov"]["ratio"] == 2e-4 and (cfg["clip_cov"]["cov_lb"], cfg["clip_cov"]["cov_ub"]) == (1.0, 5.0)
    assert (cfg["sapo"]["tau_pos"], cfg["sapo"]["tau_neg"]) == (1.0, 1.05)
    for name in ("atr", "kl1", "kl2", "is_kl3", "full_kl"):
        assert cfg[name]["delta"] == 0.07 and cfg[name]["semantics"] == "min"


@pytest.mark.parametrize(
    "name,params,words",
    [
        ("ppo", {}, ["unknown clipping rule 'ppo'", "atr", "clip_higher"]),
        ("atr", {"delta": 0.0}, ["'delta'", "> 0"]),
        ("clip", {"eps": 1.0}, ["'eps'", "(0, 1)"]),
        ("clip", {"epsilon": 0.2}, ["no parameter 'epsilon'", "eps"]),
        ("dual_clip", {"c": 1.1}, ["'c'", "1 + eps_high"]),
        ("atr", {"semantics": "soft"}, ["'semantics'", "'min'", "'mask'"]),
    ],
)
def test_bad_rules_and_parameters_are_named(name, params, words):
    with pytest.raises(ValueError) as err:
        build_rule(name, **params)
    for word in words:
        assert word in str(err.value)


def test_the_on_policy_warning_follows_the_acts_on_policy_trait():
    """A strictly on-policy run warns that its rule cannot act, unless the rule declares `acts_on_policy`."""
    from conftest import train_config

    from atr_grpo.training.pipeline import warn_if_on_policy

    def with_rule(cfg, name):  # every rule's config composes (test_config); here only the rule's name matters
        return SimpleNamespace(
            clipping=SimpleNamespace(name=name),
            trainer=cfg.trainer,
            optimizer_steps_per_rollout=cfg.optimizer_steps_per_rollout,
        )

    on_policy, reuse2 = (train_config([f"rollout={rollout}"]) for rollout in ("on_policy", "reuse2"))
    assert warn_if_on_policy(on_policy) is not None and warn_if_on_policy(reuse2) is None  # atr, the default
    for name, rule in RULES.items():
        assert (warn_if_on_policy(with_rule(on_policy, name)) is None) == rule.acts_on_policy, name
        assert warn_if_on_policy(with_rule(reuse2, name)) is None


# ---------------------------------------------------------------------------------------- batch statistics
def rows_alone(rule, logp, old, advantages, mask, extras):
    """The rule's per-token loss with each sequence given alone (its per-token extras sliced with it)."""
    losses = []
    for row in range(logp.shape[0]):
        part = slice(row, row + 1)
        alone = {k: v[part] if v.dim() == 2 else v for k, v in extras.items()}
        losses.append(rule(logp[part], old[part], advantages[part], mask[part], **alone).loss)
    return torch.cat(losses)


@pytest.mark.parametrize("name", sorted(name for name, rule in RULES.items() if not rule.batch_statistic))
def test_a_rule_without_batch_statistic_scores_each_sequence_alone(name):
    """No undeclared batch statistic: a sequence's loss is the same alone as inside the micro-batch."""
    rule = build_rule(name)
    logp, old, advantages, mask = planted_batch(8)
    extras = extras_for(rule, logp)
    torch.testing.assert_close(
        rows_alone(rule, logp, old, advantages, mask, extras), rule(logp, old, advantages, mask, **extras).loss
    )


def test_the_covariance_rules_declare_their_batch_statistic():
    """Clip-Cov and KL-Cov rank tokens by a covariance over the micro-batch: alone, a sequence gets another loss."""
    assert sorted(n for n, rule in RULES.items() if rule.batch_statistic) == ["bapo", "clip_cov", "kl_cov", "m2po"]
    logp, old, advantages, mask = planted_batch(8)
    rule = build_rule("kl_cov", ratio=0.05)
    together = rule(logp, old, advantages, mask).loss
    assert not torch.allclose(rows_alone(rule, logp, old, advantages, mask, {}), together)


# ------------------------------------------------------------------------------------------- bounds text
def test_a_divergence_rule_with_per_token_bounds_shows_them():
    """A divergence rule whose interval depends on π_old (here |π_θ − π_old| ≤ δ: w ∈ [1 − δ/q, 1 + δ/q]) shows its
    bounds at the sample values of π_old after the δ prefix, as the base class would without the prefix."""
    from atr_grpo.clipping.base import semantics_param
    from atr_grpo.clipping.kl import DivergenceRule, clamped_log_ratio, delta_param

    class ProbabilityGap(DivergenceRule):
        name = "test_probability_gap"
        params = (delta_param(), semantics_param())

        def estimate(self, batch, **_):
            return (batch.old_logp.exp() * torch.expm1(clamped_log_ratio(batch))).abs()

        def old_prob_bounds(self, old_prob):
            return (1 - self.delta / old_prob).clamp(min=0), 1 + self.delta / old_prob

    rule = ProbabilityGap(delta=0.1)
    per_token = [f"π_old {q:g}: w ∈ [{max(1 - 0.1 / q, 0):.3f}, {1 + 0.1 / q:.3f}]" for q in SAMPLE_OLD_PROBS]
    assert rule.bounds_text() == "δ = 0.1 ⇔ " + "; ".join(per_token)
    assert rule.bounds_text().startswith("δ = 0.1 ⇔ π_old 0.9: w ∈ [0.889, 1.111]; π_old 0.5: w ∈ [0.800, 1.200]")
    masked = ProbabilityGap(delta=0.1, semantics="mask").bounds_text()
    assert masked.endswith("π_old 0.01: w ∈ [0.000, 11.000] (mask semantics: frozen outside whatever the sign of A)")
    assert build_rule("full_kl").bounds_text() == ""  # no interval of any kind: nothing to say
