"""Which steps are evaluated and where each stands, from the run directory's files; the callback's order of
work at a scheduled step (save the adapter, evaluate or leave it for the stage after training, clean up)."""

import json
from pathlib import Path
from types import SimpleNamespace

from atr_grpo import rundir
from atr_grpo.config_training import EvalConfig
from atr_grpo.evaluation.callback import EvaluationCallback
from atr_grpo.evaluation.schedule import (
    Schedule,
    adapter_dir,
    evaluation_state,
    read_failures,
    record_failure,
    remove_adapter,
    run_evaluation_state,
    saved_adapters,
)
from atr_grpo.reporting.runs import Run


def test_the_schedule_is_step_zero_with_at_start_every_every_steps_and_the_last_step():
    assert Schedule(50, at_start=True).steps(1000) == [0, *range(50, 1001, 50)]
    assert Schedule(2, at_start=False).steps(5) == [2, 4, 5]
    assert Schedule(2, at_start=True).steps(4) == [0, 2, 4]


def test_a_config_without_eval_at_start_is_read_with_the_schemas_default():
    """One schedule: a saved config.yaml that lacks `eval.at_start` (or `eval.enabled`) means what the schema
    meant when the run trained, for the callback, the pipeline and the results tables alike."""
    config = {"eval": {"every_steps": 2, "benchmarks": ["arithmetic"]}, "trainer": {"max_steps": 4}}
    expected = Schedule(2, at_start=EvalConfig.at_start).steps(4)
    assert Schedule.of(config["eval"]) == Schedule(2, EvalConfig.at_start)
    assert Run(Path("run"), config).expected_eval_steps == expected
    assert run_evaluation_state(Path("nowhere"), config).scheduled == expected


def test_the_callback_evaluates_exactly_the_scheduled_steps():
    for every_steps, at_start, max_steps in [(2, True, 5), (3, False, 9), (4, True, 3), (1, False, 2)]:
        hooks = Hooks()
        schedule = Schedule(every_steps, at_start)
        run_callback(EvaluationCallback(None, schedule, save_fn=hooks.save), max_steps)
        assert [call[1] for call in hooks.calls] == schedule.steps(max_steps)


def fake_adapter(run_dir, step):
    path = adapter_dir(run_dir, step)
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    return path


def summary_line(run_dir, step, benchmark):
    rundir.append_jsonl(rundir.summary_path(run_dir), {"step": step, "benchmark": benchmark, "mean@8": 0.5})


def test_done_failed_pending_and_missing_steps(tmp_path):
    """Done = every benchmark summarised; failed = last attempt failed; pending = adapter waiting; missing = neither."""
    for step in (0, 2):
        summary_line(tmp_path, step, "amc23")
        summary_line(tmp_path, step, "aime24")
    summary_line(tmp_path, 4, "amc23")  # aime24 of step 4 never written: not done
    fake_adapter(tmp_path, 4)
    fake_adapter(tmp_path, 6)
    (adapter_dir(tmp_path, 8)).mkdir(parents=True)  # a half-written adapter (no config) does not count
    try:
        raise MemoryError("KV cache")
    except MemoryError as err:
        record = record_failure(tmp_path, 4, "during", err)
    assert record["error"] == "MemoryError: KV cache" and "Traceback" in record["traceback"]
    state = evaluation_state(tmp_path, [0, 2, 4, 6, 8, 10], ["amc23", "aime24"], trained_to=8)
    assert state.done == [0, 2] and state.pending == [4, 6] and state.missing == [8]
    assert state.failed == {4: "MemoryError: KV cache"} and not state.complete
    text = state.describe()
    assert "2 of 6 scheduled evaluations done" in text and "failed at steps [4]" in text and "[8]" in text
    assert sorted(saved_adapters(tmp_path)) == [4, 6]
    remove_adapter(tmp_path, 6)
    assert sorted(saved_adapters(tmp_path)) == [4]


def test_a_later_success_clears_a_failure(tmp_path):
    record_failure(tmp_path, 2, "after", RuntimeError("engine died"))
    summary_line(tmp_path, 2, "arithmetic")
    state = evaluation_state(tmp_path, [2], ["arithmetic"])
    assert state.complete and state.failed == {}
    assert len(read_failures(tmp_path)) == 1, "the failed attempt stays on record"


def test_run_state_from_the_config(tmp_path):
    config = {
        "eval": {"enabled": True, "every_steps": 2, "at_start": True, "benchmarks": ["arithmetic"]},
        "trainer": {"max_steps": 4},
    }
    assert run_evaluation_state(tmp_path, {**config, "eval": {"enabled": False}}) is None
    state = run_evaluation_state(tmp_path, config)
    assert state.scheduled == [0, 2, 4] and state.missing == [], "a run still training misses nothing yet"
    rundir.write_json(tmp_path / rundir.DONE_FILE, {"step": 4})
    assert run_evaluation_state(tmp_path, config).missing == [0, 2, 4]


class Hooks:
    def __init__(self, fail_at=()):
        self.calls, self.fail_at = [], set(fail_at)

    def save(self, step):
        self.calls.append(("save", step))

    def evaluate(self, step):
        self.calls.append(("evaluate", step))
        if step in self.fail_at:
            raise RuntimeError(f"boom at {step}")
        return {"eval/average/mean@8": 0.1}

    def failure(self, step, error):
        self.calls.append(("failure", step, str(error)))

    def done(self, step):
        self.calls.append(("done", step))


def run_callback(callback, max_steps):
    state, control = SimpleNamespace(global_step=0, is_world_process_zero=True), SimpleNamespace()
    callback.on_train_begin(None, state, control)
    while state.global_step < max_steps:
        state.global_step += 1
        callback.on_step_end(None, state, control)
    callback.on_train_end(None, state, control)


def test_during_training_each_step_is_saved_then_evaluated_and_a_failure_is_recorded():
    hooks = Hooks(fail_at={2})
    callback = EvaluationCallback(
        hooks.evaluate, Schedule(2, at_start=True), save_fn=hooks.save, failure_fn=hooks.failure, done_fn=hooks.done
    )
    run_callback(callback, 4)
    assert hooks.calls == [
        ("save", 0),
        ("evaluate", 0),
        ("done", 0),
        ("save", 2),
        ("evaluate", 2),
        ("failure", 2, "boom at 2"),  # the adapter of step 2 is kept
        ("save", 4),
        ("evaluate", 4),
        ("done", 4),
    ]
    assert callback.failures == [2]


def test_after_training_the_callback_only_saves_adapters():
    hooks = Hooks()
    run_callback(EvaluationCallback(None, Schedule(2, at_start=True), save_fn=hooks.save, done_fn=hooks.done), 5)
    assert hooks.calls == [("save", 0), ("save", 2), ("save", 4), ("save", 5)]


def test_a_failed_save_is_recorded_and_skips_the_evaluation():
    hooks = Hooks()

    def broken_save(step):
        raise OSError("disk full")

    callback = EvaluationCallback(
        hooks.evaluate, Schedule(2, at_start=False), save_fn=broken_save, failure_fn=hooks.failure
    )
    run_callback(callback, 2)
    assert hooks.calls == [("failure", 2, "disk full")] and callback.failures == [2]


def test_failures_file_is_jsonl(tmp_path):
    record_failure(tmp_path, 3, "after", ValueError("x"))
    lines = (tmp_path / "eval" / "failures.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["step"] == 3 and json.loads(lines[0])["stage"] == "after"
