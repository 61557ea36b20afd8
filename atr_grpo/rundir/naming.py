"""A run's name and its method's identity: what the run is called, and which settings make two runs repeats.

A run is named `<experiment>__<method>__s<seed>`, where `method` is the clipping rule plus its non-default
parameters (`clip-eps0.3`); a job of a Hydra multirun appends the overrides its name does not already show
(`__model=qwen3-8b`), so no two jobs of a sweep share a directory. A name longer than a file name may be (255
bytes: about a dozen overrides) keeps its first 245 bytes and ends in `__` and 8 hex digits of its hash (`fit_name`).
A re-launch into a run directory continues the run only when its config is the saved one (`config_differences`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

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


# ------------------------------------------------------------------------------- a method's name and its ASCII form
METHOD_SEPARATOR = " · "  # between a rule's label and each setting a method's name shows
# each non-ASCII mark a method name may hold, and the one ASCII spelling a user may type for it
ASCII_FORMS = {METHOD_SEPARATOR: "__", "·": "__", "–": "-", "δ": "delta", "ε": "eps"}


def ascii_method(name: str) -> str:
    """The ASCII form of a method name: `clip · trainer.max_steps=40` is `clip__trainer.max_steps=40` (the separator
    as a sweep's run name spells it), and an unset value `–` is `-`. An ASCII name is its own form."""
    for mark, spelling in ASCII_FORMS.items():
        name = name.replace(mark, spelling)
    return name


def override_key(override: str) -> str:
    """The dotted key a command-line override sets: `+trainer.max_steps=40` sets `trainer.max_steps`."""
    return override.split("=", 1)[0].lstrip("+~")


MODEL_KEYS = ("model", "model.name")  # the model: a column of every table, not part of a method's name


def launch_settings(config: dict[str, Any], argv: list[str]) -> list[str]:
    """`trainer.max_steps=40`, `rollout=on_policy`: each setting of a method that the run's launch command line
    (`argv`, as env.json records it) changed from its experiment, in sorted order, with the run's own value (a sweep's
    job shows its value, not the list). The seed, the rule (its label shows it), the model's name (a table's column) and
    the keys that are not the method's (NOT_METHOD_KEYS) are left out."""
    flat, shown = _flatten(config), {}
    for override in argv:
        if override.startswith("-") or "=" not in override:
            continue
        key = override_key(override)
        if key.split(".")[0] in NAMED_KEYS or key in MODEL_KEYS or in_section(key, (*NOT_METHOD_KEYS, *LABELLED_KEYS)):
            continue
        value = value_at(config, key)
        if isinstance(value, dict):  # a config group: its option's name
            shown[key] = f"{key}={value.get('name', override.split('=', 1)[1])}"
        elif key in flat:
            shown[key] = setting_text(key, value)
    return [shown[key] for key in sorted(shown)]


def value_at(config: dict[str, Any], key: str, absent: Any = None) -> Any:
    """The value of dotted `key` in a nested config; `absent` when a part of it is absent."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return absent
        node = node[part]
    return node


def sweep_suffix(overrides: list[str]) -> str:
    """`__key=value,...` for the overrides of a multirun job that its run name does not already show."""
    parts = []
    for override in sorted(overrides):
        key = override_key(override)
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
    """The run name of a multirun job launched with `overrides` whose name without them is `base`: each override as
    Hydra's sweeper hands it to the job (`as_swept`), so `lr=2.0e-4` names the run `lr=0.0002`, as the job does."""
    return fit_name(base + sweep_suffix(as_swept(overrides)))


def as_swept(overrides: list[str]) -> list[str]:
    """`overrides` spelled as Hydra's basic sweeper passes a one-value override to its job: `key=value`, the value
    parsed and written back (`2.0e-4` → `0.0002`, `'a'` → `a`); a `+`/`~` prefix stays."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [
        o.input_line if o.is_sweep_override() else f"{o.get_key_element()}={o.get_value_element_as_str()}"
        for o in parsed
    ]


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
