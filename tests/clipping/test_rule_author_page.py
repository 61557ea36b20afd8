"""docs/rules.md, the rule author's page, is run, not only read. Its code blocks are written where their first line
says; the example rule registers, passes the page's oracle test and the registry-wide checks, and trains in the
smoke run from the page's YAML. The page documents every trait of `ClipRule`, every family, the metric keys and the
reserved names, and what it says of metric pooling is what the trainer does."""

from __future__ import annotations

import importlib
import math
import re
import shlex
import subprocess
import sys
from unittest.mock import patch

import pytest
import torch
from conftest import REPO
from helpers.compiled_loss import compiled_equals_trl, compiled_left_packed, loaded_zoo
from helpers.plugin_distributions import train_with_plugins, write_distribution
from helpers.rule_checks import (
    CORRECTIONS_UNDER_TEST,
    acts_at_its_declared_bounds,
    finite_on_extreme_inputs,
    independent_of_padding,
    reinforce_on_policy,
    weighted_by_each_correction,
)
from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.clipping import METRIC_KEYS, RULES, ClipRule
from atr_grpo.clipping.base import FAMILIES
from atr_grpo.clipping.param_names import reserved_names
from atr_grpo.plugins import RULE_GROUP
from atr_grpo.rule_docs import rule_listing, table_row
from atr_grpo.training.step_stats import reduction

PAGE = REPO / "docs" / "rules.md"
RULE_FILE, YAML_FILE, TEST_FILE = (
    "atr_grpo/clipping/log_clip.py",
    "conf/clipping/log_clip.yaml",
    "tests/clipping/test_log_clip.py",
)
EXAMPLE = "log_clip"
# the methods a rule may override, besides the class attributes ClipRule declares
OVERRIDABLE = ("terms", "validate", "ratio_bounds", "old_prob_bounds", "bounds_text")

