"""`results compare --eval DIR_A DIR_B`: two models on the same problems, paired by problem id."""

import json

import numpy as np
import pytest
from helpers.sampled_runs import SAMPLES, counts_matrix, sampled_run
from omegaconf import OmegaConf

from atr_grpo import results
from atr_grpo.reporting import stats
from atr_grpo.reporting.analyses.eval_compare import EvalCompareError, compare_folders, open_side

RESAMPLING = stats.Resampling(resamples=2_000)
COUNTS_A = [(3 * i) % 9 for i in range(30)]  # correct samples of 8 per problem
COUNTS_B = [(5 * i) % 7 for i in range(30)]


def folder(root, name, counts, steps=(100,), benchmarks=("amc23",)):
    matrices = {step: dict.fromkeys(benchmarks, counts_matrix(counts)) for step in steps}
    return sampled_run(root, "evaluate", "base", 0, matrices, name=name)


def test_the_difference_is_the_mean_of_the_per_problem_differences(tmp_path):
    """Mean@8 per problem is c/8: A − B = 100 · mean(c_A − c_B) / 8 points, and the p-value is the sign-flip test
    of those 30 differences with the comparison's own stream."""
    a = open_side("A", folder(tmp_path, "a", COUNTS_A), None)
    b = open_side("B", folder(tmp_path, "b", COUNTS_B), None)
    (mean_row, pass_row) = compare_folders(a, b, RESAMPLING)
    per_problem = 100 * (np.array(COUNTS_A) - np.array(COUNTS_B)) / SAMPLES
    assert (mean_row.benchmark, mean_row.metric, mean_row.problems) == ("amc23", "mean@8", 30)
    assert mean_row.difference == pytest.approx(per_problem.mean())
    assert mean_row.mean_a == pytest.approx(100 * np.mean(COUNTS_A) / SAMPLES)
    expected_p = stats.sign_flip_pvalue([per_problem[None, :]], RESAMPLING, "compare-eval/amc23/mean@8")
    assert mean_row.p_value == pytest.approx(float(expected_p))
    assert mean_row.low <= mean_row.difference <= mean_row.high
    assert pass_row.metric == "pass@8"
    assert pass_row.mean_a == pytest.approx(100 * np.mean([c > 0 for c in COUNTS_A]))  # Pass@8 of n = 8: any correct


