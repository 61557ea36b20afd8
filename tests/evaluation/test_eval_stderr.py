"""The problem-level standard error of Mean@K and Pass@K: SD (ddof 1) of the per-problem scores / √problems."""

import math

import pytest
from conftest import REPO
from helpers.scripted_generation import FakeTokenizer, ScriptedGenerator

from atr_grpo import rundir
from atr_grpo.evaluation import SamplingConfig, load_benchmark, run_evaluation
from atr_grpo.evaluation.metrics import average, standard_errors, summarize

# three problems, four samples each: per-problem Mean@4 = 1/4, 1, 1/2
MATRIX = [[True, False, False, False], [True] * 4, [False, True, False, True]]


def test_mean_stderr_is_the_sd_over_problems_over_root_p():
    """Mean@4 per problem: 0.25, 1, 0.5; their mean 7/12; SD (ddof 1) = √(Σ(x − 7/12)² / 2); SE = SD / √3."""
    scores = [0.25, 1.0, 0.5]
    centre = sum(scores) / 3
    by_hand = math.sqrt(sum((x - centre) ** 2 for x in scores) / 2) / math.sqrt(3)
    assert standard_errors(MATRIX, ks=[4])["mean@4_stderr"] == pytest.approx(by_hand)
    assert by_hand == pytest.approx(0.2205, abs=1e-4)


def test_pass_stderr_uses_each_problems_unbiased_pass_at_k():
    """Pass@2 per problem, c correct of n = 4: 1 − C(4−c, 2)/C(4, 2) = 1/2, 1, 5/6."""
    scores = [1 - 3 / 6, 1.0, 1 - 1 / 6]
    centre = sum(scores) / 3
    by_hand = math.sqrt(sum((x - centre) ** 2 for x in scores) / 2) / math.sqrt(3)
    assert standard_errors(MATRIX, ks=[2])["pass@2_stderr"] == pytest.approx(by_hand)


def test_stderr_keys_are_additive_and_leave_summarize_unchanged():
    """`summarize` keeps exactly its keys (the results tables read them); the errors sit under `<metric>_stderr`."""
    assert set(summarize(MATRIX)) == {f"{m}@{k}" for m in ("mean", "pass") for k in range(1, 5)}
    assert set(standard_errors(MATRIX)) == {f"{m}@{k}_stderr" for m in ("mean", "pass") for k in range(1, 5)}


def test_one_problem_has_no_standard_error():
    assert standard_errors([[True, False]], ks=[2]) == {"mean@2_stderr": None, "pass@2_stderr": None}


def test_the_averages_error_combines_the_benchmarks_in_quadrature():
    """Average of B independent benchmarks: SE = √(Σ SE_b²) / B; the values themselves are plain means."""
    combined = average([{"mean@8": 0.2, "mean@8_stderr": 0.03}, {"mean@8": 0.4, "mean@8_stderr": 0.04}])
    assert combined["mean@8"] == pytest.approx(0.3)
    assert combined["mean@8_stderr"] == pytest.approx(0.05 / 2)
    assert average([{"mean@8_stderr": None}, {"mean@8_stderr": 0.1}]) == {"mean@8_stderr": None}


def test_the_summary_line_and_the_logged_metrics_carry_the_stderr(tmp_path):
    """The runner writes `mean@K_stderr` into eval/summary.jsonl and returns it under `eval/<bench>/mean@K_stderr`."""
    fixtures = REPO / "tests" / "fixtures" / "eval"
    amc = load_benchmark("amc23", fixtures / "amc23.jsonl", strict=False)
    script = {"": [("\\boxed{84}", "stop")] * 2 + [("\\boxed{0}", "stop")] * 2}
    sampling = SamplingConfig(n=4, temperature=0.3, top_p=0.95, max_tokens=64, seed=3)
    metrics = run_evaluation(
        ScriptedGenerator(script),
        FakeTokenizer(),
        [amc],
        sampling,
        tmp_path,
        5,
        k=4,
        grader_workers=0,
        show_progress=False,
    )
    (summary,) = rundir.read_jsonl(tmp_path / "eval" / "summary.jsonl")
    samples = rundir.read_jsonl(tmp_path / "eval" / "step_000005" / "amc23.jsonl")
    rows: dict = {}
    for record in samples:
        rows.setdefault(record["problem_id"], []).append(record["correct"])
    expected = standard_errors(list(rows.values()), ks=[4])["mean@4_stderr"]
    assert summary["mean@4_stderr"] == pytest.approx(expected) and expected > 0
    assert metrics["eval/amc23/mean@4_stderr"] == summary["mean@4_stderr"]
    assert metrics["eval/average/mean@4_stderr"] == pytest.approx(summary["mean@4_stderr"])  # one benchmark
