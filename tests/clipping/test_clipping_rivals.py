"""The sequence-level rules and the rival rules of the registry against their sources: float64 oracles written from
the papers' equations, verl's formulas re-typed from verl 0.9.1's `core_algos.py` (verl is not a dependency), and
TRL's own `GRPOTrainer._compute_loss` where TRL implements the loss; ATR at sequence level against token ATR; and
every rule's independence from the padding layout (Unsloth left-packs rows)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.rule_checks import independent_of_padding
from helpers.rule_inputs import loss_and_grad, sequence_batch
from helpers.trl_loss import grpo_settings, trl_compute_loss

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.losses import aggregate

# ---------------------------------------------------------------------------------------------- inputs


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


# ------------------------------------------------------------------------- TRL's own loss computation
def trl_loss_and_grad(logp, old, advantages, mask, loss_type, level="token", epsilon_low=0.2, epsilon_high=0.2):
    """TRL 1.15's `GRPOTrainer._compute_loss` on given per-token log-probs (its model pass replaced by them)."""
    from trl import GRPOTrainer

    settings = grpo_settings(logp, loss_type, level, epsilon_low, epsilon_high)
    loss, grad, _ = trl_compute_loss(
        GRPOTrainer, logp, old, advantages, mask, {"num_items_in_batch": mask.sum()}, **settings
    )
    return loss, grad


def ours(name, params, logp, old, advantages, mask, mode):
    rule = build_rule(name, **params)
    leaf = logp.clone().requires_grad_()
    out = rule(leaf, old, advantages, mask)
    loss = aggregate(out.loss, mask, mode, logp.shape[1])
    loss.backward()
    return loss.detach(), leaf.grad, out


# ------------------------------------------------------------------------------------------------ GSPO
def gspo_oracle(logp, old, advantages, mask, eps_low, eps_high):
    """GSPO's Eq. 5 per sequence in float64, gradient through s_i (the sequence objective, not the token form):
    per-token loss L_i on each valid token, and the gradient of Σ_t loss."""
    leaf = logp.detach().double().clone().requires_grad_()
    log_s = ((leaf - old) * mask).sum(-1) / mask.sum(-1)
    s = torch.exp(log_s)
    a = advantages.double()
    per_sequence = -torch.minimum(s * a, s.clamp(1 - eps_low, 1 + eps_high) * a)
    (per_sequence * mask.sum(-1)).sum().backward()
    return torch.where(mask, per_sequence[:, None], 0.0).detach(), leaf.grad


def test_gspo_matches_the_papers_sequence_objective():
    """Loss: −min(s_i·A_i, clip(s_i)·A_i) on every valid token of sequence i; gradient: the sequence objective's
    (which the GSPO-token form reproduces for a sequence-constant advantage); clip/frac: tokens of clipped
    sequences. Several sequences are clipped on each side."""
    logp, old, advantages, mask = sequence_batch(1, batch=16, spread=0.003)
    rule = build_rule("gspo")
    out, grad = loss_and_grad(rule, logp, old, advantages, mask)
    want_loss, want_grad = gspo_oracle(logp, old, advantages, mask, 3e-4, 4e-4)
    assert max_error(out.loss, want_loss) < 1e-6 and max_error(grad, want_grad) < 1e-6
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    clipped = ((advantages > 0) & (s > 1 + 4e-4)) | ((advantages < 0) & (s < 1 - 3e-4))
    assert 2 <= int(clipped.sum()) <= 14
    assert out.metrics["clip/frac"] == pytest.approx(float((mask * clipped[:, None]).sum() / mask.sum()))
    assert (grad[clipped] == 0).all() and (grad[~clipped][mask[~clipped]] != 0).all()


def verl_gspo(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high):
    """verl 0.9.1 `compute_policy_loss_gspo` re-typed, aggregated with its `seq-mean-token-mean`."""
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
    seq_importance_ratio = torch.exp(log_seq_importance_ratio)
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    seq_mask = torch.sum(response_mask, dim=-1)
    seq_losses = torch.sum(pg_losses * response_mask, dim=-1) / (seq_mask + 1e-8)
    return (seq_losses * (seq_mask > 0)).sum() / (seq_mask > 0).sum()