def test_a_model_against_itself_has_no_difference(tmp_path):
    a = open_side("A", folder(tmp_path, "a", COUNTS_A), None)
    b = open_side("B", folder(tmp_path, "b", COUNTS_A), None)
    rows = compare_folders(a, b, RESAMPLING)
    assert rows
    for row in rows:
        assert (row.difference, row.low, row.high, row.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_the_command_says_what_it_compares(tmp_path, capsys):
    """The output names both folders and steps and says it is a claim about two models, not about methods."""
    path_a = folder(tmp_path, "a", COUNTS_A, steps=(50, 100))
    path_b = folder(tmp_path, "b", COUNTS_B)
    argv = ["compare", "--eval", str(path_a), str(path_b), "--step-a", "50", "--resamples", "500"]
    assert results.main(argv) == 0
    out = capsys.readouterr().out
    assert f"A: {path_a} (step 50;" in out and f"B: {path_b} (step 100;" in out
    assert "this model vs that model on these problems" in out
    assert "It is not a claim about training methods" in out
    assert out.count("| amc23 |") == 2


def test_different_problem_sets_are_refused_naming_both_folders(tmp_path, capsys):
    path_a = folder(tmp_path, "a", COUNTS_A)
    path_b = folder(tmp_path, "b", COUNTS_B[:29])
    assert results.main(["compare", "--eval", str(path_a), str(path_b)]) == 2
    err = capsys.readouterr().err
    assert f"amc23: {path_a} (A, step 100) and {path_b} (B, step 100) evaluated different problems" in err
    assert "only in A: ['29']" in err


def test_different_k_is_refused_naming_both_folders(tmp_path):
    path_a, path_b = folder(tmp_path, "a", COUNTS_A), folder(tmp_path, "b", COUNTS_B)
    config = OmegaConf.load(path_b / "config.yaml")
    config.eval.k = 4
    OmegaConf.save(config, path_b / "config.yaml")
    with pytest.raises(EvalCompareError, match=rf"k differs: 8 in {path_a} \(A\), 4 in {path_b} \(B\)"):
        compare_folders(open_side("A", path_a, None), open_side("B", path_b, None), RESAMPLING)


def test_a_missing_step_or_benchmark_is_refused_naming_the_folder(tmp_path):
    path_a = folder(tmp_path, "a", COUNTS_A, benchmarks=("amc23", "aime24"))
    path_b = folder(tmp_path, "b", COUNTS_B)
    with pytest.raises(EvalCompareError, match=rf"B: {path_b} has no evaluation at step 7; its steps: \[100\]"):
        open_side("B", path_b, 7)
    a, b = open_side("A", path_a, None), open_side("B", path_b, None)
    with pytest.raises(EvalCompareError, match=rf"B: {path_b} has no evaluation of aime24 at step 100"):
        compare_folders(a, b, RESAMPLING)
    with pytest.raises(EvalCompareError, match=r"A: .* holds no evaluations"):
        open_side("A", tmp_path / "empty", None)


def test_several_benchmarks_add_their_average(tmp_path):
    a = open_side("A", folder(tmp_path, "a", COUNTS_A, benchmarks=("amc23", "aime24")), None)
    b = open_side("B", folder(tmp_path, "b", COUNTS_B, benchmarks=("amc23", "aime24")), None)
    rows = compare_folders(a, b, RESAMPLING, metrics=["mean@8"])
    assert [row.benchmark for row in rows] == ["amc23", "aime24", "average"]
    assert rows[2].difference == pytest.approx((rows[0].difference + rows[1].difference) / 2)
    assert rows[2].problems == 60


def _evaluated_with(path, run_seed, drawn_seed, eval_seed=None):
    """Give every summary line of `path` the run's seed as `seed` and, unless None, `drawn_seed`; `eval_seed` sets
    config.yaml's eval.seed."""
    summary = path / "eval" / "summary.jsonl"
    rows = [json.loads(line) for line in summary.read_text().splitlines()]
    drawn = {} if drawn_seed is None else {"drawn_seed": drawn_seed}
    summary.write_text("".join(json.dumps(row | {"seed": run_seed} | drawn) + "\n" for row in rows))
    if eval_seed is not None:
        config = OmegaConf.load(path / "config.yaml")
        OmegaConf.update(config, "eval.seed", eval_seed)
        OmegaConf.save(config, path / "config.yaml")
    return path


def test_the_seed_note_reads_the_drawn_seed_not_the_runs_seed(tmp_path, capsys):
    """A training run of seed 3 and a standalone evaluation both drew with eval.seed 0: no seed differs. Other
    drawn seeds are named as such."""
    path_a = _evaluated_with(folder(tmp_path, "a", COUNTS_A), run_seed=3, drawn_seed=0)
    path_b = _evaluated_with(folder(tmp_path, "b", COUNTS_B), run_seed=0, drawn_seed=0)
    assert results.main(["compare", "--eval", str(path_a), str(path_b), "--resamples", "500"]) == 0
    assert "note:" not in capsys.readouterr().err
    _evaluated_with(path_b, run_seed=0, drawn_seed=7)
    assert results.main(["compare", "--eval", str(path_a), str(path_b), "--resamples", "500"]) == 0
    assert capsys.readouterr().err.splitlines() == ["note: amc23: drawn seed differs (A 0, B 7)"]


def test_lines_without_a_drawn_seed_take_the_configs_eval_seed_and_say_so(tmp_path, capsys):
    path_a = _evaluated_with(folder(tmp_path, "a", COUNTS_A), run_seed=3, drawn_seed=None, eval_seed=0)
    path_b = _evaluated_with(folder(tmp_path, "b", COUNTS_B), run_seed=0, drawn_seed=0)
    assert results.main(["compare", "--eval", str(path_a), str(path_b), "--resamples", "500"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "note: A: written before summary lines recorded drawn_seed: its drawn seed is taken from config.yaml's "
        "eval.seed (with eval.seed_by_step, its step's seed), else from the line's seed"
    ]
