"""The in-training evaluation callback, driven by a fake Trainer loop."""

import logging
from types import SimpleNamespace

import pytest
from transformers import TrainerCallback

from atr_grpo.evaluation.callback import EvaluationCallback
from atr_grpo.evaluation.schedule import Schedule


def train(callback, max_steps, start_step=0, world_zero=True):
    """What transformers' Trainer does around the optimizer steps, minus the training."""
    state = SimpleNamespace(global_step=start_step, is_world_process_zero=world_zero)
    control = SimpleNamespace()
    assert callback.on_train_begin(None, state, control) is control
    while state.global_step < max_steps:
        state.global_step += 1
        assert callback.on_step_end(None, state, control) is control
    callback.on_train_end(None, state, control)


class Recorder:
    def __init__(self, fail_at=()):
        self.steps, self.logged, self.fail_at = [], [], set(fail_at)

    def evaluate(self, step):
        self.steps.append(step)
        if step in self.fail_at:
            raise RuntimeError(f"boom at {step}")
        return {"eval/average/mean@8": step / 100}

    def log(self, metrics, step):
        self.logged.append((step, metrics))


def test_schedule_every_steps_start_and_end():
    rec = Recorder()
    callback = EvaluationCallback(rec.evaluate, Schedule(2, at_start=True), log_fn=rec.log)
    assert isinstance(callback, TrainerCallback)
    train(callback, max_steps=5)
    assert rec.steps == [0, 2, 4, 5]
    assert rec.logged == [(s, {"eval/average/mean@8": s / 100}) for s in (0, 2, 4, 5)]


def test_the_last_step_is_evaluated_once_even_when_it_is_a_multiple():
    rec = Recorder()
    train(EvaluationCallback(rec.evaluate, Schedule(2, at_start=False)), max_steps=4)
    assert rec.steps == [2, 4]


def test_a_failed_evaluation_is_logged_and_training_continues(caplog):
    rec = Recorder(fail_at={2})
    callback = EvaluationCallback(rec.evaluate, Schedule(2, at_start=False), log_fn=rec.log)
    with caplog.at_level(logging.ERROR, logger="atr_grpo.evaluation.callback"):
        train(callback, max_steps=6)
    assert rec.steps == [2, 4, 6] and [s for s, _ in rec.logged] == [4, 6]
    assert callback.failures == [2]
    (record,) = caplog.records
    assert "step 2 failed" in record.getMessage() and record.exc_info is not None  # the traceback is kept
    assert "boom at 2" in caplog.text


def test_a_resumed_run_does_not_evaluate_step_zero():
    rec = Recorder()
    train(EvaluationCallback(rec.evaluate, Schedule(5, at_start=True)), max_steps=12, start_step=10)
    assert rec.steps == [12]


def test_only_the_main_process_evaluates():
    rec = Recorder()
    train(EvaluationCallback(rec.evaluate, Schedule(1, at_start=True)), max_steps=3, world_zero=False)
    assert rec.steps == []


def launched_callback(events, fail_save_at=()):
    def save(step):
        events.append(("save", step))
        if step in fail_save_at:
            raise OSError("disk full")

    return EvaluationCallback(
        lambda step: events.append(("evaluate", step)) or {"eval/x": 1.0},
        Schedule(2, at_start=True),
        log_fn=lambda metrics, step: events.append(("log", step)),
        save_fn=save,
        wait_fn=lambda: events.append(("wait",)),
    )


def test_under_a_launcher_every_process_saves_and_the_others_wait_for_the_main_ones_evaluation():
    """Each scheduled step: every process takes part in saving (a sharded model needs all of them), the main one
    evaluates and logs, and then each process reaches the barrier, so the others wait for the evaluation."""
    main, other = [], []
    train(launched_callback(main), max_steps=4)
    train(launched_callback(other), max_steps=4, world_zero=False)
    assert main == [
        event for step in (0, 2, 4) for event in (("save", step), ("evaluate", step), ("log", step), ("wait",))
    ]
    assert other == [event for step in (0, 2, 4) for event in (("save", step), ("wait",))]


def test_a_failed_save_still_reaches_the_barrier(caplog):
    """A failure on either side is logged and the process still waits at the barrier: no process is left hanging."""
    main, other = [], []
    with caplog.at_level(logging.ERROR, logger="atr_grpo.evaluation.callback"):
        train(launched_callback(main, fail_save_at={2}), max_steps=2)
        train(launched_callback(other, fail_save_at={2}), max_steps=2, world_zero=False)
    assert main[-2:] == [("save", 2), ("wait",)] and other[-2:] == [("save", 2), ("wait",)]
    assert sum("step 2 failed" in r.getMessage() for r in caplog.records) == 2


def test_every_steps_must_be_positive():
    with pytest.raises(ValueError):
        EvaluationCallback(lambda step: {}, Schedule(0, at_start=False))
