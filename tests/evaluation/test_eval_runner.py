"""The evaluation runner with a scripted generator: contracts §3 files, metrics, the overwrite policy."""

import json
import math
import statistics

import pytest
from conftest import REPO
from helpers.scripted_generation import FakeTokenizer, ScriptedGenerator

from atr_grpo import rundir
from atr_grpo.evaluation import (
    STATUSES,
    Sample,
    SamplingConfig,
    load_benchmark,
    pass_at_k,
    read_summary,
    run_evaluation,
)
from atr_grpo.evaluation.backends import check_samples
from atr_grpo.evaluation.outcomes import PARTS

FIXTURES = REPO / "tests" / "fixtures" / "eval"
SAMPLE_FIELDS = {
    "problem_id",
    "problem",
    "sample",
    "completion",
    "extracted",
    "gold",
    "correct",
    "status",
    "finish_reason",
    "num_tokens",
}


# aime24 fixture golds: 60 -> 24, 61 -> 21, 62 -> 32
AIME24_SCRIPT = {
    "remainder when": [
        ("\\boxed{024}", "stop"),
        ("\\boxed{25}", "stop"),
        ("no box", "stop"),
        ("\\boxed{24}", "length"),
    ],
    "Find $xy$": [("so \\boxed{21}", "stop")] * 4,
    "subsets": [
        ("\\boxed{31}", "stop"),
        ("\\boxed{31}", "stop"),
        ("\\boxed{32}", "stop"),
        ("$\\boxed{32}$", "stop"),
    ],
}
AMC_SCRIPT = {"": [("\\boxed{84}", "stop")] * 2 + [("\\boxed{0}", "stop")] * 2}
SAMPLING = SamplingConfig(n=4, temperature=0.3, top_p=0.95, max_tokens=64, seed=3)


@pytest.fixture
def aime24():
    return load_benchmark("aime24", FIXTURES / "aime24.jsonl", strict=False)


def evaluate(run_dir, benchmarks, generator, step=50, **kwargs):
    kwargs.setdefault("k", 4)
    kwargs.setdefault("grader_workers", 0)
    return run_evaluation(
        generator, FakeTokenizer(), benchmarks, SAMPLING, run_dir, step, show_progress=False, **kwargs
    )


def test_files_and_values(tmp_path, aime24):
    metrics = evaluate(tmp_path, [aime24], ScriptedGenerator(AIME24_SCRIPT), grader_workers=2)

    lines = rundir.read_jsonl(tmp_path / "eval" / "step_000050" / "aime24.jsonl")
    assert len(lines) == 3 * 4
    assert all(set(line) == SAMPLE_FIELDS for line in lines)
    assert [(line["problem_id"], line["sample"]) for line in lines][:5] == [
        (60, 0),
        (60, 1),
        (60, 2),
        (60, 3),
        (61, 0),
    ]
    assert [line["status"] for line in lines[:4]] == ["correct", "wrong", "no_answer", "truncated"]
    assert lines[0]["extracted"] == "024" and lines[0]["gold"] == "24" and lines[3]["finish_reason"] == "length"

    (summary,) = rundir.read_jsonl(tmp_path / "eval" / "summary.jsonl")
    assert (summary["step"], summary["benchmark"], summary["num_problems"], summary["n"]) == (
        50,
        "aime24",
        3,
        4,
    )
    assert {f"mean@{k}" for k in range(1, 5)} | {f"pass@{k}" for k in range(1, 5)} <= set(summary)
    assert summary["status_counts"] == {
        "correct": 7,
        "wrong": 3,
        "no_answer": 1,
        "truncated": 1,
        "timeout": 0,
    }
    # the engine's truncation: every sample ended at a stop token or at max_tokens, the latter the truncated one
    assert summary["finish_counts"] == {"stop": 11, "length": 1}
    assert summary["mean@4"] == pytest.approx((1 / 4 + 1 + 2 / 4) / 3)
    assert summary["mean@1"] == pytest.approx(2 / 3)  # first samples: correct, correct, wrong
    assert summary["pass@4"] == 1.0
    assert summary["pass@2"] == pytest.approx((pass_at_k(4, 1, 2) + 1 + pass_at_k(4, 2, 2)) / 3)
    assert summary["content_hash"] == aime24.content_hash and summary["backend"] == "scripted"
    assert (summary["temperature"], summary["top_p"], summary["max_tokens"], summary["seed"]) == (
        0.3,
        0.95,
        64,
        3,
    )
    assert len(summary["prompt_hash"]) == 16 and summary["time_s"] >= 0

    # the summary is consistent with the per-sample lines it came from
    by_problem = {}
    for line in lines:
        by_problem.setdefault(line["problem_id"], []).append(line["correct"])
    assert summary["mean@4"] == pytest.approx(sum(map(sum, by_problem.values())) / len(lines))
    assert summary["pass@4"] == pytest.approx(sum(any(v) for v in by_problem.values()) / len(by_problem))

    assert metrics["eval/aime24/mean@4"] == summary["mean@4"] and metrics["eval/aime24/pass@1"] == summary["pass@1"]
    assert metrics["eval/average/mean@4"] == summary["mean@4"]
    assert metrics["eval/aime24/status/truncated"] == metrics["eval/aime24/finish/length"] == 1
    assert metrics["eval/aime24/finish/stop"] == 11
    assert set(metrics) == {
        f"eval/{b}/{m}@{k}{e}"
        for b in ("aime24", "average")
        for m in ("mean", "pass", "answered", "acc_given_answer", "truncated")
        for k in (1, 4)
        for e in ("", "_stderr")
    } | {f"eval/aime24/status/{s}" for s in STATUSES} | {"eval/aime24/finish/stop", "eval/aime24/finish/length"}


