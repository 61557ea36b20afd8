"""What an evaluation folder holds, checked before any model loads.

A standalone evaluation folder (`python -m atr_grpo.evaluate out_dir=DIR`) holds one model, the base model or one
adapter on it, evaluated under one request: eval/request.json records them (REQUEST_KEYS, the adapter's path and
the sha256 of its weights) and the benchmarks evaluated so far. A training run's folder holds the run's own
checkpoints, evaluated as its config.yaml says. A request that differs is refused (`check_request`), naming each key
with its stored and requested value, before anything loads. Only an identical request is answered from the store,
and the console says so (`reused`). A new benchmark may join a folder: it is evaluated, not read.

A folder written before eval/request.json is read as it is: the request from its config.yaml (the first call's),
the models from its summary lines. One that already holds several models is refused as such. Its adapter's hash was
never recorded, so only the adapter's path is compared, and a setting its config.yaml lacks (a key added since) is
not compared either; the next call it accepts writes the record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atr_grpo import rundir
from atr_grpo.errors import ConfigError
from atr_grpo.evaluation.outputs import read_summary
from atr_grpo.provenance import weights_sha256
from atr_grpo.rundir import layout

# the settings that make two evaluations of one model comparable (the benchmarks aside: a new one may join)
SETTING_KEYS = (
    "model.name",
    "model.path",
    "eval.max_problems",
    "eval.n",
    "eval.k",
    "eval.temperature",
    "eval.top_p",
    "eval.top_k",
    "eval.max_tokens",
    "eval.seed",
    "eval.seed_by_step",
    "eval.strict",
    "eval.credit_inside_think",
    "prompt.system",
    "prompt.enable_thinking",
)
ADAPTER_KEYS = ("adapter", "adapter_sha256")  # which model: a training run's checkpoints differ in them by step
REQUEST_KEYS = (*SETTING_KEYS, *ADAPTER_KEYS)
BENCHMARKS_KEY = "eval.benchmarks"


def request_of(config: dict[str, Any]) -> dict[str, Any]:
    """{key: value} of REQUEST_KEYS in a resolved evaluation config: the adapter as an absolute path, with the sha256
    of its weight files (None without an adapter, or for an adapter folder with no weight file)."""
    request = {key: rundir.value_at(config, key) for key in SETTING_KEYS}
    adapter = config.get("adapter")
    request["adapter"] = None if adapter is None else str(Path(adapter).expanduser().resolve())
    request["adapter_sha256"] = None if adapter is None else _weights_hash(Path(adapter))
    return request


def _weights_hash(adapter: Path) -> str | None:
    try:
        return weights_sha256(adapter)
    except FileNotFoundError:
        return None


def check_request(out_dir: str | Path, requested: dict[str, Any]) -> None:
    """Refuse (ConfigError) a request that `out_dir` cannot take: another model, adapter or setting than it holds,
    naming the key, both values and what to do. A new or empty folder takes any request."""
    folder = Path(out_dir)
    config = _config(folder)
    if "trainer" in config:
        _check_run_checkpoint(folder, config, requested)
        return
    stored, lines = read_request(folder), list(read_summary(folder).values())
    models = sorted({_model_text(row.get("model"), _absolute(row.get("adapter"))) for row in lines})
    if len(models) > 1:
        raise ConfigError(
            f"out_dir {folder} already holds several models ({'; '.join(models)}), written before one folder held one "
            "model; its results cannot be extended: use another out_dir"
        )
    if stored is None and lines:  # summary lines only: their model and adapter
        stored = {"model.name": lines[0].get("model"), "adapter": _absolute(lines[0].get("adapter"))}
    differing = [key for key in REQUEST_KEYS if key in (stored or {}) and stored[key] != requested[key]]
    if differing:
        raise ConfigError(
            _refusal(folder, stored, requested, differing, "another evaluation", "one model and one request")
        )


def _check_run_checkpoint(folder: Path, config: dict[str, Any], requested: dict[str, Any]) -> None:
    """A training run's folder takes its own checkpoints (an adapter inside it), evaluated with its settings."""
    stored: dict[str, Any] = _known_settings(config)
    differing = [key for key in stored if stored[key] != requested[key]]
    adapter = requested["adapter"]
    if adapter is None or not Path(adapter).is_relative_to(folder.resolve()):
        differing.append("adapter")
        stored["adapter"] = f"a checkpoint inside {folder}"
    if differing:
        raise ConfigError(
            _refusal(folder, stored, requested, differing, "a training run", "its own checkpoints and its settings")
        )


