"""Evaluation inside training: a TrainerCallback that calls `evaluate_fn(step)` on a schedule.

When: every `every_steps` optimizer steps (`on_step_end`, after `state.global_step` has advanced), once
at the end of training (skipped if that step was just evaluated), and optionally at step 0
(`on_train_begin` of a run that starts from scratch: the base-model row of Table 2).
Failures are isolated: an exception in evaluation is logged with its traceback and training goes on.
On resume, steps already in eval/summary.jsonl cost nothing: the runner skips them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger(__name__)


class EvaluationCallback(TrainerCallback):
    def __init__(
        self,
        evaluate_fn: Callable[[int], dict[str, float]],
        every_steps: int,
        at_start: bool = False,
        log_fn: Callable[[dict[str, float], int], None] | None = None,
    ) -> None:
        if every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, got {every_steps}")
        self.evaluate_fn, self.every_steps, self.at_start, self.log_fn = (
            evaluate_fn,
            every_steps,
            at_start,
            log_fn,
        )
        self.evaluated: set[int] = set()  # steps evaluated (or attempted) in this process
        self.failures: list[int] = []

    def _evaluate(self, step: int, state: Any) -> None:
        if step in self.evaluated or not getattr(state, "is_world_process_zero", True):
            return
        self.evaluated.add(step)
        try:
            metrics = self.evaluate_fn(step)
            if self.log_fn is not None and metrics:
                self.log_fn(metrics, step)
        except Exception:  # evaluation must never end a training run
            self.failures.append(step)
            log.exception("evaluation at step %d failed; training continues", step)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.at_start and state.global_step == 0:
            self._evaluate(0, state)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step > 0 and state.global_step % self.every_steps == 0:
            self._evaluate(state.global_step, state)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._evaluate(state.global_step, state)
        return control
