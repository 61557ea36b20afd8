"""What `python -m atr_grpo.train` and `python -m atr_grpo.evaluate` print, for real, on the tiny model (CPU): each
line once; and a Ctrl-C during start-up (checking the config, loading the model, building the data, the SFT stage)
ends in one line that names the part interrupted, with no traceback, and the same command then resumes the run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

TRAIN = [sys.executable, "-m", "atr_grpo.train", "experiment=smoke", "logger=none"]
# Hydra's console prefix of a log record: `[2026-01-01 12:00:00,000][atr_grpo.training.pipeline][WARNING] - ` in a
# job, `[2026-01-01 12:00:00,000][HYDRA] ` before it
LOG_PREFIX = re.compile(r"^\[[^\]]*\]\[[^\]]*\](\[[A-Z]+\] -)? ")
# `python -m ENTRY ARGS` (atr_grpo.train unless ENTRY=... comes first) with one function of the run replaced by a
# Ctrl-C: SIGINT sent to itself
INTERRUPTED_IN = """
import os, runpy, signal, sys, time
import importlib

module, name = sys.argv[1].rsplit(".", 1)
entry, args = "atr_grpo.train", sys.argv[2:]
if args and args[0].startswith("ENTRY="):
    entry, args = args[0][len("ENTRY="):], args[1:]

def interrupt(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)

setattr(importlib.import_module(module), name, interrupt)
sys.argv = [entry, *args]
runpy.run_module(entry, run_name="__main__")
"""


def printed_lines(result: subprocess.CompletedProcess) -> list[str]:
    """Every line a run printed (stdout and stderr), without Hydra's log prefix and without the progress lines,
    which repeat their stage's name by design."""
    lines = [LOG_PREFIX.sub("", line) for line in (result.stdout + result.stderr).splitlines()]
    return [line for line in lines if line.strip() and not re.match(r"^(GRPO|SFT|evaluation): ", line)]


def train(run_dir, *overrides) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TRAIN, f"run_dir={run_dir}", *overrides], cwd=REPO, capture_output=True, text=True, timeout=900
    )