def _refusal(
    folder: Path, stored: dict[str, Any], requested: dict[str, Any], keys: list[str], holds: str, takes: str
) -> str:
    """The folder is what refuses, not the config: what it holds, each key with its stored and requested value."""
    values = "; ".join(
        f"{key}: stored {_shown(key, stored[key])}, requested {_shown(key, requested[key])}" for key in keys
    )
    model = _model_text(stored.get("model.name"), stored.get("adapter"))
    return (
        f"out_dir {folder} already holds {holds} ({model}) and takes {takes}; this request differs ({values}); "
        "use another out_dir. Nothing was loaded or written"
    )


def _shown(key: str, value: Any) -> str:
    """A request's value as a refusal prints it: a sha256 by its first 12 hex digits (eval/request.json keeps it
    whole), a null max_problems or adapter with what it means."""
    if key == "adapter_sha256" and isinstance(value, str):
        return value[:12]
    if key == "eval.max_problems" and value is None:
        return "null (all problems)"
    if key == "adapter" and value is None:
        return "null (the base model)"
    return repr(value)


def read_request(out_dir: str | Path) -> dict[str, Any] | None:
    """What a standalone evaluation folder holds: its eval/request.json; for a folder written before it, the request
    of its config.yaml without the adapter's hash (never recorded); None for a folder with neither."""
    folder = Path(out_dir)
    path = layout.request_path(folder)
    if path.is_file():
        return rundir.read_json(path)
    config = _config(folder)
    if not config:
        return None
    return {**_known_settings(config), "adapter": _absolute(config.get("adapter"))}


def _known_settings(config: dict[str, Any]) -> dict[str, Any]:
    """{key: value} of the SETTING_KEYS a config.yaml holds (one written before a key existed lacks it: unknown,
    so not compared)."""
    values = {key: rundir.value_at(config, key, absent=_ABSENT) for key in SETTING_KEYS}
    return {key: value for key, value in values.items() if value is not _ABSENT}


_ABSENT = object()


def record_request(out_dir: str | Path, requested: dict[str, Any], benchmarks: list[str]) -> None:
    """Write what a standalone folder holds (its request, and every benchmark evaluated in it); a training run's
    folder is described by its config.yaml and gets no record."""
    folder = Path(out_dir)
    if "trainer" in _config(folder):
        return
    path = layout.request_path(folder)
    known = rundir.read_json(path).get(BENCHMARKS_KEY, []) if path.is_file() else []
    rundir.write_json(path, {**requested, BENCHMARKS_KEY: list(dict.fromkeys([*known, *benchmarks]))})


def reused(out_dir: str | Path, step: int, benchmarks: list[str], force: bool) -> list[str]:
    """The benchmarks whose result at `step` is read from the store instead of evaluated (none with `force`)."""
    done = read_summary(out_dir)
    return [] if force else [name for name in benchmarks if (step, name) in done]


def _config(folder: Path) -> dict[str, Any]:
    path = layout.config_path(folder)
    return rundir.load_config(path) if path.is_file() else {}


def _absolute(adapter: Any) -> str | None:
    return None if adapter is None else str(Path(adapter).expanduser().resolve())


def _model_text(model: Any, adapter: Any) -> str:
    return f"the base model {model}" if adapter is None else f"{model} with adapter {adapter}"
