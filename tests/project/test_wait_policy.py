"""Every entry point imports `atr_grpo` before torch, and `atr_grpo` makes idle OpenMP threads sleep
(OMP_WAIT_POLICY=PASSIVE) unless the user chose a policy: runs that share the cores wait politely."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

PROBE = "import atr_grpo, os, sys; print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"


def _policy(env_policy: str | None, module: str = "atr_grpo") -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    probe = PROBE.replace("import atr_grpo", f"import {module}")
    return subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def test_atr_grpo_sets_passive_before_torch_is_loaded():
    assert _policy(None) == "PASSIVE False\n"


def test_a_policy_the_user_set_is_kept():
    assert _policy("ACTIVE") == "ACTIVE False\n"


def test_the_train_entry_point_gets_passive():
    assert _policy(None, "atr_grpo.train").startswith("PASSIVE ")
