"""The checks every registered rule gets, as functions of its name: the registry-wide tests run them for each rule
of the registry, and the rule author page's test runs them for its example rule."""

from __future__ import annotations

import math

import pytest
import torch

from atr_grpo.clipping import METRIC_KEYS, SAMPLE_OLD_PROBS, build_rule
from atr_grpo.losses import LossSettings, aggregate, grpo_loss
from atr_grpo.rollout_correction import LEVELS, RolloutCorrection
from helpers.rule_inputs import (
    MAX_LEN,
    engine_batch,
    extras_for,
    left_packed,
    loss_and_grad,
    on_policy_extras,
    planted_batch,
    sequence_batch,
)


def probe_interval(rule, low, high, old_prob):
    """One-token rows probing just inside / just outside each finite side of [low, high], on the side the
    advantage pushes (A < 0 below, A > 0 above), at π_old = `old_prob`: (rows, True where outside)."""
    probes = []
    if low > 0:
        probes += [(low * 0.999, -1.0, True), (low * 1.001, -1.0, False)]
    if math.isfinite(high) and high * 1.001 < 1 / old_prob:  # π_θ ≤ 1 caps w at 1/π_old
        probes += [(high * 1.001, 1.0, True), (high * 0.999, 1.0, False)]
    if not probes:
        return torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.bool)
    ratios, advantages, outside = (torch.tensor(column, dtype=torch.float64) for column in zip(*probes))
    old = torch.full((len(probes), 1), math.log(old_prob), dtype=torch.float64)
    logp = old + torch.log(ratios)[:, None]
    mask = torch.ones_like(logp, dtype=torch.bool)
    _, grad = loss_and_grad(rule, logp, old, advantages * 0.5, mask, **extras_for(rule, logp))
    followed = torch.isclose(grad[:, 0].double(), -ratios * advantages * 0.5, rtol=1e-4, atol=0)
    return followed, outside.bool()


def acts_at_its_declared_bounds(name):
    """`ratio_bounds()` / `old_prob_bounds(π_old)` say where the rule acts: a token just inside keeps the plain
    gradient −w·A, a token just outside (on the side its advantage pushes) does not (frozen or truncated weight)."""
    rule = build_rule(name)
    bounds = rule.ratio_bounds()
    cases = [] if bounds is None else [(*bounds, 0.01)]
    for q in SAMPLE_OLD_PROBS:
        per_token = rule.old_prob_bounds(torch.tensor([q], dtype=torch.float64))
        if per_token is not None:
            cases.append((float(per_token[0]), float(per_token[1]), q))
    probed = 0
    for low, high, q in cases:
        followed, outside = probe_interval(rule, low, high, q)
        assert torch.equal(followed, ~outside), (low, high, q, followed)
        probed += len(followed)
    assert probed >= 2


def reinforce_on_policy(name):
    """With old = logp.detach() (w ≡ 1) the gradient is −A on every valid token, for every rule that does not
    declare `acts_on_policy`."""
    logp, _, advantages, mask = planted_batch(5)
    rule = build_rule(name)
    extras = on_policy_extras(rule, logp)
    _, grad = loss_and_grad(rule, logp, logp.detach(), advantages, mask, **extras)
    torch.testing.assert_close(grad, torch.where(mask, -advantages[:, None].expand_as(logp), 0.0))


def finite_on_extreme_inputs(name, dtype):
    """±80 log-ratios, −inf log-probs under the mask, all-masked rows/batches, zero advantages: never NaN."""
    rule = build_rule(name)
    logp, old, advantages, mask = planted_batch(11, dtype=torch.float32)
    logp = logp.clone()
    logp[:, 5] = old[:, 5] + 80.0
    logp[:, 6] = old[:, 6] - 80.0
    logp[~mask] = -math.inf
    for adv, m in ((advantages, mask), (torch.zeros_like(advantages), mask), (advantages, torch.zeros_like(mask))):
        extras = extras_for(rule, logp)
        leaf = logp.to(dtype).clone().requires_grad_()
        out = rule(leaf, old.to(dtype), adv.to(dtype), m, **extras)
        out.loss.sum().backward()
        assert out.loss.shape == logp.shape
        assert torch.isfinite(out.loss).all() and torch.isfinite(leaf.grad).all()
        assert set(METRIC_KEYS) <= set(out.metrics) and all(math.isfinite(v) for v in out.metrics.values())
        assert (out.loss[~m] == 0).all() and (leaf.grad[~m] == 0).all()
    assert (build_rule(name)(logp, old, advantages, torch.zeros_like(mask), **extras_for(rule, logp)).metrics)[
        "ratio/mean"
    ] == 1.0