def interrupted_line(run_dir, stage: str) -> str:
    return (
        f"interrupted during {stage} of {run_dir} (before the first GRPO step); no checkpoint yet; "
        "run the same command to start it again"
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
    assert result.stdout.splitlines()[-1] == f"{run_dir}: training finished"  # the summary, on stdout

    again = train(run_dir, "rollout=on_policy", "eval=none")
    assert again.returncode == 0, again.stderr[-4000:]
    assert [line for line in printed_lines(again) if "finished" in line] == [f"{run_dir}: training already finished"]


def test_an_evaluation_prints_each_line_once(tmp_path, smoke_sft_adapter):
    """`python -m atr_grpo.evaluate` of an adapter says once which step it evaluates and how that step was read
    (its inputs are checked before Hydra's job and again in it), and prints every other line once."""
    command = [sys.executable, "-m", "atr_grpo.evaluate", "model=tiny", "eval=arithmetic", "eval.max_problems=4"]
    command += ["eval.n=2", "eval.k=2", f"adapter={smoke_sft_adapter}", f"out_dir={tmp_path / 'eval'}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = printed_lines(result)
    said = f"evaluating step 0 (from its sft_info.json (an SFT adapter is where GRPO starts)) of {smoke_sft_adapter}"
    assert [line for line in lines if line.startswith(("evaluating step", "adapter "))] == [said]
    assert [line for line, count in Counter(lines).items() if count > 1] == []


def test_ctrl_c_during_an_evaluation_ends_in_one_line_naming_what_the_folder_keeps(tmp_path):
    """`python -m atr_grpo.evaluate` of the base model at step 0, then at step 2 into the same folder with a SIGINT
    while it samples: exit status 130, no traceback, one line naming the part interrupted and step 0's evaluation,
    which the folder keeps; the same command then evaluates step 2."""
    out_dir = tmp_path / "eval"
    command = ["model=tiny", "eval=arithmetic", "eval.max_problems=4", "eval.n=2", "eval.k=2", f"out_dir={out_dir}"]
    evaluate = [sys.executable, "-m", "atr_grpo.evaluate", *command]
    first = subprocess.run(evaluate, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-4000:]
    replaced = "atr_grpo.evaluation.run_evaluation"
    interrupted = [sys.executable, "-c", INTERRUPTED_IN, replaced, "ENTRY=atr_grpo.evaluate", *command, "step=2"]
    result = subprocess.run(interrupted, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 130, result.stderr[-4000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"interrupted during sampling and grading of the evaluation into {out_dir}; kept in "
        f"{out_dir}/eval/summary.jsonl: step 0 arithmetic; run the same command to resume"
    )

    resumed = subprocess.run([*evaluate, "step=2"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    steps = [json.loads(line)["step"] for line in (out_dir / "eval" / "summary.jsonl").read_text().splitlines()]
    assert steps == [0, 2]


@pytest.mark.parametrize(
    ("replaced", "stage"),
    [
        ("atr_grpo.models.load_model_and_tokenizer", "loading the model"),
        ("atr_grpo.data.datasets.grpo_dataset", "building the data"),
    ],
)
def test_ctrl_c_while_the_model_loads_or_the_data_is_built_ends_in_one_line(
    tmp_path, smoke_sft_adapter, replaced, stage
):
    """A SIGINT while the GRPO stage loads its model or builds its prompts: exit status 130, the one line naming
    that part, no traceback; the same command then trains the run to its end."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-c", INTERRUPTED_IN, replaced, *TRAIN[3:], f"run_dir={run_dir}", "eval=none"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 130, result.stderr[-4000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.splitlines()[-1] == interrupted_line(run_dir, stage)

    resumed = train(run_dir, "eval=none")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert resumed.stdout.splitlines()[-1] == f"{run_dir}: training finished"


def test_ctrl_c_while_the_config_is_checked_ends_in_one_line(tmp_path):
    """A SIGINT while the entry point checks what this machine can run (before Hydra's job, before the run is
    known): exit status 130, one line, no traceback, no run directory."""
    run_dir = tmp_path / "run"
    replaced = "atr_grpo.machine.check_launch_here"
    command = [sys.executable, "-c", INTERRUPTED_IN, replaced, *TRAIN[3:], f"run_dir={run_dir}", "eval=none"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 130, result.stderr[-4000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert printed_lines(result) == [
        "interrupted during start-up, before the run began; run the same command to start it"
    ]
    assert not run_dir.exists()


def test_ctrl_c_while_the_tiny_base_model_is_built_names_that_part_and_the_pretraining_lost(tmp_path):
    """A SIGINT while the tiny base model pretrains (in a cache of its own, before the run is set up): exit status
    130, one line naming that part and the pretraining lost; the folder holds Hydra's log alone."""
    run_dir = tmp_path / "run"
    replaced = "atr_grpo.tiny_model._build_tiny"
    command = [sys.executable, "-c", INTERRUPTED_IN, replaced, *TRAIN[3:], f"run_dir={run_dir}", "eval=none"]
    env = {**os.environ, "ATR_GRPO_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 130, result.stderr[-4000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"interrupted during building the tiny base model of {run_dir} (before the first GRPO step); the tiny base "
        "model's pretraining so far is lost; no checkpoint yet; run the same command to start it again"
    )
    assert [path.name for path in run_dir.iterdir()] == ["train.log"]


def test_ctrl_c_in_a_sweep_ends_with_its_table_the_job_interrupted_and_those_not_started(tmp_path):
    """A SIGINT in the first job of a three-job `-m` sweep: exit status 130, the job's line, then the sweep's table:
    that job interrupted, the others not started (by the overrides that set them apart)."""
    replaced = "atr_grpo.training.pipeline.preflight"
    sweep = ["-m", *TRAIN[3:], "eval=none", "seed=0,1,2", f"run_dir={tmp_path}/${{run_name}}"]
    result = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IN, replaced, *sweep], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 130, result.stderr[-4000:]
    assert "Traceback" not in result.stdout + result.stderr
    run_dir = tmp_path / "smoke__atr__s0__eval=none"
    assert [line.split() for line in result.stderr.splitlines()[-6:]] == [
        f"interrupted during start-up of {run_dir} (before the first GRPO step); no checkpoint yet; run the same "
        "command to start it again".split(),
        ["sweep", "of", "3", "jobs:"],
        ["job", "run", "dir", "status"],
        ["1", str(run_dir), "interrupted"],
        ["2", "seed=1", "not", "started"],
        ["3", "seed=2", "not", "started"],
    ]


def test_ctrl_c_during_the_sft_stage_ends_in_one_line(tmp_path, tiny_model_dir):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once the SFT stage process prints its
    first line: exit status 130, the one line naming the SFT stage, no traceback from either process, and no
    adapter cached."""
    run_dir, sft_cache = tmp_path / "run", tmp_path / "sft"  # a cache of its own: the SFT stage always trains
    command = [*TRAIN, f"run_dir={run_dir}", f"sft.cache_dir={sft_cache}", "eval=none"]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("SFT: "):
            os.killpg(process.pid, signal.SIGINT)
            break
    stdout, stderr = process.communicate(timeout=300)
    result = subprocess.CompletedProcess(command, process.returncode, stdout, "".join(seen) + stderr)
    assert result.returncode == 130, result.stderr[-4000:]
    assert "Traceback" not in result.stdout + result.stderr, result.stderr[-4000:]
    assert result.stderr.splitlines()[-1] == interrupted_line(run_dir, "the SFT stage")
    assert not list(sft_cache.glob("*/adapter_config.json"))
