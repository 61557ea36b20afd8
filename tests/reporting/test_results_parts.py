"""What a gain is made of: Mean@K's parts read from the samples' grader statuses, tested by `compare` as secondary
endpoints, and the split of a Mean@K difference between the answered rate and the accuracy given an answer.

The tree: on every problem, clip answers 4 of 8 samples and gets 2 right (one more runs out of tokens); atr answers
6 (8 on the problems with (i + seed) % 4 == 0) and gets half of them right. So the answered rate moves by a known
amount in each seed pair, the accuracy given an answer is 50 % on both sides, and all of the Mean@K gain is the
answered rate's, in either order of the split."""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

import pytest
from helpers.sampled_runs import PROBLEMS, SAMPLES, sampled_run, status_matrix

from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses import compare, parts
from atr_grpo.reporting.runs import find_runs
from atr_grpo.results import main
from atr_grpo.rundir import files, layout

SEEDS, STEPS, BENCH = range(4), (50, 100), "amc23"


def atr_answered(seed: int) -> list[int]:
    return [8 if (i + seed) % 4 == 0 else 6 for i in range(PROBLEMS)]


def at_steps(matrix) -> dict:
    return {step: {BENCH: matrix} for step in STEPS}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts") / "runs"
    for seed in SEEDS:
        clip = status_matrix([4] * PROBLEMS, [2] * PROBLEMS, [1] * PROBLEMS)
        answered = atr_answered(seed)
        atr = status_matrix(answered, [a // 2 for a in answered], [SAMPLES - a for a in answered])
        sampled_run(root, "table3", "clip", seed, at_steps(clip), benchmarks=[BENCH])
        sampled_run(root, "table3", "atr", seed, at_steps(atr), benchmarks=[BENCH])
    return root


def answered_gain(seed: int) -> float:
    """atr − clip's answered rate in one seed pair, in points."""
    return 100 * (sum(atr_answered(seed)) / (PROBLEMS * SAMPLES) - 0.5)


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def printed(root):
    code, out, err = run_cli("compare", "atr", "clip", "--runs", root, "--endpoint", "auc", "--resamples", 500)
    assert code == 0, err
    return out


def row_of(text: str, metric: str) -> list[str]:
    """The cells of the seed-level row of `metric` (its first row in the text)."""
    line = next(line for line in text.splitlines() if line.startswith(f"| {BENCH} | {metric} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_run_pools_the_accuracy_given_an_answer_over_problems(tmp_path):
    """1 of 1 answered right on one problem, 0 of 8 on the other: Σ correct / Σ answered is 1/9, not the mean of
    the problems' ratios (1/2); Mean@K is the answered rate times it."""
    matrix = status_matrix([1, 8], [1, 0])
    sampled_run(tmp_path, "table3", "clip", 0, at_steps(matrix), benchmarks=[BENCH])
    (run,) = find_runs(tmp_path)
    assert run.eval_table("acc_given_answer@8")[100][BENCH] == pytest.approx(100 / 9)
    assert run.eval_table("answered@8")[100][BENCH] == pytest.approx(100 * 9 / 16)
    assert run.eval_table("truncated@8")[100][BENCH] == 0.0
    assert run.eval_table("mean@8")[100][BENCH] == pytest.approx(100 * 9 / 16 * 1 / 9)


def test_compare_prints_the_answered_rate_moving_with_its_per_seed_gains(printed):
    cells_ = row_of(printed, "answered@8")
    mean = sum(answered_gain(seed) for seed in SEEDS) / len(SEEDS)
    assert cells_[2:5] == ["81.25", "50.00", f"{mean:+.2f}"]
    assert cells_[5] == ", ".join(f"{answered_gain(seed):+.2f}" for seed in SEEDS)
    assert cells_[7] == "0.125"  # every seed pair gains: 2 of 2^4 sign patterns


def test_compare_prints_the_accuracy_given_an_answer_not_moving(printed):
    cells_ = row_of(printed, "acc_given_answer@8")
    assert cells_[2:6] == ["50.00", "50.00", "+0.00", "+0.00, +0.00, +0.00, +0.00"]
    assert cells_[7] == "1"


def test_the_split_gives_the_whole_gain_to_the_answered_rate_in_either_order(root):
    runs = find_runs(root)
    rows = compare.compare_methods(runs, "atr", "clip", stats.Resampling(500), metrics=["mean@8"], endpoint="auc")
    (split,) = parts.splits(rows, runs, "atr", "clip")
    gain = sum(answered_gain(seed) for seed in SEEDS) / len(SEEDS) / 2  # Mean@K = answered rate × 50 %
    assert split.difference == pytest.approx(gain)
    assert split.answered_first == pytest.approx((gain, 0.0))
    assert split.accuracy_first == pytest.approx((0.0, gain))


def test_the_printed_split_line_states_both_orders_and_the_answered_share(printed):
    (line,) = [line for line in printed.splitlines() if line.startswith(f"{BENCH} mean@8: of atr − clip")]
    assert re.search(
        r"answered rate first: the answered rate \+[\d.]+ \(100 %\), then the accuracy given an answer "
        r"[+-]0\.00",
        line,
    ), line
    assert re.search(
        r"accuracy first: the accuracy given an answer [+-]0\.00.*then the answered rate \+[\d.]+ "
        r"\(100 %\)",
        line,
    ), line


def test_the_ratio_has_no_problem_level_interval_or_test(root):
    """No problem has an accuracy given an answer of its own that averages to the run's: the interval that
    resamples problems is refused and the test that flips them is not run; the answered rate keeps both."""
    runs, resampling = find_runs(root), stats.Resampling(500)
    by_method = {m: [r for r in runs if r.method == m] for m in ("atr", "clip")}
    ratio = [cells.cell_scores(by_method[m], "acc_given_answer@8", BENCH, [BENCH]) for m in ("atr", "clip")]
    with pytest.raises(cells.ScoreError, match="ratio"):
        cells.cell_interval(ratio[0], resampling, "key")
    assert math.isnan(cells.compare(*ratio, resampling, "key").p_problems)
    answered = [cells.cell_scores(by_method[m], "answered@8", BENCH, [BENCH]) for m in ("atr", "clip")]
    assert cells.compare(*answered, resampling, "key").p_problems < 0.01
    assert cells.cell_interval(answered[0], resampling, "key")[0] == pytest.approx(81.25)


def test_samples_without_a_status_leave_the_parts_out_with_a_note(tmp_path):
    """Per-sample files from before statuses were recorded: compare prints Mean@K and says why the parts are not."""
    for seed in range(2):
        for method, answered in (("clip", 4), ("atr", 6)):
            matrix = status_matrix([answered] * PROBLEMS, [answered // 2] * PROBLEMS)
            path = sampled_run(tmp_path, "table3", method, seed, at_steps(matrix), benchmarks=[BENCH])
            for step in STEPS:
                sample_file = layout.sample_file(path, step, BENCH)
                records = [{k: v for k, v in r.items() if k != "status"} for r in files.read_jsonl(sample_file)]
                files.write_jsonl(sample_file, records)
    code, out, err = run_cli("compare", "atr", "clip", "--runs", tmp_path, "--resamples", 500)
    assert code == 0 and row_of(out, "mean@8")[4] == "+12.50"
    assert "answered@8" not in out and "note: the parts of Mean@K are not shown" in err
    assert "records no status" in err


def write_plan(folder, secondary_metrics) -> Path:
    """A plan of this tree's atr − clip on Mean@8 (paired t, α 0.05) that names `secondary_metrics`."""
    import yaml

    raw = {
        "experiment": "table3",
        "seeds": list(SEEDS),
        "endpoint": "auc",
        "metric": "mean@8",
        "benchmark": BENCH,
        "test": "paired_t",
        "alpha": 0.05,
        "equivalence_margin": 1.0,
        "primary": ["atr", "clip"],
        "secondary": [],
        "secondary_metrics": secondary_metrics,
    }
    path = folder / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_plan_names_the_parts_as_secondary_endpoints(root, tmp_path):
    """`secondary_metrics` tests the primary comparison on the parts, in the secondaries' Holm family behind the
    primary's gate: here the answered rate carries the whole Mean@K gain and the accuracy given an answer none."""
    from atr_grpo.reporting import plan
    from atr_grpo.reporting.analyses import planned

    the_plan = plan.load_plan(write_plan(tmp_path, ["answered@8", "acc_given_answer@8"]))
    assert the_plan.level(plan.SECONDARY) == pytest.approx(0.025)  # Holm's first step over the two parts
    results = planned.analyse(find_runs(root), the_plan, stats.Resampling(500, 0))
    assert [r.label for r in results] == [
        "atr − clip",
        "atr − clip (answered@8)",
        "atr − clip (acc_given_answer@8)",
    ]
    primary, answered, accuracy = results
    gains = [answered_gain(seed) for seed in SEEDS]
    assert answered.difference.difference == pytest.approx(sum(gains) / len(gains))
    assert accuracy.difference.difference == pytest.approx(0.0, abs=1e-9)
    assert primary.verdict == planned.DIFFERS and answered.verdict == planned.DIFFERS
    assert answered.p_adjusted >= primary.p_adjusted  # behind the primary's gate
    lines = planned.planned_lines(results, the_plan, "0" * 40)
    assert "the 2 secondaries by Holm" in lines[2]
    assert any(line.startswith("| qwen3-1.7b | secondary | atr − clip (answered@8) | ") for line in lines)


@pytest.mark.parametrize("value", [["mean@8"], ["answered@8", "answered@8"], ["answers@8"], "answered@8"])
def test_a_plans_secondary_metrics_are_distinct_metrics_other_than_its_own(tmp_path, value):
    from atr_grpo.reporting import plan

    with pytest.raises(plan.PlanError, match="secondary_metrics is .*; allowed: a list of distinct metrics other than"):
        plan.load_plan(write_plan(tmp_path, value))
