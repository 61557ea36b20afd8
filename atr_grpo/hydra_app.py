"""What the Hydra entry points share: composing a config from overrides, and reporting bad config input.

`compose_train(overrides)` is the config `python -m atr_grpo.train <overrides>` runs with, for code that
composes without the command line (tests, the demo, the launcher, the benchmarks). `run_app(main)` runs a
`@hydra.main` function so that bad config input (a misspelled key, a wrong type, a missing config file, a
value the schema refuses) ends the process with a message and exit status 2 instead of a traceback. A
misspelled key is reported with the keys its section allows, read from the schema's dataclass fields.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from atr_grpo.config import ConfigError, register_configs, unknown_key_message

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_ERRORS = (ConfigError, HydraException, OmegaConfBaseException)


def _chain(error: BaseException) -> list[BaseException]:
    """The exception and everything it was raised from (Hydra wraps OmegaConf's errors)."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def describe_config_error(error: BaseException) -> str:
    """One message for any bad-config exception; an unknown key comes with the keys its section allows."""
    chain = _chain(error)
    for cause in chain:
        schema = getattr(cause, "object_type", None)
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and dataclasses.is_dataclass(schema):
            return unknown_key_message(str(cause.full_key), schema)
    if isinstance(error, ConfigError):
        return str(error)
    # Hydra's own summary plus OmegaConf's cause (the offending key, value and type), as Hydra prints them
    messages = [str(cause) for cause in chain[:2] if isinstance(cause, (HydraException, OmegaConfBaseException))]
    return "invalid config: " + "\n".join(messages or [str(error)])


def compose(config_name: str, overrides: Iterable[str] = (), return_hydra_config: bool = False) -> DictConfig:
    """The composed, unresolved DictConfig of `conf/<config_name>.yaml` with `overrides`.

    Raises ConfigError (with `describe_config_error`'s message) for input Hydra or the schema refuses.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(describe_config_error(err)) from err


def compose_train(overrides: Iterable[str] = ()) -> DictConfig:
    """What `python -m atr_grpo.train <overrides>` composes (run it through `config.to_object` to validate)."""
    return compose("train", overrides)


def run_app(hydra_main: Callable[[], Any]) -> int:
    """Run a `@hydra.main` function; bad config input prints its message and returns exit status 2."""
    # Hydra reports composition errors itself and exits with 1; with this set it raises them to us instead
    # (other errors still end with their full traceback).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra_main()
    except CONFIG_ERRORS as err:
        print(describe_config_error(err), file=sys.stderr)
        return 2
    return 0