def independent_of_padding(name):
    """Moving each row's valid tokens behind a left pad (Unsloth's layout, junk under the padding) moves the loss
    and the gradient with the tokens and changes no metric: reductions over a sequence use the mask only."""
    rule = build_rule(name)
    logp, old, advantages, mask = sequence_batch(5, spread=0.3, dtype=torch.float32)
    extras = extras_for(rule, logp)
    want, want_grad = loss_and_grad(rule, logp, old, advantages, mask, **extras)
    packed_logp, packed_mask = left_packed(logp, mask)
    packed_old, _ = left_packed(old, mask)
    extras = {name: left_packed(value, mask)[0] if value.dim() == 2 else value for name, value in extras.items()}
    out, grad = loss_and_grad(rule, packed_logp, packed_old, advantages, packed_mask, **extras)
    torch.testing.assert_close(out.loss[packed_mask], want.loss[mask], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad[packed_mask], want_grad[mask], rtol=1e-6, atol=1e-7)
    assert (grad[~packed_mask] == 0).all() and (out.loss[~packed_mask] == 0).all()
    assert out.metrics == pytest.approx(want.metrics, rel=1e-5, abs=1e-7)


# every kind at every level, with TRL's default C_max (3) and an IcePop-like band
CORRECTIONS_UNDER_TEST = [
    RolloutCorrection(kind, level, low, high)
    for kind in ("tis", "mis")
    for level in LEVELS
    for low, high in ((None, 3.0), (0.5, 2.0))
]


def oracle_weight(correction: RolloutCorrection, old, sampling, mask) -> torch.Tensor:
    """`[B, T]` in float64, written from TRL 1.15's `_generate_and_score_completions` (the ratio of exp((old −
    sampling)·mask) with NaN → 0, summed per sequence for sequence modes, clamped or masked to [C_min, C_max]) and
    verl 0.9.1's `compute_rollout_correction_weights` (the log-ratio clamped to ±20 before exp)."""
    low = -math.inf if correction.low is None else correction.low
    high = math.inf if correction.high is None else correction.high
    out = torch.zeros_like(old)
    for i in range(old.shape[0]):
        diffs = [0.0 if math.isnan(d) else d for d in (old[i] - sampling[i]).tolist()]
        valid = mask[i].tolist()
        if correction.level == "sequence":
            total = sum(d for d, v in zip(diffs, valid) if v)
            ratios = [math.exp(max(-20.0, min(20.0, total)))] * len(diffs)
        else:
            ratios = [math.exp(max(-20.0, min(20.0, d))) for d in diffs]
        for t, (ratio, v) in enumerate(zip(ratios, valid)):
            if not v:
                continue
            if correction.kind == "tis":
                out[i, t] = min(max(ratio, low), high)
            else:
                out[i, t] = ratio if low <= ratio <= high else 0.0
    return out


def weighted_by_each_correction(name, correction):
    """grpo_loss with a correction = aggregate(rule loss · ρ): the same in value and in gradient, for every rule."""
    old, sampling, mask = engine_batch(seed=3)
    old, sampling = old.float(), sampling.float()
    g = torch.Generator().manual_seed(4)
    logp = old + torch.randn(old.shape, generator=g) * 0.3
    advantages = torch.randn(old.shape[0], generator=g)
    rule = build_rule(name)
    extras = extras_for(rule, logp)
    weight = oracle_weight(correction, old.double(), sampling.double(), mask).float()

    leaf = logp.clone().requires_grad_()
    settings = LossSettings(max_completion_length=MAX_LEN, correction=correction)
    got = grpo_loss(rule, leaf, old, advantages, mask, settings, sampling_logp=sampling, extras=extras).loss
    (got_grad,) = torch.autograd.grad(got, leaf)

    leaf = logp.clone().requires_grad_()
    plain = rule(leaf, old, advantages, mask, **extras).loss
    want = aggregate(plain * weight, mask, "dr_grpo", MAX_LEN)
    (want_grad,) = torch.autograd.grad(want, leaf)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-8)
