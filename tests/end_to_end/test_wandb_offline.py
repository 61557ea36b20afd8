"""The default logger for real: `WANDB_MODE=offline python -m atr_grpo.train experiment=smoke logger=wandb` with the
installed wandb (no network, no stub). What it logged is read back from the run's .wandb transaction log with
wandb's own reader, and compared with the run files it mirrors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from helpers.wandb_offline_files import offline_runs

from atr_grpo import rundir
from atr_grpo.rundir import layout

pytestmark = pytest.mark.slow

SMOKE = ["experiment=smoke", "logger=wandb"]
# the paper's design on the smoke run: the evaluation stage evaluates the adapters of steps 0, 2 and 4 after training
# (HF generate on CPU); the adapters are kept, so that a relaunch runs the stage again
AFTER = ("eval.when=after", "eval.backend=hf", "eval.keep_adapters=true")
# the evaluation stage, stopped after step 4's evaluation is in eval/summary.jsonl and before W&B gets it
STOP_BEFORE_MIRRORING_4 = """
import sys
from atr_grpo.training import run_logger
from atr_grpo.training.stages import main

mirror = run_logger.EvaluationMirror.log

def log(self, step, metrics):
    if step == 4:
        raise RuntimeError("stopped before W&B got step 4")
    mirror(self, step, metrics)

run_logger.EvaluationMirror.log = log
sys.exit(main(["evaluate", sys.argv[1]]))
"""
EVAL_AXIS = {"glob_name": "eval/*", "step_metric": "eval/step", "options": {"defined": True, "step_sync": True}}
# the keys the issue names: return, entropy, completion length and the rule's clip statistics (every generation step
# carries reward and completion_length, every step the others)
TRAIN_KEYS = ("reward", "entropy", "completion_length", "clip/frac", "clip/delta")
TRAIN_ONLY = """
import sys
from omegaconf import OmegaConf
from atr_grpo import hydra_app
from atr_grpo.compat import keep_vllm_out_of_trl
from atr_grpo.config_hydra import to_object
from atr_grpo.training.pipeline import run_training

keep_vllm_out_of_trl()  # HF rollouts in a process of one config, as under `python -m atr_grpo.train`
cfg = hydra_app.compose("train", sys.argv[1:])
run_training(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True))
"""
# a kill after the checkpoint of step 2 (the run then resumes from checkpoint-2); eval=none keeps it short
KILL_AT_2 = """
import sys
from omegaconf import OmegaConf
from transformers import TrainerCallback
from atr_grpo import hydra_app
from atr_grpo.compat import keep_vllm_out_of_trl
from atr_grpo.config_hydra import to_object
from atr_grpo.training.pipeline import run_training

keep_vllm_out_of_trl()  # HF rollouts in a process of one config, as under `python -m atr_grpo.train`

class Kill(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise RuntimeError("killed after step 2")

cfg = hydra_app.compose("train", sys.argv[1:])
run_training(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True), callbacks=[Kill()])
"""


def offline_env() -> dict[str, str]:
    env = dict(os.environ, WANDB_MODE="offline", PYTHONPATH=str(REPO))
    env.pop("WANDB_API_KEY", None)
    return env


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # cwd: a directory of the test's own, so that a wandb/ directory W&B put beside the run would show
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=offline_env(), capture_output=True, text=True, timeout=900
    )


def train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return run(["-m", "atr_grpo.train", *SMOKE, f"run_dir={run_dir}", *overrides], run_dir.parent)


@pytest.fixture(scope="module")
def wandb_smoke(tmp_path_factory, smoke_sft_adapter):
    run_dir = tmp_path_factory.mktemp("wandb") / "run"
    result = train(run_dir)
    assert result.returncode == 0, result.stderr[-4000:]
    return run_dir


def test_the_offline_wandb_run_lives_in_the_run_directory_under_the_recorded_id(wandb_smoke):
    """The run finishes; its one W&B run sits in run_dir/wandb (nothing beside the run directory), carries the id
    saved in the run directory, the run's name and the experiment as group, and ended with exit code 0."""
    assert (wandb_smoke / rundir.DONE_FILE).exists()
    assert sorted(p.name for p in wandb_smoke.parent.iterdir()) == ["run"]
    (only,) = offline_runs(wandb_smoke)
    run_id = (wandb_smoke / layout.WANDB_ID_FILE).read_text().strip()
    assert only["run"]["run_id"] == run_id and run_id
    assert only["run"]["display_name"] == "smoke__atr__s0" and only["run"]["run_group"] == "smoke"
    assert only["run"]["config"]["update"]["method"] == "atr"  # what the W&B report groups the runs by
    assert only["exit"]["exit_code"] == 0


