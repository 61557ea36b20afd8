"""What the Hydra entry points share: composing a config from overrides, and reporting bad config input.

`compose_train(overrides)` is the config `python -m atr_grpo.train <overrides>` runs with, for code that
composes without the command line (tests, the demo, the launcher, the benchmarks). Composing is a pure function of
the files under conf/, the registered schemas, the working directory and the overrides. A process keeps each result
under those inputs (the files by size and modification time) and hands out copies. So a launcher that validates a
plan's runs and then names their directories composes each run once.

`run_app(main)` runs a `@hydra.main` function so that bad config input (a misspelled key, a wrong type, a missing
config file, a value the schema refuses, a `--config-dir` that is not a folder) ends the process with a message and
exit status 2 instead of a traceback. A misspelled key is reported with the keys its section allows, read from the
schema's dataclass fields, and the file that sets it; a misspelled option (`clipping=atrr`) with the group's
options; each with the closest name when one is close (`errors.closest`). `--cfg` is validated as a run is. A
run, or `--cfg`, is composed once, with Hydra's own node, and that composition is validated before Hydra's job
runs on it (its run folder, log file and job logging); the `@hydra.main` function takes the object the check
validated (`checked_config`), so a run is composed and validated, and its rule built, once per process.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from atr_grpo.config import unknown_key_message
from atr_grpo.config_hydra import CONF_DIR, register_configs
from atr_grpo.errors import ConfigError, did_you_mean

CONFIG_ERRORS = (ConfigError, HydraException, OmegaConfBaseException)
# what `check_sweep` validated in this process: (config name, a job's overrides) → (its resolved YAML, its object)
_checked: dict[tuple[str, tuple[str, ...]], tuple[str, Any]] = {}


def _chain(error: BaseException) -> list[BaseException]:
    """The exception and everything it was raised from (Hydra wraps OmegaConf's errors)."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def describe_config_error(error: BaseException, dirs: Sequence[Path] = (CONF_DIR,), primary: str | None = None) -> str:
    """One message for any bad-config exception: an unknown key with the keys its section allows and the file
    that holds it, a missing option with the group's options, never Hydra's search path.

    dirs: the folders Hydra read config files from, in its order; primary: the config composed (`train`)."""
    if isinstance(error, ConfigError):  # described where it was raised
        return str(error)
    chain = _chain(error)
    source = _source_file(chain, dirs)
    for cause in chain:
        schema = getattr(cause, "object_type", None)
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and dataclasses.is_dataclass(schema):
            return unknown_key_message(str(cause.full_key), schema, source)
    missing = next((c for c in chain if isinstance(c, MissingConfigException) and c.options), None)
    if missing is not None:
        return _missing_option_message(missing, None if _source_name(chain) == primary else source)
    # Hydra's own summary plus OmegaConf's cause (the offending key, value and type), as Hydra prints them
    messages = [str(cause) for cause in chain[:2] if isinstance(cause, (HydraException, OmegaConfBaseException))]
    return "invalid config: " + _without_search_path("\n".join(messages or [str(error)]))


def _source_name(chain: list[BaseException]) -> str | None:
    """The config Hydra was composing when it failed (`clipping/mine` of "In 'clipping/mine': ...")."""
    for cause in chain:
        found = re.match(r"In '([^']+)':", str(cause)) if isinstance(cause, HydraException) else None
        if found:
            return found.group(1)
    return None


def _source_file(chain: list[BaseException], dirs: Sequence[Path]) -> Path | None:
    """The file of the config Hydra was composing when it failed: the first of `dirs` that has it."""
    name = _source_name(chain)
    files = [folder / f"{name}.yaml" for folder in dirs] if name else []
    return next((path for path in files if path.is_file()), None)


def _missing_option_message(error: MissingConfigException, source: Path | None) -> str:
    """`clipping=atrr: no such clipping config; did you mean 'atr'? allowed: ...` (and the file whose defaults
    list named it, when that is not the primary config)."""
    group, _, name = str(error.missing_cfg_file).rpartition("/")
    options = [str(option) for option in error.options or ()]
    where = f" (in the defaults of {source})" if source else ""
    guess = did_you_mean(name, options)
    return f"invalid config: {group}={name}: no such {group} config{where}{guess} allowed: {', '.join(options)}"


def _without_search_path(text: str) -> str:
    """Hydra's message without the config search path it lists (the folders are not what the user typed)."""
    return text.split("\nConfig search path:")[0].rstrip()


def compose(
    config_name: str,
    overrides: Iterable[str] = (),
    return_hydra_config: bool = False,
    config_dir: str | Path | None = None,
) -> DictConfig:
    """The composed, unresolved DictConfig of `conf/<config_name>.yaml` with `overrides` (the caller's own copy);
    `config_dir`: a folder of the user's config files, read as `--config-dir` reads it.

    Raises ConfigError (with `describe_config_error`'s message) for input Hydra or the schema refuses.
    """
    extra, overrides = _config_dir(config_dir), tuple(overrides)
    if extra is not None:  # a user's folder may hold any number of files: composed afresh, never kept
        return _composed.__wrapped__(config_name, overrides, return_hydra_config, extra, ())
    inputs = (_conf_files_stamp(), os.getcwd())
    return copy.deepcopy(_composed(config_name, overrides, return_hydra_config, None, inputs))


def _config_dir(config_dir: str | Path | None) -> Path | None:
    """`--config-dir`'s folder as an absolute path; ConfigError naming it when it is not a folder."""
    if config_dir is None:
        return None
    folder = Path(config_dir).expanduser().absolute()
    if not folder.is_dir():
        raise ConfigError(
            f"invalid config: --config-dir {config_dir}: no such folder ({folder}); it names a folder of your own "
            "config files (e.g. clipping/<name>.yaml), read besides conf/"
        )
    return folder


def _search_dirs(config_dir: Path | None) -> tuple[Path, ...]:
    """The folders Hydra reads config files from, in its order: conf/, then `--config-dir`'s."""
    return (CONF_DIR,) if config_dir is None else (CONF_DIR, config_dir)


def _conf_files_stamp() -> tuple[tuple[str, int, int], ...]:
    """Every file under conf/ with its size and modification time: a composed config is kept until one changes."""
    stats = ((str(path), path.stat()) for path in CONF_DIR.rglob("*.yaml"))
    return tuple(sorted((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats))


@contextlib.contextmanager
def _hydra_reading(config_dir: Path | None, task_name: str = "app") -> Iterator[Any]:
    """Hydra set up to read conf/ and, where `--config-dir` puts it (after conf/, before the schemas), `config_dir`;
    yields that Hydra. `task_name`: the job's name (`hydra.job.name`, the log file's name)."""
    from hydra import initialize_config_dir
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=str(CONF_DIR), job_name=task_name, version_base="1.3"):
        if config_dir is not None:
            search_path = create_config_search_path(str(CONF_DIR))
            search_path.prepend("command-line", f"file://{config_dir}", SearchPathQuery(provider="schema"))
            GlobalHydra.instance().clear()
            Hydra.create_main_hydra2(task_name=task_name, config_search_path=search_path)
        yield GlobalHydra.instance().hydra


@contextlib.contextmanager
def _described(config_name: str, config_dir: Path | None) -> Iterator[None]:
    """Input Hydra or OmegaConf refuses, raised again as ConfigError with `describe_config_error`'s message."""
    try:
        yield
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(describe_config_error(err, _search_dirs(config_dir), config_name)) from err


@functools.lru_cache(maxsize=256)
def _composed(
    config_name: str, overrides: tuple[str, ...], return_hydra_config: bool, config_dir: Path | None, inputs: tuple
) -> DictConfig:
    """Hydra's composition, kept per `inputs` (the conf/ files, the working directory; the registered schemas are
    fixed once the rules are imported); an error is raised again on every call, never kept."""
    from hydra import compose as hydra_compose

    register_configs()
    with _described(config_name, config_dir), _hydra_reading(config_dir):
        cfg = hydra_compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)
        if _untyped_clipping(cfg):
            choices = hydra_compose(config_name, overrides=list(overrides), return_hydra_config=True)
            raise ConfigError(_schema_line_missing(cfg.clipping, choices.hydra.runtime.choices, config_dir))
    return cfg


