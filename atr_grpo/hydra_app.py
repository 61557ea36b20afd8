"""What the Hydra entry points share: composing a config from overrides, and reporting bad config input.

`compose_train(overrides)` is the config `python -m atr_grpo.train <overrides>` runs with, for code that
composes without the command line (tests, the demo, the launcher, the benchmarks). Composing is a pure function of
the files under conf/, the registered schemas, the working directory and the overrides, and Hydra takes about 0.2 s
for it: a process keeps each result under those inputs (the files by size and modification time) and hands out
copies, so a launcher that validates a plan's runs and then names their directories composes each run once.

`run_app(main)` runs a `@hydra.main` function so that bad config input (a misspelled key, a wrong type, a missing
config file, a value the schema refuses) ends the process with a message and exit status 2 instead of a
traceback. A misspelled key is reported with the keys its section allows, read from the schema's dataclass fields.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from atr_grpo.config import unknown_key_message
from atr_grpo.config_hydra import CONF_DIR, register_configs
from atr_grpo.errors import ConfigError

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
    """The composed, unresolved DictConfig of `conf/<config_name>.yaml` with `overrides` (the caller's own copy).

    Raises ConfigError (with `describe_config_error`'s message) for input Hydra or the schema refuses.
    """
    inputs = (_conf_files_stamp(), os.getcwd())
    return copy.deepcopy(_composed(config_name, tuple(overrides), return_hydra_config, inputs))


def _conf_files_stamp() -> tuple[tuple[str, int, int], ...]:
    """Every file under conf/ with its size and modification time: a composed config is kept until one changes."""
    stats = ((str(path), path.stat()) for path in CONF_DIR.rglob("*.yaml"))
    return tuple(sorted((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats))


@functools.lru_cache(maxsize=256)
def _composed(config_name: str, overrides: tuple[str, ...], return_hydra_config: bool, inputs: tuple) -> DictConfig:
    """Hydra's composition, kept per `inputs` (the conf/ files, the working directory; the registered schemas are
    fixed once the rules are imported); an error is raised again on every call, never kept."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(describe_config_error(err)) from err


def compose_train(overrides: Iterable[str] = ()) -> DictConfig:
    """What `python -m atr_grpo.train <overrides>` composes (run it through `config_hydra.to_object` to validate)."""
    return compose("train", overrides)


def sweep_jobs(overrides: Iterable[str]) -> list[list[str]]:
    """The overrides of every job of a `-m` sweep, in the order Hydra's basic sweeper runs them (a command line
    that sweeps nothing is one job with its overrides as written)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = list(overrides)
    parsed = OverridesParser.create().parse_overrides(overrides)
    if not any(override.is_sweep_override() for override in parsed):
        return [overrides]
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def check_sweep(config_name: str, overrides: Iterable[str], check: Callable[[Any], None] | None = None) -> int:
    """Compose and validate every job of a sweep (Hydra's own `hydra...` overrides aside), and `check` each job's
    config object, so that a bad value is refused before the first job starts; returns the number of jobs."""
    from atr_grpo.config_hydra import PLAN_KEY, to_object

    overrides = list(overrides)
    for override in overrides:  # the schema drops an experiment's plan: set for one run, it would do nothing
        if override.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == PLAN_KEY:
            raise ConfigError(
                f"{override!r}: {PLAN_KEY} is an experiment's list of runs, read by `python -m atr_grpo.launch "
                "<experiment>`, not a setting of one run; edit it in conf/experiment/<experiment>.yaml"
            )
    try:
        jobs = sweep_jobs(o for o in overrides if not o.lstrip("+~").startswith("hydra"))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(describe_config_error(err)) from err
    for number, job in enumerate(jobs, 1):
        try:
            job_cfg = to_object(compose(config_name, job))
            if check is not None:
                check(job_cfg)
        except ConfigError as err:
            where = f"sweep job {number} of {len(jobs)} ({' '.join(job)})" if len(jobs) > 1 else "the job"
            raise ConfigError(f"{err} (in {where}; no job of the sweep was started)") from None
    return len(jobs)


def run_app(
    hydra_main: Callable[[], Any], config_name: str | None = None, check: Callable[[Any], None] | None = None
) -> int:
    """Run a `@hydra.main` function; bad config input prints its message and returns exit status 2.

    With `config_name`, the config of the run, or of every job of a multirun (`-m`), is composed, validated and
    given to `check` before Hydra starts: a refused run writes nothing (not even the log file Hydra creates in
    its output folder), and a sweep with one bad job starts none."""
    from hydra._internal.utils import get_args_parser

    # Hydra reports composition errors itself and exits with 1; with this set it raises them to us instead
    # (other errors still end with their full traceback).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        args = get_args_parser().parse_known_args(sys.argv[1:])[0]
        informational = args.help or args.hydra_help or args.cfg or args.info or args.shell_completion
        if config_name is not None and not informational:
            check_sweep(config_name, args.overrides, check)
        hydra_main()
    except CONFIG_ERRORS as err:
        print(describe_config_error(err), file=sys.stderr)
        return 2
    return 0
