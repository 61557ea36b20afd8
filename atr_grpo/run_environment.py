"""What a run's `env.json` records of the machine it ran on: package versions, the source commit, the interpreter,
the CPU and its kernel choice, the GPU, the processes of the launch."""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from atr_grpo.distributed import world_size

TRACKED_PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "math-verify",
    "latex2sympy2_extended",
    "hydra-core",
    "wandb",
    "unsloth",
    "unsloth_zoo",
    "vllm",
)


def package_versions(names: Iterable[str] = TRACKED_PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The commit of the source tree, with '-dirty' when it has uncommitted changes; None outside git."""
    cwd = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo on Linux, else what `platform` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def device_info(threads: int | None = None) -> dict[str, Any]:
    """The device of a run. Float results are bit-identical only on the same CPU type and thread count:
    `cpu_capability` is the vector instruction set torch's CPU kernels dispatch to (AVX512, AVX2, ...), which vLLM's
    choice follows too; `cpu_threads` is the run's own thread count (trainer.num_threads) when it sets one, else
    torch's."""
    import torch

    from atr_grpo.numeric_paths import kernel_choice

    info: dict[str, Any] = {
        "cuda": torch.cuda.is_available(),
        "cpu_threads": threads or torch.get_num_threads(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernel_choice": kernel_choice(),  # ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA where set
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        info["cuda_version"] = torch.version.cuda
    return info


def environment(threads: int | None = None) -> dict[str, Any]:
    """What env.json records: versions, commit, interpreter, device (`device_info`, with the run's thread count) and
    the time of this launch."""
    return {
        "packages": package_versions(),
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": device_info(threads),
        "world_size": world_size(),  # processes of this launch (torchrun / accelerate launch), 1 without one
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
    }
