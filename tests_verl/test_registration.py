"""`import verl` registers every rule of the registry, through this package's `verl.plugins` entry point."""

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from atr_grpo.clipping import RULES

pytest.importorskip("verl", reason="needs verl: run make test-verl")

PROBE = (
    "import json, sys, verl.trainer.ppo.core_algos as core; "
    "print(json.dumps([sorted(core.POLICY_LOSS_REGISTRY), 'atr_grpo.integrations.verl' in sys.modules]))"
)


def registry_after_import_verl(**env):
    """verl's policy-loss registry in a fresh process that imports verl only, and whether our module got loaded."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    names, loaded = json.loads(result.stdout.strip().splitlines()[-1])
    return set(names), loaded


def test_entry_point_is_declared():
    """The installed package declares the module under verl's plugin group."""
    declared = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert declared.get("atr_grpo") == "atr_grpo.integrations.verl"


def test_import_verl_registers_atr_grpo_loss_for_every_rule():
    """Exactly one `atr_grpo.<rule>` per registered rule, next to verl's own losses, with no import of ours."""
    names, loaded = registry_after_import_verl()
    assert loaded
    assert {name for name in names if name.startswith("atr_grpo.")} == {f"atr_grpo.{rule}" for rule in RULES}
    assert {"vanilla", "clip_cov", "gspo"} <= names


def test_plugins_disabled_means_no_atr_grpo_loss():
    """VERL_USE_EXTERNAL_PLUGINS=none switches the entry point off: the registration comes from it alone."""
    names, loaded = registry_after_import_verl(VERL_USE_EXTERNAL_PLUGINS="none")
    assert not loaded
    assert not {name for name in names if name.startswith("atr_grpo.")}
    assert "vanilla" in names


def test_the_reserved_parameter_names_cover_verls_policy_loss_config():
    """`register` refuses these names on any machine (tests/clipping/test_param_names.py); here they are checked
    against the installed verl's class, which the plugin adds one field per parameter name to."""
    import dataclasses

    from verl.workers.config import PolicyLossConfig

    from atr_grpo.clipping.param_names import VERL_POLICY_LOSS_NAMES

    names = {f.name for f in dataclasses.fields(PolicyLossConfig)} | set(dir(PolicyLossConfig))
    assert {name for name in names if not name.startswith("_")} <= set(VERL_POLICY_LOSS_NAMES)
