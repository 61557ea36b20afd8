"""What reaches metrics.jsonl (and the W&B mirror) from the trainer's log events."""

import logging
import os
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import train_config
from helpers.wandb_offline_files import offline_runs

from atr_grpo import rundir
from atr_grpo.evaluation.grader import STATUSES
from atr_grpo.rundir import layout
from atr_grpo.training.run_logger import EvaluationMirror, MetricsCallback, RunLogger, wandb_sync_command

OFFLINE = ["experiment=smoke", "logger=wandb", "logger.mode=offline"]


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
    RunLogger on the same run directory (a relaunch) continues the W&B run whose id the first one saved. An
    evaluation carries `eval/step`, its axis, and is logged once: the relaunch's repeat of step 0 adds nothing."""
    cfg = train_config(OFFLINE)
    first = RunLogger(cfg, tmp_path)
    first.log_eval({"eval/arithmetic/mean@4": 0.25, "eval/arithmetic/pass@4": 0.5}, 0)
    first.log(1, {"reward": 0.5, "clip/frac": 0.125, "entropy": float("nan")})
    first.log(2, {"clip/frac": 0.25})
    first.finish(exit_code=1)  # as a run that raised
    run_id = (tmp_path / layout.WANDB_ID_FILE).read_text().strip()
    second = RunLogger(cfg, tmp_path)
    assert not second.log_eval({"eval/arithmetic/mean@4": 0.25, "eval/arithmetic/pass@4": 0.5}, 0)
    second.log(3, {"reward": 0.75})
    second.finish()
    assert (tmp_path / layout.WANDB_ID_FILE).read_text().strip() == run_id
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        rundir.METRICS_FILE,
        "wandb",
        layout.WANDB_EVAL_FILE,
        layout.WANDB_ID_FILE,
    ]
    assert rundir.read_jsonl(tmp_path / layout.WANDB_EVAL_FILE) == [{"step": 0, "wandb_step": 0, "run_id": run_id}]
    first_run, second_run = offline_runs(tmp_path)
    assert first_run["run"]["run_id"] == second_run["run"]["run_id"] == run_id
    assert first_run["history"] == {
        0: {"eval/step": 0, "eval/arithmetic/mean@4": 0.25, "eval/arithmetic/pass@4": 0.5},
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


def _summary_row(step: int, mean: float) -> dict:
    """An eval/summary.jsonl line of the smoke run's one benchmark (k = 4)."""
    values = {"mean@1": mean, "pass@1": mean, "mean@4": mean, "pass@4": min(1.0, 2 * mean)}
    return {"step": step, "benchmark": "arithmetic", **values, "status_counts": {"correct": 3, "wrong": 5}}


def test_the_evaluation_stage_mirrors_each_step_once_above_the_training_steps(tmp_path):
    """The stage's evaluations reach the training run's W&B run (same id, resumed) at W&B steps after training's
    (W&B drops lower ones), each with `eval/step` = its training step. Opened with the done steps, the mirror first
    logs those summary.jsonl holds and W&B lacks (step 2: evaluated, never mirrored), not those W&B has (step 0);
    a relaunch's repeat of step 4 adds nothing, and its new step goes above every W&B step used before."""
    cfg = train_config(OFFLINE)
    training = RunLogger(cfg, tmp_path)
    training.log_eval({"eval/arithmetic/mean@4": 0.125}, 0)
    for step in (1, 2, 3, 4):
        training.log(step, {"reward": step / 10})
    training.finish()
    run_id = (tmp_path / layout.WANDB_ID_FILE).read_text().strip()
    rundir.append_jsonl(rundir.summary_path(tmp_path), [_summary_row(0, 0.125), _summary_row(2, 0.25)])

    stage = EvaluationMirror(cfg, tmp_path, done_steps=[0, 2])
    stage.log(4, {"eval/arithmetic/mean@4": 0.5, "eval/average/mean@4": 0.5})
    stage.close()
    relaunch = EvaluationMirror(cfg, tmp_path, done_steps=[0, 2, 4])
    relaunch.log(4, {"eval/arithmetic/mean@4": 0.5})
    relaunch.log(6, {"eval/arithmetic/mean@4": 0.75})
    relaunch.close()

    first, second, third = offline_runs(tmp_path)
    assert {first["run"]["run_id"], second["run"]["run_id"], third["run"]["run_id"]} == {run_id}
    assert sorted(first["history"]) == [0, 1, 2, 3, 4]
    assert second["history"] == {
        5: {
            "eval/step": 2,
            "eval/arithmetic/mean@1": 0.25,
            "eval/arithmetic/pass@1": 0.25,
            "eval/arithmetic/mean@4": 0.25,
            "eval/arithmetic/pass@4": 0.5,
            **{f"eval/arithmetic/status/{status}": {"correct": 3, "wrong": 5}.get(status, 0) for status in STATUSES},
            "eval/average/mean@1": 0.25,
            "eval/average/pass@1": 0.25,
            "eval/average/mean@4": 0.25,
            "eval/average/pass@4": 0.5,
        },
        6: {"eval/step": 4, "eval/arithmetic/mean@4": 0.5, "eval/average/mean@4": 0.5},
    }
    assert third["history"] == {7: {"eval/step": 6, "eval/arithmetic/mean@4": 0.75}}
    assert [(r["step"], r["wandb_step"]) for r in rundir.read_jsonl(tmp_path / layout.WANDB_EVAL_FILE)] == [
        (0, 0),
        (2, 5),
        (4, 6),
        (6, 7),
    ]


def test_a_wandb_failure_in_the_evaluation_stage_is_recorded_and_loses_nothing(tmp_path, monkeypatch, caplog):
    """W&B cannot start: no exception reaches the evaluation loop, summary.jsonl is untouched, wandb_eval.jsonl
    records the error, and the log names the steps W&B lacks and the command that mirrors them; that command
    (a later stage, W&B working again) then mirrors them."""
    import wandb

    cfg = train_config(OFFLINE)
    rows = [_summary_row(0, 0.125), _summary_row(2, 0.25)]
    rundir.append_jsonl(rundir.summary_path(tmp_path), rows)
    before = rundir.summary_path(tmp_path).read_bytes()

    def refused(**kwargs):
        raise wandb.errors.CommError("the W&B server could not be reached")

    monkeypatch.setattr(wandb, "init", refused)
    with caplog.at_level(logging.ERROR):
        mirror = EvaluationMirror(cfg, tmp_path, done_steps=[0])
        mirror.log(2, {"eval/arithmetic/mean@4": 0.25})
        mirror.close()
    assert rundir.summary_path(tmp_path).read_bytes() == before
    (record,) = rundir.read_jsonl(tmp_path / layout.WANDB_EVAL_FILE)
    assert record["step"] == 0
    assert record["error"] == "starting the W&B run: CommError: the W&B server could not be reached"
    assert "W&B lacks the evaluations of steps [0, 2]" in caplog.text
    assert f"python -m atr_grpo.training.stages evaluate {tmp_path}" in caplog.text

    monkeypatch.undo()
    EvaluationMirror(cfg, tmp_path, done_steps=[0, 2]).close()
    (only,) = offline_runs(tmp_path)
    assert {step: row["eval/step"] for step, row in only["history"].items()} == {0: 0, 1: 2}
    assert only["history"][1]["eval/arithmetic/pass@4"] == pytest.approx(0.5)


def test_an_offline_wandb_run_keeps_the_console_quiet_and_names_every_folder_to_sync(tmp_path, capfd, caplog):
    """No per-checkpoint `URL not available` warning (TRL asks an offline run for its URL at each save) and no
    history or summary at the end. W&B cannot continue an offline folder: a launch and its relaunch with the same id
    write one folder each, and the last line names both, in start order, in one `wandb sync` command, which W&B reads
    as its two parts of one run."""
    caplog.set_level(logging.INFO)
    for step in (1, 2):
        logger = RunLogger(train_config(OFFLINE), tmp_path)
        logger.log(step, {"reward": 0.5})
        assert logger.wandb_run.url is None  # what TRL's model card asks at each checkpoint
        logger.finish()
    err = capfd.readouterr().err
    assert "URL not available" not in err and "Run summary" not in err and "Run history" not in err
    run_id = (tmp_path / layout.WANDB_ID_FILE).read_text().strip()
    first, second = (run["path"] for run in offline_runs(tmp_path))  # in start order, by their run records
    assert sorted((tmp_path / layout.WANDB_DIR).glob("offline-run-*")) == sorted([first, second])
    assert caplog.messages[-1] == f"W&B offline run {run_id}: `wandb sync {first} {second}` uploads all of it"
    env = dict(os.environ, WANDB_MODE="offline")
    program, *arguments = shlex.split(wandb_sync_command(tmp_path, run_id))
    assert program == "wandb"  # the user's command; here, this interpreter's wandb, whatever PATH holds
    command = [sys.executable, "-m", "wandb", *arguments, "--dry-run"]
    dry_run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert dry_run.returncode == 0 and "Would sync 2 run(s)" in dry_run.stdout + dry_run.stderr, dry_run.stderr


def test_the_offline_folders_of_a_wandb_run_are_its_own_in_start_order(tmp_path):
    """A W&B id's folders, the `-<n>` of a second start in the same second after the first; another id's folders
    (one that starts with this id included) and other files are not among them."""
    for name in (
        "offline-run-20260101_120005-abc",
        "offline-run-20260101_120000-abc-2",
        "offline-run-20260101_120000-abc",
        "offline-run-20260101_120000-abc-1",
        "offline-run-20260101_120000-abcd",
        "run-20260101_120000-abc",
    ):
        (tmp_path / layout.WANDB_DIR / name).mkdir(parents=True)
    assert [path.name for path in layout.wandb_offline_folders(tmp_path, "abc")] == [
        "offline-run-20260101_120000-abc",
        "offline-run-20260101_120000-abc-1",
        "offline-run-20260101_120000-abc-2",
        "offline-run-20260101_120005-abc",
    ]
    assert layout.wandb_offline_folders(tmp_path / "elsewhere", "abc") == []
