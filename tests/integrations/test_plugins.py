"""Rules and benchmarks from other packages (`atr_grpo.plugins`): a distribution that declares an entry point is
read before any name is validated (rules by the config layer, the listing and the verl plugin, benchmarks by their
registry), and one whose module fails to import stops the program with the entry point and the distribution named.
The distributions are written by the tests (a module and its `.dist-info`, as pip would leave them) and put on the
path of this process or of a child process: nothing is installed."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys
from unittest.mock import patch

import pytest
import torch
from conftest import train_config
from helpers.plugin_distributions import child_env, train_with_plugins, write_distribution
from helpers.run_trees import make_run
from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.benchmarks import BENCHMARKS, BenchmarkError
from atr_grpo.clipping import RULES, build_rule
from atr_grpo.clipping.__main__ import main as clipping_main
from atr_grpo.errors import ConfigError
from atr_grpo.evaluation.benchmarks import load_benchmark
from atr_grpo.plugins import BENCHMARK_GROUP, RULE_GROUP, PluginError, load_entry_points, load_rule_plugins
from atr_grpo.results import main as results_main

# a benchmark in one module: its source, answer format, size, column heading and place (between AIME2024 and 2025)
MATH500_MODULE = """
from atr_grpo.benchmarks import BenchmarkSpec, register_benchmark

register_benchmark(
    BenchmarkSpec(
        name="math500",
        hub_id="HuggingFaceH4/MATH-500",
        num_problems=500,
        answer_fields=("answer",),
        display_name="MATH500",
        order=2.5,
    )
)
"""

# a rule in one module: PPO's clip on the log-ratio, |log w| ≤ eps, with a metric of its own
DUMMY_RULE_MODULE = '''
import math
from typing import Any

from atr_grpo.clipping import ClipRule, RuleTerms, TokenBatch, register
from atr_grpo.clipping.base import positive
from atr_grpo.clipping.ratio import ppo_clip_terms


@register
class DummyLogClip(ClipRule):
    """|log w| <= eps inside PPO's min."""

    name = "dummy_log_clip"
    family = "ratio"
    params = (positive("eps", 0.05, "the bound on |log w|"),)
    summary = "|log w| <= eps"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        terms = ppo_clip_terms(batch, math.exp(-self.eps), math.exp(self.eps))
        terms.extra["dummy/frac_outside"] = batch.log_ratio.abs() > self.eps
        return terms
