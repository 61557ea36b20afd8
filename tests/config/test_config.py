"""Good configs resolve to the paper's values, the registries decide the allowed names, and `--cfg job --resolve`
prints a run's values without loading anything. The values and keys a config refuses are in
tests/refusals/test_config_values.py."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, compose, train_config

from atr_grpo.benchmarks import BENCHMARKS, BenchmarkSpec
from atr_grpo.clipping import RULES, rule_defaults
from atr_grpo.clipping.adaptive_delta import DELTA_CONTROL_DEFAULTS
from atr_grpo.config_hydra import to_object
from atr_grpo.data.arithmetic import DEFAULT_TASK
from atr_grpo.errors import ConfigError
from atr_grpo.losses import AGGREGATIONS, KL_ESTIMATORS


def test_the_allowed_names_are_the_registries():
    """Aggregations, KL estimators and benchmarks are whatever their registries hold, with no list in config.py:
    each registered choice composes, and a benchmark registered at run time is accepted once it exists."""
    for agg in AGGREGATIONS:
        assert train_config([f"trainer.loss_agg={agg}"]).trainer.loss_agg == agg
    for estimator in KL_ESTIMATORS:
        assert train_config([f"trainer.kl_estimator={estimator}"]).trainer.kl_estimator == estimator
    with pytest.raises(ConfigError, match="eval.benchmarks"):
        train_config(["eval.benchmarks=[toy]"])
    spec = BenchmarkSpec(name="toy", loader=lambda: [{"id": 0, "problem": "1 + 1?", "answer": "2"}])
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(BENCHMARKS, "toy", spec)
        assert train_config(["eval.benchmarks=[toy,amc23]"]).eval.benchmarks == ["toy", "amc23"]


def test_data_and_sft_names_are_labels_and_the_source_decides(tmp_path):
    """A new dataset needs a YAML file, not a config.py edit: `name` is free, `source` picks the loader."""
    path = tmp_path / "my.parquet"
    path.write_bytes(b"")  # a local file must exist when the config is validated
    cfg = train_config(["data.name=my_math", "data.source=file", f"data.path={path}", "sft.name=my_sft"])
    assert (cfg.data.name, cfg.data.source, cfg.data.path) == ("my_math", "file", str(path))
    assert (cfg.sft.name, cfg.sft.source, cfg.sft.enabled) == ("my_sft", "hub", True)
    assert not train_config(["sft=none"]).sft.enabled
    demo = train_config(["experiment=demo"])
    assert (demo.data.source, demo.sft.source, demo.sft.enabled) == ("arithmetic", "arithmetic", True)


def test_the_arithmetic_benchmark_is_known_without_a_training_run():
    """`arithmetic` is in the benchmark registry from the start, with the task of conf/data/arithmetic.yaml, so the
    evaluate app accepts `eval=arithmetic` and loads the demo's held-out problems."""
    data = train_config(["data=arithmetic"]).data
    task = {k: getattr(data, k) for k in ("num_train", "num_eval", "max_operand", "operations")}
    assert {**task, "seed": data.generator_seed} == DEFAULT_TASK
    cfg = to_object(compose(["model=tiny", "eval=arithmetic", "out_dir=x"], config_name="evaluate"))
    assert cfg.eval.benchmarks == ["arithmetic"]


def test_a_config_pickles_and_reads_as_its_dataclasses():
    """Composed configs and their dataclasses (the generated clipping schemas too) survive pickle unchanged,
    e.g. for a launcher that ships them to another process."""
    for overrides in ([], ["experiment=smoke", "clipping=clip_higher"]):
        cfg = compose(overrides)
        assert pickle.loads(pickle.dumps(cfg)) == cfg
        obj = train_config(overrides)
        again = pickle.loads(pickle.dumps(obj))
        assert again == obj and type(again.clipping) is type(obj.clipping)
    assert repr(train_config().trainer).startswith("TrainerConfig(backend='auto'")


def test_a_kept_composition_is_the_callers_own_copy_and_follows_the_files(tmp_path, monkeypatch):
    """Composing keeps each result per process: a caller's change to its config never reaches the next caller, an
    error is raised every time, and an edited file under conf/ is composed anew."""
    import shutil

    from atr_grpo import hydra_app

    first = compose(["experiment=smoke"])
    first.trainer.learning_rate = 123.0
    assert compose(["experiment=smoke"]).trainer.learning_rate != 123.0
    for _ in range(2):
        with pytest.raises(ConfigError, match="trainer.lr"):
            compose(["experiment=smoke", "trainer.lr=1"])
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    monkeypatch.setattr(hydra_app, "CONF_DIR", conf)
    assert compose(["experiment=smoke"]).seed == 0
    smoke = conf / "experiment" / "smoke.yaml"
    smoke.write_text(smoke.read_text() + "seed: 7\n")
    assert compose(["experiment=smoke"]).seed == 7


