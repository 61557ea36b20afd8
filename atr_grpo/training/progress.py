"""A transformers `Trainer`'s console: one `console.StageProgress` line per run instead of its printed logs.

By default a Trainer prints every logged dict (`PrinterCallback`, or `ProgressCallback` next to its bar): one
`{'loss': ...}` line per GRPO step. `attach_progress` takes those out and puts in `TrainerProgress`, which
moves one stage line with the optimizer steps and shows the stage's chosen values (`console.GRPO_SHOWN`, ...).
What the dicts held is still in metrics.jsonl and W&B (GRPO) or sft_info.json's log_history (SFT).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TextIO

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from atr_grpo.console import StageProgress


class TrainerProgress(TrainerCallback):
    """One `StageProgress` over a Trainer's optimizer steps (main process only), fed by its step and log events."""

    def __init__(self, desc: str, shown: Mapping[str, str], stream: TextIO | None = None) -> None:
        self.desc, self.shown, self.stream = desc, dict(shown), stream
        self.progress: StageProgress | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.progress = StageProgress(
                self.desc, state.max_steps, shown=self.shown, initial=state.global_step, stream=self.stream
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # A step about to be logged (the trainer's flow callback, which runs first, has decided) moves in on_log
        # with its metrics; moving it here would print a tenth's plain line with the previous step's values.
        if self.progress is not None and not control.should_log:
            self.progress.update(state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.update(state.global_step, logs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None


def attach_progress(trainer: Any, desc: str, shown: Mapping[str, str]) -> TrainerProgress:
    """Give `trainer` one console line (`TrainerProgress`) in place of its printing of every log dict."""
    from transformers.trainer import DEFAULT_PROGRESS_CALLBACK  # ProgressCallback, or in a notebook its own

    for printing in (PrinterCallback, ProgressCallback, DEFAULT_PROGRESS_CALLBACK):
        trainer.remove_callback(printing)
    callback = TrainerProgress(desc, shown)
    trainer.add_callback(callback)
    return callback
