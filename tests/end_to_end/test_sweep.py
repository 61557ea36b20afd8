"""A Hydra multirun over δ on the tiny CPU config, for real: two runs, each in its own directory named from
its overrides, each with its δ in config.yaml, its metrics and the DONE marker."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO
from omegaconf import OmegaConf

from atr_grpo import rundir

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
