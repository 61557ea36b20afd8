"""Evaluation inside training: a TrainerCallback that acts at every scheduled step.

When: at the steps of the run's `Schedule` (`evaluation/schedule.py`, the one definition): each step it
evaluates as it is reached (`on_step_end`, after `state.global_step` has advanced; with `at_start`, step 0 in
`on_train_begin` of a run that starts from scratch: the base row of Table 2), and the last step at the end of
training (skipped if that step was just handled).

What, at such a step:
1. `save_fn(step)`, on every process (a model sharded over the processes is saved by all of them; the main
   one writes): keep the adapter of that step (eval/adapters/step_<N:06d>), so that the step can be evaluated,
   or evaluated again, from the file whatever happens next;
2. `evaluate_fn(step)`, on the main process, when evaluating during training; without one (eval.when=after)
   the saved adapter waits for the evaluation stage that runs after training;
3. `wait_fn()`, on every process: a barrier, where the other processes of a launched run wait for the main
   one's evaluation instead of running into the next step's collectives.
A failure never ends the training run, and is never silent: it is logged with its traceback, passed to
`failure_fn` (which writes eval/failures.jsonl) and listed in `failures`; the adapter stays for a retry.
After a successful evaluation `done_fn(step)` runs (it deletes the adapter unless eval.keep_adapters).
On resume, steps already in eval/summary.jsonl cost nothing: the runner skips them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from atr_grpo.evaluation.schedule import Schedule

log = logging.getLogger(__name__)


class EvaluationCallback(TrainerCallback):
    def __init__(
        self,
        evaluate_fn: Callable[[int], dict[str, float]] | None,
        schedule: Schedule,
        log_fn: Callable[[dict[str, float], int], None] | None = None,
        save_fn: Callable[[int], Any] | None = None,
        failure_fn: Callable[[int, BaseException], Any] | None = None,
        done_fn: Callable[[int], Any] | None = None,
        wait_fn: Callable[[], Any] | None = None,
    ) -> None:
        if schedule.every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, got {schedule.every_steps}")
        self.evaluate_fn, self.schedule, self.log_fn = evaluate_fn, schedule, log_fn
        self.save_fn, self.failure_fn, self.done_fn, self.wait_fn = save_fn, failure_fn, done_fn, wait_fn
        self.handled: set[int] = set()  # steps handled (saved and/or evaluated, or attempted) in this process
        self.failures: list[int] = []

    def _fail(self, step: int, what: str, error: BaseException) -> None:
        self.failures.append(step)
        log.error("%s at step %d failed; training continues", what, step, exc_info=error)
        if self.failure_fn is not None:
            self.failure_fn(step, error)

    def _handle(self, step: int, state: Any) -> None:
        if step in self.handled:
            return
        self.handled.add(step)
        try:
            if getattr(state, "is_world_process_zero", True):
                self._save_and_evaluate(step)
            elif self.save_fn is not None:
                self._save_share(self.save_fn, step)
        finally:
            if self.wait_fn is not None:
                self.wait_fn()

    def _save_share(self, save_fn: Callable[[int], Any], step: int) -> None:
        """Another process's part of saving (it writes no file): a failure is logged here, and only what the
        main process writes decides whether the step can be evaluated."""
        try:
            save_fn(step)
        except Exception as err:
            log.error("saving the adapter for evaluation at step %d failed on this process", step, exc_info=err)

    def _save_and_evaluate(self, step: int) -> None:
        if self.save_fn is not None:
            try:
                self.save_fn(step)
            except Exception as err:
                self._fail(step, "saving the adapter for evaluation", err)
                return
        if self.evaluate_fn is None:
            return
        try:
            metrics = self.evaluate_fn(step)
        except Exception as err:  # an evaluation must never end a training run, nor vanish
            self._fail(step, "evaluation", err)
            return
        if self.log_fn is not None and metrics:
            self.log_fn(metrics, step)
        if self.done_fn is not None:
            self.done_fn(step)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == 0 and self.schedule.reached(0):
            self._handle(0, state)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step > 0 and self.schedule.reached(state.global_step):
            self._handle(state.global_step, state)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._handle(state.global_step, state)
        return control
