"""The timing table (per run: wall, training and evaluation seconds) on runs whose times are known exactly."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from conftest import compose
from helpers.run_trees import make_run
from omegaconf import OmegaConf

from atr_grpo import results
from atr_grpo.config_hydra import to_object
from atr_grpo.machine import Decision
from atr_grpo.reporting.analyses.timing import stretch_starts, timing_table
from atr_grpo.reporting.runs import find_runs
from atr_grpo.rundir import layout, records
from atr_grpo.training import pipeline


def _rewrite(path, name, edit):
    rows = [edit(json.loads(line)) for line in (path / name).read_text().splitlines()]
    (path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def timed_run(root, method, seed, step0_shared, done_seconds):
    evals = {s: {"arithmetic": (0.2, 0.5)} for s in (0, 2, 4)}
    bench = ["arithmetic"]
    path = make_run(root, "power2", "tiny", method, {"name": method}, seed, evals, max_steps=4, benchmarks=bench)
    times = {0: 30.0, 2: 20.0, 4: 25.0}

    def summary(row):
        row["time_s"] = times[row["step"]]
        if row["step"] == 0 and step0_shared:
            row["shared_start"] = "f6de41cdc17e37f2"  # copied: its time was spent by another run
        return row

    _rewrite(path / "eval", "summary.jsonl", summary)
    _rewrite(path, "metrics.jsonl", lambda row: {**row, "step_time": 1.5 * row["step"]})  # 1.5+3+4.5+6 = 15
    if done_seconds is not None:
        (path / "DONE").write_text(json.dumps({"step": 4, "seconds": done_seconds}))
    return path


def test_each_run_splits_its_wall_time_into_training_its_own_evaluations_and_the_rest(tmp_path):
    timed_run(tmp_path, "clip", 0, step0_shared=False, done_seconds=100.0)
    timed_run(tmp_path, "atr", 0, step0_shared=True, done_seconds=80.0)
    timed_run(tmp_path, "atr", 1, step0_shared=True, done_seconds=None)
    table = timing_table(find_runs(tmp_path))
    rows = {(r["method"], r["seed"]): r for r in table.rows}
    clip = rows[("clip", 0)]
    assert (clip["wall_s"], clip["train_s"], clip["eval_s"], clip["evals"], clip["other_s"]) == (100, 15, 75, 3, 10)
    atr = rows[("atr", 0)]  # step 0 came from the cache: two evaluations of its own
    assert (atr["wall_s"], atr["train_s"], atr["eval_s"], atr["evals"], atr["other_s"]) == (80, 15, 45, 2, 20)
    unfinished = rows[("atr", 1)]
    assert math.isnan(unfinished["wall_s"]) and math.isnan(unfinished["other_s"])
    assert table.missing == ["atr seed 1: no DONE (not finished)"]
    assert "2 finished runs: 180 s of run time in all, median 90.0 s a run (80.0–100.0)" in table.notes[1]


def test_results_writes_the_timing_table_with_the_others(tmp_path):
    timed_run(tmp_path / "runs", "clip", 0, step0_shared=False, done_seconds=100.0)
    out = tmp_path / "tables"
    assert results.main(["timing", "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    text = (out / "timing.md").read_text()
    assert "| power2 | tiny | clip | 0 | 100.0 | 15.0 | 75.0 | 3 | 10.0 |" in text
    csv_lines = (out / "timing.csv").read_text().splitlines()
    assert csv_lines[0] == "experiment,model,method,seed,wall_s,train_s,eval_s,evals,other_s"
    assert pytest.approx(float(csv_lines[1].split(",")[4])) == 100.0


@pytest.mark.parametrize("table", ["timing", "clip_binding"])
def test_a_run_whose_steps_were_logged_twice_stops_the_tables_that_read_its_metrics(tmp_path, capsys, table):
    path = timed_run(tmp_path / "runs", "clip", 0, step0_shared=False, done_seconds=100.0)
    metrics = path / "metrics.jsonl"
    metrics.write_text(metrics.read_text() * 2)  # two processes wrote the run: every step twice
    out = tmp_path / "tables"
    assert results.main([table, "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {metrics}: steps logged more than once: 1, 2, 3, 4" in err
    assert not (out / f"{table}.csv").exists()


def test_a_resumed_run_counts_every_stretch_and_the_table_says_how_many(tmp_path):
    """Launched at 10:00:00, resumed at 10:01:40 and 10:02:10, finished 50 s into the last stretch: wall_s is
    100 + 30 + 50 = 180, not DONE's 50; train_s adds the 2 × 3 s of steps set aside on resume; the table gains a
    `stretches` column (1 for the run that ran once) and a note naming the resumed run."""
    resumed = timed_run(tmp_path / "runs", "atr", 0, step0_shared=False, done_seconds=50.0)
    timed_run(tmp_path / "runs", "clip", 0, step0_shared=False, done_seconds=100.0)
    launch = {"start_time": "2026-12-01T10:00:00+0000", "argv": ["train"]}
    resumes = [{"start_time": "2026-12-01T10:01:40+0000"}, {"start_time": "2026-12-01T10:02:10+0000"}]
    (resumed / "env.json").write_text(json.dumps({**launch, "resumes": resumes}))
    discarded = [{"step": 3, "step_time": 3.0}, {"step": 4, "step_time": 3.0}]
    (resumed / "metrics.discarded.jsonl").write_text("".join(json.dumps(r) + "\n" for r in discarded))
    out = tmp_path / "tables"
    assert results.main(["timing", "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    csv_lines = (out / "timing.csv").read_text().splitlines()
    assert csv_lines[0] == "experiment,model,method,seed,wall_s,train_s,eval_s,evals,other_s,stretches"
    text = (out / "timing.md").read_text()
    assert "| power2 | tiny | atr | 0 | 180.0 | 21.0 | 75.0 | 3 | 84.0 | 3 |" in text
    assert "| power2 | tiny | clip | 0 | 100.0 | 15.0 | 75.0 | 3 | 10.0 | 1 |" in text
    assert "resumed runs, in stretches (launches): atr seed 0 (3); their wall_s adds each earlier stretch" in text


def test_a_relaunch_records_a_stretch_only_when_the_run_is_not_finished(tmp_path):
    """The same command again: an unfinished run continues, a new stretch in env.json's `resumes`; a finished run
    trains nothing, so env.json is left as it was and timing still counts the stretches it ran."""
    composed = compose(["experiment=smoke", "eval=none", f"run_dir={tmp_path / 'run'}"])

    def relaunch():
        return pipeline.prepare_run_dir(to_object(composed), OmegaConf.to_yaml(composed), Decision("trl", "hf", None))

    relaunch()
    relaunch()  # cut off before DONE: a resume
    records.write_done(tmp_path / "run", records.Done(step=4, seconds=50.0))
    before = layout.env_path(tmp_path / "run").read_text()
    assert relaunch().finished
    assert layout.env_path(tmp_path / "run").read_text() == before
    assert len(json.loads(before)["resumes"]) == 1
    assert len(stretch_starts(SimpleNamespace(path=tmp_path / "run"))) == 2


def test_a_run_that_ran_once_keeps_the_table_without_a_stretches_column(tmp_path):
    path = timed_run(tmp_path / "runs", "clip", 0, step0_shared=False, done_seconds=100.0)
    (path / "env.json").write_text(json.dumps({"start_time": "2026-12-01T10:00:00+0000"}))
    table = timing_table(find_runs(tmp_path / "runs"))
    assert table.columns[-1] == "other_s" and table.rows[0]["wall_s"] == 100.0
    assert not any("resumed" in note for note in table.notes)


def test_the_notes_give_the_experiments_span_and_the_evaluations_inside_the_run_folders(tmp_path):
    """First start to last end: the earliest env.json start_time to the latest start + DONE's seconds, so runs at
    once count once; then the evaluations of the standalone folders inside the runs (a plan's final evaluation)."""
    starts = {"clip": "2026-12-05T10:00:00+0000", "atr": "2026-12-05T10:30:00+0000"}
    for method, seconds in (("clip", 600.0), ("atr", 1200.0)):  # atr ends at 10:50
        path = timed_run(tmp_path, method, 0, step0_shared=False, done_seconds=seconds)
        (path / layout.ENV_FILE).write_text(json.dumps({"start_time": starts[method]}))
        final = path / "final_eval"
        layout.request_path(final).parent.mkdir(parents=True)
        layout.request_path(final).write_text("{}")
        line = {"step": 4, "benchmark": "arithmetic", "time_s": 45.0}
        layout.summary_path(final).write_text(json.dumps(line) + "\n")
    notes = timing_table(find_runs(tmp_path)).notes
    (span,) = [note for note in notes if note.startswith("first start to last end")]
    assert span.startswith("first start to last end: 50.0 min (2026-12-05 10:00 UTC and on;")
    assert "the wall time of these 2 runs, runs at once counted once" in span
    (inner,) = [note for note in notes if note.startswith("evaluations inside the run folders")]
    assert inner.startswith("evaluations inside the run folders (final_eval/, e.g. a plan's final evaluation): 2 of")
    assert "1.5 min of evaluation in all" in inner
