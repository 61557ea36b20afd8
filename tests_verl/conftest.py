"""Tests that need verl: run them with `make test-verl` (.venv-verl). Each module skips without verl."""

import os

import pytest

from atr_grpo.integrations import verl as plugin


@pytest.fixture(scope="session")
def compose():
    """Compose verl's own `ppo_trainer` Hydra config with command-line style overrides."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")

    def composed(overrides):
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return hydra_compose("ppo_trainer", overrides=list(overrides))

    return composed


@pytest.fixture(scope="session")
def actor_from(compose):
    """The actor config object verl builds from `actor_rollout_ref.actor` (as its driver and workers do)."""
    from verl.utils.config import omega_conf_to_dataclass

    def actor(overrides):
        return omega_conf_to_dataclass(compose(overrides).actor_rollout_ref.actor)

    return actor


@pytest.fixture(autouse=True)
def fresh_key_streams():
    """Every test starts the plugin's random streams from their seeds, as a fresh worker process would."""
    plugin.reset_key_generators()
    yield
