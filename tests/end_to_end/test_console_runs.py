"""What `python -m atr_grpo.train` prints, for real, on the tiny model (CPU): each line once."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

TRAIN = [sys.executable, "-m", "atr_grpo.train", "experiment=smoke", "logger=none"]
# Hydra's console prefix of a log record: `[2026-01-01 12:00:00,000][atr_grpo.training.pipeline][WARNING] - `
LOG_PREFIX = re.compile(r"^\[[^\]]*\]\[[^\]]*\]\[[A-Z]+\] - ")


def printed_lines(result: subprocess.CompletedProcess) -> list[str]:
    """Every line a run printed (stdout and stderr), without Hydra's log prefix and without the progress lines,
    which repeat their stage's name by design."""
    lines = [LOG_PREFIX.sub("", line) for line in (result.stdout + result.stderr).splitlines()]
    return [line for line in lines if line.strip() and not re.match(r"^(GRPO|SFT|evaluation): ", line)]


def train(run_dir, *overrides) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TRAIN, f"run_dir={run_dir}", *overrides], cwd=REPO, capture_output=True, text=True, timeout=900
    )


def test_a_run_prints_each_warning_and_info_line_once_and_a_relaunch_one_final_line(tmp_path, smoke_sft_adapter):
    """rollout=on_policy warns that the rule cannot act: the warning appears once in the console (stdout and stderr
    together), as does every other log line. Launched again, the finished run ends with one line saying so."""
    run_dir = tmp_path / "run"
    result = train(run_dir, "rollout=on_policy", "eval=none")
    assert result.returncode == 0, result.stderr[-4000:]
    lines = printed_lines(result)
    assert sum("every update of this run is on-policy" in line for line in lines) == 1, lines
    assert [line for line, count in Counter(lines).items() if count > 1] == []
    assert lines[-1] == f"{run_dir}: training finished"

    again = train(run_dir, "rollout=on_policy", "eval=none")
    assert again.returncode == 0, again.stderr[-4000:]
    assert [line for line in printed_lines(again) if "finished" in line] == [f"{run_dir}: training already finished"]
