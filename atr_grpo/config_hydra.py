"""Between Hydra / OmegaConf and the config dataclasses: the schemas and resolvers registered for composition,
a composed DictConfig validated into its dataclasses (`to_object`), and a run's config.yaml written and read back.
Hydra itself is imported only inside `register_configs`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, flag_override, open_dict
from omegaconf.errors import OmegaConfBaseException

from atr_grpo import rundir
from atr_grpo.cache import cache_dir
from atr_grpo.clipping.bounds import kl3_ratio_bounds
from atr_grpo.config import CLIPPING_SCHEMAS, EvaluateConfig, TrainConfig, unknown_key_message
from atr_grpo.distributed import log_suffix
from atr_grpo.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

# --------------------------------------------------------------------------------------- registration
# An experiment file (conf/experiment/<name>.yaml) may hold one key that is not a run's config: `plan`, the runs
# `python -m atr_grpo.launch <name>` starts. This is the one place that knows it: the root schemas accept the key
# so that the file composes, and `to_object` drops it, so it reaches neither a config object nor a run's files.
PLAN_KEY = "plan"


def _root_schema(schema: type) -> DictConfig:
    """The root schema as Hydra composes it: the dataclass's fields, plus the experiment's `plan` (null)."""
    node = OmegaConf.structured(schema)
    with open_dict(node):
        node[PLAN_KEY] = None
    return node


_registered: tuple = ()  # the rule schemas registered last


def register_configs() -> None:
    """Register schemas and resolvers; entry points and tests call this before composing. Idempotent: the work is
    done once per set of rule schemas, not at every composition."""
    from hydra.core.config_store import ConfigStore

    global _registered
    schemas = tuple(CLIPPING_SCHEMAS.items())
    if schemas == _registered:
        return
    OmegaConf.register_new_resolver("atr_method", rundir.method_label, replace=True)
    OmegaConf.register_new_resolver("atr_mul", lambda a, b: a * b, replace=True)
    OmegaConf.register_new_resolver("atr_run_name", rundir.run_name, replace=True)
    OmegaConf.register_new_resolver("atr_cache", lambda name: str(cache_dir(name)), replace=True)
    OmegaConf.register_new_resolver("atr_rank_suffix", log_suffix, replace=True)
    # a sweep's folders (conf/train.yaml): each job writes in its run_dir, the sweep in the folder above it
    OmegaConf.register_new_resolver("atr_abspath", os.path.abspath, replace=True)
    OmegaConf.register_new_resolver("atr_parent", lambda path: str(Path(path).parent), replace=True)
    # ATR's box under min semantics, exact (Thm 4.1-4.2): `clipping.eps_low: ${atr_kl3_eps_low:0.07}`
    OmegaConf.register_new_resolver(
        "atr_kl3_eps_low", lambda delta: 1.0 - kl3_ratio_bounds(float(delta))[0], replace=True
    )
    OmegaConf.register_new_resolver(
        "atr_kl3_eps_high", lambda delta: kl3_ratio_bounds(float(delta))[1] - 1.0, replace=True
    )
    store = ConfigStore.instance()
    store.store(name="train_schema", node=_root_schema(TrainConfig))
    store.store(name="evaluate_schema", node=_root_schema(EvaluateConfig))
    # The groups are typed through the root schemas' fields; a clipping file picks its rule's schema with
    # `defaults: [/schema/clipping@_here_: <rule>]`, since the field itself cannot know the rule.
    for name, node in CLIPPING_SCHEMAS.items():
        store.store(group="schema/clipping", name=name, node=node)
        if not (CONF_DIR / "clipping" / f"{name}.yaml").exists():  # a rule with no file (a plugin's): its defaults
            store.store(group="clipping", name=name, node=node(name=name))
    _registered = schemas


def config_to_yaml(cfg: TrainConfig) -> str:
    """The resolved YAML of a config object (the inverse of `config_from_yaml`)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_from_yaml(text: str) -> TrainConfig:
    """A run's resolved config.yaml back into its dataclasses (what a stage process of the run reads)."""
    raw = OmegaConf.create(text)
    refuse_legacy_truncation(raw)
    schema = OmegaConf.structured(TrainConfig)
    name = raw.get("clipping", {}).get("name")
    if name not in CLIPPING_SCHEMAS:
        raise ConfigError(f"invalid config: clipping.name must be one of {', '.join(CLIPPING_SCHEMAS)}, got {name!r}")
    schema.clipping = OmegaConf.structured(CLIPPING_SCHEMAS[name])
    return to_object(OmegaConf.merge(schema, raw))


def refuse_legacy_truncation(raw: DictConfig) -> None:
    """A config.yaml from before `trainer.truncation` trained with another reward: it cannot be continued as is."""
    trainer = raw.get("trainer") or {}
    if "mask_truncated_completions" in trainer and "truncation" not in trainer:
        raise ConfigError(
            f"invalid config: this {rundir.CONFIG_FILE} predates trainer.truncation (it has "
            "trainer.mask_truncated_completions, and its reward graded the box of a truncated completion); start a new "
            "run, with trainer.truncation=credit_box to train as it did"
        )


def _refuse_unknown_keys(node: DictConfig, prefix: str = "") -> None:
    """A `+trainer.lr=...` override adds a key the schema lacks, which OmegaConf would carry along as a stray
    attribute that nothing reads; refuse it like a misspelled key."""
    schema = OmegaConf.get_type(node)
    allowed = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    for key, value in node.items_ex(resolve=False):
        if allowed is not None and key not in allowed:
            raise ConfigError(unknown_key_message(f"{prefix}{key}", schema))
        if isinstance(value, DictConfig) and not OmegaConf.is_missing(node, key) and OmegaConf.get_type(value):
            _refuse_unknown_keys(value, f"{prefix}{key}.")  # (get_type is None for a null section)


def drop_plan(cfg: DictConfig) -> None:
    """Drop the experiment's `plan` from a composed config (see PLAN_KEY)."""
    with flag_override(cfg, ["readonly", "struct"], False):
        cfg.pop(PLAN_KEY, None)


def to_object(cfg: DictConfig) -> Any:
    """Resolve a composed DictConfig into its dataclasses, running every validation; drops the experiment's
    `plan` from `cfg` (see PLAN_KEY), so a run's config.yaml written from `cfg` afterwards holds none."""
    drop_plan(cfg)
    _refuse_unknown_keys(cfg)
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:  # a missing mandatory value, an interpolation that fails
        raise ConfigError(f"invalid config: {err}") from err
