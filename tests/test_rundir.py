"""Run-directory files: appended, atomically written, never silently overwritten."""

import json

import pytest

from atr_grpo import rundir


def test_jsonl_appends_and_skips_only_a_torn_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    rundir.append_jsonl(path, {"step": 1})
    rundir.append_jsonl(path, [{"step": 2}, {"step": 3}])
    with path.open("a") as handle:
        handle.write('{"step": 4, "rew')  # a run killed mid-write
    assert [r["step"] for r in rundir.read_jsonl(path)] == [1, 2, 3]
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=":2: not valid JSON"):
        rundir.read_jsonl(path)


def test_write_json_refuses_to_overwrite_when_asked(tmp_path):
    path = tmp_path / "env.json"
    rundir.write_json(path, {"a": 1}, overwrite=False)
    with pytest.raises(FileExistsError):
        rundir.write_json(path, {"a": 2}, overwrite=False)
    assert json.loads(path.read_text()) == {"a": 1}
    assert not list(tmp_path.glob(".*tmp*")), "no temporary file is left behind"


def test_find_run_dirs_and_eval_paths(tmp_path):
    for name in ("b", "a/x"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "config.yaml").write_text("seed: 0\n")
    (tmp_path / "a/x/checkpoints/checkpoint-1").mkdir(parents=True)
    (tmp_path / "a/x/checkpoints/checkpoint-1/config.yaml").write_text("")
    assert rundir.find_run_dirs(tmp_path) == [tmp_path / "a/x", tmp_path / "b"]
    assert rundir.eval_step_dir(tmp_path, 50) == tmp_path / "eval" / "step_000050"
    assert rundir.summary_path(tmp_path) == tmp_path / "eval" / "summary.jsonl"


def test_environment_records_versions_and_device():
    env = rundir.environment()
    assert env["packages"]["torch"].startswith("2.13.0")
    assert env["packages"]["trl"] == "1.15.0"
    assert {"git_commit", "python", "device", "start_time"} <= set(env)