def test_the_summary_line_holds_what_mean_at_k_is_made_of(tmp_path, aime24):
    """Of AIME24_SCRIPT's 12 samples, 10 hold a final box (7 correct, 3 wrong), 1 has none and 1 ran out of tokens:
    answered 10/12, accuracy given an answer 7/10, truncated 1/12, and Mean@4 = 10/12 × 7/10. The first samples
    (correct, correct, wrong) all answered. The logged metrics and the Average carry the same values."""
    metrics = evaluate(tmp_path, [aime24], ScriptedGenerator(AIME24_SCRIPT))
    (summary,) = rundir.read_jsonl(tmp_path / "eval" / "summary.jsonl")
    assert summary["answered@4"] == pytest.approx(10 / 12)
    assert summary["acc_given_answer@4"] == pytest.approx(7 / 10)
    assert summary["truncated@4"] == pytest.approx(1 / 12)
    assert summary["answered@4"] * summary["acc_given_answer@4"] == pytest.approx(summary["mean@4"])
    assert (summary["answered@1"], summary["acc_given_answer@1"], summary["truncated@1"]) == pytest.approx(
        (1, 2 / 3, 0)
    )
    answered = [2 / 4, 4 / 4, 4 / 4]  # each problem's answered rate over its 4 samples
    assert summary["answered@4_stderr"] == pytest.approx(statistics.stdev(answered) / math.sqrt(3))
    for k in range(1, 5):  # every K that Mean@K has, each part with its standard error
        assert {f"{part}@{k}{e}" for part in PARTS for e in ("", "_stderr")} <= set(summary)
    for part in PARTS:
        assert metrics[f"eval/aime24/{part}@4"] == summary[f"{part}@4"]
        assert metrics[f"eval/aime24/{part}@4_stderr"] == summary[f"{part}@4_stderr"]
        assert metrics[f"eval/average/{part}@4"] == pytest.approx(summary[f"{part}@4"])


def test_no_answer_leaves_the_accuracy_given_an_answer_out_of_the_logged_metrics(tmp_path, aime24):
    """None answered: the summary line holds acc_given_answer@K as null, and the logger (W&B takes no None) and the
    Average leave it out."""
    silent = {"": [("no box", "stop")] * 4}
    metrics = evaluate(tmp_path, [aime24], ScriptedGenerator(silent))
    (summary,) = rundir.read_jsonl(tmp_path / "eval" / "summary.jsonl")
    assert summary["answered@4"] == 0.0 and summary["acc_given_answer@4"] is None
    assert "eval/aime24/acc_given_answer@4" not in metrics and "eval/average/acc_given_answer@4" not in metrics
    assert metrics["eval/aime24/answered@4"] == 0.0


def test_the_summary_line_records_the_seed_it_drew_with(tmp_path, aime24):
    """`drawn_seed` is the sampling seed; a training run's metadata puts the run's seed under `seed`."""
    evaluate(tmp_path, [aime24], ScriptedGenerator(AIME24_SCRIPT), metadata={"seed": 0})
    row = read_summary(tmp_path)[(50, "aime24")]
    assert (row["drawn_seed"], row["seed"]) == (SAMPLING.seed, 0)


def test_prompts_are_rendered_with_the_training_template(tmp_path, aime24):
    generator = ScriptedGenerator(AIME24_SCRIPT)
    evaluate(tmp_path, [aime24], generator, system_prompt="SYS")
    prompts, params = generator.calls[0]
    assert prompts[0] == f"<system>SYS<user>{aime24.problems[0].problem}<assistant>"
    assert params == SAMPLING