def test_the_offline_wandb_history_mirrors_the_run_files_step_by_step(wandb_smoke):
    """W&B holds, at the same steps, the values of metrics.jsonl (return, entropy, completion length, clip/frac,
    clip/delta) and of eval/summary.jsonl (Mean@k and Pass@k at steps 0, 2 and 4)."""
    (only,) = offline_runs(wandb_smoke)
    history = only["history"]
    assert sorted(history) == [0, 1, 2, 3, 4]
    rows = rundir.read_jsonl(wandb_smoke / rundir.METRICS_FILE)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows:
        logged = history[row["step"]]
        for key in TRAIN_KEYS:
            if key in row:
                assert logged[key] == pytest.approx(row[key], rel=1e-12), (row["step"], key)
        assert all(key in logged for key in ("entropy", "clip/frac", "clip/delta")), row["step"]
    assert all("reward" in history[step] and "completion_length" in history[step] for step in (1, 3))
    summary = rundir.read_jsonl(wandb_smoke / rundir.EVAL_DIR / rundir.SUMMARY_FILE)
    assert [row["step"] for row in summary] == [0, 2, 4]
    for row in summary:
        logged = history[row["step"]]
        for metric in ("mean@4", "pass@4", "mean@1", "pass@1"):
            assert logged[f"eval/{row['benchmark']}/{metric}"] == pytest.approx(row[metric], rel=1e-12)
    assert not any(key.startswith("eval/") for key in (*history[1], *history[3]))


def test_a_relaunch_after_a_kill_continues_the_same_wandb_run(tmp_path, smoke_sft_adapter):
    """Killed after the checkpoint of step 2 and launched again, the run logs its remaining steps to the W&B run it
    started (same id, resumed); the killed part ends with a nonzero exit code, the relaunch with 0."""
    run_dir = tmp_path / "run"
    killed = run(["-c", KILL_AT_2, *SMOKE, f"run_dir={run_dir}", "eval=none"], tmp_path)
    assert killed.returncode != 0 and "killed after step 2" in killed.stderr, killed.stderr[-4000:]
    assert not (run_dir / rundir.DONE_FILE).exists()
    run_id = (run_dir / layout.WANDB_ID_FILE).read_text().strip()

    relaunched = train(run_dir, "eval=none")
    assert relaunched.returncode == 0, relaunched.stderr[-4000:]
    assert (run_dir / layout.WANDB_ID_FILE).read_text().strip() == run_id
    first, second = offline_runs(run_dir)
    assert first["run"]["run_id"] == second["run"]["run_id"] == run_id
    assert sorted(first["history"]) == [1, 2] and sorted(second["history"]) == [3, 4]
    assert first["exit"]["exit_code"] != 0 and second["exit"]["exit_code"] == 0
    rows = rundir.read_jsonl(run_dir / rundir.METRICS_FILE)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows[2:]:
        assert second["history"][row["step"]]["clip/frac"] == pytest.approx(row["clip/frac"], rel=1e-12)


@pytest.fixture(scope="module")
def wandb_smoke_after(tmp_path_factory, smoke_sft_adapter):
    run_dir = tmp_path_factory.mktemp("wandb_after") / "run"
    result = train(run_dir, *AFTER)
    assert result.returncode == 0, result.stderr[-4000:]
    return run_dir


def test_evaluations_after_training_reach_the_training_runs_wandb_run_on_the_eval_axis(wandb_smoke_after):
    """eval.when=after: the evaluation stage continues the training run's W&B run (same id) and logs every
    benchmark's Mean@k / Pass@k equal to eval/summary.jsonl, each with eval/step = the step evaluated (0, 2, 4), the
    axis both processes define for eval/*, at W&B steps after training's (5, 6, 7), which W&B keeps."""
    run_id = (wandb_smoke_after / layout.WANDB_ID_FILE).read_text().strip()
    training, evaluation = offline_runs(wandb_smoke_after)
    assert training["run"]["run_id"] == evaluation["run"]["run_id"] == run_id
    assert training["exit"]["exit_code"] == evaluation["exit"]["exit_code"] == 0
    assert EVAL_AXIS in training["metrics"] and EVAL_AXIS in evaluation["metrics"]
    assert sorted(training["history"]) == [1, 2, 3, 4]
    assert not any(key.startswith("eval/") for row in training["history"].values() for key in row)
    assert sorted(evaluation["history"]) == [5, 6, 7]
    logged = {row["eval/step"]: row for row in evaluation["history"].values()}
    summary = rundir.read_jsonl(wandb_smoke_after / rundir.EVAL_DIR / rundir.SUMMARY_FILE)
    assert [(row["step"], row["benchmark"]) for row in summary] == [
        (0, "arithmetic"),
        (2, "arithmetic"),
        (4, "arithmetic"),
    ]
    assert sorted(logged) == [0, 2, 4]
    for row in summary:
        for metric in ("mean@4", "pass@4", "mean@1", "pass@1"):
            assert logged[row["step"]][f"eval/arithmetic/{metric}"] == pytest.approx(row[metric], rel=1e-12)
            assert logged[row["step"]][f"eval/average/{metric}"] == pytest.approx(row[metric], rel=1e-12)
    mirrored = rundir.read_jsonl(wandb_smoke_after / layout.WANDB_EVAL_FILE)
    assert [(r["step"], r["wandb_step"], r["run_id"]) for r in mirrored] == [
        (0, 5, run_id),
        (2, 6, run_id),
        (4, 7, run_id),
    ]


