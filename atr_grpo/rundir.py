"""The run directory: its name, and the files every number in this project is computed from.

A run is named `<experiment>__<method>__s<seed>`, where `method` is the clipping rule plus its non-default
parameters (`clip-eps0.3`); a job of a Hydra multirun appends the overrides its name does not already show
(`__model=qwen3-8b`), so no two jobs of a sweep share a directory. A name longer than a file name may be (255
bytes: about a dozen overrides) keeps its first 245 bytes and ends in `__` and 8 hex digits of its hash (`fit_name`).
Its files:

    <run_dir>/
      config.yaml            fully resolved config of the run
      env.json               package versions, git commit, python, device, number of processes, start time
      metrics.jsonl          one JSON object per logged training step
      checkpoints/           trainer checkpoints (resume continues from the newest)
      eval/step_<step:06d>/<benchmark>.jsonl   one line per (problem, sample)
      eval/summary.jsonl     one line per (step, benchmark)

Writers here never truncate an existing file: JSONL files are appended to, JSON files are written
through a temporary file and renamed, and a file that must not change is refused if present. The one exception
is a JSONL file's torn last line (a killed write): it is moved to `<name>.torn` before the next append. A
re-launch into a run directory continues the run only when its config is the saved one (`config_differences`).
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
ENV_FILE = "env.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
EVAL_DIR = "eval"
SUMMARY_FILE = "summary.jsonl"
DONE_FILE = "DONE"  # written when a training run reached its last step

# Packages whose version changes what a run computes: env.json records them for every run.


# Overrides already spelled out in the run name (or that do not change what a run computes)
NAMED_KEYS = ("experiment", "seed", "clipping", "run_dir", "run_name", "resume", "logger", "hydra")


def method_label(clipping: Any) -> str:
    """`atr`, `clip-eps0.3`, `clip_higher-eps_low0.329-eps_high0.6`, `atr-target_kl3_0.01`: the rule and its
    non-default values (adaptive δ's included; a key ending in a digit is separated from its value by `_`)."""
    from atr_grpo.clipping import rule_defaults
    from atr_grpo.clipping.adaptive_delta import DELTA_CONTROL_DEFAULTS, takes_delta

    values = OmegaConf.to_container(clipping, resolve=True) if OmegaConf.is_config(clipping) else dict(clipping)
    name = values.pop("name")
    defaults = rule_defaults(name) | (DELTA_CONTROL_DEFAULTS if takes_delta(name) else {})
    changed = [(k, v) for k, v in values.items() if k in defaults and v != defaults[k]]
    parts = [(k + "_" if k[-1].isdigit() else k) + (f"{v:g}" if isinstance(v, float) else f"{v}") for k, v in changed]
    return "-".join([name, *parts])


# Keys (dotted, or a section) that say where a run's files are, what the run is called, how fast it runs or when
# it is evaluated. They do not define its method: runs that differ only in them and the seed are repeats of one point
# (`method_settings`). The seed and the study are left out too: they place a run, they are not its method.
NOT_METHOD_KEYS = (
    "seed",
    "study",
    "run_name",
    "run_dir",
    "resume",
    "hydra",
    "logger",
    "out_dir",
    "force",
    "sft.cache_dir",
    "trainer.logging_steps",
    "trainer.save_steps",
    "trainer.save_total_limit",
    "trainer.log_completions",
    "trainer.num_threads",
    "trainer.ddp_timeout",
    "trainer.gradient_checkpointing",
    "rollout.vllm.enable_sleep_mode",
    "rollout.vllm.gpu_memory_utilization",
    "rollout.vllm.server_base_url",
    "rollout.vllm.server_host",
    "rollout.vllm.server_port",
    "rollout.vllm.server_timeout",
    "rollout.vllm.group_port",
    "eval.enabled",  # the evaluation schedule says when a run is measured, not what it trains
    "eval.when",
    "eval.every_steps",
    "eval.at_start",
    "eval.keep_adapters",
    "eval.share_start",
    "eval.paths",
    "eval.batch_size",
    "eval.grader_workers",
    "eval.gpu_memory_utilization",
)
# Keys the method label (`method_label`) already shows
LABELLED_KEYS = ("method", "clipping")


def in_section(key: str, sections: tuple[str, ...]) -> bool:
    """Whether dotted `key` is one of `sections` or lies inside one."""
    return any(key == s or key.startswith(s + ".") for s in sections)


def study_of(config: dict[str, Any]) -> str:
    """A run's study: its `study` key, or its experiment for a config.yaml from before the key."""
    return str(config.get("study") or config.get("experiment", "?"))


def method_settings(config: dict[str, Any]) -> dict[str, Any]:
    """{dotted key: value} of every setting that defines a run's method: its whole config but NOT_METHOD_KEYS."""
    return {k: v for k, v in _flatten(config).items() if not in_section(k, NOT_METHOD_KEYS)}


def setting_text(key: str, value: Any) -> str:
    """`trainer.learning_rate=0.001`: one setting as a method name shows it (floats as `%g`, YAML's null/true)."""
    if isinstance(value, bool) or value is None:
        shown = json.dumps(value)
    elif isinstance(value, float):
        shown = f"{value:g}"
    elif isinstance(value, list):
        shown = "[" + ",".join(map(str, value)) + "]"
    else:
        shown = str(value)
    return f"{key}={shown}"


def sweep_suffix(overrides: list[str]) -> str:
    """`__key=value,...` for the overrides of a multirun job that its run name does not already show."""
    parts = []
    for override in sorted(overrides):
        key = override.split("=", 1)[0].lstrip("+~")
        if key.split(".")[0].split("/")[0] not in NAMED_KEYS:
            parts.append(override.replace("/", "_").replace(" ", ""))
    return "__" + ",".join(parts) if parts else ""


# the longest file name most filesystems allow, in bytes (Linux NAME_MAX, macOS)
MAX_NAME_BYTES = 255
NAME_HASH_HEX = 8


def fit_name(name: str) -> str:
    """`name` as it is when it fits in a file name (255 bytes); a longer one (a sweep with many overrides) becomes
    its first bytes and `__` and 8 hex digits of its SHA-256: the name lists the sorted overrides, so jobs that
    differ anywhere in them keep distinct names, and the same job always gets the same one."""
    encoded = name.encode("utf-8")
    if len(encoded) <= MAX_NAME_BYTES:
        return name
    digest = hashlib.sha256(encoded).hexdigest()[:NAME_HASH_HEX]
    prefix = encoded[: MAX_NAME_BYTES - NAME_HASH_HEX - 2].decode("utf-8", errors="ignore")
    return f"{prefix}__{digest}"


def sweep_run_name(base: str, overrides: list[str]) -> str:
    """The run name of a multirun job with `overrides` whose name without them is `base`."""
    return fit_name(base + sweep_suffix(overrides))


def run_name(base: str) -> str:
    """The `${atr_run_name:...}` resolver: `base`, plus the running multirun job's overrides, fitted to a file
    name."""
    return fit_name(base + multirun_suffix())


def multirun_suffix() -> str:
    """`sweep_suffix` of the running Hydra multirun job; empty outside one."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return ""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return ""
    return sweep_suffix(list(hydra_cfg.overrides.task))


@contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if needed): serialises cache builds across processes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def eval_step_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / EVAL_DIR / f"step_{step:06d}"


def summary_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / EVAL_DIR / SUMMARY_FILE


def append_jsonl(path: str | Path, records: dict[str, Any] | Iterable[dict[str, Any]]) -> None:
    """Append one record (a dict) or several to a JSONL file, creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(records, dict):
        records = [records]
    set_torn_tail_aside(path)
    with path.open("a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False, allow_nan=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def set_torn_tail_aside(path: Path) -> None:
    """A JSONL file that does not end in a newline ends in a write that was cut off (a killed process). Before the
    next record is appended, that fragment is moved to `<name>.torn` (kept, never deleted), so the new record does
    not glue onto it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        data = path.read_bytes()
        keep = data.rfind(b"\n") + 1  # 0 when the whole file is one torn line
        aside = path.with_name(path.name + ".torn")
        with aside.open("ab") as torn:
            torn.write(data[keep:] + b"\n")
            torn.flush()
            os.fsync(torn.fileno())
        handle.truncate(keep)
    log.warning("%s: its last line was cut off; the fragment is kept in %s", path, aside)


class RunFileError(ValueError):
    """A run file cannot be read (cut off, or changed into something else); the message names the file."""


def _reason(err: BaseException) -> str:
    """An exception's first line (YAML and JSON errors span several), for a one-line message."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def read_text(path: str | Path) -> str:
    """The text of a file, decompressed when its name ends in `.gz` (committed per-sample files are)."""
    path = Path(path)
    if path.suffix != ".gz":
        return path.read_text(encoding="utf-8")
    try:
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    except (EOFError, OSError) as err:  # gzip.BadGzipFile is an OSError
        raise RunFileError(f"{path}: not a complete gzip file ({err})") from None


def iter_jsonl(path: str | Path, whole: bool = False) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file (or `.jsonl.gz`). A torn last line (a run killed mid-write) is skipped and any
    other bad line refused; with `whole` (readers that need every record: the results commands) it is refused too."""
    lines = read_text(path).splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and not whole:
                return
            torn = " (the last line: a write that was cut off?)" if number == len(lines) else ""
            raise RunFileError(f"{path}:{number}: not valid JSON{torn}") from None


def read_jsonl(path: str | Path, whole: bool = False) -> list[dict[str, Any]]:
    return list(iter_jsonl(path, whole))


def read_json(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise RunFileError(f"{path}: not valid JSON ({_reason(err)})") from None


def load_config(path: str | Path, resolve: bool = True) -> dict[str, Any]:
    """A run's config.yaml as a plain dict; a file that is empty or not a YAML mapping is a RunFileError naming it."""
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    try:
        config = OmegaConf.load(path)
        if not isinstance(config, DictConfig):
            raise RunFileError(f"{path}: not a config (a YAML mapping of keys)")
        if not config:  # a run's config.yaml holds its whole config: an empty one was cut off or emptied
            raise RunFileError(f"{path}: damaged: empty (a run's config.yaml holds every key of its config)")
        container = OmegaConf.to_container(config, resolve=resolve)
        assert isinstance(container, dict)  # what to_container gives for a DictConfig
        return {str(key): value for key, value in container.items()}
    except (YAMLError, OmegaConfBaseException, UnicodeDecodeError) as err:
        raise RunFileError(f"{path}: not a readable config ({_reason(err)})") from None


def write_json(path: str | Path, obj: Any, overwrite: bool = True) -> None:
    """Write JSON atomically (temporary file + rename). With overwrite=False an existing file is an error."""
    path = Path(path)
    if not overwrite and path.exists():
        raise FileExistsError(f"{path} exists and is not overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_text(path: str | Path, text: str, overwrite: bool = True) -> None:
    path = Path(path)
    if not overwrite and path.exists():
        raise FileExistsError(f"{path} exists and is not overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------- is a re-launch the same run?
# keys that may change when a run is resumed (they do not change what the run computes)
RESUMABLE_CHANGES = ("resume", "logger")
# keys that hold a file or folder (compared resolved), besides eval.paths.<benchmark>
PATH_KEYS = ("model.path", "data.path", "sft.path", "sft.cache_dir")


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def _same_value(key: str, a: Any, b: Any) -> bool:
    """Paths compare resolved (`runs/x` and `/home/me/runs/x` are one file); a hub id resolves alike on both
    sides, so it still compares as itself."""
    if a == b:
        return True
    if key in PATH_KEYS or key.startswith("eval.paths."):
        return (
            isinstance(a, str)
            and isinstance(b, str)
            and Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
        )
    return False


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ, ignoring keys a resume may change and where the run directory is (a
    relaunch may spell it as an absolute path, or the directory may have been moved or copied)."""
    if "study" in current and "study" not in saved:  # a run from before the key: its study was its experiment
        saved = {**saved, "study": study_of(saved)}
    a, b = _flatten(saved), _flatten(current)
    keys = sorted((set(a) | set(b)) - {"run_dir"})
    return [k for k in keys if not _same_value(k, a.get(k), b.get(k)) and not k.startswith(RESUMABLE_CHANGES)]


def find_run_dirs(root: str | Path) -> list[Path]:
    """Every run directory below `root`, recognised by its config.yaml, in a stable order."""
    root = Path(root)
    if not root.exists():
        return []
    return sorted(p.parent for p in root.rglob(CONFIG_FILE) if CHECKPOINT_DIR not in p.parts)
