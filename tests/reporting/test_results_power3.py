"""The committed experiment power3 (`make reproduce-power3`, results/power3/) is what its run files say, it was run
under its analysis plan, committed before its first run, and it held its budget.

50 runs: clip ε 0.2, atr δ 0.07, clip ε 0.329, clip ε 0.2 at twice the learning rate and clip ε 0.6 × seeds 10–19,
on power2's testbed. Each seed starts from its own SFT adapter and reads evaluation random numbers of its own at
every step, shared by its methods. Each run has its final evaluation at the paper's sampling (temperature 0.3,
top-p 0.95) in final_eval/, with the draws of its own step 128. The tables rebuild byte for byte; `compare` prints
the plan's rows, the final evaluation's among them, the gates and the decomposition, as the log quotes them.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest
from conftest import REPO
from helpers.committed_results import assert_tables_rebuild, kept_by_git, section_lines

from atr_grpo import results
from atr_grpo.evaluation.sampling import step_seed
from atr_grpo.reporting import plan
from atr_grpo.reporting.runs import load_run

POWER3 = REPO / "results" / "power3"
RUNS = POWER3 / "runs"
TABLES = POWER3 / "tables"
PLAN = POWER3 / "plan.yaml"
METHODS = ("clip", "atr", "clip-eps0.329", "clip__trainer.learning_rate=0.0002", "clip-eps0.6")
SEEDS = tuple(range(10, 20))
EVAL_STEPS = [0, 32, 64, 96, 128]
DOCS = REPO / "docs" / "experiment-log.md"
BUDGET_MIN = 120
COMPARE = ["compare", "atr", "clip", "--runs", str(RUNS), "--experiment", "power3", "--endpoint", "auc"]


def _names():
    return sorted(path.name for path in RUNS.iterdir() if path.is_dir())


def _run_name(method, seed):
    if "__" in method:  # a launch setting outside the rule: the sweep suffix after the seed
        rule, setting = method.split("__")
        return f"power3__{rule}__s{seed}__{setting}"
    return f"power3__{method}__s{seed}"


def test_the_plan_was_committed_before_every_run_and_names_the_issues_design():
    loaded = plan.load_plan(PLAN)
    assert not plan.plan_commit(PLAN).uncommitted
    assert loaded.seeds == SEEDS and loaded.endpoint == "auc" and loaded.equivalence_margin == 0.5
    assert (loaded.primary.a, loaded.primary.b) == ("atr", "clip")
    assert loaded.secondary_metrics == ("answered@8", "acc_given_answer@8")
    assert loaded.final_evaluation == plan.FinalEvaluation("final_eval", 0.3, 0.95)
    commit = plan.plan_commit(PLAN).commit
    assert plan.runs_against_plan([RUNS / run for run in _names()], PLAN, commit) == []


def test_the_committed_runs_are_the_plans_runs_with_their_final_evaluations_and_without_weights():
    assert _names() == sorted(_run_name(m, s) for m in METHODS for s in SEEDS)
    for run in _names():
        files = kept_by_git(RUNS / run)
        assert {"config.yaml", "env.json", "metrics.jsonl", "eval/summary.jsonl"} <= set(files), run
        assert {"final_eval/eval/summary.jsonl", "final_eval/eval/request.json"} <= set(files), run
        assert not [f for f in files if f.endswith((".safetensors", ".bin", ".pt", ".pth"))], run
        steps = [json.loads(line)["step"] for line in (RUNS / run / "eval" / "summary.jsonl").open()]
        assert steps == EVAL_STEPS, run


def test_each_seed_starts_from_its_own_adapter_shared_by_its_methods():
    by_seed = {}
    for run in _names():
        seed = int(re.search(r"__s(\d+)", run)[1])
        start = json.loads((RUNS / run / "env.json").read_text())["start_point"]
        by_seed.setdefault(seed, set()).add((start["base_model_sha256"], start["sft_adapter_sha256"]))
    assert all(len(starts) == 1 for starts in by_seed.values()), by_seed
    assert len({next(iter(s))[1] for s in by_seed.values()}) == len(SEEDS)
    assert len({next(iter(s))[0] for s in by_seed.values()}) == 1


def test_the_final_evaluation_is_the_plans_sampling_with_the_draws_of_step_128():
    for run in _names():
        config = load_run(RUNS / run).config
        assert config["eval"]["seed"] == config["seed"] and config["eval"]["seed_by_step"] is True, run
        (line,) = [json.loads(x) for x in (RUNS / run / "final_eval" / "eval" / "summary.jsonl").open()]
        assert line["step"] == 128 and line["drawn_seed"] == step_seed(config["seed"], 128), run
        request = json.loads((RUNS / run / "final_eval" / "eval" / "request.json").read_text())
        assert (request["eval.temperature"], request["eval.top_p"], request["eval.n"]) == (0.3, 0.95, 8), run


@pytest.mark.slow
def test_the_committed_tables_rebuild_byte_for_byte(tmp_path):
    required = {"plan.csv", "plan.md", "gates.csv", "parts.csv", "timing.md"}
    assert_tables_rebuild(RUNS, "power3", TABLES, tmp_path / "tables", required)


def test_compare_prints_the_plans_rows_as_the_log_quotes_them(capsys):
    """The plan's seven rows (the final evaluation's last), the gates and what atr − clip is made of."""
    assert results.main([*COMPARE, "--benchmark", "arithmetic", "--metric", "mean@8"]) == 0
    out = capsys.readouterr().out
    printed = [line for line in out.splitlines() if line.startswith("| tiny | ")]
    assert len(printed) == 7 and printed[-1].split(" | ")[2] == "atr − clip [final_eval, final]"
    quoted = [line for line in section_lines(DOCS.read_text(), "## 5. power3") if line.startswith("| tiny | ")]
    assert quoted == printed
    assert "tiny: the design gates" in out
    assert "arithmetic mean@8: of atr − clip = " in out


def test_the_budget_held():
    """From the first run's first log line (before it built the base model) to the last run's end, plus the final
    evaluation's time summed over the runs (`results timing`; two ran at once, so it took less), is within the
    120 minutes `make reproduce-power3` may take from an empty cache; the log quotes the timing note's numbers."""
    text = (TABLES / "timing.md").read_text()
    span = float(re.search(r"first start to last end: ([0-9.]+) min", text)[1])
    final = float(re.search(r"final_eval/, e\.g\. a plan's final evaluation\): 50 of them, ([0-9.]+) min", text)[1])
    first_lines = [(RUNS / run / "train.log").read_text().splitlines()[0] for run in _names()]
    first = min(datetime.strptime(line[1:20], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc) for line in first_lines)
    ends = []
    for run in _names():
        start = datetime.strptime(
            json.loads((RUNS / run / "env.json").read_text())["start_time"], "%Y-%m-%dT%H:%M:%S%z"
        )
        ends.append(start.timestamp() + json.loads((RUNS / run / "DONE").read_text())["seconds"])
    whole = (max(ends) - first.timestamp()) / 60
    assert span < whole < span + 10 and whole + final <= BUDGET_MIN, (span, whole, final)
    log = DOCS.read_text()
    assert f"gives {span:.1f} min from the first run's start" in log and f"{final:.1f} min of final evaluation" in log
