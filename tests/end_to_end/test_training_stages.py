"""A training run's stages on the tiny model (CPU), for real: evaluation after training with a vLLM engine of its
own, every scheduled step evaluated and its adapter kept until then; a failed evaluation recorded, reported by
the exit status, and evaluated again by a re-launch; TRL's colocated vLLM engine for rollouts with the
rollout/trainer mismatch logged every step, and the rollout correction weighing by it."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time

import pytest
from conftest import REPO, compose, group_variables_kept, needs_vllm
from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.config_hydra import to_object
from atr_grpo.evaluation.schedule import adapter_dir, read_failures, run_complete, saved_adapters
from atr_grpo.training import evaluations
from atr_grpo.training.pipeline import EXIT_EVALUATIONS_INCOMPLETE, run_outcome, run_training

pytestmark = pytest.mark.slow


def train_cli(run_dir, *overrides):
    return subprocess.run(
        [sys.executable, "-m", "atr_grpo.train", "experiment=smoke", f"run_dir={run_dir}", *overrides],
        cwd=REPO,  # the tiny model and SFT caches under results/cache
        capture_output=True,
        text=True,
        timeout=900,
    )


def summary(run_dir):
    return rundir.read_jsonl(rundir.summary_path(run_dir))


def metrics(run_dir):
    return rundir.read_jsonl(run_dir / rundir.METRICS_FILE)


@needs_vllm
def test_evaluation_after_training_with_vllm_evaluates_every_scheduled_step(tmp_path, smoke_sft_adapter):
    """eval.when=after: GRPO in one process, then one vLLM engine for the adapters of steps 0, 2 and 4. Each stage
    prints its progress line (off a terminal: plain lines), with no raw log dict and no vLLM INFO line."""
    run_dir = tmp_path / "run"
    result = train_cli(run_dir, "eval.when=after", "eval.backend=vllm")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "3 of 3 scheduled evaluations done" in result.stdout
    printed = result.stdout + result.stderr
    assert "{'" not in printed and not re.search(r"pid=\d+\) INFO ", printed)
    assert printed.count("runs on: training backend") == 1, "decided in the checks, passed to the GRPO stage"
    stage_lines = [line for line in result.stderr.splitlines() if line.startswith(("GRPO: ", "evaluation: "))]
    grpo = [i for i, line in enumerate(stage_lines) if line.startswith("GRPO: ")]
    assert "GRPO: 100% 4/4" in stage_lines[grpo[-1]] and "evaluation: 100% 3/3" in stage_lines[-1]
    assert all(line.startswith("evaluation: ") for line in stage_lines[grpo[-1] + 1 :])  # the stages in order
    assert re.search(r"mean@4 [\d.]+, pass@4 [\d.]+$", stage_lines[-1])
    rows = summary(run_dir)
    assert [(r["step"], r["benchmark"], r["backend"]) for r in rows] == [(s, "arithmetic", "vllm") for s in (0, 2, 4)]
    assert [r["adapter_step"] for r in rows] == [0, 2, 4]
    for step in (0, 2, 4):  # the same per-sample files as in-training evaluation writes
        samples = rundir.read_jsonl(rundir.eval_step_dir(run_dir, step) / "arithmetic.jsonl")
        assert len(samples) == 8 * 4 and {"completion", "correct", "status", "finish_reason"} <= set(samples[0])
    assert saved_adapters(run_dir) == {}, "each adapter is deleted once its evaluation is recorded"
    assert (run_dir / "final_adapter" / "adapter_model.safetensors").exists()
    assert run_complete(run_dir) and not (run_dir / "eval" / "failures.jsonl").exists()


def test_a_failed_evaluation_is_recorded_reported_and_retried(tmp_path, monkeypatch, smoke_sft_adapter):
    """eval.when=during, the evaluation of step 2 fails: the failure and its traceback go to eval/failures.jsonl,
    step 2's adapter stays, the run is not complete; a re-launch evaluates step 2 from that adapter."""
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    cfg = compose(["experiment=smoke", f"run_dir={run_dir}"])
    real_run = evaluations._run

    def failing_at_2(cfg, generator, tokenizer, benchmarks, run_dir, step):
        if step == 2:
            raise MemoryError("CUDA out of memory (simulated)")
        return real_run(cfg, generator, tokenizer, benchmarks, run_dir, step)

    monkeypatch.setattr(evaluations, "_run", failing_at_2)
    run_training(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True))
    (failure,) = read_failures(run_dir)
    assert failure["step"] == 2 and failure["stage"] == "during" and "MemoryError" in failure["traceback"]
    assert [r["step"] for r in summary(run_dir)] == [0, 4]
    assert sorted(saved_adapters(run_dir)) == [2], "only the failed step keeps its adapter"
    outcome = run_outcome(run_dir)
    assert (
        not outcome.ok and outcome.summary().startswith("NOT COMPLETE") and "failed at steps [2]" in outcome.summary()
    )
    assert not run_complete(run_dir), "make reproduce-* launches it again"

    monkeypatch.undo()
    result = train_cli(run_dir)  # the same command: training is done, step 2 is evaluated from its adapter
    assert result.returncode == 0, result.stderr[-4000:]
    assert [r["step"] for r in summary(run_dir)] == [0, 4, 2] and run_complete(run_dir)
    assert saved_adapters(run_dir) == {}