'''


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on this process's sys.path for the test; the modules imported from it are forgotten afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(folder)):
            del sys.modules[name]


def test_a_benchmark_module_makes_its_name_selectable_and_its_column_in_table2(site, tmp_path):
    """One module declaring `math500` (from a distribution's entry point): `eval.benchmarks=[..., math500]` passes
    validation, its rows load from a local file in the declared answer format, and Table 2 shows a MATH500 column
    where its `order` puts it."""
    data = tmp_path / "math500.jsonl"
    rows = [{"problem": "What is $1 + 1$?", "answer": "2"}, {"problem": "Simplify $4/6$.", "answer": "\\frac{2}{3}"}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    benches = ["amc23", "aime24", "aime25", "math500"]
    overrides = [f"eval.benchmarks=[{','.join(benches)}]", f"+eval.paths.math500={data}"]
    with pytest.raises(ConfigError, match="eval.benchmarks"):
        train_config(overrides)

    write_distribution(
        site, "math500-bench", {BENCHMARK_GROUP: {"math500": "math500_bench"}}, {"math500_bench.py": MATH500_MODULE}
    )
    with patch.dict(BENCHMARKS):  # the registry gets its own entries back afterwards
        assert "math500" in load_entry_points(BENCHMARK_GROUP)
        assert train_config(overrides).eval.benchmarks == benches

        bench = load_benchmark("math500", path=data, strict=False)
        assert [(p.id, p.gold) for p in bench.problems] == [(0, "2"), (1, "\\frac{2}{3}")]
        with pytest.raises(BenchmarkError, match="expected 500 problems, found 2"):
            load_benchmark("math500", path=data)

        runs, out = tmp_path / "runs", tmp_path / "tables"
        for method, level in (("atr", 0.4), ("clip", 0.3)):
            evals = {step: {b: (level, level + 0.2) for b in benches} for step in (50, 100)}
            make_run(runs, "table2", "qwen3-1.7b", method, {"name": method}, 0, evals, benchmarks=benches)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert results_main(["table2", "--runs", str(runs), "--out", str(out)]) == 0
    header = next(line for line in (out / "table2.md").read_text().splitlines() if line.startswith("| model |"))
    columns = [cell.strip() for cell in header.strip("|").split("|")[2:]]
    assert columns[4:6] == ["MATH500 Mean@8 (%)", "MATH500 Pass@8 (%)"]
    headings = list(dict.fromkeys(column.split(" ")[0] for column in columns))
    assert headings == ["AMC2023", "AIME2024", "MATH500", "AIME2025", "Average"]
    tex = (out / "table2.tex").read_text()
    assert tex.index(r"{AIME2024}") < tex.index(r"\multicolumn{2}{c}{MATH500}") < tex.index(r"{AIME2025}")


def test_a_rule_module_registers_its_rule_and_the_listing_names_its_module(site):
    """In this process: `python -m atr_grpo.clipping` loads the entry point's module, which registers the rule; the
    listing names it under its own module name, and the rule builds and computes its loss and metrics."""
    write_distribution(
        site,
        "dummy-rule",
        {RULE_GROUP: {"dummy_log_clip": "dummy_rule_pkg"}},
        {"dummy_rule_pkg/__init__.py": DUMMY_RULE_MODULE},
    )
    with patch.dict(RULES):
        assert "dummy_log_clip" not in RULES  # importing atr_grpo.clipping read no entry points
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            assert clipping_main(["dummy_log_clip"]) == 0
        assert "dummy_log_clip" in RULES and "dummy_log_clip" in load_rule_plugins()
        listing = printed.getvalue()
        assert listing.splitlines()[:2] == ["dummy_log_clip  (dummy_rule_pkg, family ratio)", "  |log w| <= eps"]
        assert "eps = 0.05  a finite number > 0; the bound on |log w|" in listing
        # log w = 0 and 0.2 on two tokens with A > 0: with eps = 0.1 the second is outside and its gradient frozen
        logp, old_logp = torch.tensor([[0.0, 0.2]]), torch.zeros(1, 2)
        out = build_rule("dummy_log_clip", eps=0.1)(
            logp, old_logp, torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool)
        )
        assert (out.metrics["dummy/frac_outside"], out.metrics["clip/frac_high"], out.metrics["clip/frac"]) == (
            0.5,
            0.5,
            0.5,
        )


@pytest.mark.parametrize("module_text", ["raise RuntimeError('needs a library this machine lacks')\n", None])
def test_a_plugin_that_fails_to_import_is_named_with_its_distribution(site, module_text):
    """A module that raises on import, or one that is not there: the error names the entry point, its group and
    its distribution, and says what went wrong; nothing is skipped."""
    files = {"broken_rules.py": module_text} if module_text else {}
    write_distribution(site, "broken-rules", {RULE_GROUP: {"half_clip": "broken_rules"}}, files)
    with pytest.raises(PluginError) as raised:
        load_entry_points(RULE_GROUP)
    message = str(raised.value)
    assert "half_clip = 'broken_rules' (group atr_grpo.rules) of the distribution broken-rules 0.1" in message
    cause = "RuntimeError: needs a library this machine lacks" if module_text else "No module named 'broken_rules'"
    assert cause in message


@pytest.mark.slow
def test_a_rule_with_a_reserved_parameter_name_stops_train_in_one_line(tmp_path):
    """A plugin rule whose parameter is named like a key of the clipping config (`rule`) is refused when the
    entry points are read: `train` ends with one line naming the entry point and the reserved name, exit status 2,
    whichever rule the run uses."""
    site = tmp_path / "site"
    module = DUMMY_RULE_MODULE.replace('positive("eps"', 'positive("rule"').replace("self.eps", "self.rule")
    write_distribution(
        site, "reserved-rule", {RULE_GROUP: {"dummy_log_clip": "reserved_rule"}}, {"reserved_rule.py": module}
    )
    result = train_with_plugins(site, "experiment=smoke", "clipping=atr", "--cfg", "job", timeout=300)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "dummy_log_clip = 'reserved_rule'" in line and "'rule'" in line and "reserved" in line


@pytest.mark.slow
@pytest.mark.parametrize("group", [RULE_GROUP, BENCHMARK_GROUP])
def test_the_entry_points_stop_a_child_process_before_validation(tmp_path, group):
    """The config layer (rules) and the benchmark registry read the entry points when they are imported, so a broken
    one stops `python -m atr_grpo.train` before the config is even composed: one line naming the entry point and its
    distribution, exit status 2, no traceback. Importing the rules' registry alone reads none."""
    site = tmp_path / "site"
    write_distribution(
        site,
        "broken-plugin",
        {group: {"broken": "broken_plugin"}},
        {"broken_plugin.py": "raise ImportError('no such thing')\n"},
    )
    result = train_with_plugins(site, "experiment=smoke", "--cfg", "job", timeout=300)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot load the entry point broken = 'broken_plugin'")
    assert f"(group {group}) of the distribution broken-plugin 0.1: ImportError: no such thing" in last
    if group == RULE_GROUP:
        command = [sys.executable, "-c", "from atr_grpo.clipping import RULES; assert 'atr' in RULES"]
        clipping = subprocess.run(command, env=child_env(site), capture_output=True, text=True, timeout=300)
        assert clipping.returncode == 0, clipping.stderr[-2000:]


@pytest.mark.slow
def test_a_rule_from_another_package_trains_without_a_config_file(tmp_path, smoke_sft_adapter):
    """A distribution declaring a rule under `atr_grpo.rules`, on a child process's path: `clipping=<rule>` selects
    it with no conf/clipping/ file (its defaults, here overridden), and the run's metrics.jsonl holds the rule's
    metrics every step, its own `dummy/frac_outside` included."""
    site = tmp_path / "site"
    write_distribution(
        site,
        "dummy-rule",
        {RULE_GROUP: {"dummy_log_clip": "dummy_rule_pkg"}},
        {"dummy_rule_pkg/__init__.py": DUMMY_RULE_MODULE},
    )
    run_dir = tmp_path / "run"
    result = train_with_plugins(
        site, "experiment=smoke", "clipping=dummy_log_clip", "clipping.eps=0.01", f"run_dir={run_dir}"
    )
    assert result.returncode == 0, result.stderr[-4000:]
    config = OmegaConf.load(run_dir / "config.yaml")
    assert (config.clipping.name, config.clipping.eps) == ("dummy_log_clip", 0.01)
    assert config.method == "dummy_log_clip-eps0.01"  # the run is named after the rule and its non-default value
    rows = [row for row in rundir.read_jsonl(run_dir / rundir.METRICS_FILE) if "clip/frac" in row]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows:
        for key in ("clip/frac", "clip/frac_low", "clip/frac_high", "dummy/frac_outside"):
            value = row[key]
            assert isinstance(value, float) and 0 <= value <= 1 and not math.isnan(value), (key, row)
    # off-policy steps (2 and 4) see ratios away from 1: some token leaves |log w| ≤ 0.01
    assert max(row["dummy/frac_outside"] for row in rows) > 0
