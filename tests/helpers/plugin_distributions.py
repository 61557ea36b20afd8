"""Distributions written as pip would leave them (a module and its `.dist-info`), for the tests of plugins: nothing
is installed, the folder goes on the path of this process or of a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def write_distribution(site: Path, dist: str, entry_points: dict[str, dict[str, str]], files: dict[str, str]) -> None:
    """`files` and `<dist>-0.1.dist-info` (METADATA, entry_points.txt) in `site`, as pip would install them."""
    for relative, text in files.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_text(text)
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"  # the folder name pip gives it
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = [
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in names.items()) for group, names in entry_points.items()
    ]
    (info / "entry_points.txt").write_text("\n".join(lines))


def child_env(site: Path) -> dict[str, str]:
    """This process's environment with `site` first on the child's PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def train_with_plugins(site: Path, *overrides: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`python -m atr_grpo.train OVERRIDES` in a child process that sees the distributions under `site`."""
    repo = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "atr_grpo.train", *overrides]
    return subprocess.run(command, cwd=repo, env=child_env(site), capture_output=True, text=True, timeout=timeout)