def test_a_relaunch_logs_no_evaluation_twice(wandb_smoke_after):
    """Launched again, the finished run's kept adapters run the evaluation stage again: every step is in
    eval/summary.jsonl and in W&B, so nothing is evaluated or logged (no new W&B run, the same wandb_eval.jsonl)."""
    runs_before = sorted(p.name for p in (wandb_smoke_after / "wandb").glob("offline-run-*"))
    mirrored_before = (wandb_smoke_after / layout.WANDB_EVAL_FILE).read_bytes()
    summary_before = rundir.summary_path(wandb_smoke_after).read_bytes()
    result = train(wandb_smoke_after, *AFTER)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "3 of 3 scheduled evaluations done" in result.stderr + result.stdout
    assert sorted(p.name for p in (wandb_smoke_after / "wandb").glob("offline-run-*")) == runs_before
    assert (wandb_smoke_after / layout.WANDB_EVAL_FILE).read_bytes() == mirrored_before
    assert rundir.summary_path(wandb_smoke_after).read_bytes() == summary_before


def test_a_step_evaluated_but_not_mirrored_reaches_wandb_once_on_relaunch(tmp_path, smoke_sft_adapter):
    """The evaluation stage stops after step 4's evaluation is recorded and before W&B gets it (its adapter stays).
    The relaunch evaluates nothing again and gives W&B step 4 from eval/summary.jsonl: across the W&B runs of the one
    id, every evaluated step appears once, equal to the summary, at increasing W&B steps."""
    run_dir = tmp_path / "run"
    overrides = [*SMOKE, f"run_dir={run_dir}", "eval.when=after", "eval.backend=hf"]
    trained = run(["-c", TRAIN_ONLY, *overrides], tmp_path)  # GRPO only: the adapters of 0, 2, 4 wait
    assert trained.returncode == 0, trained.stderr[-4000:]
    stopped = run(["-c", STOP_BEFORE_MIRRORING_4, str(run_dir)], tmp_path)
    assert stopped.returncode == 1 and "stopped before W&B got step 4" in stopped.stderr, stopped.stderr[-4000:]
    summary_rows = rundir.read_jsonl(rundir.summary_path(run_dir))
    assert [row["step"] for row in summary_rows] == [0, 2, 4]

    relaunched = train(run_dir, "eval.when=after", "eval.backend=hf")  # the run's command again
    assert relaunched.returncode == 0, relaunched.stderr[-4000:]
    assert rundir.read_jsonl(rundir.summary_path(run_dir)) == summary_rows, "nothing was evaluated again"
    run_id = (run_dir / layout.WANDB_ID_FILE).read_text().strip()
    training, first_stage, second_stage = offline_runs(run_dir)
    assert {training["run"]["run_id"], first_stage["run"]["run_id"], second_stage["run"]["run_id"]} == {run_id}
    assert (first_stage["exit"]["exit_code"], second_stage["exit"]["exit_code"]) == (1, 0)  # a crash shows as failed
    eval_rows = [(step, row) for part in (first_stage, second_stage) for step, row in sorted(part["history"].items())]
    assert [(step, row["eval/step"]) for step, row in eval_rows] == [(5, 0), (6, 2), (7, 4)]
    for (_, logged), row in zip(eval_rows, summary_rows, strict=True):
        assert logged["eval/arithmetic/pass@4"] == pytest.approx(row["pass@4"], rel=1e-12)
        assert logged["eval/arithmetic/mean@4"] == pytest.approx(row["mean@4"], rel=1e-12)
