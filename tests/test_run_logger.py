"""What reaches metrics.jsonl from the trainer's log events."""

from types import SimpleNamespace

from conftest import train_config

from atr_grpo import rundir
from atr_grpo.training.logging import MetricsCallback, RunLogger


def test_unsloth_clip_ratio_metrics_are_not_recorded_beside_the_rules(tmp_path):
    """Unsloth logs `clip_ratio/*` computed with TRL's ε = 0.2 whatever the rule: a reader would take them for the
    rule's. The rule's own `clip/*` and everything else are recorded, `completions/mean_length` also as
    `completion_length`."""
    logger = RunLogger(train_config(["experiment=smoke"]), tmp_path)
    callback = MetricsCallback(logger)
    logs = {
        "loss": 0.1,
        "clip/frac": 0.02,
        "clip_ratio/low_mean": 0.3,
        "clip_ratio/region_mean": 0.4,
        "completions/mean_length": 17.0,
    }
    callback.on_log(None, SimpleNamespace(global_step=3), None, logs=logs)
    (row,) = rundir.read_jsonl(tmp_path / rundir.METRICS_FILE)
    assert row == {
        "step": 3,
        "loss": 0.1,
        "clip/frac": 0.02,
        "completions/mean_length": 17.0,
        "completion_length": 17.0,
    }


def test_sampling_metrics_of_two_meanings_are_not_recorded(tmp_path):
    """With vLLM rollouts on the Unsloth path, TRL logs `sampling/*` at generation (its own clamp of π_old/π_rollout)
    and Unsloth logs the same keys from the loss (our correction's weight): averaged together they mean neither.
    Only the rule's `rollout/*` keys, one meaning on both paths, are recorded."""
    logger = RunLogger(train_config(["experiment=smoke"]), tmp_path)
    logs = {
        "loss": 0.1,
        "sampling/importance_sampling_ratio/mean": 1.4,
        "sampling/importance_sampling_ratio/max": 2.0,
        "sampling/sampling_logp_difference/mean": 0.02,
        "sampling/rollout_kl_k1/mean": 0.001,
        "rollout/logp_abs_diff_mean": 0.02,
        "rollout/weight_mean": 1.0,
    }
    MetricsCallback(logger).on_log(None, SimpleNamespace(global_step=5), None, logs=logs)
    (row,) = rundir.read_jsonl(tmp_path / rundir.METRICS_FILE)
    assert row == {"step": 5, "loss": 0.1, "rollout/logp_abs_diff_mean": 0.02, "rollout/weight_mean": 1.0}
