"""The rules whose statistic is over the optimizer step's whole batch (`ClipRule.whole_batch`): M2PO and BAPO.

Each against its paper's law on constructed batches, with float64 oracles written again from the papers (M2PO's
Algorithm 1 as a loop of argmaxes, BAPO's Algorithm 1 as a loop of steps); then the refusals that keep the batch
the rule sees the step's batch: gradient accumulation and several processes before any model loads, and verl.
"""

from __future__ import annotations

import subprocess
import sys
from unittest.mock import patch

import pytest
import torch
from conftest import REPO, train_config

from atr_grpo.clipping import RULES, ClipRule, build_rule, register
from atr_grpo.errors import ConfigError
from atr_grpo.integrations import verl as plugin
from atr_grpo.machine import Machine, decide

WHOLE_BATCH = sorted(name for name, rule in RULES.items() if rule.whole_batch)
CPU = Machine(cuda=False, unsloth=False, vllm=False)


def stale_batch(seed: int, batch: int = 6, steps: int = 20, spread: float = 0.4):
    """float64 log-probs with |log w| ~ `spread`, both advantage signs, a masked tail per row."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, steps, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = old + torch.randn(batch, steps, generator=g, dtype=torch.float64) * spread
    advantages = torch.randn(batch, generator=g, dtype=torch.float64)
    lengths = torch.randint(steps // 2, steps + 1, (batch,), generator=g)
    mask = torch.arange(steps)[None, :] < lengths[:, None]
    return logp, old, advantages, mask


def rule_log_ratio(logp, old):
    """log w as the rule computes it (make_batch: float32), in float64."""
    return (logp.float() - old.float()).double()


def loss_and_grad(rule, logp, old, advantages, mask):
    leaf = logp.clone().requires_grad_()
    out = rule(leaf, old, advantages, mask)
    out.loss.sum().backward()
    return out, leaf.grad


# ------------------------------------------------------------------------------------------------------ M2PO
def m2po_oracle_mask(log_ratio, advantages, mask, tau, scope="trust_region"):
    """Algorithm 1 of M2PO, as written: while the mean (log w)² of the tokens of 𝒯 left is > τ, mask the argmax (the
    first in row-major order among equal values). Returns (mask M of masked tokens, 𝒯)."""
    a = advantages[:, None].expand_as(log_ratio)
    if scope == "trust_region":
        region = mask & (((a > 0) & (log_ratio > 0)) | ((a < 0) & (log_ratio < 0)))
    else:
        region = mask.clone()
    m2 = log_ratio.square()
    left = [(b, t) for b in range(m2.shape[0]) for t in range(m2.shape[1]) if region[b, t]]
    masked = torch.zeros_like(mask)
    while left and sum(float(m2[i]) for i in left) / len(left) > tau:
        j = max(left, key=lambda i: (float(m2[i]), -left.index(i)))  # the largest; the first of equal ones
        masked[j] = True
        left.remove(j)
    return masked, region


@pytest.mark.parametrize("scope", ["trust_region", "all"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_m2po_masks_the_fewest_largest_tokens_that_bring_the_second_moment_under_tau(seed, scope):
    """Algorithm 1's mask, and its law: the mean (log w)² of the tokens of 𝒯 left is ≤ τ; every masked token's
    (log w)² is ≥ every kept one's; keeping the smallest masked token again would break the bound (the fewest). The
    loss is −w·A on the tokens left, without a clip, and the masked ones lose their gradient."""
    tau = 0.04
    logp, old, advantages, mask = stale_batch(seed)
    rule = build_rule("m2po", tau_m2=tau, m2_scope=scope)
    out, grad = loss_and_grad(rule, logp, old, advantages, mask)

    log_ratio = rule_log_ratio(logp, old)
    masked, region = m2po_oracle_mask(log_ratio, advantages, mask, tau, scope)
    m2 = log_ratio.square()
    kept = region & ~masked
    assert 0 < masked.sum() < region.sum()
    assert m2[kept].mean() <= tau
    assert m2[masked].min() >= m2[kept].max()
    smallest_masked = m2[masked].min()
    assert (m2[kept].sum() + smallest_masked) / (kept.sum() + 1) > tau

    w, a = torch.exp(log_ratio), advantages[:, None].expand_as(log_ratio)
    live = mask & ~masked
    torch.testing.assert_close(out.loss.double(), torch.where(live, -w * a, 0.0), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, torch.where(live, -w * a, 0.0), rtol=1e-5, atol=1e-6)
    assert out.metrics["clip/frac"] == pytest.approx(float(masked.sum() / mask.sum()))
    assert out.metrics["m2po/m2"] == pytest.approx(float(m2[mask].mean()), rel=1e-5)
    assert out.metrics["m2po/eligible"] == pytest.approx(float(region.sum() / mask.sum()))


def test_m2po_masks_nothing_when_the_second_moment_is_under_tau():
    """A batch whose (log w)² already has a mean ≤ τ keeps every token: the loss is REINFORCE with the ratio."""
    logp, old, advantages, mask = stale_batch(3, spread=0.05)
    out, grad = loss_and_grad(build_rule("m2po"), logp, old, advantages, mask)
    reference, reference_grad = loss_and_grad(build_rule("no_clip"), logp, old, advantages, mask)
    assert out.metrics["clip/frac"] == 0
    torch.testing.assert_close(out.loss, reference.loss)
    torch.testing.assert_close(grad, reference_grad)


def test_m2po_masks_every_trust_region_token_when_even_the_smallest_exceeds_tau():
    """|log w| = 0.5 everywhere ((log w)² = 0.25 > τ): masking goes on until no trust-region token is left (an empty
    remainder ends Algorithm 1's loop); the tokens outside 𝒯 keep −w·A."""
    logp, old, advantages, mask = stale_batch(4)
    signs = torch.where(torch.rand(logp.shape, generator=torch.Generator().manual_seed(5)) > 0.5, 1.0, -1.0)
    logp = old + 0.5 * signs.double()
    out, grad = loss_and_grad(build_rule("m2po"), logp, old, advantages, mask)
    log_ratio = rule_log_ratio(logp, old)
    a = advantages[:, None].expand_as(log_ratio)
    region = mask & (a * log_ratio > 0)
    assert region.any() and (mask & ~region).any()
    assert out.metrics["clip/frac"] == pytest.approx(float(region.sum() / mask.sum()))
    torch.testing.assert_close(grad, torch.where(mask & ~region, -torch.exp(log_ratio) * a, 0.0))


def left_packed(values, mask, pad):
    """Each row's valid tokens moved to the front (Unsloth's layout), `pad` extra columns."""
    out = torch.zeros(values.shape[0], values.shape[1] + pad, dtype=values.dtype)
    packed = torch.zeros(out.shape, dtype=torch.bool)
    for row in range(values.shape[0]):
        valid = values[row][mask[row]]
        out[row, : valid.numel()] = valid
        packed[row, : valid.numel()] = True
    return out, packed


def test_m2po_masks_equal_values_in_the_order_of_the_valid_tokens_in_either_layout():
    """Six trust-region tokens with (log w)² = 0.01 and four tied at 0.09: the mean 0.042 > 0.04 masks one tied token,
    then 0.0367 ≤ 0.04. It is the first tied one in row-major order of the valid tokens, in the right-padded layout
    and in the left-packed one."""
    mask = torch.tensor(
        [[False, True, True, True, False], [True, True, True, True, False], [True, True, True, False, False]]
    )
    shift = torch.tensor([[0.0, 0.1, 0.3, 0.1, 0.0], [0.1, 0.3, 0.1, 0.3, 0.0], [0.3, 0.1, 0.1, 0.0, 0.0]])
    old = torch.full(mask.shape, -1.0, dtype=torch.float64)
    logp, advantages = old + shift.double(), torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    out, _ = loss_and_grad(build_rule("m2po"), logp, old, advantages, mask)
    first_tied = torch.zeros_like(mask)
    first_tied[0, 2] = True
    assert torch.equal(out.loss == 0, ~mask | first_tied)

    packed_logp, packed_mask = left_packed(logp, mask, pad=2)
    packed_old, _ = left_packed(old, mask, pad=2)
    packed = build_rule("m2po")(packed_logp, packed_old, advantages, packed_mask)
    assert torch.equal(packed.loss[packed_mask], out.loss[mask])


def test_m2po_on_a_split_batch_is_another_rule():
    """Why the run refuses to split the step: the two halves of a batch, masked each on its own, mask other tokens
    than the whole batch does."""
    logp, old, advantages, mask = stale_batch(6, batch=8)
    rule = build_rule("m2po")
    whole = rule(logp, old, advantages, mask).loss
    halves = torch.cat([rule(logp[p], old[p], advantages[p], mask[p]).loss for p in (slice(0, 4), slice(4, 8))])
    assert not torch.equal(whole == 0, halves == 0)


# ------------------------------------------------------------------------------------------------------ BAPO
def positive_share(w, a, mask, low, high):
    """Eq. 8 over a batch of samples: ρ = P / (P + N), P = Σ_{A>0} A·min(w, c_high), N = Σ_{A<0} |A|·max(w, c_low)."""
    positive = float(torch.where(mask & (a > 0), a * torch.clamp(w, max=high), 0.0).sum())
    negative = float(torch.where(mask & (a < 0), -a * torch.clamp(w, min=low), 0.0).sum())
    return positive / (positive + negative) if positive + negative > 0 else 1.0


def bapo_oracle_walk(w, a, mask, rule):
    """Algorithm 1 of BAPO as a loop of steps: the (c_low, c_high) pairs it visits, the last one the chosen. Each
    bound is a + k·δ (k steps taken), and a range's end counts as reached within 1e-9."""
    low_steps, high_steps = 0, 0
    low, high = rule.c_low_start, rule.c_high_start
    pairs = [(low, high)]
    while positive_share(w, a, mask, low, high) < rule.rho0 and low + rule.c_low_step <= rule.c_low_max + 1e-9:
        if high + rule.c_high_step <= rule.c_high_max + 1e-9:
            high_steps += 1
            high = min(rule.c_high_start + high_steps * rule.c_high_step, rule.c_high_max)
        else:
            low_steps += 1
            low = min(rule.c_low_start + low_steps * rule.c_low_step, rule.c_low_max)
        pairs.append((low, high))
    return pairs


def bapo_batch(kind: str):
    """A stale batch whose positive tokens reach ρ₀ at once ('start'), after c_high is raised ('raised'), or never
    ('never': negative tokens dominate the loss)."""
    logp, old, advantages, mask = stale_batch(7, batch=8, steps=24, spread=0.3)
    advantages = torch.tensor([1.0, -1.0, 0.8, -0.6, 1.2, -1.1, 0.5, -0.9], dtype=torch.float64)
    if kind == "raised":  # the positive rows' tokens far above 1.2: they count fully only as c_high rises
        logp[advantages > 0] = old[advantages > 0] + 0.9 + 0.1 * torch.rand(4, 24, dtype=torch.float64)
        advantages = torch.where(advantages > 0, 0.55 * advantages, advantages)
    elif kind == "never":
        advantages = torch.where(advantages > 0, 0.05 * advantages, advantages)
    return logp, old, advantages, mask


@pytest.mark.parametrize("kind", ["start", "raised", "never"])
def test_bapo_bounds_are_the_first_pair_of_the_walk_that_reaches_rho0_or_the_ranges_ends(kind):
    """The bounds the rule uses are Algorithm 1's: its walk raises c_high, then c_low, and stops at the first pair
    with ρ ≥ ρ₀; the pair before it falls short; when no pair reaches ρ₀ the bounds sit at the ranges' ends
    (3.0, 0.9). The loss is PPO's clip with those bounds."""
    logp, old, advantages, mask = bapo_batch(kind)
    rule = build_rule("bapo")
    out, grad = loss_and_grad(rule, logp, old, advantages, mask)
    w = torch.exp(rule_log_ratio(logp, old))
    a = advantages[:, None].expand_as(w)

    pairs = bapo_oracle_walk(w, a, mask, rule)
    low, high = pairs[-1]
    assert out.metrics["bapo/c_low"] == pytest.approx(low, abs=1e-6)
    assert out.metrics["bapo/c_high"] == pytest.approx(high, abs=1e-6)
    rho = positive_share(w, a, mask, low, high)
    assert out.metrics["bapo/rho"] == pytest.approx(rho, rel=1e-5)
    if kind == "never":
        assert (low, high) == pytest.approx((rule.c_low_max, rule.c_high_max)) and rho < rule.rho0
    else:
        assert rho >= rule.rho0 and rule.c_low_start <= low <= rule.c_low_max
        assert rule.c_high_start <= high <= rule.c_high_max
    if len(pairs) > 1 and kind != "never":
        assert positive_share(w, a, mask, *pairs[-2]) < rule.rho0
    assert (kind == "start") == (len(pairs) == 1)
    assert (kind == "raised") == (rule.c_high_start < high < rule.c_high_max and low == rule.c_low_start)

    frozen = mask & (((a < 0) & (w < low)) | ((a > 0) & (w > high)))
    oracle = torch.where(mask, -torch.minimum(w * a, w.clamp(low, high) * a), 0.0)
    torch.testing.assert_close(out.loss.double(), oracle, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, torch.where(mask & ~frozen, -w * a, 0.0), rtol=1e-5, atol=1e-6)
    assert out.metrics["clip/frac"] == pytest.approx(float(frozen.sum() / mask.sum()))


def test_bapo_contributions_are_eq_8s_sums_at_every_grid_point():
    """The sums per bucket give P and N of Eq. 8 at every point of both grids, for ratios below, inside and above the
    ranges and exactly at grid points."""
    from atr_grpo.clipping import make_batch
    from atr_grpo.clipping.bapo import contributions

    rule = build_rule("bapo")
    logp, old, advantages, mask = stale_batch(8, spread=0.8)
    logp[:, :4] = old[:, :4] + torch.tensor([1.25, 0.7, 3.0, 0.9], dtype=torch.float64).log()  # at grid points
    batch = make_batch(logp, old, advantages, mask)
    low_grid = torch.tensor(rule._low_grid, dtype=torch.float64)
    high_grid = torch.tensor(rule._high_grid, dtype=torch.float64)
    positive, negative = contributions(batch, low_grid, rule.c_low_step, high_grid, rule.c_high_step)
    w, a = torch.exp(rule_log_ratio(logp, old)), advantages[:, None].expand_as(logp)
    for k, c in enumerate(rule._high_grid):
        expected = float(torch.where(mask & (a > 0), a * torch.clamp(w, max=c), 0.0).sum())
        assert float(positive[k]) == pytest.approx(expected, rel=1e-6), c
    for k, c in enumerate(rule._low_grid):
        expected = float(torch.where(mask & (a < 0), -a * torch.clamp(w, min=c), 0.0).sum())
        assert float(negative[k]) == pytest.approx(expected, rel=1e-6), c


def test_bapo_never_raises_c_low_above_its_start_when_c_high_alone_reaches_rho0():
    """Raising c_low cannot raise ρ (a negative token's contribution |A|·max(w, c_low) grows with it): c_low moves
    only once c_high is at its end, and then to the end of its own range."""
    rule = build_rule("bapo")
    for seed in range(6):
        logp, old, advantages, mask = stale_batch(10 + seed, spread=0.5)
        metrics = rule(logp, old, advantages, mask).metrics
        moved_low = metrics["bapo/c_low"] > rule.c_low_start + 1e-6
        assert not moved_low or (
            metrics["bapo/c_high"] == pytest.approx(rule.c_high_max)
            and metrics["bapo/c_low"] == pytest.approx(rule.c_low_max)
        )


def test_bapo_walks_c_high_even_when_c_low_cannot_step():
    """With c_low's range one point ([0.6, 0.6]) Algorithm 1's loop would not start at all; here c_high still walks
    its range (the rule's documented choice), and c_low stays."""
    logp, old, advantages, mask = bapo_batch("raised")
    fixed_low = build_rule("bapo", c_low_max=0.6)(logp, old, advantages, mask).metrics
    walked = build_rule("bapo")(logp, old, advantages, mask).metrics
    assert fixed_low["bapo/c_low"] == pytest.approx(0.6) and fixed_low["bapo/c_high"] == walked["bapo/c_high"] > 1.2


def test_bapo_ranges_are_checked():
    with pytest.raises(ValueError, match="'c_high_max' must be ≥ c_high_start = 2.0"):
        build_rule("bapo", c_high_start=2.0, c_high_max=1.5)
    with pytest.raises(ValueError, match="'c_low_start' must be a number in"):
        build_rule("bapo", c_low_start=1.2)
    with pytest.raises(ValueError, match="'c_high_start' must be a number ≥ 1"):
        build_rule("bapo", c_high_start=0.9)


def test_bapo_range_ends_are_reached_by_whole_steps():
    """(3.0 − 1.2) / 0.05 is not 36 in floats; the grid still ends at 3.0, and at 0.9 for c_low."""
    rule = build_rule("bapo")
    assert (rule._high_grid[-1], len(rule._high_grid)) == (3.0, 37)
    assert (rule._low_grid[-1], len(rule._low_grid)) == (0.9, 16)


# --------------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name", WHOLE_BATCH)
def test_gradient_accumulation_is_refused_before_any_model_loads_naming_the_key(name):
    """The smoke run accumulates 2 micro-batches of 8: refused, with the batch size that keeps its batch; with it,
    the run is accepted."""
    with pytest.raises(ConfigError) as err:
        decide(train_config(["experiment=smoke", f"clipping={name}"]), CPU)
    message = str(err.value)
    assert message.startswith(
        f"invalid config: trainer.gradient_accumulation_steps must be 1 with clipping.name={name}"
    )
    assert "trainer.per_device_train_batch_size=16 keeps the batch" in message and message.endswith("got 2")
    one_micro_batch = ["trainer.per_device_train_batch_size=16", "trainer.gradient_accumulation_steps=1"]
    assert decide(train_config(["experiment=smoke", f"clipping={name}", *one_micro_batch]), CPU).training_backend


@pytest.mark.parametrize("name", WHOLE_BATCH)
def test_several_processes_are_refused(name):
    cfg = train_config(["experiment=smoke", f"clipping={name}", "trainer.gradient_accumulation_steps=1"])
    launched = Machine(cuda=True, unsloth=False, vllm=False, processes=2)
    with pytest.raises(ConfigError, match=f"clipping.name={name} trains on one process .*this launch has 2 processes"):
        decide(cfg, launched)


def test_a_rule_that_keeps_its_micro_batch_statistic_is_not_refused():
    """Clip-Cov's statistic is per micro-batch, as in its source: gradient accumulation and processes run."""
    assert not RULES["clip_cov"].whole_batch and RULES["clip_cov"].batch_statistic
    decide(train_config(["experiment=smoke", "clipping=clip_cov"]), CPU)
    cfg = train_config(["experiment=smoke", "clipping=clip_cov", "trainer.backend=trl"])
    decide(cfg, Machine(cuda=True, unsloth=False, vllm=False, processes=2))


@pytest.mark.parametrize("name", WHOLE_BATCH)
def test_verl_refuses_the_rule_naming_the_loss_mode(name):
    with pytest.raises(ValueError, match=rf"'atr_grpo\.{name}' is not available under verl.*whole batch"):
        plugin.rule_from_config(f"atr_grpo.{name}", {})


def test_whole_batch_needs_a_declared_batch_statistic():
    class Undeclared(ClipRule):
        name, family, whole_batch = "undeclared_whole_batch", "ratio", True

    with patch.dict(RULES), pytest.raises(ValueError, match="whole_batch needs batch_statistic"):
        register(Undeclared)


@pytest.mark.slow  # starts Python
def test_the_train_entry_point_refuses_with_status_2_before_the_run_is_prepared(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "atr_grpo.train", "experiment=smoke", "clipping=m2po", f"run_dir={run_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "trainer.gradient_accumulation_steps must be 1 with clipping.name=m2po" in result.stderr
    assert "Traceback" not in result.stderr
    assert [path.name for path in run_dir.iterdir()] == ["train.log"]  # Hydra's log: no config.yaml, no model


def test_the_whole_batch_rules_are_m2po_and_bapo_with_their_sources_defaults():
    assert WHOLE_BATCH == ["bapo", "m2po"]
    assert build_rule("m2po").config() == {"tau_m2": 0.04, "m2_scope": "trust_region"}
    assert build_rule("bapo").config() == {
        "rho0": 0.4,
        "c_high_start": 1.2,
        "c_high_max": 3.0,
        "c_high_step": 0.05,
        "c_low_start": 0.6,
        "c_low_max": 0.9,
        "c_low_step": 0.02,
    }