def test_gspo_matches_verl_and_trl():
    """Under seq_mean (its native aggregation) GSPO's loss and gradient equal verl's `gspo` (seq-mean-token-mean)
    and TRL's `importance_sampling_level="sequence"` with `loss_type="grpo"`, computed by TRL itself."""
    logp, old, advantages, mask = sequence_batch(2, batch=16, spread=0.003, dtype=torch.float32)
    loss, grad, _ = ours("gspo", {}, logp, old, advantages, mask, "seq_mean")
    leaf = logp.clone().requires_grad_()
    verl = verl_gspo(old, leaf, advantages[:, None].expand_as(logp), mask.float(), 3e-4, 4e-4)
    verl.backward()
    assert abs(float(loss - verl.detach())) < 1e-6 and max_error(grad, leaf.grad) < 1e-7
    trl, trl_grad = trl_loss_and_grad(logp, old, advantages, mask, "grpo", "sequence", 3e-4, 4e-4)
    assert abs(float(loss - trl)) < 1e-6 and max_error(grad, trl_grad) < 1e-7
    assert grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------- atr_seq
@pytest.mark.parametrize("reduction", ["mean", "geo", "max"])
@pytest.mark.parametrize("semantics", ["min", "mask"])
def test_atr_seq_on_one_token_sequences_is_exactly_atr(reduction, semantics):
    """With one valid token per row (anywhere in the row) every reduction is that token's KL3, so `atr_seq`
    equals `atr` bit for bit in loss and gradient, planted out-of-region tokens included."""
    g = torch.Generator().manual_seed(3)
    rows, steps = 64, 9
    old = -torch.rand(rows, steps, generator=g) * 3
    logp = old + torch.randn(rows, steps, generator=g) * 0.5
    mask = torch.zeros(rows, steps, dtype=torch.bool)
    mask[torch.arange(rows), torch.randint(0, steps, (rows,), generator=g)] = True
    advantages = torch.randn(rows, generator=g)
    atr, atr_grad = loss_and_grad(build_rule("atr", semantics=semantics), logp, old, advantages, mask)
    seq = build_rule("atr_seq", reduction=reduction, semantics=semantics)
    out, grad = loss_and_grad(seq, logp, old, advantages, mask)
    assert torch.equal(out.loss, atr.loss) and torch.equal(grad, atr_grad)
    assert out.metrics == atr.metrics and atr.metrics["clip/frac"] > 0.1


def atr_seq_oracle(logp, old, advantages, mask, delta, reduction, semantics):
    """Per token (loss, gradient, frozen) from the sequence divergence D_i, in float64 loops."""
    loss, grad = torch.zeros_like(logp), torch.zeros_like(logp)
    frozen_count = 0
    for i in range(logp.shape[0]):
        s = [float(logp[i, t] - old[i, t]) for t in range(logp.shape[1]) if mask[i, t]]
        kl3 = [math.exp(x) - 1 - x for x in s]
        mean_s = sum(s) / len(s)
        divergence = {"mean": sum(kl3) / len(s), "geo": math.exp(mean_s) - 1 - mean_s, "max": max(kl3)}[reduction]
        a = float(advantages[i])
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            w = math.exp(float(logp[i, t] - old[i, t]))
            frozen = divergence > delta and (semantics == "mask" or w * a > a)
            loss[i, t], grad[i, t] = (-a, 0.0) if frozen else (-w * a, -w * a)
            frozen_count += frozen
    return loss, grad, frozen_count / int(mask.sum())


@pytest.mark.parametrize("reduction", ["mean", "geo", "max"])
@pytest.mark.parametrize("semantics", ["min", "mask"])
def test_atr_seq_matches_its_oracle(reduction, semantics):
    """Each reduction's D_i decides the general operator for every token of the sequence (Eq. 5 per sequence)."""
    logp, old, advantages, mask = sequence_batch(4, batch=24, spread=0.35)
    delta = {"mean": 0.07, "geo": 0.01, "max": 0.3}[reduction]
    rule = build_rule("atr_seq", delta=delta, reduction=reduction, semantics=semantics)
    out, grad = loss_and_grad(rule, logp, old, advantages, mask)
    want_loss, want_grad, frozen = atr_seq_oracle(logp, old, advantages, mask, delta, reduction, semantics)
    assert max_error(out.loss, want_loss) < 1e-5 and max_error(grad, want_grad) < 1e-5
    assert out.metrics["clip/frac"] == pytest.approx(frozen) and 0.05 < frozen < 0.95


