"""One validation and one rule per process, one δ at the loss: the launching process trains the config object its
check validated, a GRPO stage validates its config.yaml once, and each trains with the rule that validation built;
the δ the trainer hands the loss starts from that rule's δ, not from a second copy."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import REPO, compose
from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.clipping import RULES
from atr_grpo.config_hydra import config_from_yaml, to_object
from atr_grpo.training import pipeline, stages, trl_backend
from atr_grpo.training.rule_trainer import delta_control


class Stop(Exception):
    """Raised where the trainer would be built: what came before is what this test checks."""


def count_builds(monkeypatch, rule_name: str) -> list[int]:
    """A counter of the instances of `rule_name`'s class made from now on."""
    rule_class, built = RULES[rule_name], [0]
    original = rule_class.__init__

    def counting_init(self, **values):
        built[0] += 1
        original(self, **values)

    monkeypatch.setattr(rule_class, "__init__", counting_init)
    return built


def test_a_grpo_stage_process_builds_its_rule_once_and_hands_its_delta_to_the_loss(tmp_path, monkeypatch):
    overrides = ["experiment=smoke", f"run_dir={tmp_path}", "sft=none", "clipping.delta=0.05"]
    composed = compose(overrides)
    to_object(composed)  # as `python -m atr_grpo.train` does before it writes config.yaml
    rundir.write_text(tmp_path / rundir.CONFIG_FILE, OmegaConf.to_yaml(composed, resolve=True))
    handed = {}

    def build_trainer(cfg, rule, adapter, run_dir, engine):
        handed.update(rule=rule, control=delta_control(cfg), same=rule is cfg.clipping.rule())
        raise Stop

    monkeypatch.setattr(trl_backend, "build_trl_trainer", build_trainer)
    monkeypatch.setattr(pipeline, "import_only_what_runs", lambda decision: None)  # this process trains again
    built = count_builds(monkeypatch, "atr")
    with pytest.raises(Stop):
        stages.run_here("grpo", tmp_path)
    assert built[0] == 1, "the stage built the rule more than once"
    assert handed["same"], "the trainer got another rule than the one the config validated"
    assert handed["control"].delta == handed["rule"].delta == 0.05


def test_a_validated_config_hands_out_the_rule_it_built(monkeypatch):
    built = count_builds(monkeypatch, "atr")
    cfg = to_object(compose(["experiment=smoke", "clipping.delta=0.05"]))
    assert cfg.clipping.rule() is cfg.clipping.rule() and built[0] == 1
    assert delta_control(cfg).delta == cfg.clipping.rule().delta == 0.05 and built[0] == 1


def test_a_config_changed_after_validation_is_validated_again():
    composed = compose(["experiment=smoke"])
    to_object(composed)
    cfg = config_from_yaml(OmegaConf.to_yaml(composed, resolve=True))
    cfg.clipping.delta = 0.02
    assert cfg.clipping.rule().delta == 0.02


def test_the_launching_process_validates_the_run_once_and_trains_the_object_it_checked(monkeypatch):
    """`run_app`'s check validates the run before Hydra starts it; the `@hydra.main` function then gets that same
    object for the config Hydra composed (no second validation, no second rule). A job no check saw is validated
    when it arrives."""
    from hydra.core.hydra_config import HydraConfig

    from atr_grpo import hydra_app

    overrides = ["experiment=smoke", "clipping.delta=0.05"]
    built = count_builds(monkeypatch, "atr")
    hydra_app.check_sweep("train", overrides, multirun=False)
    monkeypatch.setattr(HydraConfig.instance(), "cfg", compose(overrides, return_hydra_config=True))
    job = compose(overrides)
    cfg = hydra_app.checked_config("train", job)
    assert built[0] == 1 and cfg.clipping.rule().delta == 0.05 and "plan" not in job
    unchecked = ["experiment=smoke", "clipping.delta=0.04"]
    monkeypatch.setattr(HydraConfig.instance(), "cfg", compose(unchecked, return_hydra_config=True))
    assert hydra_app.checked_config("train", compose(unchecked)).clipping.delta == 0.04 and built[0] == 2


# `python -m atr_grpo.train ARGS` with every composition counted (Hydra's config loader composes every config: its
# own, a sweep job's and `hydra.compose`'s), the run's pipeline left out: what is counted happens before it.
COUNTED_TRAIN = """
import runpy, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
import atr_grpo.training.pipeline as pipeline

compositions, compose = [], ConfigLoaderImpl.load_configuration

def counted(self, *args, **kwargs):
    compositions.append(1)
    return compose(self, *args, **kwargs)

ConfigLoaderImpl.load_configuration = counted
pipeline.run_pipeline = lambda cfg, config_yaml: None
sys.argv = ["train", *sys.argv[1:]]
try:
    runpy.run_module("atr_grpo.train", run_name="__main__", alter_sys=True)
finally:
    print(f"compositions: {len(compositions)}", file=sys.stderr)
"""


def counted_train(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    """The finished process and the number of compositions it made."""
    result = subprocess.run(
        [sys.executable, "-c", COUNTED_TRAIN, *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    counts = re.findall(r"^compositions: (\d+)$", result.stderr, re.MULTILINE)
    assert counts, result.stderr[-2000:]
    return result, int(counts[-1])


@pytest.mark.slow
def test_a_run_composes_its_config_once_and_hydra_writes_its_log_file(tmp_path):
    """The launching process composes the run's config once: the check validates the composition Hydra's job runs
    with, and Hydra's run folder and log file come from it."""
    run_dir = tmp_path / "run"
    result, compositions = counted_train("experiment=smoke", "logger=none", f"run_dir={run_dir}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert compositions == 1
    assert (run_dir / "train.log").is_file()


@pytest.mark.slow
def test_cfg_job_composes_the_config_once():
    result, compositions = counted_train("experiment=smoke", "--cfg", "job")
    assert result.returncode == 0 and result.stdout.startswith("experiment: smoke\n"), result.stderr[-2000:]
    assert compositions == 1
