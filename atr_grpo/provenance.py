"""Where a run started: the base model and the SFT adapter, recorded in env.json and checked before runs are paired.

Every method and seed of a model is meant to start GRPO from one adapter, and the paired statistics assume it.
The adapter's cache key names the config that built it, but the same config can train different weights (an
unseeded initialisation, another CPU type), so the weights are hashed too. env.json's `start_point`:

    {"base_model": "tiny/<fingerprint>" or a hub id / path,
     "base_model_sha256": <hash of the tiny model's weight files> (locally built models only),
     "sft_adapter": <cache key> or null (sft=none),
     "sft_adapter_sha256": <hash of the adapter's weight files> or null}

`weights_sha256` hashes the weight files only (`*.safetensors`, `*.bin`), by name and content in name order:
the configs beside them carry machine-specific paths.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atr_grpo import rundir

if TYPE_CHECKING:
    from atr_grpo.machine import Decision

START_KEY = "start_point"
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def weights_sha256(directory: str | Path) -> str:
    """sha256 over the weight files of a model or adapter directory (names and bytes, in name order)."""
    directory = Path(directory)
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"{directory}: no weight file ({', '.join(WEIGHT_SUFFIXES)})")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def loaded_models(cfg: Any, decision: Decision) -> dict[str, str]:
    """The weights each stage of a run (a TrainConfig) on `decision`'s backends loads, recorded in env.json: one
    and the same for all.

    The SFT stage and the evaluation load `resolve_model_path` through transformers or vLLM; GRPO through
    transformers (TRL path) or through Unsloth, which is told to load that name exactly (never its own mirror).
    """
    from atr_grpo.models import resolve_model_path

    path = resolve_model_path(cfg.model)
    grpo = path
    if decision.training_backend == "unsloth":
        from atr_grpo.training.unsloth_trainer import unsloth_model_arguments

        grpo = unsloth_model_arguments(cfg, decision.rollout_engine)["model_name"]
    return {"sft": path, "grpo": grpo, "evaluation": path}


def start_point(cfg: Any, adapter: Path | None) -> dict[str, Any]:
    """The `start_point` of a run of `cfg` (a TrainConfig) that starts from `adapter` (None: no SFT stage)."""
    from atr_grpo.models import resolve_model_path
    from atr_grpo.tiny_model import tiny_fingerprint
    from atr_grpo.training.sft import sft_cache_key

    model = cfg.model
    local = model.tiny is not None and model.path is None
    return {
        "base_model": f"tiny/{tiny_fingerprint(model.tiny)}" if local else model.path,
        "base_model_sha256": weights_sha256(resolve_model_path(model)) if local else None,
        "sft_adapter": sft_cache_key(cfg) if adapter is not None else None,
        "sft_adapter_sha256": weights_sha256(adapter) if adapter is not None else None,
    }


def record_start_point(run_dir: Path, start: dict[str, Any]) -> str | None:
    """Add `start` to the run's env.json; a resumed run keeps its first record and gets a warning (returned) when
    the adapter in the cache is no longer the one it started from."""
    path = Path(run_dir) / rundir.ENV_FILE
    env = rundir.read_json(path) if path.exists() else {}
    recorded = env.get(START_KEY)
    if recorded is None:
        env[START_KEY] = start
        rundir.write_json(path, env)
        return None
    if recorded != start:
        changed = sorted(k for k in start if recorded.get(k) != start[k])
        return (
            f"{run_dir} started from another base model or SFT adapter than the cache holds now "
            f"(differs: {', '.join(changed)}); {rundir.ENV_FILE} keeps the one it started from"
        )
    return None


def describe(start: dict[str, Any] | None) -> str:
    if start is None:
        return "not recorded"
    adapter = start.get("sft_adapter")
    sha = start.get("sft_adapter_sha256") or ""
    return f"{start.get('base_model')} + {adapter} (sha256 {sha[:12]})" if adapter else f"{start.get('base_model')}"


def identity(start: dict[str, Any]) -> tuple[Any, ...]:
    """What must agree for two runs to be paired: the base model and the adapter, by their weights."""
    return (start.get("base_model"), start.get("base_model_sha256"), start.get("sft_adapter_sha256"))


def read_start_point(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / rundir.ENV_FILE
    if not path.exists():
        return None
    return rundir.read_json(path).get(START_KEY)


def check_start_points(runs: list[Any]) -> tuple[list[str], list[str]]:
    """(errors, notes) for runs about to be paired (`Run`s: .path, .experiment, .model, .seed).

    Runs are paired by seed, so within one experiment, model and seed every run must have started from the same
    base model and adapter: an error names the runs of each starting point otherwise. Seeds may start from points
    of their own (sampled start points, e.g. `sft.seed: ${seed}`): a note says how many. Runs that record none
    (made before env.json recorded it) cannot be checked: a note says how many, and that their pairing assumes
    one starting point.
    """
    errors, notes = [], []
    groups: dict[tuple[str, str], list[Any]] = {}
    for run in runs:
        groups.setdefault((run.experiment, run.model), []).append(run)
    for (experiment, model), group in sorted(groups.items()):
        by_seed: dict[int, dict[tuple[Any, ...], list[str]]] = {}
        described: dict[tuple[Any, ...], str] = {}
        unrecorded = []
        for run in sorted(group, key=lambda r: r.path.name):
            start = read_start_point(run.path)
            if start is None:
                unrecorded.append(run.path.name)
                continue
            by_seed.setdefault(run.seed, {}).setdefault(identity(start), []).append(run.path.name)
            described[identity(start)] = describe(start)
        split = {seed: by_start for seed, by_start in sorted(by_seed.items()) if len(by_start) > 1}
        for seed, by_start in split.items():
            listing = "; ".join(f"{described[key]}: {', '.join(names)}" for key, names in by_start.items())
            errors.append(
                f"{experiment}/{model}, seed {seed}: the runs started from different base models or SFT adapters, "
                f"so they cannot be paired ({listing})"
            )
        if not split and len(described) > 1:
            notes.append(
                f"{experiment}/{model}: {len(described)} starting points over {len(by_seed)} seeds; the runs of "
                "each seed share theirs, so the pairing holds and the seed spread includes the start points'"
            )
        if unrecorded:
            notes.append(
                f"{experiment}/{model}: {len(unrecorded)} of {len(group)} runs record no starting adapter "
                f"({rundir.ENV_FILE} start_point; runs made before it was recorded): their pairing assumes that they "
                "all started from the same one"
            )
    return errors, notes
