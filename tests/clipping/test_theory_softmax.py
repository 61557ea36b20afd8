"""§5 on a tabular softmax policy (one state, exact expectations over the actions): the logit difference between
one ATR step and one ratio-clipping step (Thm 5.1) and the entropy difference it causes (Thm 5.2, Eq. 28–29).

The update is the full-batch policy gradient of J(θ) = Σ_a π_old(a)·(−loss_rule(a)), i.e. E_{a∼π_old}[surrogate],
taken at the current logits θ^k (π_θk ≠ π_old, so ratios w(a) = π_θk(a)/π_old(a) are spread out), with d(s) = 1.

What holds exactly (and is tested):
- Thm 5.1 as printed, with I = X₋ (both advantage signs), is the two-sided reading of ATR (`semantics="mask"`),
  which is what App. A.2 Eq. 22 sums over. With PPO's min (`semantics="min"`, the default) ATR only freezes the
  X₋ tokens whose advantage pushes them further out (A < 0), so the same formula holds with I = X₋ ∩ {A < 0};
  under X₊ the ratio clip only freezes A > 0 tokens, so I = X₊ ∩ {A > 0}.
- Thm 5.2 via Eq. 29: ΔH = −E_{a∼π}[Δθ_a (log π(a) − E log π)] + O(η²). App. A.3's last step (Eq. 30) drops the
  factor π(a) carried by Δθ_a, so its unweighted Cov(A·I, log π) is not the first-order term in general; we test
  Eq. 29 with Thm 5.1's Δθ against the entropies of the two updated policies.
"""

from __future__ import annotations

import pytest
import torch

from atr_grpo.clipping import build_rule, kl3_ratio_bounds

L, U = kl3_ratio_bounds(0.07)


def policy_pair(ratios: list[float], advantages: list[float]):
    """π_old and θ^k with the given ratios on all but the last action (the last absorbs the normalisation)."""
    pi_old = torch.tensor([0.08, 0.07, 0.09, 0.06, 0.1, 0.6], dtype=torch.float64)
    w = torch.tensor(ratios + [0.0], dtype=torch.float64)
    w[-1] = (1 - (w[:-1] * pi_old[:-1]).sum()) / pi_old[-1]
    assert L < w[-1] < U
    theta_k = torch.log(w * pi_old)
    return pi_old, theta_k, torch.tensor(advantages, dtype=torch.float64)


def policy_gradient(rule, pi_old, theta_k, advantages):
    theta = theta_k.clone().requires_grad_()
    logp = torch.log_softmax(theta, 0)
    out = rule(logp[None], torch.log(pi_old)[None], advantages[None], torch.ones(1, len(pi_old), dtype=torch.bool))
    (-(pi_old * out.loss[0]).sum()).backward()
    return theta.grad


def theorem_5_1(theta_k, advantages, indicator, sign):
    pi = torch.softmax(theta_k, 0)
    f = advantages * indicator
    return sign * pi * (f - (pi * f).sum())


def entropy(theta):
    p = torch.softmax(theta, 0)
    return -(p * torch.log(p)).sum()


# X₋: 1 + ε = u_δ, tokens with w ∈ [1 − ε, l_δ]; X₊: 1 − ε = l_δ, tokens with w ∈ [1 + ε, u_δ]
X_MINUS = dict(eps=U - 1, ratios=[0.60, 0.64, 0.62, 1.2, 0.9], advantages=[-1.0, 0.7, -0.4, 0.5, -0.8, 0.3])
X_PLUS = dict(eps=1 - L, ratios=[1.36, 1.40, 1.38, 0.8, 1.1], advantages=[0.9, -0.6, 0.4, -0.5, 0.8, -0.2])


def in_event(w, event):
    return (w >= 1 - event["eps"]) & (w <= L) if event is X_MINUS else (w >= 1 + event["eps"]) & (w <= U)


