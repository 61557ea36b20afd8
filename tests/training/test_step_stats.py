"""Metrics pooled over micro-batches (and processes) equal the metrics of the whole optimizer step's batch."""

import math

import pytest
import torch

from atr_grpo.clipping import build_rule
from atr_grpo.training.step_stats import StepStats, ratio_outside_box, reduction, rollout_mismatch


def micro_batch(seed, batch, steps):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, steps, generator=g) * 3
    logp = old + torch.randn(batch, steps, generator=g) * 0.4
    lengths = torch.randint(1, steps + 1, (batch,), generator=g)
    mask = (torch.arange(steps)[None, :] < lengths[:, None]).long()
    return logp, old, torch.randn(batch, generator=g), mask


def test_pooled_rule_metrics_equal_those_of_the_concatenated_batch():
    """Token-weighted means over micro-batches of different sizes, min of minima, max of maxima."""
    rule = build_rule("clip", eps=0.2)
    parts = [micro_batch(seed, batch, 12) for seed, batch in ((0, 3), (1, 5), (2, 2))]
    stats = StepStats()
    for logp, old, adv, mask in parts:
        stats.add(rule(logp, old, adv, mask).metrics, int(mask.sum()))
    pooled = stats.reduce()
    whole = rule(*(torch.cat([p[i] for p in parts]) for i in range(4))).metrics
    assert pooled.keys() == whole.keys()
    for key, value in whole.items():
        assert pooled[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
    assert stats.keys() == [], "reduce empties the accumulator"


def test_missing_values_register_their_key_and_contribute_nothing():
    stats = StepStats()
    stats.add({"entropy": float("nan"), "ratio/max": float("nan")}, 5)
    stats.add({"entropy": 2.0, "ratio/max": 3.0}, 4)
    stats.add({"entropy": 9.0}, 0)  # no valid token: no weight
    assert stats.reduce() == {"entropy": 2.0, "ratio/max": 3.0}
    stats.add({"entropy": float("nan"), "ratio/min": float("nan")}, 3)
    out = stats.reduce()
    assert math.isnan(out["entropy"]) and math.isnan(out["ratio/min"]), "every process still reports the key"


def test_reduce_pools_sums_counts_and_extremes_across_processes():
    """Two simulated processes: what process 1 contributes to each all-reduce is combined with process 0's."""
    ranks = [StepStats(), StepStats()]
    ranks[0].add({"clip/frac": 0.5, "ratio/min": 0.8, "ratio/max": 1.5}, 10)
    ranks[1].add({"clip/frac": 0.0, "ratio/min": 0.5, "ratio/max": 1.1}, 30)
    sent = {}
    ranks[1].reduce(lambda tensor, op: sent.setdefault(op, tensor))
    combine = {"sum": torch.add, "min": torch.minimum, "max": torch.maximum}
    out = ranks[0].reduce(lambda tensor, op: combine[op](tensor, sent[op]))
    assert out == {"clip/frac": pytest.approx(5 / 40), "ratio/min": 0.5, "ratio/max": 1.5}


def test_reduction_kind_follows_the_key():
    assert [
        reduction(k)
        for k in (
            "ratio/max",
            "rollout/logp_abs_diff_max",
            "ratio/min",
            "clip/frac",
            "kl/kl3_mean",
            "completions/finish_length",
        )
    ] == ["max", "max", "min", "mean", "mean", "sum"]


def test_counts_are_summed_over_micro_batches_and_processes():
    ranks = [StepStats(), StepStats()]
    ranks[0].add({"completions/finish_length": 1, "completions/finish_stop": 7}, 8)
    ranks[0].add({"completions/finish_length": 2, "completions/finish_stop": 6}, 8)
    ranks[1].add({"completions/finish_length": 4, "completions/finish_stop": 4}, 8)
    sent = {}
    ranks[1].reduce(lambda tensor, op: sent.setdefault(op, tensor))
    combine = {"sum": torch.add, "min": torch.minimum, "max": torch.maximum}
    out = ranks[0].reduce(lambda tensor, op: combine[op](tensor, sent[op]))
    assert out == {"completions/finish_length": 7, "completions/finish_stop": 17}


def test_rollout_mismatch_of_known_log_probs():
    """|Δ log p| mean and max over valid, non-NaN tokens, and the share of ratios outside [0.9, 1.1]."""
    trainer = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-1.0, -1.0, 0.0, 0.0]])
    rollout = torch.tensor([[-1.0, -2.2, float("nan"), -4.05], [-1.5, -1.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    out = rollout_mismatch(rollout, trainer, mask)  # valid and scored: 0, 0.2, 0.05, 0.5, 0
    assert out["rollout/logp_abs_diff_mean"] == pytest.approx(0.75 / 5)
    assert out["rollout/logp_abs_diff_max"] == pytest.approx(0.5)
    assert out["rollout/ratio_out_of_band_frac"] == pytest.approx(2 / 5)  # e^0.2 = 1.22 and e^0.5 = 1.65
    same = rollout_mismatch(trainer, trainer, mask)
    assert set(same.values()) == {0.0}, "an exact engine shows no mismatch"


def test_each_process_draws_its_own_clip_cov_keys_and_one_process_draws_as_before():
    import hashlib

    from atr_grpo.rule_random import micro_batch_stream

    draw = lambda generator: torch.randint(0, 2**31 - 1, (4,), generator=generator).tolist()  # noqa: E731
    legacy = hashlib.sha256(b"7:3:1").digest()
    expected = torch.Generator().manual_seed(int.from_bytes(legacy[:8], "little") & ((1 << 63) - 1))
    assert draw(micro_batch_stream(7, 3, 1)) == draw(micro_batch_stream(7, 3, 1, 0)) == draw(expected)
    assert draw(micro_batch_stream(7, 3, 1, 1)) != draw(micro_batch_stream(7, 3, 1, 0))


def test_the_share_of_engine_ratios_outside_the_rules_box():
    """r = π_old/π_rollout counted outside the rule's box [1 − ε, 1 + ε] over valid tokens (NaN: r = 1), and per
    token where the box depends on π_old (DCPO); a rule with no box logs nothing."""
    trainer = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-1.0, -1.0, 0.0, 0.0]])
    rollout = torch.tensor([[-1.0, -2.3, float("nan"), -3.85], [-1.5, -1.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    # log r over the 6 valid tokens: 0, 0.3, (none), -0.15, 0.5, 0 → r = 1, 1.35, 1, 0.86, 1.65, 1
    clip = ratio_outside_box(build_rule("clip", eps=0.2), rollout, trainer, mask)
    assert clip == {"rollout/ratio_outside_box_frac": pytest.approx(2 / 6)}
    narrow = ratio_outside_box(build_rule("clip", eps=0.1), rollout, trainer, mask)
    assert narrow["rollout/ratio_outside_box_frac"] == pytest.approx(3 / 6)
    dcpo = build_rule("dcpo")
    low, high = dcpo.old_prob_bounds(trainer.double().exp())
    ratio = torch.exp(torch.nan_to_num(trainer.double() - rollout.double(), nan=0.0))
    expected = ((mask.bool() & ((ratio < low) | (ratio > high))).sum() / 6).item()
    per_token = ratio_outside_box(dcpo, rollout, trainer, mask)
    assert per_token == {"rollout/ratio_outside_box_frac": pytest.approx(expected)} and 0 < expected < 1
    assert ratio_outside_box(build_rule("sapo"), rollout, trainer, mask) == {}