@pytest.mark.parametrize("value,expected", [("false", False), ("true", True), ("null", None)])
def test_bf16_and_checkpointing_take_booleans_from_the_command_line(value, expected):
    """`trainer.bf16=false` arrives as a bool and is kept as one; null means "decide from the device"."""
    cfg = train_config([f"trainer.bf16={value}", f"trainer.gradient_checkpointing={value}"])
    assert cfg.trainer.bf16 is expected and cfg.trainer.gradient_checkpointing is expected
    assert train_config().trainer.bf16 is None and train_config(["experiment=demo"]).trainer.bf16 is False
    with pytest.raises(ConfigError, match="trainer.bf16"):
        train_config(["trainer.bf16=maybe"])


def test_trl_arguments_follow_the_bf16_and_checkpointing_flags():
    """An explicit true/false reaches TRL's arguments; null is the device's choice (off on a CPU)."""
    from atr_grpo.training.rule_trainer import grpo_arg_values

    for value in (True, False):
        cfg = train_config(["experiment=smoke", f"trainer.bf16={value}", f"trainer.gradient_checkpointing={value}"])
        args = grpo_arg_values(cfg, REPO / "results" / "unused", "hf")
        assert (args["bf16"], args["gradient_checkpointing"]) == (value, value)
    args = grpo_arg_values(train_config(["experiment=smoke", "trainer.bf16=null"]), REPO / "results" / "unused", "hf")
    assert args["bf16"] is False


def test_the_default_run_is_the_papers_protocol():
    """Table 4 / §6: the values a plain `python -m atr_grpo.train` uses."""
    cfg = train_config()
    assert (cfg.model.name, cfg.model.path) == ("qwen3-1.7b", "Qwen/Qwen3-1.7B")
    assert (cfg.model.lora.r, cfg.model.lora.alpha, cfg.model.lora.dropout) == (32, 64, 0.0)
    assert cfg.model.max_seq_length == 2048
    assert (cfg.clipping.name, cfg.clipping.delta) == ("atr", 0.07)
    tr = cfg.trainer
    assert (tr.learning_rate, tr.weight_decay, tr.max_steps, tr.beta) == (5e-6, 1e-3, 1000, 0.0)
    assert (tr.per_device_train_batch_size, tr.gradient_accumulation_steps, tr.num_generations) == (8, 4, 8)
    assert (tr.temperature, tr.top_p, tr.top_k) == (1.0, 1.0, -1)
    assert (tr.loss_agg, tr.scale_rewards) == ("dr_grpo", "none")
    assert cfg.optimizer_steps_per_rollout == 2  # rollout=reuse2: the rule can act
    ev = cfg.eval
    assert (ev.every_steps, ev.k, ev.n, ev.temperature, ev.top_p, ev.max_tokens) == (50, 8, 8, 0.3, 0.95, 32768)
    assert ev.benchmarks == ["amc23", "aime24", "aime25"]
    assert cfg.run_name == "default__atr__s0" and cfg.run_dir == "results/runs/default/default__atr__s0"


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_rule_file_composes_with_the_source_defaults(name):
    cfg = train_config([f"clipping={name}"])
    assert cfg.clipping.name == name
    assert cfg.clipping.params() == rule_defaults(name)
    assert cfg.method == name  # default parameters: the label is the bare rule name


def test_method_labels_name_non_default_parameters():
    assert train_config(["clipping=clip", "clipping.eps=0.3"]).method == "clip-eps0.3"
    cfg = train_config(["clipping=clip_higher", "clipping.eps_low=0.329", "clipping.eps_high=0.6", "seed=2"])
    assert cfg.run_name == "default__clip_higher-eps_low0.329-eps_high0.6__s2"


def test_cfg_job_resolve_prints_the_contract_keys_without_loading_a_model():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "atr_grpo.train",
            "experiment=smoke",
            "clipping.delta=0.05",
            "--cfg",
            "job",
            "--resolve",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    printed = yaml.safe_load(done.stdout)
    assert printed["clipping"] == {"name": "atr", "delta": 0.05, "semantics": "min", **DELTA_CONTROL_DEFAULTS}
    assert printed["run_dir"] == "results/runs/smoke/smoke__atr-delta0.05__s0"
    for key in ("lora", "max_seq_length"):
        assert key in printed["model"]
    for key in ("learning_rate", "num_generations", "max_steps", "beta", "loss_agg"):
        assert key in printed["trainer"]
    assert printed["rollout"]["steps_per_generation"] == 4
    assert not (REPO / printed["run_dir"]).exists()