def test_a_run_whose_evaluations_cannot_be_completed_exits_with_status_3(tmp_path, monkeypatch, smoke_sft_adapter):
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    cfg = compose(["experiment=smoke", f"run_dir={run_dir}", "eval.when=after", "eval.backend=hf"])
    run_training(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True))  # trains, leaves adapters 0, 2, 4
    assert sorted(saved_adapters(run_dir)) == [0, 2, 4] and summary_missing(run_dir)
    for step in (2, 4):
        evaluations.remove_adapter(run_dir, step)  # lost: these steps can no longer be evaluated
    result = train_cli(run_dir, "eval.when=after", "eval.backend=hf")
    assert result.returncode == EXIT_EVALUATIONS_INCOMPLETE, result.stderr[-3000:]
    assert "NOT COMPLETE" in result.stderr and "without an adapter at steps [2, 4]" in result.stderr
    assert [r["step"] for r in summary(run_dir)] == [0], "what could be evaluated was"
    assert not adapter_dir(run_dir, 0).exists()


def summary_missing(run_dir):
    return not rundir.summary_path(run_dir).exists()


# one run on TRL's colocated vLLM engine serves the rollout tests below (an engine start is most of its time): clip
# with ε 0.05 and a large step, so that the reused steps are off-policy enough for the rule to bind, and the rollout
# correction (mis, token level) with the band [0.995, 1.005]
VLLM_ROLLOUTS = [
    "rollout.engine=vllm",
    "eval=none",
    "clipping=clip",
    "clipping.eps=0.05",
    "trainer.learning_rate=1e-3",
    "rollout.correction=mis",
    "rollout.correction_min=0.995",
    "rollout.correction_max=1.005",
]


@pytest.fixture(scope="module")
def vllm_rollout_run(tmp_path_factory, smoke_sft_adapter):
    run_dir = tmp_path_factory.mktemp("vllm_rollouts") / "run"
    with pytest.MonkeyPatch.context() as patch, group_variables_kept():  # TRL's engine sets RANK ... MASTER_PORT
        patch.chdir(REPO)
        cfg = compose(["experiment=smoke", f"run_dir={run_dir}", *VLLM_ROLLOUTS])
        run_training(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True))
    return run_dir


@needs_vllm
def test_vllm_rollouts_train_bind_off_policy_and_log_the_engine_mismatch(vllm_rollout_run):
    """rollout.engine=vllm (TRL's colocated engine): the run trains; the reused steps (2, 4) are off-policy and the
    rule binds, the fresh ones (1, 3) have w ≡ 1; rollout/* compares the engine's log-probs with the trainer's."""
    assert json.loads((vllm_rollout_run / rundir.DONE_FILE).read_text())["rollout_engine"] == "vllm"
    rows = metrics(vllm_rollout_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        mean, peak = row["rollout/logp_abs_diff_mean"], row["rollout/logp_abs_diff_max"]
        assert 0 < mean <= peak, row  # float32 engine vs trainer: close, never bit-identical
        assert mean < 0.05 and 0 <= row["rollout/ratio_out_of_band_frac"] < 0.05, row
    for row in rows[0::2]:
        assert row["ratio/min"] == row["ratio/max"] == 1.0 and row["clip/frac"] == 0.0
    reused = rows[1::2]
    assert all(max(r["ratio/max"] - 1, 1 - r["ratio/min"]) > 0.05 for r in reused), reused  # off-policy
    assert any(r["clip/frac"] > 0 for r in reused), reused  # ε 0.05 binds (on tokens whose advantage is not 0)


@needs_vllm
def test_the_rollout_correction_runs_with_vllm_rollouts(vllm_rollout_run):
    """rollout.correction=mis at token level with the band [0.995, 1.005], on TRL's colocated vLLM engine: the run
    trains and logs, every step, the weights it applied: 1 on average, at most 1.005, exactly 0 on the tokens whose
    trainer/engine ratio leaves the band (a float32 engine differs from the trainer by more than 0.5 % on some)."""
    rows = metrics(vllm_rollout_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        assert 0 < row["rollout/masked_frac"] < 0.5, row
        assert row["rollout/weight_min"] == 0.0 and 0.995 <= row["rollout/weight_max"] <= 1.005, row
        assert abs(row["rollout/weight_mean"] - (1 - row["rollout/masked_frac"])) < 0.01, row
        assert math.isfinite(row["loss"]) and row["rollout/logp_abs_diff_max"] > 0.005, row


def test_a_finished_run_ends_with_its_outcome_in_one_line(tmp_path, smoke_sft_adapter):
    run_dir = tmp_path / "run"
    result = train_cli(run_dir, "eval=none", "logger=none")
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in (result.stdout + result.stderr).splitlines() if "training finished" in line]
    assert said == [f"{run_dir}: training finished"]


def test_two_launches_on_one_run_dir_train_once(tmp_path, smoke_sft_adapter):
    """Two `python -m atr_grpo.train experiment=smoke run_dir=D` started together: one trains; the other is refused
    in seconds (exit status 2, naming the lock and its holder) while the first still runs; every step is logged
    once."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "atr_grpo.train", "experiment=smoke", f"run_dir={run_dir}", "eval=none"]
    launches = [
        subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    refused = None
    while refused is None:  # the first to end is the refused one
        ended = [proc for proc in launches if proc.poll() is not None]
        if ended:
            refused = ended[0]
        else:
            time.sleep(0.2)
    (trains,) = [proc for proc in launches if proc is not refused]
    assert trains.poll() is None, "the refused launch ended while the other still trained"
    err = refused.communicate()[1]
    assert refused.returncode == 2, err[-3000:]
    assert f"{rundir.layout.lock_path(run_dir)} is locked by pid {trains.pid}" in err and "Traceback" not in err, err
    out, err = trains.communicate(timeout=900)
    assert trains.returncode == 0, err[-3000:]
    assert [row["step"] for row in metrics(run_dir)] == [1, 2, 3, 4]