@pytest.mark.parametrize("event,semantics", [(X_MINUS, "mask"), (X_MINUS, "min"), (X_PLUS, "min"), (X_PLUS, "mask")])
def test_logit_difference_has_the_form_of_theorem_5_1(event, semantics):
    pi_old, theta_k, adv = policy_pair(event["ratios"], event["advantages"])
    w = torch.softmax(theta_k, 0) / pi_old
    members = in_event(w, event)
    assert members.sum() == 3  # the planted event tokens
    eta = 0.1
    atr = policy_gradient(build_rule("atr", delta=0.07, semantics=semantics), pi_old, theta_k, adv)
    ratio = policy_gradient(build_rule("clip", eps=event["eps"]), pi_old, theta_k, adv)
    delta_theta = eta * (atr - ratio)
    if event is X_MINUS:  # ATR freezes X₋ tokens that ratio clipping keeps: Δθ = −η π [A I − E(A I)]
        indicator = members & (adv < 0) if semantics == "min" else members
        expected = theorem_5_1(theta_k, adv, indicator.double(), -eta)
    else:  # ratio clipping freezes X₊ tokens (A > 0) that ATR keeps: Δθ = +η π [A I − E(A I)]
        expected = theorem_5_1(theta_k, adv, (members & (adv > 0)).double(), eta)
    torch.testing.assert_close(delta_theta, expected, rtol=1e-6, atol=1e-9)
    assert delta_theta.abs().max() > 1e-3  # the event makes a difference


def test_theorem_5_1_with_every_event_token_pushed_out_is_the_printed_formula():
    """When every X₊ token has A > 0 (every X₋ token A < 0), the printed indicator I_X is exact under PPO's min."""
    for event, sign in ((X_MINUS, -1), (X_PLUS, 1)):
        adv = [sign * abs(a) if i < 3 else a for i, a in enumerate(event["advantages"])]
        pi_old, theta_k, adv_t = policy_pair(event["ratios"], adv)
        w = torch.softmax(theta_k, 0) / pi_old
        atr = policy_gradient(build_rule("atr", delta=0.07), pi_old, theta_k, adv_t)
        ratio = policy_gradient(build_rule("clip", eps=event["eps"]), pi_old, theta_k, adv_t)
        expected = theorem_5_1(theta_k, adv_t, in_event(w, event).double(), -1.0 if event is X_MINUS else 1.0)
        torch.testing.assert_close(atr - ratio, expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("event", [X_MINUS, X_PLUS])
def test_entropy_difference_is_the_first_order_term_of_eq_29(event):
    pi_old, theta_k, adv = policy_pair(event["ratios"], event["advantages"])
    atr = policy_gradient(build_rule("atr", delta=0.07, semantics="mask"), pi_old, theta_k, adv)
    ratio = policy_gradient(build_rule("clip", eps=event["eps"]), pi_old, theta_k, adv)
    pi = torch.softmax(theta_k, 0)
    logpi = torch.log(pi)
    for eta in (1e-3, 1e-4):
        actual = entropy(theta_k + eta * atr) - entropy(theta_k + eta * ratio)
        delta_theta = eta * (atr - ratio)
        first_order = -(pi * delta_theta * (logpi - (pi * logpi).sum())).sum()
        assert actual.item() == pytest.approx(first_order.item(), rel=20 * eta)
        assert actual.abs() > 0


@pytest.mark.parametrize("event,sign", [(X_MINUS, 1.0), (X_PLUS, -1.0)])
def test_sign_of_the_entropy_difference_follows_theorem_5_2_for_rare_event_tokens(event, sign):
    """Thm 5.2's sign: ΔH has the sign of +η·Cov(A·I_X₋, log π) under X₋ and −η·Cov(A·I_X₊, log π) under X₊. In
    the usual case (the event tokens are rare: log π below its mean, each pushed out by its advantage) the
    π(a)-weighting dropped in Eq. 30 does not change the sign, and both cases raise ATR's entropy."""
    advantages = [-1.0, -0.7, -0.4, 0.5, -0.8, 0.3] if event is X_MINUS else [1.0, 0.7, 0.4, -0.5, 0.8, -0.3]
    pi_old, theta_k, adv = policy_pair(event["ratios"], advantages)
    pi = torch.softmax(theta_k, 0)
    logpi = torch.log(pi)
    indicator = in_event(pi / pi_old, event).double()
    f = adv * indicator
    covariance = (pi * f * logpi).sum() - (pi * f).sum() * (pi * logpi).sum()
    atr = policy_gradient(build_rule("atr", delta=0.07), pi_old, theta_k, adv)
    ratio = policy_gradient(build_rule("clip", eps=event["eps"]), pi_old, theta_k, adv)
    eta = 1e-2
    delta_h = entropy(theta_k + eta * atr) - entropy(theta_k + eta * ratio)
    assert torch.sign(delta_h) == torch.sign(sign * covariance) == 1
