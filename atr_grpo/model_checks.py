"""Checks of a model's modules before its weights load: LoRA target names that match nothing, and an adapter
given a base model it was not trained on.

Both read the model's architecture from its config alone (`meta_model`: every module, no weights), so a wrong
setting is refused in a second, with the names involved, instead of PEFT skipping modules silently (a misspelled
target, an adapter's layers the model lacks) or failing on a size mismatch after the model has loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from atr_grpo.config_inputs import ModelConfig
from atr_grpo.errors import ConfigError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def meta_model(cfg: ModelConfig) -> Any:
    """The model's modules, built from its config on the meta device (no memory, nothing downloaded but the
    config)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from atr_grpo.models import resolve_model_path

    path = resolve_model_path(cfg)
    try:
        config = AutoConfig.from_pretrained(path)
    except OSError as err:  # offline, no such model, no config.json
        reason = (str(err).splitlines() or [type(err).__name__])[0][:200]
        raise ConfigError(f"invalid config: model.path: cannot read the config of {path} ({reason})") from None
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _linear_names(model: Any) -> set[str]:
    import torch

    return {name.rpartition(".")[2] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}


def check_lora_targets(cfg: ModelConfig, model: Any | None = None) -> None:
    """Every `model.lora.target_modules` entry names a linear module of the model (PEFT applies the entries that
    match and silently ignores the others)."""
    model = meta_model(cfg) if model is None else model
    names = _linear_names(model)
    unknown = [target for target in cfg.lora.target_modules if target not in names]
    if unknown:
        raise ConfigError(
            f"invalid config: model.lora.target_modules: {', '.join(map(repr, unknown))} match no module of "
            f"{cfg.path or 'the tiny model'}; its linear modules: {', '.join(sorted(names))}"
        )


def _adapter_shapes(adapter: Path) -> dict[str, list[int]]:
    """Tensor name → shape, from the adapter's safetensors header (the tensors are not read)."""
    import struct

    with (adapter / ADAPTER_WEIGHTS).open("rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    return {name: entry["shape"] for name, entry in header.items() if name != "__metadata__"}


def adapter_problem(adapter: Path, model: Any) -> str | None:
    """What of the adapter's LoRA weights `model` has no module for, or no module of their shape, or None."""
    import torch

    for name, shape in sorted(_adapter_shapes(adapter).items()):
        module_path, _, kind = name.removeprefix("base_model.model.").rpartition(".lora_")
        if not kind:
            continue  # not a LoRA weight (a saved embedding or head, checked by PEFT itself)
        try:
            module = model.get_submodule(module_path)
        except AttributeError:
            return f"the model has no module {module_path}"
        if not isinstance(module, torch.nn.Linear):
            continue
        expected = module.in_features if kind.startswith("A") else module.out_features
        found = shape[1] if kind.startswith("A") else shape[0]
        if found != expected:
            return f"{name} has {found} features where {module_path} has {expected}"
    return None


def check_adapter_base(cfg: ModelConfig, adapter: str | Path) -> None:
    """Refuse an adapter whose LoRA weights do not fit the given base model, naming both base models."""
    adapter = Path(adapter)
    config_path = adapter / ADAPTER_CONFIG
    try:
        trained_on = json.loads(config_path.read_text(encoding="utf-8")).get("base_model_name_or_path") or (
            f"a base model its {ADAPTER_CONFIG} does not name"
        )
    except (OSError, ValueError) as err:
        raise ConfigError(f"invalid config: adapter: {config_path} cannot be read ({err})") from None
    if not (adapter / ADAPTER_WEIGHTS).is_file():
        raise ConfigError(f"invalid config: adapter: {adapter} holds no {ADAPTER_WEIGHTS}")
    problem = adapter_problem(adapter, meta_model(cfg))
    if problem is not None:
        given = cfg.path or f"the tiny model ({cfg.name})"
        raise ConfigError(
            f"invalid config: adapter {adapter} was trained on {trained_on} and does not fit model={cfg.name} "
            f"({given}): {problem}; evaluate it with the base model it was trained on"
        )