_BLOCK = re.compile(r"^```\w*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_FILE_LINE = re.compile(r"# (\S+\.(?:py|yaml))")


@pytest.fixture(scope="module")
def zoo():
    """unsloth_zoo's loss module, for the test that runs the example rule inside the compiled loss."""
    with loaded_zoo() as zoo_loss:
        yield zoo_loss


def page_files() -> dict[str, str]:
    """{path: text} of each code block of the page whose first line is a comment naming a file."""
    files = {}
    for body in _BLOCK.findall(PAGE.read_text()):
        named = _FILE_LINE.fullmatch(body.splitlines()[0])
        if named:
            files[named.group(1)] = body
    return files


def section(title: str) -> str:
    """The text of the page's `## title` section."""
    text = PAGE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


@pytest.fixture
def example_rule(tmp_path, monkeypatch):
    """The page's rule module imported from a folder on sys.path: the rule is registered for the test only."""
    folder = tmp_path / "site"
    folder.mkdir()
    files = page_files()
    (folder / "log_clip_from_page.py").write_text(files[RULE_FILE])
    (folder / "oracle_test_from_page.py").write_text(files[TEST_FILE])
    monkeypatch.syspath_prepend(str(folder))
    with patch.dict(RULES):
        assert EXAMPLE not in RULES
        importlib.import_module("log_clip_from_page")
        yield RULES[EXAMPLE]
    for name in ("log_clip_from_page", "oracle_test_from_page"):
        sys.modules.pop(name, None)
    assert EXAMPLE not in RULES


# ------------------------------------------------------------------------------------------ the example
def test_the_page_shows_a_rule_module_its_yaml_and_its_oracle_test():
    files = page_files()
    assert set(files) == {RULE_FILE, YAML_FILE, TEST_FILE}
    yaml = OmegaConf.create(files[YAML_FILE])
    assert list(yaml.defaults) == [{"/schema/clipping@_here_": EXAMPLE}, "_self_"]
    assert (yaml.name, yaml.eps) == (EXAMPLE, 0.2)


def test_the_example_registers_and_passes_the_pages_oracle_test(example_rule):
    assert (example_rule.family, example_rule.summary, [p.name for p in example_rule.params]) == (
        "ratio",
        "|log w| ≤ ε",
        ["eps"],
    )
    oracle = importlib.import_module("oracle_test_from_page")
    tests = [test for name, test in vars(oracle).items() if name.startswith("test_")]
    assert len(tests) == 1
    for test in tests:
        test()


def test_the_example_passes_the_registry_wide_checks(example_rule):
    """The checks every registered rule gets: its bounds are where it acts, it is REINFORCE on-policy, it stays
    finite on extreme inputs, it does not see the padding layout, and a rollout correction multiplies its loss."""
    acts_at_its_declared_bounds(EXAMPLE)
    reinforce_on_policy(EXAMPLE)
    for dtype in (torch.float32, torch.bfloat16):
        finite_on_extreme_inputs(EXAMPLE, dtype)
    independent_of_padding(EXAMPLE)
    for correction in CORRECTIONS_UNDER_TEST[:4]:
        weighted_by_each_correction(EXAMPLE, correction)


def test_the_example_is_listed_with_its_trust_region(example_rule):
    listing = rule_listing([EXAMPLE])
    assert listing.splitlines()[:2] == ["log_clip  (log_clip_from_page, family ratio)", "  |log w| ≤ ε"]
    assert "eps = 0.2  a finite number > 0; the bound on |log w|" in listing
    assert "trust region at the defaults: w ∈ [0.819, 1.221]" in listing
    assert table_row(EXAMPLE).startswith("| `log_clip` | `log_clip_from_page` | ratio | \\|log w\\| ≤ ε | `eps=0.2` |")


@pytest.mark.slow
def test_the_example_gives_the_trl_paths_loss_inside_the_compiled_unsloth_loss(example_rule, request):
    zoo_loss = request.getfixturevalue("zoo")
    compiled_equals_trl(zoo_loss, EXAMPLE)
    compiled_left_packed(zoo_loss, EXAMPLE)


@pytest.mark.slow
def test_the_example_trains_in_the_smoke_run_from_the_pages_yaml(tmp_path, smoke_sft_adapter):
    """The module, from a distribution's entry point on a child process's path, and the YAML, in a --config-dir
    as `clipping/from_page.yaml`: only that file offers `clipping=from_page`, so the run reads the page's YAML,
    schema line included. The run writes the rule's metrics every step, its own included."""
    files = page_files()
    site = tmp_path / "site"
    write_distribution(site, "log-clip-example", {RULE_GROUP: {EXAMPLE: "log_clip"}}, {"log_clip.py": files[RULE_FILE]})
    (tmp_path / "conf" / "clipping").mkdir(parents=True)
    (tmp_path / "conf" / "clipping" / "from_page.yaml").write_text(files[YAML_FILE])
    run_dir = tmp_path / "run"
    command = ["--config-dir", str(tmp_path / "conf"), "experiment=smoke", "clipping=from_page", f"run_dir={run_dir}"]
    result = train_with_plugins(site, *command)
    assert result.returncode == 0, result.stderr[-4000:]
    config = OmegaConf.load(run_dir / "config.yaml")
    assert (config.clipping.name, config.clipping.eps, config.method) == (EXAMPLE, 0.2, EXAMPLE)
    rows = [row for row in rundir.read_jsonl(run_dir / rundir.METRICS_FILE) if "clip/frac" in row]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows:
        for key in (*METRIC_KEYS, "log_clip/abs_log_ratio"):
            assert isinstance(row[key], float) and math.isfinite(row[key]), (key, row)
    assert max(row["log_clip/abs_log_ratio"] for row in rows) > 0  # steps 2 and 4 reuse a rollout: w moved


# ------------------------------------------------------------------------------------- after the example
def page_commands() -> list[str]:
    """Each command line of the page's bash blocks, its comment left out."""
    blocks = re.findall(r"^```bash\n(.*?)^```$", PAGE.read_text(), re.MULTILINE | re.DOTALL)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_page_says_to_rename_the_example_which_the_page_test_registers():
    intro = PAGE.read_text().split("\n## ")[0]
    assert "rename everything the example names `log_clip`" in intro and "test_rule_author_page.py" in intro


def test_the_pages_test_command_runs_the_oracle_test_and_the_registry_wide_checks_of_one_rule():
    """`make test-rule RULE=<name>`, run here for one rule of the registry, collects its registry-wide checks (the
    oracle test file `tests/clipping/test_<name>.py` is matched by its name too) and no other rule's."""
    (command,) = [line for line in page_commands() if line.startswith("make test-rule")]
    assert command == "make test-rule RULE=my_clip"
    dry = subprocess.run(["make", "-n", "test-rule", "RULE=cispo"], cwd=REPO, capture_output=True, text=True)
    (pytest_line,) = [line for line in dry.stdout.splitlines() if " -m pytest " in line]
    argv = shlex.split(pytest_line.replace(" -n 2", ""))
    collected = subprocess.run(
        [sys.executable, *argv[1:], "--collect-only", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    for check in (
        "tests/clipping/test_clipping_math.py::test_on_policy_every_ratio_rule_is_reinforce[cispo]",
        "tests/config/test_config.py::test_every_rule_file_composes_with_the_source_defaults[cispo]",
        "tests/training/test_unsloth_path.py::test_compiled_unsloth_loss_equals_trl_path[cispo]",
    ):
        assert check in ids, (check, collected.stdout[-2000:])
    assert not [line for line in ids if "[atr]" in line]


def test_the_pages_cpu_training_command_is_a_sweep_a_cpu_launch_accepts():
    """The command that trains the new rule beside clip on CPU, here for a registered rule: both jobs compose and
    pass the launch checks of a machine without a GPU, in the tiny model's experiment with power2's length."""
    from atr_grpo.config_hydra import to_object
    from atr_grpo.hydra_app import compose, sweep_jobs
    from atr_grpo.machine import Machine, check_launch_here

    (command,) = [line for line in page_commands() if line.startswith("python -m atr_grpo.train")]
    arguments = shlex.split(command.replace("my_clip", "cispo"))[3:]
    assert arguments[0] == "-m"
    configs = [to_object(compose("train", job)) for job in sweep_jobs(arguments[1:])]
    for cfg in configs:
        check_launch_here(cfg, Machine(cuda=False, unsloth=False, vllm=False))
        assert cfg.experiment == "power2" and cfg.trainer.max_steps >= 128
    assert [cfg.clipping.name for cfg in configs] == ["clip", "cispo"]


# ------------------------------------------------------------------------------------------- the contract
def test_every_trait_of_a_rule_has_its_item_on_the_page():
    """Each class attribute `ClipRule` declares and each method a rule overrides is a list item of the page."""
    text = section("Traits")
    traits = [*ClipRule.__annotations__, *OVERRIDABLE]
    assert {"name", "family", "params", "needs", "acts_on_policy", "summary", "source"} <= set(traits)
    missing = [trait for trait in traits if not re.search(rf"^- `{trait}(\([^)]*\))?`: ", text, re.MULTILINE)]
    assert missing == []


def test_every_family_has_its_row_and_every_reserved_name_is_named():
    families = section("Families")
    assert [family for family in FAMILIES if f"\n| `{family}` | " not in families] == []
    reserved = section("Reserved names")
    assert [name for name in reserved_names() if f"`{name}`" not in reserved] == []


def test_the_metric_naming_rule_is_the_trainers():
    """The page's keys and their pooling: every common key named, and a suffix `min` / `max` pooled as said."""
    metrics = section("Metrics")
    assert [key for key in METRIC_KEYS if f"`{key}`" not in metrics] == []
    assert "`/min`, `_min`, `/max` or `_max`" in metrics
    pooled = {key: reduction(key) for key in ("log_clip/abs_log_ratio", "log_clip/abs_log_ratio_max", "ratio/min")}
    assert pooled == {"log_clip/abs_log_ratio": "mean", "log_clip/abs_log_ratio_max": "max", "ratio/min": "min"}