def test_one_wild_token_freezes_its_sequence_under_max_not_under_mean():
    """A single token with log w = 2 in a 200-token sequence (KL3 4.39, mean KL3 0.022): `max` freezes the
    sequence (δ = 0.07), `mean` does not; `mask` semantics freezes every token of it."""
    old = torch.full((1, 200), -1.0)
    logp = old.clone()
    logp[0, 17] += 2.0
    mask = torch.ones_like(old, dtype=torch.bool)
    advantages = torch.tensor([1.0])
    for reduction, frac in (("max", 1.0), ("mean", 0.0)):
        out = build_rule("atr_seq", reduction=reduction, semantics="mask")(logp, old, advantages, mask)
        assert out.metrics["clip/frac"] == frac
    out = build_rule("atr_seq", reduction="max")(logp, old, advantages, mask)
    assert out.metrics["clip/frac"] == pytest.approx(1 / 200)  # min semantics: only w > 1 with A > 0 pushes out


# ------------------------------------------------------------------------------------ layout invariance
@pytest.mark.parametrize("name", sorted(RULES))
def test_every_rule_is_independent_of_the_padding_layout(name):
    independent_of_padding(name)


# ----------------------------------------------------------------------------------------------- CISPO
def cispo_oracle(logp, old, advantages, mask, low, high):
    """MiniMax-M1's CISPO objective per token in float64: (−sg(clip(w))·A·log π, its gradient −clip(w)·A)."""
    w = torch.exp(logp.double() - old.double()).clamp(low, high)
    a = advantages.double()[:, None]
    return torch.where(mask, -w * a * logp.double(), 0.0), torch.where(mask, -w * a, 0.0)


