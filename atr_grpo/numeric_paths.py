"""Which CPU kernels a process computes with, and how to choose another host's.

Float results on a CPU depend on the kernels torch, MKL and oneDNN pick for the processor. Three variables, read
when those libraries load, choose them instead. So one host can run the numeric path of another CPU type (not bit
for bit: an AMD host's AVX2 path is not an Intel host's), and a result can be checked for hanging on float noise.
"""

from __future__ import annotations

import os

KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")

NUMERIC_PATHS: dict[str, dict[str, str]] = {
    "native": {},  # what the libraries pick for this processor
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "baseline": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},  # scalar ATen kernels, MKL's plain path
}


# the values ATen's dispatcher takes (aten/src/ATen/native/DispatchStub.cpp); any other it ignores with a warning,
# computing on the native path while the run would record the value as its kernel choice
ATEN_CAPABILITIES = ("default", "avx2", "avx512", "vsx", "zvector", "sve256")


def check_kernel_choice() -> None:
    """Refuse an ATEN_CPU_CAPABILITY that torch would ignore (ConfigError naming the allowed values)."""
    from atr_grpo.errors import ConfigError

    value = os.environ.get("ATEN_CPU_CAPABILITY")
    if value is not None and value not in ATEN_CAPABILITIES:
        raise ConfigError(
            f"invalid environment: ATEN_CPU_CAPABILITY={value!r} is not a value torch's CPU kernels take "
            f"({', '.join(ATEN_CAPABILITIES)}); torch would ignore it and compute on the native path. "
            "Unset it, or choose a numeric path by name (scripts/numeric_paths.py)"
        )


def numeric_path(device: dict) -> dict:
    """What decides a run's CPU numerics, from env.json's `device` (`run_environment.device_info`): the instruction
    set torch dispatches to and the kernel-choosing variables."""
    return {"cpu_capability": device.get("cpu_capability"), "kernel_choice": device.get("kernel_choice") or {}}


def kernel_choice() -> dict[str, str]:
    """The kernel-choosing variables set in this process (empty: the native path)."""
    return {name: os.environ[name] for name in KERNEL_VARIABLES if name in os.environ}


def path_environment(path: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with only `path`'s kernel variables set."""
    if path not in NUMERIC_PATHS:
        raise ValueError(f"numeric path must be one of {', '.join(NUMERIC_PATHS)}, got {path!r}")
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in KERNEL_VARIABLES}
    return {**env, **NUMERIC_PATHS[path]}
