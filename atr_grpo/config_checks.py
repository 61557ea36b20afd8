"""The value checks of the config schemas: each refuses a bad value with ConfigError, naming the key, what it
must be and what it got (`invalid config: eval.k must be in [1, eval.n=8], got 9`)."""

from __future__ import annotations

from typing import Any

from atr_grpo.errors import ConfigError

# where data.datasets reads rows from: data.source / sft.source (sft.source may also be "none")
SOURCES = ("hub", "file", "arithmetic")


def check(ok: bool, key: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"invalid config: {key} must be {allowed}, got {value!r}")


def check_study(study: str) -> None:
    """`study=` (empty) would file the runs under no study, or silently under the experiment's."""
    check(
        bool(str(study).strip()),
        "study",
        "a non-empty name (the runs compared together; default: the experiment)",
        study,
    )


def check_seed(key: str, seed: int) -> None:
    check(0 <= seed < 2**32, key, "in [0, 2**32 - 1] (the seeds numpy and torch accept)", seed)


def require_positive(key: str, value: float) -> None:
    check(value > 0, key, "> 0", value)


def require_one_of(key: str, value: Any, options: tuple[str, ...]) -> None:
    check(value in options, key, "one of " + ", ".join(repr(o) for o in options), value)


def check_source(section: str, source: str, hub_id: str | None, path: str | None) -> None:
    """`hub` needs a hub id, `file` a path; a path with `hub` would be ignored, so it is refused."""
    if source == "hub":
        check(hub_id is not None, f"{section}.hub_id", f"set when {section}.source='hub'", hub_id)
        check(path is None, f"{section}.path", f"null when {section}.source='hub' (or {section}.source=file)", path)
    elif source == "file":
        check(path is not None, f"{section}.path", f"set when {section}.source='file'", path)


def require_exists(key: str, path: str) -> None:
    from pathlib import Path

    check(Path(path).expanduser().exists(), key, "an existing file or directory", path)


def looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id (`org/name`): absolute, relative with ./ or ../, or ~."""
    return path.startswith(("/", "./", "../", "~"))


# vLLM 0.31 refuses a sampling temperature above 2 (vllm/sampling_params.py)
VLLM_MAX_TEMPERATURE = 2.0


def check_vllm_temperature(value: float, key: str, why: str, hint: str = "") -> None:
    """vLLM refuses temperatures above 2 at the first request: refuse them before anything loads."""
    allowed = f"<= {VLLM_MAX_TEMPERATURE} with {why} (vLLM refuses more{hint})"
    check(value <= VLLM_MAX_TEMPERATURE, key, allowed, value)
