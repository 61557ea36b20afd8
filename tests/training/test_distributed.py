"""A run on N processes, piece by piece: the global batch split, the refusals, the stage processes' environment, the
gradient law behind the split, and the helpers through which the processes agree (on a real 2-process gloo group).
The launched runs themselves are in test_distributed_runs.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import compose, train_config
from omegaconf import OmegaConf

from atr_grpo import distributed, rundir
from atr_grpo.clipping import build_rule
from atr_grpo.config_hydra import to_object
from atr_grpo.errors import ConfigError
from atr_grpo.losses import AGGREGATIONS, LossSettings, grpo_loss
from atr_grpo.machine import Machine, decide
from atr_grpo.numeric_paths import KERNEL_VARIABLES
from atr_grpo.training import pipeline, stage_process
from atr_grpo.training.rule_trainer import grpo_arg_values

LAUNCHED = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29511",
    "TORCHELASTIC_RUN_ID": "x",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "ACCELERATE_USE_DEEPSPEED": "true",
    "ACCELERATE_MIXED_PRECISION": "bf16",
}


def launched_as(monkeypatch, processes: int, rank: int = 0) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(processes))
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_the_global_batch_is_the_configs_on_any_number_of_processes(monkeypatch, processes):
    """Table 4 with rollout=reuse2 (batch 8, GA 4, 8 micro-batches per generation): on N processes each accumulates
    4/N micro-batches and takes 8/N from each generation, so an optimizer step still sees 32 completions and a
    generation batch holds 64, as on one GPU."""
    launched_as(monkeypatch, processes)
    cfg = train_config([])
    args = grpo_arg_values(cfg, "unused", "hf")
    assert processes * args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] == 32
    assert processes * args["per_device_train_batch_size"] * args["steps_per_generation"] == 64
    assert args["ddp_timeout"] == cfg.trainer.ddp_timeout and args["ddp_find_unused_parameters"] is False


def test_a_batch_the_processes_cannot_share_is_refused_naming_the_keys():
    """8 processes and GA 4: refused, with a split of the same global batch that works; 3 processes: none exists."""
    with pytest.raises(ConfigError, match="trainer.gradient_accumulation_steps must be a multiple") as err:
        distributed.process_batch(8, 4, 8, 8)
    assert "trainer.per_device_train_batch_size=4 trainer.gradient_accumulation_steps=8" in str(err.value)
    with pytest.raises(ConfigError, match="no micro-batch size splits 32 over 3 processes"):
        distributed.process_batch(8, 4, 8, 3)


def test_a_launch_on_several_processes_refuses_what_it_cannot_run(monkeypatch):
    """Unsloth trains on one GPU; a ZeRO-3 model cannot be evaluated by the main process alone; auto picks TRL."""
    launched_as(monkeypatch, 2)
    gpus = Machine(cuda=True, unsloth=True, vllm=True, processes=2)
    with pytest.raises(ConfigError, match="trainer.backend='unsloth' trains on one GPU; on 2 processes"):
        decide(train_config(["trainer.backend=unsloth"]), gpus)
    assert decide(train_config(["trainer.backend=auto"]), gpus).training_backend == "trl"
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    with pytest.raises(ConfigError, match="eval.when='during'.*ZeRO-3"):
        pipeline.check_processes(train_config(["experiment=smoke"]))  # (the smoke run evaluates during training)
    pipeline.check_processes(train_config(["experiment=smoke", "eval.when=after"]))
    launched_as(monkeypatch, 4)
    with pytest.raises(ConfigError, match="trainer.gradient_accumulation_steps"):
        pipeline.check_processes(train_config(["experiment=smoke"]))  # GA 2 on 4 processes


def test_a_stage_process_is_never_a_member_of_the_launchers_group(monkeypatch):
    """The SFT and evaluation stages are started without RANK, WORLD_SIZE, MASTER_PORT, torchrun's and accelerate's
    variables (inherited, the SFT stage joined the group's rendezvous and every process waited forever)."""
    for key, value in LAUNCHED.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    started = {}
    monkeypatch.setattr(stage_process.subprocess, "run", lambda command, env: started.update(env) or _Done())
    stage_process.run_stage("sft", Path("/nowhere"))
    assert not set(LAUNCHED) & set(started)
    assert started["CUDA_VISIBLE_DEVICES"] == "5" and started["PATH"] == os.environ["PATH"]  # LOCAL_RANK 1's GPU
    assert started["PYTHONUNBUFFERED"] == "1"


@pytest.mark.parametrize(
    ("visible", "launcher", "seen"),
    [
        ("1,2,3,4", {"LOCAL_RANK": "0", "WORLD_SIZE": "4"}, "1"),  # docs/scaling.md's recipe: process 0's GPU
        ("1,2,3,4", {"LOCAL_RANK": "2", "WORLD_SIZE": "4"}, "3"),
        ("0,1", {}, "0"),  # one process on a 2-GPU machine: the first visible GPU
        ("GPU-aa11, GPU-bb22", {}, "GPU-aa11"),  # UUIDs, as nvidia-smi names them
        (None, {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, "1"),  # nothing set: every GPU of the machine, from 0
        (None, {}, "0"),
        ("", {}, ""),  # no GPU visible stays so
    ],
)
def test_a_stage_process_sees_exactly_one_gpu_when_several_are_visible(visible, launcher, seen):
    """TRL's SFTTrainer (and GRPOTrainer) refuse a process that sees more than one GPU outside a process group
    (n_gpu > 1), so a stage process is given the one GPU it uses: its caller's own, or the first visible one."""
    environ = {"PATH": "/bin", **launcher, **({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})}
    env = distributed.stage_environment(environ)
    assert env["CUDA_VISIBLE_DEVICES"] == seen
    assert len([device for device in seen.split(",") if device]) == (1 if seen else 0)
    assert env["PATH"] == "/bin" and not set(launcher) & set(env)


def test_a_stage_process_starts_a_wandb_service_of_its_own():
    """wandb records its service's address in WANDB_SERVICE once a process has started one: a stage that inherited
    it would open its W&B run in the parent's service, where a crashed client's stream of the same run id lingers
    and the resumed run is refused ("run ID ... is in use")."""
    environ = {"PATH": "/bin", "WANDB_SERVICE": "3-4242-unix-/tmp/wandb-service.sock", "WANDB_MODE": "offline"}
    env = distributed.stage_environment(environ)
    assert "WANDB_SERVICE" not in env and env["WANDB_MODE"] == "offline" and env["PATH"] == "/bin"


def test_a_stage_process_of_a_rank_without_a_visible_gpu_is_refused():
    with pytest.raises(RuntimeError, match="LOCAL_RANK=2 but CUDA_VISIBLE_DEVICES='0,1' shows 2 GPU"):
        distributed.stage_environment({"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "2", "WORLD_SIZE": "3"})


class _Done:
    returncode = 0


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_n_processes_accumulating_ga_over_n_take_the_one_process_step(mode):
    """DDP averages the processes' gradients; with each process's loss divided by its own GA/N (what TRL's
    accumulation does with the split batch), 2 processes × 2 micro-batches give the gradient of 1 process × 4."""
    rule, settings = build_rule("clip", eps=0.2), LossSettings(loss_agg=mode, max_completion_length=7)
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(4, 3, 7, generator=g) * 2).requires_grad_()
    old_logp = logp.detach() + 0.3 * torch.randn(4, 3, 7, generator=g)
    advantages = torch.randn(4, 3, generator=g)
    mask = torch.rand(4, 3, 7, generator=g) > 0.3

    def accumulated(micro_batches, accumulation):
        total = sum(
            grpo_loss(
                rule, logp[i], old_logp[i], advantages[i], mask[i], settings, gradient_accumulation_steps=accumulation
            ).loss
            for i in micro_batches
        )
        return torch.autograd.grad(total, logp)[0]

    one_process = accumulated(range(4), 4)
    two_processes = (accumulated([0, 1], 2) + accumulated([2, 3], 2)) / 2
    assert torch.allclose(one_process, two_processes, atol=1e-7)
    assert one_process.abs().sum() > 0


def test_env_json_records_the_number_of_processes_and_a_changed_one_is_pointed_out(monkeypatch, tmp_path, caplog):
    """env.json has world_size; a run continued on another number of processes says its random streams change."""
    cfg = compose(["experiment=smoke", f"run_dir={tmp_path / 'run'}"])
    launched_as(monkeypatch, 2)
    pipeline.prepare_run_dir(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True), decide(to_object(cfg)))
    assert json.loads((tmp_path / "run" / rundir.ENV_FILE).read_text())["world_size"] == 2
    launched_as(monkeypatch, 1)
    pipeline.prepare_run_dir(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True), decide(to_object(cfg)))
    assert "started on 2 process(es) and continues on 1" in caplog.text
    env = json.loads((tmp_path / "run" / rundir.ENV_FILE).read_text())
    assert env["world_size"] == 2 and env["resumes"][0]["world_size"] == 1


def test_each_process_logs_to_its_own_file(monkeypatch):
    launched_as(monkeypatch, 2, rank=1)
    assert distributed.log_suffix() == ".rank1" and not distributed.is_main()
    launched_as(monkeypatch, 2, rank=0)
    assert distributed.log_suffix() == "" and distributed.is_main()


# ------------------------------------------------------------------------------ a real 2-process gloo group
def _agree(rank: int, port: int, folder: str) -> None:
    """One process of the group: what on_main and main_first let each process see."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    out, marker = Path(folder), Path(folder) / "built"
    seen: dict = {}

    def refuse():
        raise pipeline.RunDirError("refused on the main process")

    def build_once():
        if marker.exists():
            return "found"
        marker.write_text(str(rank))
        return "built"

    with distributed.process_group(timeout_seconds=60):
        seen["shared"] = distributed.on_main(lambda: {"value": 40 + distributed.rank()})
        try:
            distributed.on_main(refuse)
        except pipeline.RunDirError as err:
            seen["error"] = str(err)
        seen["first"] = distributed.main_first(build_once)
        try:
            distributed.main_first(lambda: 1 / 0)
        except (ZeroDivisionError, distributed.ProcessFailed) as err:
            seen["failure"] = type(err).__name__ + ": " + str(err)
    seen["after"] = torch.distributed.is_initialized()
    (out / f"rank{rank}.json").write_text(json.dumps(seen))


@pytest.mark.slow  # starts 2 Python processes
def test_processes_agree_through_the_main_one(tmp_path):
    """on_main: the main process's result, or its exception, reaches every process. main_first: the first process
    of the machine runs first (the other finds its work done), and a failure there stops both."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(_agree, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in (0, 1):
        assert seen[rank]["shared"] == {"value": 40}
        assert seen[rank]["error"] == "refused on the main process"
        assert seen[rank]["after"] is False
    assert (seen[0]["first"], seen[1]["first"]) == ("built", "found")
    assert seen[0]["failure"] == "ZeroDivisionError: division by zero"
    assert seen[1]["failure"] == "ProcessFailed: process 0 failed: ZeroDivisionError: division by zero"


def test_a_run_continued_on_another_numeric_path_is_pointed_out(monkeypatch, tmp_path, caplog):
    """A resume whose CPU kernels differ (ATEN_CPU_CAPABILITY, MKL_CBWR, ...) warns as a changed process count
    does; the same path says nothing."""
    cfg = compose(["experiment=smoke", f"run_dir={tmp_path / 'run'}"])
    for name in KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def prepare():
        pipeline.prepare_run_dir(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True), decide(to_object(cfg)))

    prepare()
    prepare()
    assert "numeric path" not in caplog.text
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    prepare()
    err = caplog.text
    assert "was started on the numeric path" in err and "'kernel_choice': {'MKL_CBWR': 'COMPATIBLE'}" in err, err
