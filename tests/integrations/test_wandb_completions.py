"""W&B's evaluation row: a table of sample completions per benchmark, capped, and each metric's standard error."""

import pytest
from conftest import REPO, train_config
from helpers.scripted_generation import FakeTokenizer, ScriptedGenerator
from helpers.wandb_offline_files import logged_table, offline_runs

from atr_grpo import rundir
from atr_grpo.errors import ConfigError
from atr_grpo.evaluation import SamplingConfig, load_benchmark, run_evaluation
from atr_grpo.evaluation.outputs import COMPLETION_COLUMNS
from atr_grpo.training.run_logger import RunLogger

FIXTURES = REPO / "tests" / "fixtures" / "eval"
OFFLINE = ["experiment=smoke", "logger=wandb", "logger.mode=offline"]
STEP = 5


def evaluated(run_dir):
    """An evaluation at STEP of amc23's 4 fixture problems × 4 samples; returns the logger's metrics."""
    amc = load_benchmark("amc23", FIXTURES / "amc23.jsonl", strict=False)
    script = {"": [("\\boxed{84}", "stop"), ("no box", "stop"), ("\\boxed{0}", "length"), ("\\boxed{84}", "stop")]}
    sampling = SamplingConfig(n=4, temperature=0.3, top_p=0.95, max_tokens=64, seed=3)
    return run_evaluation(
        ScriptedGenerator(script),
        FakeTokenizer(),
        [amc],
        sampling,
        run_dir,
        STEP,
        k=4,
        grader_workers=0,
        show_progress=False,
    )


def test_the_completions_table_is_capped_and_read_back_from_the_offline_run(tmp_path):
    """logger.eval_completions=3: the row of step 5 holds a 3-row table of the per-sample file's first sample of
    the first three problems, with the columns prompt, completion, gold, status (and ids, extracted answer)."""
    metrics = evaluated(tmp_path)
    logger = RunLogger(train_config([*OFFLINE, "logger.eval_completions=3"]), tmp_path)
    assert logger.log_eval(metrics, STEP)
    logger.finish()
    (run,) = offline_runs(tmp_path)
    table = logged_table(run, STEP, "eval/amc23/completions")
    assert table["columns"] == list(COMPLETION_COLUMNS)
    assert {"prompt", "completion", "gold", "status"} <= set(table["columns"])
    assert len(table["data"]) == 3 and run["history"][STEP]["eval/amc23/completions.nrows"] == 3
    samples = rundir.read_jsonl(tmp_path / "eval" / f"step_{STEP:06d}" / "amc23.jsonl")
    firsts = [s for s in samples if s["sample"] == 0][:3]
    column = {name: i for i, name in enumerate(table["columns"])}
    for row, sample in zip(table["data"], firsts):
        assert row[column["prompt"]] == sample["problem"] and sample["problem"]
        assert row[column["completion"]] == "\\boxed{84}" and row[column["gold"]] == sample["gold"]
        assert row[column["status"]] == sample["status"] and row[column["sample"]] == 0
    assert len({row[column["problem_id"]] for row in table["data"]}) == 3  # three problems, not one problem thrice


def test_the_eval_row_carries_each_metrics_standard_error(tmp_path):
    metrics = evaluated(tmp_path)
    logger = RunLogger(train_config(OFFLINE), tmp_path)
    logger.log_eval(metrics, STEP)
    logger.finish()
    (summary,) = rundir.read_jsonl(tmp_path / "eval" / "summary.jsonl")
    logged = offline_runs(tmp_path)[0]["history"][STEP]
    for metric in ("mean@4", "pass@4", "mean@1", "pass@1"):
        assert logged[f"eval/amc23/{metric}_stderr"] == pytest.approx(summary[f"{metric}_stderr"], rel=1e-12)
    assert summary["mean@4_stderr"] > 0
    assert logged["eval/amc23/completions.nrows"] == 16  # the default cap, 16: all 4 problems × 4 samples


def test_zero_completions_logs_no_table(tmp_path):
    metrics = evaluated(tmp_path)
    logger = RunLogger(train_config([*OFFLINE, "logger.eval_completions=0"]), tmp_path)
    logger.log_eval(metrics, STEP)
    logger.finish()
    logged = offline_runs(tmp_path)[0]["history"][STEP]
    assert not any(key.startswith("eval/amc23/completions") for key in logged)
    assert logged["eval/amc23/mean@4"] == metrics["eval/amc23/mean@4"]


@pytest.mark.parametrize("value", [-1, 1001])
def test_a_cap_outside_its_range_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"logger.eval_completions must be an integer in 0\.\.1000"):
        train_config([*OFFLINE, f"logger.eval_completions={value}"])