def verl_cispo(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high):
    """verl 0.9.1 `compute_policy_loss_cispo` re-typed, with its default token-mean aggregation."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    clipped_ratio_sg = torch.clamp(ratio, 1 - clip_low, 1 + clip_high).detach()
    pg_losses = -clipped_ratio_sg * advantages * log_prob
    return (pg_losses * response_mask).sum() / response_mask.sum()


@pytest.mark.parametrize("params", [{}, {"eps_low": 0.2, "eps_high": 0.2}])
def test_cispo_matches_its_oracle_verl_and_trl(params):
    """CISPO (defaults: no floor, cap 5; and verl's 0.2 / 0.2) equals its float64 oracle per token, verl's
    `cispo` under token_mean, and, with the defaults, TRL's `loss_type="cispo"` (epsilon_high = 5.0, the cap)."""
    logp, old, advantages, mask = sequence_batch(6, batch=12, spread=0.8, dtype=torch.float32)
    rule = build_rule("cispo", **params)
    low, high = rule.ratio_bounds()
    out, grad = loss_and_grad(rule, logp, old, advantages, mask)
    want_loss, want_grad = cispo_oracle(logp, old, advantages, mask, low, high)
    assert max_error(out.loss, want_loss) < 1e-5 and max_error(grad, want_grad) < 1e-5
    truncated = mask & ((torch.exp(logp - old) > high) | (torch.exp(logp - old) < low))
    assert out.metrics["clip/frac"] == pytest.approx(float(truncated.sum() / mask.sum())) and truncated.any()
    assert (grad[mask] != 0).all()  # no token's gradient is dropped
    loss, grad, _ = ours("cispo", params, logp, old, advantages, mask, "token_mean")
    leaf = logp.clone().requires_grad_()
    verl = verl_cispo(old, leaf, advantages[:, None], mask.float(), 1 - low, high - 1)
    verl.backward()
    assert abs(float(loss - verl.detach())) < 1e-6 and max_error(grad, leaf.grad) < 1e-7
    if not params:
        trl, trl_grad = trl_loss_and_grad(logp, old, advantages, mask, "cispo", epsilon_high=5.0)
        assert abs(float(loss - trl)) < 1e-6 and max_error(grad, trl_grad) < 1e-7


# ------------------------------------------------------------------------------------------------ GMPO
def gmpo_oracle(logp, old, advantages, mask, eps_low, eps_high):
    """GMPO's objective per sequence from its equation, in float64 loops: the value on every valid token, and the
    gradient of Σ_t loss (= n_i·∂loss_i/∂log π_t = −A_i·ratio_i on tokens not clipped on their side)."""
    loss, grad = torch.zeros_like(logp, dtype=torch.float64), torch.zeros_like(logp, dtype=torch.float64)
    for i in range(logp.shape[0]):
        a = float(advantages[i])
        clipped, free = [], []
        for t in range(logp.shape[1]):
            if mask[i, t]:
                s = float(logp[i, t] - old[i, t])
                bounded = min(max(s, -eps_low), eps_high)
                clipped.append(min(s, bounded) if a > 0 else max(s, bounded))
                free.append(clipped[-1] == s and (a <= 0 or s <= eps_high) and (a > 0 or s >= -eps_low))
        ratio = math.exp(sum(clipped) / len(clipped))
        columns = [t for t in range(logp.shape[1]) if mask[i, t]]
        for t, is_free in zip(columns, free):
            loss[i, t] = -a * ratio
            grad[i, t] = -a * ratio if is_free else 0.0
    return loss, grad


def verl_geo_mean(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high):
    """verl 0.9.1 `compute_policy_loss_geo_mean` re-typed (its loss is a plain mean over sequences)."""
    negative_approx_kl = log_prob - old_log_prob
    sgn_advantage = torch.sign(advantages)
    negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -clip_low, clip_high)
    negative_approx_kl_min = torch.min(sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp)
    negative_approx_kl_min = sgn_advantage * negative_approx_kl_min
    response_mask_sum = response_mask.sum(dim=-1)
    ratio = torch.exp((negative_approx_kl_min * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
    advantage = (advantages * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
    return torch.mean(-advantage * ratio)


def trl_gmpo_loss_and_grad(logp, old, advantages, mask, epsilon):
    """TRL 1.15's `experimental.gmpo.GMPOTrainer._compute_loss` on given per-token log-probs."""
    from trl.experimental.gmpo import GMPOTrainer

    loss, grad, _ = trl_compute_loss(
        GMPOTrainer, logp, old, advantages, mask, epsilon_low=epsilon, epsilon_high=epsilon
    )
    return loss, grad


def test_gmpo_matches_its_oracle_verl_and_trl():
    """GMPO: the value −A_i·exp(mean_t clip_A(log w_t)) on every token of sequence i and its gradient (float64
    oracle); under seq_mean, verl's `geo_mean` and TRL's experimental GMPO trainer, computed by TRL itself."""
    logp, old, advantages, mask = sequence_batch(7, batch=12, spread=0.5, dtype=torch.float32)
    out, grad = loss_and_grad(build_rule("gmpo"), logp, old, advantages, mask)
    want_loss, want_grad = gmpo_oracle(logp, old, advantages, mask, 0.4, 0.4)
    assert max_error(out.loss, want_loss) < 1e-5 and max_error(grad, want_grad) < 1e-5
    assert 0.05 < out.metrics["clip/frac"] < 0.6
    loss, grad, _ = ours("gmpo", {}, logp, old, advantages, mask, "seq_mean")
    leaf = logp.clone().requires_grad_()
    verl = verl_geo_mean(old, leaf, advantages[:, None].expand_as(logp), mask.float(), 0.4, 0.4)
    verl.backward()
    assert abs(float(loss - verl.detach())) < 1e-6 and max_error(grad, leaf.grad) < 1e-7
    trl, trl_grad = trl_gmpo_loss_and_grad(logp, old, advantages, mask, 0.4)
    assert abs(float(loss - trl)) < 1e-6 and max_error(grad, trl_grad) < 1e-7


# ------------------------------------------------------------------------------------------------ DPPO
def dppo_oracle(name, logp, old, advantages, mask, delta, c):
    """DPPO-Binary's loss per token from the paper's masks, in float64 loops (Bernoulli KL written out)."""
    loss, grad = torch.zeros_like(logp, dtype=torch.float64), torch.zeros_like(logp, dtype=torch.float64)
    for i, t in mask.nonzero().tolist():
        lp, olp, a = float(logp[i, t]), float(old[i, t]), float(advantages[i])
        p, q = math.exp(lp), math.exp(olp)
        if name == "dppo_tv":
            valid = p - q <= delta if a > 0 else p - q >= -delta
        else:
            kl = q * (olp - lp) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
            valid = (kl <= delta or p <= q) if a > 0 else (kl <= delta or p >= q)
        weight = min(math.exp(lp - olp), c)
        loss[i, t], grad[i, t] = (-a * weight * lp, -a * weight) if valid else (0.0, 0.0)
    return loss, grad


def verl_dppo(name, old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_ratio_c):
    """verl 0.9.1 `compute_policy_loss_dppo_tv` / `_dppo_kl` re-typed, with token-mean aggregation."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    truncated_ratio = torch.clamp(ratio, max=clip_ratio_c).detach()
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    if name == "dppo_tv":
        valid_positive_mask = (prob - old_prob) <= clip_high
        valid_negative_mask = (prob - old_prob) >= -clip_low
    else:
        binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        valid_positive_mask = (binary_kl <= clip_high) | (prob <= old_prob)
        valid_negative_mask = (binary_kl <= clip_low) | (prob >= old_prob)
    valid_mask = torch.where(advantages > 0, valid_positive_mask, valid_negative_mask).detach().float()
    pg_losses = -advantages * truncated_ratio * log_prob * valid_mask
    return (pg_losses * response_mask).sum() / response_mask.sum()


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("c", [1e4, 1.5])
def test_dppo_matches_its_oracle_and_verl(name, c):
    """DPPO-Binary-TV / -KL: loss and gradient against the float64 oracle of the paper's masks and against verl's
    `dppo_tv` / `dppo_kl` (token_mean); with c = 1.5 the IS truncation is exercised too."""
    g = torch.Generator().manual_seed(8)
    old = torch.log(torch.rand(10, 14, generator=g) * 0.98 + 0.01)  # π_old from 0.01 to 0.99
    logp = (old + torch.randn(10, 14, generator=g) * 0.7).clamp(max=-1e-4)
    mask = torch.rand(10, 14, generator=g) > 0.2
    advantages = torch.randn(10, generator=g)
    delta = build_rule(name).delta_high
    rule = build_rule(name, c=c)
    out, grad = loss_and_grad(rule, logp, old, advantages, mask)
    want_loss, want_grad = dppo_oracle(name, logp, old, advantages, mask, delta, c)
    assert max_error(out.loss, want_loss) < 1e-5 and max_error(grad, want_grad) < 1e-5
    assert 0.05 < out.metrics["clip/frac"] < 0.8 and (out.metrics["clip/frac_truncated"] > 0) == (c < 10)
    loss, grad, _ = ours(name, {"c": c}, logp, old, advantages, mask, "token_mean")
    leaf = logp.clone().requires_grad_()
    verl = verl_dppo(name, old, leaf, advantages[:, None], mask.float(), delta, delta, c)
    verl.backward()
    assert abs(float(loss - verl.detach())) < 1e-6 and max_error(grad, leaf.grad) < 1e-7


# the (lowest w for A < 0, highest w for A > 0) of DPPO's regions, by bisection / exact TV, computed apart from the rule
DPPO_TABLE = {
    "dppo_kl": {0.001: (0.000, 53.5), 0.01: (0.002, 7.81), 0.1: (0.313, 2.20), 0.5: (0.692, 1.31), 0.9: (0.867, 1.08)},
    "dppo_tv": {0.001: (0.000, 151), 0.01: (0.000, 16.0), 0.1: (0.000, 2.50), 0.5: (0.700, 1.30), 0.9: (0.833, 1.11)},
}


@pytest.mark.parametrize("name", sorted(DPPO_TABLE))
def test_dppo_bounds_are_probability_dependent(name):
    """`old_prob_bounds`: the ratio interval of DPPO at its defaults for each π_old, equal to an independent table
    (δ 0.05 KL, 0.15 TV) and, for KL, to scipy's root of the Bernoulli KL; rare tokens may move much further
    than under ATR's fixed [0.671, 1.422]."""
    rule = build_rule(name)
    qs = torch.tensor(sorted(DPPO_TABLE[name]), dtype=torch.float64)
    low, high = rule.old_prob_bounds(qs)
    for q, lo, hi in zip(qs.tolist(), low.tolist(), high.tolist()):
        want_low, want_high = DPPO_TABLE[name][q]
        assert lo == pytest.approx(want_low, abs=6e-4) and hi == pytest.approx(want_high, rel=6e-3), q
    if name == "dppo_kl":
        optimize = pytest.importorskip("scipy.optimize")

        def excess(log_p, q):  # in log p, so that the tiny lower roots are found to relative precision
            p = math.exp(log_p)
            return q * (math.log(q) - log_p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8)) - 0.05

        for q, lo, hi in zip(qs.tolist(), low.tolist(), high.tolist()):
            upper = math.exp(optimize.brentq(excess, math.log(q), math.log1p(-1e-12), args=(q,), xtol=1e-15))
            lower = math.exp(optimize.brentq(excess, -700.0, math.log(q), args=(q,), xtol=1e-15))
            assert hi * q == pytest.approx(upper, rel=1e-9, abs=0) and lo * q == pytest.approx(lower, rel=1e-9, abs=0)
    assert high[1] > 5 * 1.422  # π_old = 0.01