def _untyped_clipping(cfg: DictConfig) -> bool:
    """The composed `clipping` is a plain mapping, not its rule's schema: its file lacks the schema line."""
    if "clipping" not in cfg or OmegaConf.is_missing(cfg, "clipping"):
        return False
    node = cfg._get_node("clipping")
    return isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict


def _schema_line_missing(clipping: DictConfig, choices: DictConfig, config_dir: Path | None) -> str:
    """`invalid config: <file>: a rule's config file needs the defaults line ...`: the file `clipping=<option>` read,
    and the line it lacks. Without it the file composes into a mapping with no rule's schema: no value is checked,
    and the run has no rule to build."""
    option = choices.get("clipping")
    files = [folder / "clipping" / f"{option}.yaml" for folder in _search_dirs(config_dir)]
    source = next((path for path in files if path.is_file()), f"clipping/{option}.yaml")
    rule = clipping.get("name") or "<rule>"
    return (
        f"invalid config: {source}: a rule's config file needs the defaults line 'defaults: "
        f"[/schema/clipping@_here_: {rule}, _self_]', which picks the rule's schema (parameter types, ranges, allowed "
        "keys); without it no rule reads the file (see docs/rules.md)"
    )


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


def check_sweep(
    config_name: str,
    overrides: Iterable[str],
    check: Callable[[Any], None] | None = None,
    config_dir: str | Path | None = None,
    multirun: bool = True,
) -> int:
    """Compose and validate the run, or with `multirun` every job of the sweep (Hydra's own `hydra...` overrides
    aside), and `check` each job's config object, so that a bad value is refused before the first job starts;
    returns the number of jobs. `config_dir`: `--config-dir`'s folder."""
    overrides = list(overrides)
    _refuse_plan(overrides)
    own = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    jobs = _sweep_jobs_checked(own) if multirun else [own]
    for number, job in enumerate(jobs, 1):
        try:
            _check_job(config_name, job, check, config_dir)
        except ConfigError as err:
            if not multirun:
                raise
            where = f"sweep job {number} of {len(jobs)} ({' '.join(job)})" if len(jobs) > 1 else "the job"
            raise ConfigError(f"{err} (in {where}; no job of the sweep was started)") from None
    return len(jobs)


