"""The `study` key: it defaults to the experiment, is recorded in config.yaml, and a run saved before the key
existed still continues (its study was its experiment)."""

from __future__ import annotations

from conftest import compose, train_config
from omegaconf import OmegaConf

from atr_grpo import rundir


def test_the_study_defaults_to_the_experiment_and_can_be_named():
    assert train_config(["experiment=smoke"]).study == "smoke"
    assert train_config(["experiment=smoke", "study=lr_sweep"]).study == "lr_sweep"


def test_the_saved_config_records_the_study():
    saved = OmegaConf.to_container(compose(["experiment=smoke", "study=lr_sweep"]), resolve=True)
    assert (saved["experiment"], saved["study"]) == ("smoke", "lr_sweep")


def test_a_run_saved_before_the_study_key_continues_under_its_experiment():
    current = OmegaConf.to_container(compose(["experiment=smoke"]), resolve=True)
    saved = {k: v for k, v in current.items() if k != "study"}
    assert rundir.config_differences(saved, current) == []
    renamed = {**current, "study": "other"}
    assert rundir.config_differences(saved, renamed) == ["study"]


def test_settings_that_say_where_or_how_fast_do_not_define_the_method():
    config = OmegaConf.to_container(compose(["experiment=smoke"]), resolve=True)
    moved = OmegaConf.to_container(
        compose(["experiment=smoke", "run_dir=elsewhere", "trainer.num_threads=7", "eval.batch_size=3", "seed=4"]),
        resolve=True,
    )
    assert rundir.method_settings(config) == rundir.method_settings(moved)
    faster = OmegaConf.to_container(compose(["experiment=smoke", "trainer.learning_rate=1e-3"]), resolve=True)
    assert rundir.method_settings(faster)["trainer.learning_rate"] == 1e-3 != config["trainer"]["learning_rate"]
