"""eval.share_start: step 0 is evaluated once per starting point and evaluation settings, and every later run from
it gets the same per-sample files and summary values, with its own run fields and the cache key it came from."""

from __future__ import annotations

import json

from conftest import train_config

from atr_grpo import rundir
from atr_grpo.evaluation.outputs import read_summary, sample_file
from atr_grpo.provenance import record_start_point
from atr_grpo.training.shared_start import evaluate_start_once, start_key

START = {"base_model": "tiny/abc", "base_model_sha256": "b" * 64, "sft_adapter": "k", "sft_adapter_sha256": "1" * 64}


def fake_evaluation(run_dir, calls):
    """What run_evaluation leaves for step 0: a per-sample file, then its summary line; returns flat metrics."""

    def evaluate():
        calls.append(run_dir)
        lines = [{"problem_id": i, "sample": 0, "correct": i % 2 == 0} for i in range(4)]
        path = sample_file(run_dir, 0, "arithmetic")
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        row = {
            "step": 0,
            "benchmark": "arithmetic",
            "mean@8": 0.5,
            "pass@8": 0.5,
            "mean@1": 0.5,
            "pass@1": 0.5,
            "method": "clip",
            "seed": 0,
            "model": "tiny",
            "adapter_step": 0,
        }
        rundir.append_jsonl(rundir.summary_path(run_dir), row)
        return {"eval/arithmetic/mean@8": 0.5}

    return evaluate


def test_step_0_is_evaluated_once_and_copied_into_later_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("ATR_GRPO_CACHE", str(tmp_path / "cache"))
    cfg = train_config(["experiment=power"])
    first, second = tmp_path / "power__clip__s0", tmp_path / "power__atr__s3"
    calls = []
    for run in (first, second):
        run.mkdir()
        record_start_point(run, START)
    interrupted = sample_file(second, 0, "arithmetic")  # a step-0 file without its summary line
    interrupted.parent.mkdir(parents=True)
    interrupted.write_text("partial\n")
    meta = {"model": "tiny", "method": "atr", "seed": 3, "adapter_step": 0}
    assert evaluate_start_once(cfg, first, ["arithmetic"], {}, fake_evaluation(first, calls))
    metrics = evaluate_start_once(cfg, second, ["arithmetic"], meta, fake_evaluation(second, calls))
    assert calls == [first], "the second run must not evaluate step 0 again"
    assert metrics["eval/arithmetic/mean@8"] == 0.5 and metrics["eval/average/mean@8"] == 0.5
    assert sample_file(second, 0, "arithmetic").read_bytes() == sample_file(first, 0, "arithmetic").read_bytes()
    row = read_summary(second)[(0, "arithmetic")]
    assert (row["method"], row["seed"], row["mean@8"]) == ("atr", 3, 0.5)
    assert row["shared_start"] == start_key(cfg, START)
    assert interrupted.with_name("arithmetic.jsonl.interrupted-1").read_text() == "partial\n"
    # the same second run again (a resume) adds nothing; another adapter gets an evaluation of its own
    evaluate_start_once(cfg, second, ["arithmetic"], meta, fake_evaluation(second, calls))
    assert len(rundir.read_jsonl(rundir.summary_path(second))) == 1
    other = tmp_path / "other"
    other.mkdir()
    record_start_point(other, START | {"sft_adapter_sha256": "2" * 64})
    evaluate_start_once(cfg, other, ["arithmetic"], meta, fake_evaluation(other, calls))
    assert calls == [first, other]


def test_a_run_without_a_recorded_start_evaluates_step_0_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("ATR_GRPO_CACHE", str(tmp_path / "cache"))
    cfg = train_config(["experiment=power"])
    calls = []
    (tmp_path / "run").mkdir()
    evaluate_start_once(cfg, tmp_path / "run", ["arithmetic"], {}, fake_evaluation(tmp_path / "run", calls))
    assert calls == [tmp_path / "run"] and not (tmp_path / "cache").exists()
    assert "shared_start" not in read_summary(tmp_path / "run")[(0, "arithmetic")]


def test_an_entry_cached_before_a_score_existed_is_not_reused(tmp_path, monkeypatch):
    """The key names the scores a summary line holds: a step 0 cached by a version without the parts of Mean@K
    would show "-" for them in every run that copied it, so those runs evaluate step 0 again."""
    from atr_grpo.evaluation.outcomes import PARTS
    from atr_grpo.training import shared_start

    monkeypatch.setenv("ATR_GRPO_CACHE", str(tmp_path / "cache"))
    cfg = train_config(["experiment=power"])
    current = shared_start.summary_scores

    def without_parts(statuses):
        return {k: v for k, v in current(statuses).items() if k.split("@")[0] not in PARTS}

    older, newer, calls = tmp_path / "older", tmp_path / "newer", []
    for run in (older, newer):
        run.mkdir()
        record_start_point(run, START)
    monkeypatch.setattr(shared_start, "summary_scores", without_parts)
    old_key = start_key(cfg, START)
    evaluate_start_once(cfg, older, ["arithmetic"], {}, fake_evaluation(older, calls))
    monkeypatch.setattr(shared_start, "summary_scores", current)
    assert start_key(cfg, START) != old_key
    evaluate_start_once(cfg, newer, ["arithmetic"], {}, fake_evaluation(newer, calls))
    assert calls == [older, newer], "a run must not reuse a step 0 cached without the scores it expects"
