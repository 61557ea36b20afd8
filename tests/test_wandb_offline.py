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
from wandb_offline_files import offline_runs

from atr_grpo import rundir
from atr_grpo.training.logging import WANDB_ID_FILE

pytestmark = pytest.mark.slow

SMOKE = ["experiment=smoke", "logger=wandb"]
# the keys the issue names: return, entropy, completion length and the rule's clip statistics (every generation step
# carries reward and completion_length, every step the others)
TRAIN_KEYS = ("reward", "entropy", "completion_length", "clip/frac", "clip/delta")
# a kill after the checkpoint of step 2 (the run then resumes from checkpoint-2); eval=none keeps it short
KILL_AT_2 = """
import sys
from omegaconf import OmegaConf
from transformers import TrainerCallback
from atr_grpo import hydra_app
from atr_grpo.config import to_object
from atr_grpo.training.pipeline import run_training

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
    run_id = (wandb_smoke / WANDB_ID_FILE).read_text().strip()
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
    run_id = (run_dir / WANDB_ID_FILE).read_text().strip()

    relaunched = train(run_dir, "eval=none")
    assert relaunched.returncode == 0, relaunched.stderr[-4000:]
    assert (run_dir / WANDB_ID_FILE).read_text().strip() == run_id
    first, second = offline_runs(run_dir)
    assert first["run"]["run_id"] == second["run"]["run_id"] == run_id
    assert sorted(first["history"]) == [1, 2] and sorted(second["history"]) == [3, 4]
    assert first["exit"]["exit_code"] != 0 and second["exit"]["exit_code"] == 0
    rows = rundir.read_jsonl(run_dir / rundir.METRICS_FILE)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows[2:]:
        assert second["history"][row["step"]]["clip/frac"] == pytest.approx(row["clip/frac"], rel=1e-12)
