"""The 2026 rivals (issue 45): MinPRO, DRPO, CPPO, DPPO's top-K estimates, NSR and ERC, each against the law of its
paper, written again here in float64. None of these papers released code we could read (DPPO's top-K aside, whose
authors' code was not read either): each test states the law from the paper's rule as the rule's `source` does."""

from __future__ import annotations

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
def test_minpro_weighs_each_token_by_the_smallest_ratio_of_its_prefix():
    """MinPRO's law: weight m_t = min_{i≤t} w_i over the row's valid tokens, gradient −m_t·A·∇log π (a loop)."""
    logp, old, advantages, mask = probs_batch()
    loss, grad, metrics = run("minpro", {}, logp, old, advantages, mask)
    w, a = torch.exp(logp - old), broadcast(advantages, logp)
    weight = torch.zeros_like(w)
    for row in range(w.shape[0]):
        smallest = float("inf")
        for t in range(w.shape[1]):
            if mask[row, t]:
                smallest = min(smallest, float(w[row, t]))
                weight[row, t] = smallest
    torch.testing.assert_close(grad, torch.where(mask, -weight * a, 0.0), **TOL)
    torch.testing.assert_close(loss, torch.where(mask, -weight * a * logp, 0.0), **TOL)
    truncated = mask & (weight < w) & (a != 0)
    assert 0 < truncated.sum() < mask.sum()
    assert metrics["clip/frac"] == pytest.approx(float(truncated.sum() / mask.sum()), abs=1e-6)


def test_minpro_is_not_the_prefix_product_and_ignores_padding_before_a_row():
    """A row of ratios (2, 0.5, 4): MinPRO weighs them 2, 0.5, 0.5 (the product would be 2, 1, 4), whatever padding
    precedes or follows the row."""
    ratios = torch.tensor([2.0, 0.5, 4.0], dtype=torch.float64)
    for pad_left, pad_right in ((0, 0), (2, 0), (0, 3), (1, 1)):
        old = torch.full((1, pad_left + 3 + pad_right), -3.0, dtype=torch.float64)
        logp = old.clone()
        logp[0, pad_left : pad_left + 3] += torch.log(ratios)
        logp[0, :pad_left] = -50.0  # junk under the padding, far below the row's ratios
        mask = torch.zeros_like(old, dtype=torch.bool)
        mask[0, pad_left : pad_left + 3] = True
        _, grad, _ = run("minpro", {}, logp, old, torch.tensor([1.0], dtype=torch.float64), mask)
        expected = -torch.tensor([2.0, 0.5, 0.5], dtype=torch.float64)
        torch.testing.assert_close(grad[0, pad_left : pad_left + 3], expected)


# -------------------------------------------------------------------------------------------------- DRPO
@pytest.mark.parametrize("params", [{}, {"delta_low": 0.05, "delta_high": 0.3}])
def test_drpo_has_the_penalised_loss_and_its_gradient(params):
    """DRPO's law as this project reads it: loss −w·A + |A|·(p − q)²/(2δ·q), gradient w·(−A + |A|·(p − q)/δ)."""
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


# -------------------------------------------------------------------------------------------------- CPPO
def cppo_oracle(logp, old, advantages, mask, divergence, delta, ramp, budget):
    """CPPO's kept tokens, written token by token from its law: D_t ≤ δ·min(1, (t+1)/ramp) unless π moved against
    A's push, and the prefix's Σ D_s ≤ budget (t and the sum over the row's valid tokens)."""
    p, q = torch.exp(logp), torch.exp(old)
    kept = torch.zeros_like(mask)
    for row in range(mask.shape[0]):
        position, spent, a = 0, 0.0, float(advantages[row])
        for t in range(mask.shape[1]):
            if not mask[row, t]:
                continue
            pt, qt = float(p[row, t]), float(q[row, t])
            if divergence == "tv":
                d = abs(pt - qt)
            else:
                d = qt * torch.log(torch.tensor(qt / pt)) + (1 - qt) * torch.log(torch.tensor((1 - qt) / (1 - pt)))
                d = float(d)
            position, spent = position + 1, spent + d
            pushed = (pt > qt) if a > 0 else (pt < qt)
            within = d <= delta * min(1.0, position / ramp) or not pushed
            kept[row, t] = within and spent <= budget
    return kept


@pytest.mark.parametrize(
    "params",
    [{}, {"divergence": "kl", "delta": 0.05, "ramp": 4, "budget": 0.5}, {"ramp": 1, "budget": 1.0}],
)
def test_cppo_keeps_the_tokens_of_its_law_with_dppos_loss(params):
    """CPPO's law (a loop): the kept tokens above, each with DPPO's gradient −A·w·∇log π (c = 1e4 never binds)."""
    settings = {"divergence": "tv", "delta": 0.15, "ramp": 16, "budget": 2.0, **params}
    logp, old, advantages, mask = probs_batch(spread=0.3)
    loss, grad, metrics = run("cppo", params, logp, old, advantages, mask)
    kept = cppo_oracle(logp, old, advantages, mask, **settings)
    a, w = broadcast(advantages, logp), torch.exp(logp - old)
    torch.testing.assert_close(grad, torch.where(kept, -a * w, 0.0), **TOL)
    torch.testing.assert_close(loss, torch.where(kept, -a * w * logp, 0.0), **TOL)
    dropped = mask & ~kept & (a != 0)
    assert 0 < dropped.sum() < mask.sum()
    assert metrics["clip/frac"] == pytest.approx(float(dropped.sum() / mask.sum()), abs=1e-6)


@pytest.mark.parametrize("divergence,dppo,delta", [("tv", "dppo_tv", 0.15), ("kl", "dppo_kl", 0.05)])
def test_cppo_without_ramp_or_budget_is_dppo_binary(divergence, dppo, delta):
    """ramp = 1 and a budget never reached: CPPO is DPPO-Binary, loss and gradient."""
    logp, old, advantages, mask = probs_batch(spread=0.8)
    params = {"divergence": divergence, "delta": delta, "ramp": 1, "budget": 1e9}
    loss, grad, metrics = run("cppo", params, logp, old, advantages, mask)
    dppo_loss, dppo_grad, dppo_metrics = run(dppo, {}, logp, old, advantages, mask)
    torch.testing.assert_close(loss, dppo_loss, **TOL)
    torch.testing.assert_close(grad, dppo_grad, **TOL)
    assert metrics["clip/frac"] == pytest.approx(dppo_metrics["clip/frac"]) and metrics["clip/frac"] > 0


def test_cppo_holds_early_tokens_tighter_and_stops_a_row_past_its_budget():
    """One shift of +0.05 on every token (q = 0.5, A > 0, TV): with ramp 8 the first two tokens (δ_t = 0.15/8,
    0.15·2/8 < 0.05) are dropped and the third kept; with budget 0.22 everything from the 5th token (Σ D = 0.25) on."""
    q = torch.full((1, 10), 0.5, dtype=torch.float64)
    logp, old, mask = torch.log(q + 0.05), torch.log(q), torch.ones(1, 10, dtype=torch.bool)
    _, grad, metrics = run("cppo", {"ramp": 8, "budget": 0.22}, logp, old, torch.tensor([1.0]), mask)
    kept = grad[0] != 0
    assert kept.tolist() == [False, False, True, True, False, False, False, False, False, False]
    assert metrics["cppo/frac_over_budget"] == pytest.approx(0.6)


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
