"""One process per run directory: the launch that holds `run.lock` runs, any other is refused before it writes a
thing and names the holder; the OS frees the lock of a killed process, and the next launch takes it over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import compose
from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.config_hydra import to_object
from atr_grpo.rundir import layout
from atr_grpo.training import pipeline

HOLD = (
    "import sys, time; from atr_grpo import rundir; "
    "rundir.lock_run_dir(sys.argv[1]); print('held', flush=True); time.sleep(600)"
)


@pytest.fixture
def holder(tmp_path):
    """Another process that holds tmp_path/run's lock; killed (SIGKILL) at the end if still running."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    yield run_dir, proc
    proc.kill()
    proc.wait()


def test_a_second_process_is_refused_naming_the_holder_and_writes_nothing(holder):
    run_dir, proc = holder
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(rundir.RunDirInUseError) as refused:
        rundir.lock_run_dir(run_dir)
    message = str(refused.value)
    assert f"{layout.lock_path(run_dir)} is locked by pid {proc.pid} on host {socket.gethostname()}" in message
    assert "wait for that run to end, or stop it" in message
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    assert list(before) == [layout.LOCK_FILE]


def test_a_killed_holders_lock_is_taken_over_with_a_warning_naming_it(holder):
    run_dir, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    warning = rundir.lock_run_dir(run_dir)
    try:
        assert warning is not None and f"named pid {proc.pid} on host {socket.gethostname()}" in warning
        assert json.loads(layout.lock_path(run_dir).read_text())["pid"] == os.getpid()
    finally:
        rundir.unlock_run_dir(run_dir)


def test_a_lock_given_back_names_no_one_and_is_taken_without_warning(tmp_path):
    run_dir = tmp_path / "run"
    assert rundir.lock_run_dir(run_dir) is None
    assert rundir.lock_run_dir(run_dir) is None, "the holder takes it again at no cost"
    rundir.unlock_run_dir(run_dir)
    assert layout.lock_path(run_dir).read_text() == ""
    taken = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(600)", "pass"), str(run_dir)])
    assert taken.returncode == 0
    assert rundir.lock_run_dir(run_dir) is None, "a process that exited holding it is not 'killed' (warned)"
    rundir.unlock_run_dir(run_dir)


def test_a_launch_on_a_locked_run_dir_is_refused_before_its_config_is_written(holder):
    run_dir, proc = holder
    cfg = compose(["experiment=smoke", f"run_dir={run_dir}", "logger=none"])
    with pytest.raises(rundir.RunDirInUseError, match=f"pid {proc.pid}"):
        pipeline.run_pipeline(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True))
    assert sorted(p.name for p in run_dir.iterdir()) == [layout.LOCK_FILE]


def refused(*args, **kwargs):
    raise PermissionError(13, "Permission denied")


@pytest.mark.parametrize("made", [False, True])
def test_a_run_dir_that_cannot_be_written_is_one_line_naming_it(tmp_path, monkeypatch, made):
    """A read-only folder, or one that cannot be made (the test runs as root too: the OS is told to refuse)."""
    run_dir = tmp_path / "run"
    if made:
        run_dir.mkdir()
        monkeypatch.setattr(os, "access", lambda path, mode: mode != os.W_OK)
    else:
        monkeypatch.setattr(Path, "mkdir", refused)
    with pytest.raises(rundir.RunFileError, match=r"run/run\.lock: cannot be written \(Permission denied\); choose a"):
        rundir.lock_run_dir(run_dir)
