"""`regrade`: every saved sample re-scored with the current grader, beside the originals and never over them.
Unchanged code changes 0 verdicts and reproduces the summaries; a verdict the old grader got wrong is reported
(count and example) and corrected in the new summary, which the tables use with --grader; a second regrade
grades only what is new; compressed per-sample files are read; the grader's identity is recorded."""

from __future__ import annotations

import contextlib
import gzip
import io
import json

import pytest
from helpers.run_trees import BENCHES, cell, read_csv
from helpers.sampled_runs import method_matrices, sampled_run

from atr_grpo import rundir
from atr_grpo.evaluation.outputs import read_summary
from atr_grpo.reporting import regrade
from atr_grpo.results import main


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def regrade_cli(root, *extra):
    return run_cli("regrade", "--runs", root, "--workers", 0, "--no-progress", *extra)


@pytest.fixture()
def tree(tmp_path):
    root = tmp_path / "runs"
    sampled_run(root, "table2", "clip", 0, method_matrices(0, 0))
    sampled_run(root, "table2", "atr", 0, method_matrices(1, 0), compress=True)
    return root


def tag():
    return regrade.grader_identity()["tag"]


def snapshot(root):
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "regrade" not in p.parts}


def test_unchanged_grader_changes_nothing_and_reproduces_the_summaries(tree):
    before = snapshot(tree)
    code, out, err = regrade_cli(tree)
    assert code == 0, err
    assert f"grader {tag()} (math-verify 0.9.0" in out
    assert "clip__s0__model=qwen3-1.7b: amc23: 0 of 480 verdicts changed, 0 statuses (steps 50, 100)" in out
    assert "0 of 2880 verdicts changed in 2 runs" in out  # 2 runs × 3 benchmarks × 2 steps × 30 × 8
    assert snapshot(tree) == before  # nothing of the originals is touched
    for run in tree.glob("table2/*"):
        original, regraded = read_summary(run), rundir.read_jsonl(regrade.summary_path(run, tag()))
        assert len(regraded) == len(original) == 6
        for line in regraded:
            assert line["mean@8"] == original[(line["step"], line["benchmark"])]["mean@8"]
            assert (line["changed"], line["grader"], line["grader_before"]) == (0, tag(), None)
    identity = rundir.read_json(regrade.regrade_dir(run, tag()) / "grader.json")
    assert identity["packages"]["math-verify"] == "0.9.0" and len(identity["grader_code_sha256"]) == 64


def flip_one_verdict(path, summary=None):
    """Record one right answer as wrong, as a buggier grader would have (and its summary line, if given)."""
    records = rundir.read_jsonl(path)
    wrong = next(r for r in records if r["correct"])
    wrong.update(correct=False, status="wrong")
    text = "".join(json.dumps(r) + "\n" for r in records)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    if summary is not None:
        lines = rundir.read_jsonl(summary)
        for line in lines:
            if (line["step"], line["benchmark"]) == (100, path.name.split(".")[0]):
                line["mean@8"] -= 1 / 240
        summary.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return wrong


def test_a_wrong_old_verdict_is_reported_corrected_and_used_with_grader(tree, tmp_path):
    run = tree / "table2" / "table2__clip__s0__model=qwen3-1.7b"
    wrong = flip_one_verdict(run / "eval" / "step_000100" / "aime24.jsonl", run / "eval" / "summary.jsonl")
    code, out, _ = regrade_cli(tree)
    assert code == 0
    assert "clip__s0__model=qwen3-1.7b: aime24: 1 of 480 verdicts changed, 1 statuses (steps 50, 100)" in out
    assert (
        f"step 100, problem {wrong['problem_id']}, sample {wrong['sample']}: gold '{wrong['gold']}', "
        f"extracted '{wrong['gold']}': wrong → correct" in out
    )
    assert "1 of 2880 verdicts changed" in out
    (change,) = rundir.read_jsonl(regrade.regrade_dir(run, tag()) / "changes.jsonl")
    assert change["before"]["correct"] is False and change["after"]["correct"] is True
    fixed = {(r["step"], r["benchmark"]): r for r in rundir.read_jsonl(regrade.summary_path(run, tag()))}
    assert fixed[(100, "aime24")]["mean@8"] == pytest.approx(read_summary(run)[(100, "aime24")]["mean@8"] + 1 / 240)
    assert fixed[(100, "aime24")]["changed"] == 1
    # the tables keep the original verdicts by default and take the regrade on request, intervals included
    for grader, value in ((None, "24.58"), (tag(), "25.00")):
        out_dir = tmp_path / f"out-{grader}"
        extra = ("--grader", grader) if grader else ()
        assert run_cli("table2", "--runs", tree, "--out", out_dir, "--resamples", 200, *extra)[0] == 0
        row = cell(read_csv(out_dir / "table2.csv"), method="clip", benchmark="aime24", metric="mean@8")
        assert row["final"] == value and row["ci_low"] != "nan"