def test_average_is_the_mean_of_benchmarks(tmp_path, aime24):
    amc = load_benchmark("amc23", FIXTURES / "amc23.jsonl", strict=False)
    script = {**AIME24_SCRIPT, "": AMC_SCRIPT[""]}
    metrics = evaluate(tmp_path, [aime24, amc], ScriptedGenerator(script))
    rows = read_summary(tmp_path)
    assert set(rows) == {(50, "aime24"), (50, "amc23")}
    # 2 of 4 samples right on the one problem whose gold is 84, none on the other three
    assert rows[(50, "amc23")]["mean@4"] == pytest.approx(0.5 / 4)
    assert metrics["eval/average/mean@4"] == pytest.approx((rows[(50, "aime24")]["mean@4"] + 0.125) / 2)


def test_a_rerun_skips_what_is_done(tmp_path, aime24):
    first = evaluate(tmp_path, [aime24], ScriptedGenerator(AIME24_SCRIPT))
    generator = ScriptedGenerator(AIME24_SCRIPT)
    again = evaluate(tmp_path, [aime24], generator)
    assert generator.calls == [] and again == first
    assert len(rundir.read_jsonl(tmp_path / "eval" / "summary.jsonl")) == 1


def test_an_interrupted_evaluation_is_moved_aside(tmp_path, aime24):
    path = tmp_path / "eval" / "step_000050" / "aime24.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"partial": true}\n')
    evaluate(tmp_path, [aime24], ScriptedGenerator(AIME24_SCRIPT))
    assert (path.parent / "aime24.jsonl.interrupted-1").read_text() == '{"partial": true}\n'
    assert len(rundir.read_jsonl(path)) == 12


def test_force_keeps_the_old_files_and_the_last_summary_line_wins(tmp_path, aime24):
    evaluate(tmp_path, [aime24], ScriptedGenerator(AIME24_SCRIPT))
    all_right = {
        "remainder": [("\\boxed{24}", "stop")] * 4,
        "xy": [("\\boxed{21}", "stop")] * 4,
        "subsets": [("\\boxed{32}", "stop")] * 4,
    }
    metrics = evaluate(tmp_path, [aime24], ScriptedGenerator(all_right), force=True)
    assert metrics["eval/aime24/mean@4"] == 1.0
    step_dir = tmp_path / "eval" / "step_000050"
    assert len(rundir.read_jsonl(step_dir / "aime24.jsonl.replaced-1")) == 12
    first, forced = rundir.read_jsonl(tmp_path / "eval" / "summary.jsonl")
    assert "replaces" not in first and forced["replaces"] == "aime24.jsonl.replaced-1"
    assert read_summary(tmp_path)[(50, "aime24")]["mean@4"] == 1.0


def test_metadata_goes_into_the_summary(tmp_path, aime24):
    evaluate(tmp_path, [aime24], ScriptedGenerator(AIME24_SCRIPT), metadata={"adapter": "ckpt-100"})
    assert read_summary(tmp_path)[(50, "aime24")]["adapter"] == "ckpt-100"


def test_k_larger_than_n_and_short_generators_are_errors(tmp_path, aime24):
    with pytest.raises(ValueError, match="k=5"):
        evaluate(tmp_path, [aime24], ScriptedGenerator(AIME24_SCRIPT), k=5)
    short = {phrase: samples[:3] for phrase, samples in AIME24_SCRIPT.items()}
    with pytest.raises(RuntimeError, match="instead of n=4"):
        evaluate(tmp_path, [aime24], ScriptedGenerator(short))
    assert not (tmp_path / "eval" / "summary.jsonl").exists(), "a failed evaluation writes no summary line"


def test_check_samples():
    row = [Sample("a", "stop", 1)] * 2
    assert check_samples([row], 1, 2) == [row]
    with pytest.raises(RuntimeError, match="1 results for 2 prompts"):
        check_samples([row], 2, 2)
    with pytest.raises(RuntimeError, match="finish_reason"):
        check_samples([[Sample("a", "abort", 1)] * 2], 1, 2)


def test_summary_lines_are_valid_json_with_fractions(tmp_path, aime24):
    evaluate(tmp_path, [aime24], ScriptedGenerator(AIME24_SCRIPT))
    row = json.loads((tmp_path / "eval" / "summary.jsonl").read_text())
    assert all(0.0 <= row[key] <= 1.0 for key in row if key.startswith(("mean@", "pass@")))
