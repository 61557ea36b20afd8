"""What reaches metrics.jsonl (and the W&B mirror) from the trainer's log events."""

from types import SimpleNamespace

from conftest import train_config
from wandb_offline_files import offline_runs

from atr_grpo import rundir
from atr_grpo.training.logging import WANDB_ID_FILE, MetricsCallback, RunLogger


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


def test_the_wandb_mirror_holds_each_step_and_a_relaunch_continues_its_run(tmp_path):
    """logger=wandb with the installed wandb (offline): each logged step and each evaluation reaches W&B at its step
    (non-finite values left out, as in metrics.jsonl's nulls), W&B's files stay in the run directory, and a second
    RunLogger on the same run directory (a relaunch) continues the W&B run whose id the first one saved."""
    cfg = train_config(["experiment=smoke", "logger=wandb", "logger.mode=offline"])
    first = RunLogger(cfg, tmp_path)
    first.log_eval({"eval/arithmetic/mean@4": 0.25, "eval/arithmetic/pass@4": 0.5}, 0)
    first.log(1, {"reward": 0.5, "clip/frac": 0.125, "entropy": float("nan")})
    first.log(2, {"clip/frac": 0.25})
    first.finish(exit_code=1)  # as a run that raised
    run_id = (tmp_path / WANDB_ID_FILE).read_text().strip()
    second = RunLogger(cfg, tmp_path)
    second.log(3, {"reward": 0.75})
    second.finish()
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == run_id
    assert sorted(p.name for p in tmp_path.iterdir()) == [rundir.METRICS_FILE, "wandb", WANDB_ID_FILE]
    first_run, second_run = offline_runs(tmp_path)
    assert first_run["run"]["run_id"] == second_run["run"]["run_id"] == run_id
    assert first_run["history"] == {
        0: {"eval/arithmetic/mean@4": 0.25, "eval/arithmetic/pass@4": 0.5},
        1: {"reward": 0.5, "clip/frac": 0.125},
        2: {"clip/frac": 0.25},
    }
    assert second_run["history"] == {3: {"reward": 0.75}}
    assert (first_run["exit"]["exit_code"], second_run["exit"]["exit_code"]) == (1, 0)


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