def _refuse_plan(overrides: list[str]) -> None:
    """The schema drops an experiment's plan: set for one run, it would do nothing."""
    from atr_grpo.config_hydra import PLAN_KEY

    for override in overrides:
        if override.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == PLAN_KEY:
            raise ConfigError(
                f"{override!r}: {PLAN_KEY} is an experiment's list of runs, read by `python -m atr_grpo.launch "
                "<experiment>`, not a setting of one run; edit it in conf/experiment/<experiment>.yaml"
            )


def _sweep_jobs_checked(overrides: list[str]) -> list[list[str]]:
    """`sweep_jobs`, with an override Hydra cannot parse refused as bad config."""
    try:
        return sweep_jobs(overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(describe_config_error(err)) from err


def _check_job(
    config_name: str, job: list[str], check: Callable[[Any], None] | None, config_dir: str | Path | None
) -> None:
    """Compose one job's config, validate it into its dataclasses and `check` them."""
    _validate(config_name, compose(config_name, job, config_dir=config_dir), job, check)


def _validate(
    config_name: str, job_cfg: DictConfig, overrides: Sequence[str], check: Callable[[Any], None] | None
) -> None:
    """Validate a job's composed config (no `hydra` node) into its dataclasses and `check` them; the object is kept
    for `checked_config` under the job's overrides."""
    from atr_grpo.config_hydra import to_object

    job = to_object(job_cfg)
    if check is not None:
        check(job)
    _checked[(config_name, tuple(overrides))] = (OmegaConf.to_yaml(job_cfg, resolve=True), job)


def checked_config(config_name: str, cfg: DictConfig) -> Any:
    """The config object of the job Hydra hands a `@hydra.main` function (`cfg`, its `plan` dropped): the one
    `check_sweep` validated in this process for the same overrides and the same resolved config, so that a run is
    validated, and its rule built, once; a job no check saw is validated here."""
    from hydra.core.hydra_config import HydraConfig

    from atr_grpo.config_hydra import drop_plan, to_object

    drop_plan(cfg)
    overrides = tuple(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None
    resolved, job_cfg = _checked.pop((config_name, overrides), (None, None))
    if job_cfg is not None and resolved == OmegaConf.to_yaml(cfg, resolve=True):
        return job_cfg
    return to_object(cfg)


def _run_once(hydra_main: Callable[..., Any], config_name: str, args: Any, check: Callable[[Any], None] | None) -> bool:
    """One run, or `--cfg`, from one composition: the config with its `hydra` node, composed as Hydra's run composes
    it, validated and checked before anything is written, then run through Hydra's `run_job` (the run folder, the
    log file, job logging and callbacks, as `@hydra.main` runs a job) or printed as `--cfg` prints it. False, with
    nothing run, when a config file sets `hydra.mode: MULTIRUN`: Hydra sweeps it (`run_app` hands over)."""
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.utils import detect_calling_file_or_module_from_task_function, detect_task_name
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict, read_write

    _refuse_plan(args.overrides)
    config_dir = _config_dir(args.config_dir)
    task_name = detect_task_name(*detect_calling_file_or_module_from_task_function(hydra_main))
    register_configs()
    with _hydra_reading(config_dir, task_name) as hydra:
        with _described(config_name, config_dir):  # as `compose` describes it
            cfg = hydra.compose_config(
                config_name, list(args.overrides), RunMode.RUN, with_log_configuration=not args.cfg, from_shell=False
            )
        if _untyped_clipping(cfg):
            raise ConfigError(_schema_line_missing(cfg.clipping, cfg.hydra.runtime.choices, config_dir))
        if cfg.hydra.mode == RunMode.MULTIRUN and not args.cfg:
            return False
        _validate(config_name, hydra.get_sanitized_cfg(copy.deepcopy(cfg), "job"), cfg.hydra.overrides.task, check)
        if args.cfg:
            _show(hydra, cfg, args)
            return True
        with read_write(cfg.hydra), open_dict(cfg.hydra):  # what Hydra records for a run no config gives a mode
            cfg.hydra.mode = RunMode.RUN
            if "hydra.mode=RUN" not in cfg.hydra.overrides.hydra:
                cfg.hydra.overrides.hydra.append("hydra.mode=RUN")
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=config_name)
        context = HydraContext(config_loader=hydra.config_loader, callbacks=callbacks)
        job = run_job(hydra_main, cfg, "hydra.run.dir", None, hydra_context=context)
        callbacks.on_run_end(config=cfg, config_name=config_name, job_return=job)
        _ = job.return_value  # raises the task's exception
    return True


def _show(hydra: Any, cfg: DictConfig, args: Any) -> None:
    """Print `cfg` as Hydra's `--cfg job|hydra|all [--package P] [--resolve]` prints it."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import Container

    HydraConfig.instance().set_config(cfg)
    OmegaConf.set_readonly(cfg.hydra, None)
    shown: Any = hydra.get_sanitized_cfg(cfg, args.cfg)
    package = None if args.package == "_global_" else args.package
    if package is not None:
        shown = OmegaConf.select(shown, package)
        if shown is None:
            sys.stderr.write(f"package '{package}' not found in config\n")
            sys.exit(1)
    if not isinstance(shown, Container):
        print(shown)
        return
    if package is not None:
        print(f"# @package {package}")
    if args.resolve:
        OmegaConf.resolve(shown)
    sys.stdout.write(OmegaConf.to_yaml(shown))


def _each(*checks: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """One check that runs `checks` (None: none) in their order."""

    def every(job_cfg: Any) -> None:
        for one in checks:
            if one is not None:
                one(job_cfg)

    return every


def run_app(
    hydra_main: Callable[[], Any],
    config_name: str | None = None,
    check: Callable[[Any], None] | None = None,
    launch_check: Callable[[Any], None] | None = None,
) -> int:
    """Run a `@hydra.main` function; bad config input prints its message and returns exit status 2.

    With `config_name`, the config of the run, or of every job of a multirun (`-m`), is composed (with
    `--config-dir`'s files), validated and given to `check` before Hydra writes anything: a refused run writes
    nothing (not even the log file Hydra creates in its output folder), and a sweep with one bad job starts none.
    `--cfg` is validated the same way, so a config it prints is one a run accepts. A run and `--cfg` compose once
    (`_run_once`); a sweep's jobs are composed by the check, then again by Hydra's launcher. `launch_check` (what
    this machine can run) is given each job's config too, except under `--cfg`, which runs nothing, and with a
    `hydra/launcher=` (SLURM), whose jobs run on other machines."""
    from hydra._internal.utils import get_args_parser

    # Hydra reports composition errors itself and exits with 1; with this set it raises them to us instead
    # (other errors still end with their full traceback).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        args = get_args_parser().parse_known_args(sys.argv[1:])[0]
        if args.resolve and not (args.cfg or args.help):
            raise ConfigError("--resolve is read with --cfg or --help only (e.g. --cfg job --resolve)")
        runs_nothing = args.help or args.hydra_help or args.info or args.shell_completion
        one_run = not (args.multirun or args.experimental_rerun or (args.cfg and args.run))
        if config_name is not None and not runs_nothing:
            here = not args.cfg and not any(o.startswith("hydra/launcher=") for o in args.overrides)
            checks = (check, launch_check if here else None)
            job_check = _each(*checks) if any(checks) else None
            name = args.config_name or config_name
            if one_run and _run_once(hydra_main, name, args, job_check):
                return 0
            check_sweep(name, args.overrides, job_check, args.config_dir, args.multirun or one_run)
        hydra_main()
    except CONFIG_ERRORS as err:
        print(describe_config_error(err), file=sys.stderr)
        return 2
    return 0
