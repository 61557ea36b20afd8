"""A Hydra multirun over δ on the tiny CPU config, for real: two runs, each in its own directory named from
its overrides, each with its δ in config.yaml, its metrics and the DONE marker."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO
from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.rundir import layout

pytestmark = pytest.mark.slow


def test_delta_sweep_through_hydra_multirun(tmp_path, tiny_model_dir):
    overrides = ["experiment=smoke", "clipping.delta=0.05,0.09", "eval=none", "trainer.max_steps=2"]
    outputs = [f"hydra.sweep.dir={tmp_path}", f"run_dir={tmp_path}/${{run_name}}"]
    cmd = [sys.executable, "-m", "atr_grpo.train", "-m", *overrides, *outputs]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted(p.parent for p in tmp_path.glob(f"*/{rundir.CONFIG_FILE}"))
    names = [p.name for p in runs]
    assert names == [
        "smoke__atr-delta0.05__s0__eval=none,trainer.max_steps=2",
        "smoke__atr-delta0.09__s0__eval=none,trainer.max_steps=2",
    ]
    for path, delta in zip(runs, (0.05, 0.09)):
        assert OmegaConf.load(path / rundir.CONFIG_FILE).clipping.delta == delta
        assert len((path / rundir.METRICS_FILE).read_text().splitlines()) == 2
        assert (path / rundir.DONE_FILE).exists()


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory, tiny_model_dir):
    """The same two-job sweep launched twice into one folder (the second finds both runs finished)."""
    folder = tmp_path_factory.mktemp("sweeps")
    overrides = ["experiment=smoke", "seed=0,1", "eval=none", "logger=none", "trainer.max_steps=2"]
    outputs = [f"hydra.sweep.dir={folder}", f"run_dir={folder}/${{run_name}}"]
    cmd = [sys.executable, "-m", "atr_grpo.train", "-m", *overrides, *outputs]
    return folder, [subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600) for _ in range(2)]


def test_a_sweep_ends_with_a_table_of_its_jobs_run_dirs_and_statuses(two_sweeps):
    folder, (first, _) = two_sweeps
    assert first.returncode == 0, first.stderr[-3000:]
    table = first.stdout[first.stdout.index("sweep of 2 jobs:") :].splitlines()
    name = "smoke__atr__s{}__eval=none,trainer.max_steps=2"
    assert [line.split() for line in table[1:]] == [
        ["job", "run", "dir", "status"],
        ["1", str(folder / name.format(0)), "finished"],
        ["2", str(folder / name.format(1)), "finished"],
        ["multirun.yaml", "kept", "in", str(folder)],
    ]


def test_each_sweep_into_a_folder_keeps_its_config(two_sweeps):
    """Hydra rewrites multirun.yaml at each sweep; the config of every sweep is kept beside it."""
    folder, sweeps = two_sweeps
    assert all(sweep.returncode == 0 for sweep in sweeps)
    kept = sorted(folder.glob("multirun.*.yaml"))
    assert len(kept) == 2 and all(path.read_text() == (folder / "multirun.yaml").read_text() for path in kept)


def test_a_sweep_given_only_run_dir_writes_each_run_in_its_run_dir(tmp_path, tiny_model_dir):
    """`run_dir=<folder>/${run_name}` alone (as docs/rules.md writes it): each job's train.log is in its run_dir,
    multirun.yaml in the folder above them, and nothing lands in the checkout's results/runs/."""
    runs = REPO / "results" / "runs"
    before = sorted(runs.rglob("*")) if runs.exists() else []
    overrides = ["experiment=smoke", "seed=0,1", "eval=none", "logger=none", "trainer.max_steps=1"]
    cmd = [sys.executable, "-m", "atr_grpo.train", "-m", *overrides, f"run_dir={tmp_path}/runs/${{run_name}}"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    name = "smoke__atr__s{}__eval=none,trainer.max_steps=1"
    for seed in (0, 1):
        run_dir = tmp_path / "runs" / name.format(seed)
        assert (run_dir / rundir.DONE_FILE).exists() and "training" in (run_dir / "train.log").read_text()
    assert (tmp_path / "runs" / layout.SWEEP_CONFIG_FILE).is_file()
    assert f"multirun.yaml kept in {tmp_path / 'runs'}" in done.stdout
    assert (sorted(runs.rglob("*")) if runs.exists() else []) == before
