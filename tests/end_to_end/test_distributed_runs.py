"""The smoke run on 2 CPU processes over gloo, started as users start it: `torchrun --nproc_per_node 2 -m
atr_grpo.train ...` and `accelerate launch --config_file examples/accelerate/cpu.yaml -m atr_grpo.train ...`.

Three launches serve every test (each is a few seconds of training and half a minute of start-up on 2 cores):
  whole    torchrun, the command line, 4 steps with evaluation during training at steps 0, 2 and 4;
  killed   torchrun, tests/helpers/distributed_probe.py (the same GRPO stage, plus probes), stopped after checkpoint 2;
  resumed  accelerate launch, the command line again into the killed run's directory.
All three use the same config (clip with ε = 0.05 and a large step, so that the off-policy step 2 clips tokens).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO

from atr_grpo import rundir
from atr_grpo.clipping import build_rule
from atr_grpo.clipping.base import make_batch, rule_metrics

pytestmark = pytest.mark.slow

OVERRIDES = [
    "experiment=smoke",
    "logger=none",
    "trainer.num_threads=1",
    "clipping=clip",
    "clipping.eps=0.05",
    "trainer.learning_rate=1e-3",
]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ACCELERATE = [
    sys.executable,
    "-m",
    "accelerate.commands.launch",
    "--config_file",
    str(REPO / "examples" / "accelerate" / "cpu.yaml"),
]
TRAIN = ["-m", "atr_grpo.train"]
PROBE = [str(REPO / "tests" / "helpers" / "distributed_probe.py")]
# values of a step that depend on the process's clock, not on what it computed
TIMINGS = ("step_time",)


def launch(launcher, program, run_dir, *arguments):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [*launcher, *program, *arguments, *OVERRIDES, f"run_dir={run_dir}"]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)


def metrics(run_dir):
    return rundir.read_jsonl(run_dir / rundir.METRICS_FILE)


def records(path):
    return rundir.read_jsonl(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, smoke_sft_adapter):
    """The three launches, in order (the shared SFT adapter is built first, by one process, outside them)."""
    root = tmp_path_factory.mktemp("distributed")
    whole = launch(TORCHRUN, TRAIN, root / "whole")
    killed = launch(TORCHRUN, PROBE, root / "killed", root / "probe", "2")
    resumed = launch(ACCELERATE, TRAIN, root / "killed")
    return {"root": root, "whole": whole, "killed": killed, "resumed": resumed}


def test_the_torchrun_smoke_run_finishes_and_writes_each_run_file_once(runs):
    """torchrun -m atr_grpo.train on 2 processes: one line per step in metrics.jsonl, one evaluation per scheduled
    step (the other process waited for it), one DONE, and world_size 2 in env.json; each process its own log file."""
    result, run_dir = runs["whole"], runs["root"] / "whole"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert [row["step"] for row in metrics(run_dir)] == [1, 2, 3, 4]
    summary = records(rundir.summary_path(run_dir))
    assert [(row["step"], row["benchmark"]) for row in summary] == [
        (0, "arithmetic"),
        (2, "arithmetic"),
        (4, "arithmetic"),
    ]
    outcome = f"{run_dir}: training finished; 3 of 3 scheduled evaluations done"
    assert result.stdout.splitlines().count(outcome) == 1, "the main process alone reports the outcome"
    done = json.loads((run_dir / rundir.DONE_FILE).read_text())
    assert done["step"] == 4 and done["world_size"] == 2
    assert json.loads((run_dir / rundir.ENV_FILE).read_text())["world_size"] == 2
    assert (run_dir / "final_adapter" / "adapter_model.safetensors").exists()
    checkpoint = run_dir / rundir.CHECKPOINT_DIR / "checkpoint-2"
    assert (checkpoint / "rng_state_0.pth").exists() and (checkpoint / "rng_state_1.pth").exists()
    assert (run_dir / "train.log").exists() and (run_dir / "train.rank1.log").exists()


def test_the_processes_hold_identical_weights_after_every_step(runs):
    """DDP: after each optimizer step both processes hold bit-identical trainable weights, and the weights moved."""
    probe = runs["root"] / "probe"
    per_rank = [records(probe / f"rank{rank}" / "weights.jsonl") for rank in (0, 1)]
    assert [row["step"] for row in per_rank[0]] == [0, 1, 2]
    assert per_rank[0] == per_rank[1]
    digests = [row["digest"] for row in per_rank[0]]
    assert len(set(digests)) == 3, "every step changed the weights"


def test_pooled_rule_metrics_equal_those_of_the_concatenated_batch(runs):
    """clip/*, ratio/* and kl/* in metrics.jsonl are those of the rule on both processes' micro-batches together
    (sums and counts all-reduced, min and max reduced), not rank 0's shard."""
    probe, run_dir = runs["root"] / "probe", runs["root"] / "killed"
    logged = {row["step"]: row for row in metrics(run_dir)}
    rule = build_rule("clip", eps=0.05)

    def rule_metrics_of(parts):
        width = max(part["logp"].shape[1] for part in parts)
        padded = {
            key: torch.cat([torch.nn.functional.pad(part[key], (0, width - part[key].shape[1])) for part in parts])
            for key in parts[0]
        }
        batch = make_batch(padded["logp"], padded["old_logp"], padded["advantages"], padded["mask"])
        return rule_metrics(batch, rule.terms(batch))

    for step in (1, 2):
        shards = [
            [torch.load(path) for path in sorted((probe / f"rank{rank}").glob(f"batch_{step}_*.pt"))] for rank in (0, 1)
        ]
        assert all(len(shard) == 1 for shard in shards), "1 micro-batch per process: GA 2 split over 2 processes"
        pooled = rule_metrics_of(shards[0] + shards[1])
        for key, value in pooled.items():
            assert logged[step][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, key)
    alone = rule_metrics_of(shards[0])  # step 2 is off-policy: rank 0's shard alone gives other values
    assert logged[2]["clip/frac"] > 0
    assert any(alone[key] != pytest.approx(logged[2][key], rel=1e-5) for key in ("clip/frac", "ratio/mean"))


def test_every_process_logs_the_same_metrics(runs):
    """TRL's metrics (reward, lengths, loss, grad norm) and ours are global: both processes log the same values."""
    probe = runs["root"] / "probe"
    rank0, rank1 = (records(probe / f"rank{rank}" / "logs.jsonl") for rank in (0, 1))
    assert [row["step"] for row in rank0] == [1, 2] and len(rank1) == 2
    for a, b in zip(rank0, rank1):
        assert {k: v for k, v in a.items() if k not in TIMINGS} == {k: v for k, v in b.items() if k not in TIMINGS}
    assert {"reward", "loss", "grad_norm", "clip/frac", "entropy"} <= set(rank0[0])


def test_the_sft_adapter_is_built_once_while_the_other_process_waits(runs):
    """Inside the process group, both processes ask for a fresh SFT adapter: it is trained once, in a stage process
    that does not join the group (no deadlock), and both get the same adapter."""
    probe = runs["root"] / "probe"
    paths = {json.loads((probe / f"rank{rank}" / "sft.json").read_text())["path"] for rank in (0, 1)}
    (path,) = paths
    cache = probe / "sft"
    built = sorted(p.name for p in cache.iterdir() if p.is_dir())
    assert built == [os.path.basename(path)], "one adapter, no staging folder left"
    assert json.loads((cache / built[0] / "sft_info.json").read_text())["examples"] == 64


def test_the_other_processes_wait_for_an_sft_stage_longer_than_ddp_timeout(tmp_path):
    """The first process's SFT stage (a download and 2 epochs of an 8B model) can outlast trainer.ddp_timeout, which
    bounds the group's collectives: the others wait for it in a group of their own, so a stage of 10 s under a
    5 s ddp_timeout still gives both processes the adapter (waiting in the run's group, they timed out)."""
    program = [str(REPO / "tests" / "helpers" / "distributed_sft_wait.py"), str(tmp_path), "5", "10"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([*TORCHRUN, *program], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    paths = {json.loads((tmp_path / f"rank{rank}.json").read_text())["path"] for rank in (0, 1)}
    (path,) = paths
    assert (tmp_path / "sft" / os.path.basename(path) / "adapter_config.json").exists()


def test_kill_and_resume_under_accelerate_launch_matches_the_uninterrupted_run(runs):
    """Stopped after checkpoint 2 and re-launched with accelerate's CPU config, the 2-process run ends with the
    metrics of the uninterrupted one; evaluations of steps 0 and 2 are not repeated."""
    killed, resumed = runs["killed"], runs["resumed"]
    assert killed.returncode != 0 and "Preempted" in killed.stderr
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    run_dir = runs["root"] / "killed"
    whole, again = metrics(runs["root"] / "whole"), metrics(run_dir)
    assert [row["step"] for row in again] == [1, 2, 3, 4]
    for a, b in zip(whole, again):
        assert set(a) == set(b)
        for key in set(a) - {"step", *TIMINGS}:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
    assert [row["step"] for row in records(rundir.summary_path(run_dir))] == [0, 2, 4]
    env = json.loads((run_dir / rundir.ENV_FILE).read_text())
    assert env["world_size"] == 2 and [launch["world_size"] for launch in env["resumes"]] == [2]
