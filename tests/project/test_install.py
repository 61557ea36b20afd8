"""`make install`'s recipe, read with `make -n` (nothing runs): on a CPU machine Unsloth goes in without its
dependencies after every other pip install, so that no later install makes pip list the GPU requirements it leaves
out (bitsandbytes, xformers, ...) as conflicts; a GPU machine installs the full extra."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="reads the Makefile with make -n")


def pip_commands(tmp_path: Path, has_gpu: str) -> list[str]:
    """The arguments of each pip command `make install` would run in a new venv, in order."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "install", f"VENV={venv}", f"HAS_GPU={has_gpu}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    pip = f"{venv}/bin/pip "
    return [line.split(pip, 1)[1] for line in result.stdout.splitlines() if line.startswith(pip)]


def test_on_a_cpu_machine_unsloth_goes_in_last_and_alone_without_dependencies(tmp_path):
    commands = pip_commands(tmp_path, has_gpu="")
    assert commands[-1] == "install -q --no-deps unsloth==2026.10.9 unsloth_zoo==2026.10.9"
    assert not any("--no-deps" in command or "unsloth" in command for command in commands[:-1])
    assert "install -q -e '.[dev,cpu]' torch==2.13.0" in commands


def test_on_a_gpu_machine_unsloth_comes_with_its_dependencies(tmp_path):
    commands = pip_commands(tmp_path, has_gpu="1")
    assert commands[-1] == "install -q -e '.[dev,gpu]'"
    assert not any("--no-deps" in command for command in commands)