def test_the_regrade_summary_holds_what_mean_at_k_is_made_of(tree):
    """clip's step 100 on aime24: 60 of 240 samples right (problem i has i % 5), none on problem 0. Two of problem
    0's wrong samples lose their box and one runs out of tokens: 237 answered, 60 of them right, 1 truncated, and
    Mean@8 = 237/240 × 60/237 is unchanged."""
    run = tree / "table2" / "table2__clip__s0__model=qwen3-1.7b"
    path = run / "eval" / "step_000100" / "aime24.jsonl"
    records = rundir.read_jsonl(path)
    for sample in records[:2]:
        sample.update(completion="I cannot tell.", extracted=None, status="no_answer")
    records[2].update(finish_reason="length", status="truncated")
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert regrade_cli(tree)[0] == 0
    line = {(r["step"], r["benchmark"]): r for r in rundir.read_jsonl(regrade.summary_path(run, tag()))}[
        (100, "aime24")
    ]
    assert line["answered@8"] == pytest.approx(237 / 240)
    assert line["acc_given_answer@8"] == pytest.approx(60 / 237)
    assert line["truncated@8"] == pytest.approx(1 / 240)
    assert line["mean@8"] == pytest.approx(60 / 240) and line["changed"] == 0
    assert line["answered@8_stderr"] > 0 and line["mean@8_stderr"] > 0
    assert line["status_counts"]["no_answer"] == 2 and line["status_counts"]["truncated"] == 1


def test_a_second_regrade_grades_only_what_is_new(tree):
    run = tree / "table2" / "table2__atr__s0__model=qwen3-1.7b"
    regrade_cli(tree)
    lines = rundir.read_jsonl(regrade.summary_path(run, tag()))
    code, out, _ = regrade_cli(tree)
    assert code == 0 and "amc23: 0 of 480 verdicts changed, 0 statuses (steps 50, 100) (already regraded" in out
    assert rundir.read_jsonl(regrade.summary_path(run, tag())) == lines
    # a re-evaluation replaced one per-sample file (another hash): that evaluation alone is graded again
    flip_one_verdict(run / "eval" / "step_000100" / "amc23.jsonl.gz")
    sampled_run(tree, "other", "x", 0, {100: {"amc23": [[True] * 8] * 30}})  # and a new run appeared
    code, out, _ = regrade_cli(tree)
    assert "atr__s0__model=qwen3-1.7b: amc23: 1 of 480 verdicts changed, 1 statuses (steps 50, 100)\n" in out
    assert "atr__s0__model=qwen3-1.7b: aime24: 0 of 480 verdicts changed, 0 statuses (steps 50, 100) (already" in out
    assert "x__s0__model=qwen3-1.7b: amc23: 0 of 240 verdicts changed" in out
    after = rundir.read_jsonl(regrade.summary_path(run, tag()))
    assert after[: len(lines)] == lines
    assert [(r["step"], r["benchmark"]) for r in after[len(lines) :]] == [(100, "amc23")]
    assert (regrade.verdict_file(run, tag(), 100, "amc23").parent / "amc23.jsonl.replaced-1").exists()


def test_grader_tag_unknown_lists_the_regrades(tree, capsys):
    regrade_cli(tree)
    with pytest.raises(SystemExit):
        main(["table2", "--runs", str(tree), "--grader", "math-verify-0.0.1__0000000000"])
    assert (
        f"no run under {tree} has eval/regrade/math-verify-0.0.1__0000000000/; regrades found: {tag()}"
        in capsys.readouterr().err
    )


def test_regrade_uses_the_worker_pool(tree):
    code, out, _ = run_cli("regrade", "--runs", tree, "--workers", 2, "--no-progress", "--experiment", "table2")
    assert code == 0 and "0 of 2880 verdicts changed in 2 runs" in out
    assert set(BENCHES) == {
        line["benchmark"]
        for line in rundir.read_jsonl(
            regrade.summary_path(tree / "table2" / "table2__clip__s0__model=qwen3-1.7b", tag())
        )
    }
