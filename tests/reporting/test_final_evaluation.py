"""A plan's final evaluation (`final_evaluation` in plan.yaml): the key checked, its test the last secondary of the
family, read from each run's `<folder>/eval/` (not the run's own evaluations) at the final endpoint, not gated for
precision, and a missing folder named with the command that writes it."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers.run_trees import BENCHES, read_csv
from helpers.sampled_runs import PROBLEMS, SAMPLES, counts_matrix, mean_and_pass, sampled_run, write_sample_file
from test_analysis_plan import commit_all, git, run_cli, write_plan

from atr_grpo.reporting import plan
from atr_grpo.rundir import files, layout
from atr_grpo.rundir.records import SummaryRow

SEEDS = list(range(7))  # the sign-flip's smallest p, 2/128, is below Holm's first level 0.05/2
FINAL = {"folder": "final_eval", "temperature": 0.3, "top_p": 0.95}


def test_the_final_evaluation_loads_typed_and_joins_the_family(tmp_path):
    loaded = plan.load_plan(write_plan(tmp_path / "plan.yaml", final_evaluation=FINAL))
    assert loaded.final_evaluation == plan.FinalEvaluation("final_eval", 0.3, 0.95)
    assert loaded.secondary_count == 3  # two comparisons and the final evaluation
    assert loaded.level("secondary") == pytest.approx(0.05 / 3)
    assert plan.load_plan(write_plan(tmp_path / "plan.yaml")).level("secondary") == pytest.approx(0.05 / 2)


@pytest.mark.parametrize(
    "value, message",
    [
        ({"folder": "eval", "temperature": 0.3, "top_p": 0.95}, "final_evaluation.folder is 'eval'; allowed: a folder"),
        ({"folder": "a/b", "temperature": 0.3, "top_p": 0.95}, "final_evaluation.folder is 'a/b'"),
        ({"folder": "f", "temperature": 0, "top_p": 0.95}, "final_evaluation.temperature is 0; allowed: a number > 0"),
        ({"folder": "f", "temperature": 0.3, "top_p": 1.5}, "final_evaluation.top_p is 1.5; allowed: a number in"),
        ({"folder": "f", "temperature": 0.3}, "allowed: a mapping with exactly the keys folder, temperature, top_p"),
    ],
)
def test_a_bad_final_evaluation_names_the_key_and_what_it_allows(tmp_path, value, message):
    with pytest.raises(plan.PlanError, match=message.replace("(", r"\(").replace(".", r"\.")):
        plan.load_plan(write_plan(tmp_path / "plan.yaml", final_evaluation=value))


def _final_evaluation(run, step, correct):
    """`<run>/final_eval/eval/`: one step, every problem with `correct` correct samples of 8."""
    root, matrix = run / "final_eval", counts_matrix([correct] * PROBLEMS)
    lines = []
    for bench in yaml.safe_load((run / "config.yaml").read_text())["eval"]["benchmarks"]:
        write_sample_file(layout.sample_file(root, step, bench), matrix)
        mean, passk = mean_and_pass(matrix)
        lines.append(SummaryRow(step, bench, {"num_problems": PROBLEMS, "n": SAMPLES, "mean@8": mean, "pass@8": passk}))
    files.write_jsonl(layout.summary_path(root), [line.to_dict() for line in lines])


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """7 seeds: atr above clip in every seed of the runs' own evaluations (4 against 2 correct samples per problem),
    and below it in the final evaluation (3 against 5); the plan with a final evaluation, committed first."""
    root = tmp_path_factory.mktemp("final")
    git(root, "init", "-q")
    write_plan(root / "plan.yaml", seeds=SEEDS, secondary=[["clip_higher", "clip"]], final_evaluation=FINAL)
    planned = commit_all(root, "plan")
    own = {"clip": 2, "clip_higher": 2, "atr": 4}
    final = {"clip": 5, "clip_higher": 5, "atr": 3}
    runs = []
    for seed in SEEDS:
        for method in own:
            matrix = counts_matrix([own[method] + (i + seed) % 3 for i in range(PROBLEMS)])
            matrices = {step: dict.fromkeys(BENCHES, matrix) for step in (50, 100)}
            path = sampled_run(root / "runs", "trial", method, seed, matrices)
            (path / "env.json").write_text(json.dumps({"git_commit": planned}))
            runs.append((path, final[method]))
    return root, runs


def test_a_plan_without_the_final_evaluation_names_the_command_that_writes_it(experiment):
    root, _ = experiment
    code, _, err = run_cli("compare", "atr", "clip", "--runs", root / "runs", "--resamples", 200)
    assert code == 2
    assert "final_evaluation: no evaluation in final_eval/ of trial__" in err
    assert "`python -m atr_grpo.final_eval --runs" in err


def test_the_final_evaluations_test_reads_its_folder_at_the_final_step(experiment, tmp_path):
    root, runs = experiment
    for path, correct in runs:
        _final_evaluation(path, 100, correct)
    out = tmp_path / "tables"
    code, _, err = run_cli("all", "--runs", root / "runs", "--out", out, "--resamples", 200)
    assert code == 0, err
    rows = {r["comparison"]: r for r in read_csv(out / "plan.csv")}
    assert list(rows) == ["atr − clip", "clip_higher − clip", "atr − clip [final_eval, final]"]
    primary, final = rows["atr − clip"], rows["atr − clip [final_eval, final]"]
    assert primary["difference"] == "25.00" and primary["verdict"].startswith("differs: atr above clip")
    # 3 against 5 correct samples of 8 on every problem of every seed: −25 points, from the folder alone
    assert (final["role"], final["difference"], final["level"]) == ("secondary", "-25.00", "0.025")
    assert final["verdict"].startswith("differs: atr below clip")
    code, printed, err = run_cli("compare", "atr", "clip", "--runs", root / "runs", "--resamples", 200)
    assert code == 0, err
    assert "the 2 secondaries by Holm" in printed  # clip_higher − clip and the final evaluation
    assert "Final evaluation: final_eval: the final adapters at temperature 0.3, top-p 0.95" in printed
    (row,) = [line for line in printed.splitlines() if "| atr − clip [final_eval, final] |" in line]
    assert "| -25.00 |" in row and "differs: atr below clip" in row
