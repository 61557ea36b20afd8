"""The example launcher (`examples/verl/run_atr_qwen3.sh`) composes in verl's config and trains ATR with its δ.

It is not run on GPUs here: the test takes the command it would run (DRY_RUN=1), composes its overrides with
verl's `ppo_trainer` config and builds the actor and algorithm configs verl would build.
"""

import os
import shlex
import subprocess

import pytest

from atr_grpo.integrations import verl as plugin

pytest.importorskip("verl", reason="needs verl: run make test-verl")

LAUNCHER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples/verl/run_atr_qwen3.sh")
DATA = {"TRAIN_FILES": "/data/dapo-math-17k.parquet", "VAL_FILES": "/data/aime-2024.parquet"}


def launcher_command(*args, **env):
    """The argv the launcher would exec, for the given environment and extra arguments."""
    result = subprocess.run(
        ["bash", LAUNCHER, *args],
        env={**os.environ, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return shlex.split(result.stdout)


def overrides_of(argv):
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    return argv[3:]


def test_launcher_runs_atr_with_the_delta_override(compose, actor_from):
    """DELTA reaches ATR's δ through verl's config; the paper's Dr.GRPO settings come with it."""
    from verl.utils.config import omega_conf_to_dataclass

    overrides = overrides_of(launcher_command(**DATA, DELTA="0.05"))
    actor = actor_from(overrides)
    assert actor.policy_loss.loss_mode == "atr_grpo.atr" and actor.policy_loss.delta == 0.05
    rule = plugin.rule_from_config(actor.policy_loss.loss_mode, actor.policy_loss)
    assert plugin.check_aggregation(rule, actor.loss_agg_mode, actor.loss_scale_factor) == "dr_grpo"
    assert actor.loss_scale_factor == 1536 and not actor.use_kl_loss
    config = compose(overrides)
    algorithm = omega_conf_to_dataclass(config.algorithm)
    assert algorithm.adv_estimator == "grpo" and algorithm.norm_adv_by_std_in_grpo is False
    assert config.actor_rollout_ref.rollout.n == 8 and config.actor_rollout_ref.model.path == "Qwen/Qwen3-1.7B"
    assert config.data.train_files == DATA["TRAIN_FILES"]


def test_launcher_default_delta_is_the_papers_and_extra_overrides_are_passed_on(actor_from):
    argv = launcher_command("actor_rollout_ref.model.path=Qwen/Qwen3-8B", **DATA)
    assert argv[-1] == "actor_rollout_ref.model.path=Qwen/Qwen3-8B"
    assert actor_from(overrides_of(argv)).policy_loss.delta == 0.07


def test_launcher_refuses_to_start_without_data_files():
    result = subprocess.run(
        ["bash", LAUNCHER], env={**os.environ, "DRY_RUN": "1"}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "set TRAIN_FILES" in result.stderr
