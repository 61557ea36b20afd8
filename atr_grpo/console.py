"""What a run prints while it works: one progress line per stage, with the few numbers that say it is healthy.

Every logged value goes to metrics.jsonl and W&B (`training.run_logger`); the console shows where each stage is
(tiny-model pretraining, SFT, GRPO, evaluation) and its latest values (`GRPO_SHOWN`, `LOSS_SHOWN`,
`evaluation_shown`). Warnings, our stderr notes and the final summary are printed as before.

On a terminal a stage is a tqdm bar redrawn in place; log records and Python warnings raised meanwhile are
written above it, so none is lost. Anywhere else (a CI log, a cluster job's output file, a pipe) the same line
is printed as plain text when the stage starts, at each tenth of it, at least every `HEARTBEAT_S` seconds while
it moves, and at its end: a log that neither floods nor goes silent. Progress goes to stderr; stdout keeps the
results (the demo's table, a run's summary line). A transformers `Trainer` gets its line from
`training.progress.attach_progress`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, TextIO

# Off a terminal, a stage prints its first line, one per tenth done, and its last ...
PLAIN_LINES_PER_STAGE = 10
# ... and, while steps complete, at least one line every five minutes (a long run's tenth can take hours)
HEARTBEAT_S = 300.0
PLAIN_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]{postfix}"

# What the console shows of a stage's logged values: metric key → label
GRPO_SHOWN = {"reward": "reward", "entropy": "entropy", "clip/frac": "clip/frac", "kl/kl3_mean": "KL3"}
LOSS_SHOWN = {"loss": "loss"}


def evaluation_shown(k: int) -> dict[str, str]:
    """An evaluation's values: Mean@k and Pass@k averaged over its benchmarks (`runner.flat_metrics` keys)."""
    return {f"eval/average/mean@{k}": f"mean@{k}", f"eval/average/pass@{k}": f"pass@{k}"}


# The parts of Mean@K in a printed table (the demo's, `python -m atr_grpo.evaluate`'s): short headers and their keys
PART_COLUMNS = (("answered", "answered"), ("acc | answered", "acc_given_answer"))
PARTS_NOTE = "Mean@{k} = answered × acc | answered (the share of samples with a final box × its accuracy)"


def percent(value: float | None) -> str:
    """`16.7%`; `-` for a value a summary lacks (a line written before it was recorded, or no answer to grade)."""
    return "-" if value is None else f"{100 * value:.1f}%"


def text_table(rows: list[tuple[str, ...]]) -> list[str]:
    """`rows` (the header first) as aligned lines: the first column to the left, the others to the right, and a
    rule under the header."""
    width = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, width))) for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def console_is_terminal(stream: TextIO | None = None) -> bool:
    """Whether progress written to `stream` (default stderr) is seen on a terminal, where bars redraw in place."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def configure_logging() -> None:
    """The console of an entry point that Hydra does not set up (the demo, a stage process): INFO records with
    their time, source and level, as Hydra's console shows them, and `quiet_libraries`. The level is the one place a
    warning says WARNING: a logged message does not start with the word."""
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s %(name)s][%(levelname)s] %(message)s", datefmt="%H:%M:%S"
    )
    quiet_libraries()


def quiet_libraries() -> None:
    """Silence what libraries print by default where we call them, keeping their warnings.

    - vLLM logs warnings only (VLLM_LOGGING_LEVEL=WARNING unless set, inherited by stage processes): its INFO
      lines repeat an engine's whole configuration. Until vLLM sets up its own logger (when an engine starts),
      its records reach ours, so the `vllm` logger gets that level too.
    - No progress bars of datasets' `map`/`filter` (SFT tokenization, the prompt-length filter) or of
      transformers' weight loading: a stage is one line, and off a terminal every redraw of such a bar is
      written to the log. Hub downloads keep theirs. datasets is told through HF_DATASETS_DISABLE_PROGRESS_BARS
      (read when it is imported, and inherited by stage processes) unless already imported: a process that
      never tokenizes a dataset does not import it for this (the import is slow).
    """
    import transformers

    logging.getLogger("vllm").setLevel(os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING").upper())
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def format_values(values: Mapping[str, float]) -> str:
    """`reward 0.412, entropy 1.23, clip/frac 0.0121, KL3 0.00034`: label and value, three significant digits."""
    return ", ".join(f"{label} {value:.3g}" for label, value in values.items())


@contextmanager
def _warnings_above(bar: Any) -> Iterator[None]:
    """Python warnings shown while `bar` is on screen are written above it (their text unchanged)."""
    original = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if file is not None:  # a warning sent to a file of its own goes there as before
            original(message, category, filename, lineno, file, line)
            return
        bar.write(warnings.formatwarning(message, category, filename, lineno, line), file=bar.fp, end="")

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original


class StageProgress:
    """The console line of one stage of `total` units, `initial` of them done before (a resumed run).

    `update(n, metrics)` moves it to `n` units done (None: one more) and takes the values of the keys of `shown`
    (metric key → label) found in `metrics`. A line shows each value's mean over the units since the previous
    line (a tenth of the stage, or a heartbeat): one GRPO step's reward is noisy, and with reused rollouts every
    other step is on-policy, where clip/frac and KL3 are 0. A value not logged since then keeps its previous
    mean. With `latest=True` a line shows the latest values instead (an evaluation: each is a result of its
    own). A terminal's bar shows the same values, over the same spans, as they accumulate. `terminal` (default:
    whether `stream` is one) chooses the bar or plain lines. Use it as a context manager, or call `close`.
    """

    def __init__(
        self,
        desc: str,
        total: int,
        *,
        shown: Mapping[str, str] | None = None,
        latest: bool = False,
        initial: int = 0,
        unit: str = "step",
        stream: TextIO | None = None,
        terminal: bool | None = None,
    ) -> None:
        self.desc, self.total, self.initial, self.unit = desc, max(int(total), 1), int(initial), unit
        self.shown, self.latest = dict(shown or {}), latest
        self.stream = sys.stderr if stream is None else stream
        self.terminal = console_is_terminal(self.stream) if terminal is None else terminal
        self.n = self.line_n = self.initial
        self.started = self.line_at = time.monotonic()
        self._sums: dict[str, float] = {}  # label → sum and count of its values since the previous line
        self._counts: dict[str, int] = {}
        self._earlier: dict[str, float] = {}  # label → its value on the previous line
        self.closed = False
        self._restore = ExitStack()
        self.bar: Any = None
        if self.terminal:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.bar = tqdm(
                total=self.total, initial=self.initial, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True
            )
            # transformers' loggers write to stderr through a handler of their own, not the root logger's
            self._restore.enter_context(logging_redirect_tqdm([logging.root, logging.getLogger("transformers")]))
            self._restore.enter_context(_warnings_above(self.bar))
        else:
            print(self.line(), file=self.stream, flush=True)

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def values(self) -> dict[str, float]:
        """What the line shows now: label → the mean since the previous line, or the previous line's value."""
        labels = [label for label in self.shown.values() if label in self._counts or label in self._earlier]
        return {
            label: self._sums[label] / self._counts[label] if label in self._counts else self._earlier[label]
            for label in labels
        }

    def update(self, n: int | None = None, metrics: Mapping[str, Any] | None = None) -> None:
        """Move to `n` units done (None: one more) and take the shown values found in `metrics`."""
        for key, label in self.shown.items():
            value = (metrics or {}).get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                kept = 0 if self.latest else 1
                self._sums[label] = kept * self._sums.get(label, 0.0) + float(value)
                self._counts[label] = kept * self._counts.get(label, 0) + 1
        previous, self.n = self.n, self.n + 1 if n is None else int(n)
        due = self._line_due()
        if self.bar is not None:
            self.bar.set_postfix_str(format_values(self.values), refresh=False)
            self.bar.update(self.n - previous)
        elif due:
            print(self.line(), file=self.stream, flush=True)
        if due:
            self._next_line()

    def _line_due(self) -> bool:
        tenth = lambda n: n * PLAIN_LINES_PER_STAGE // self.total
        moved = self.n != self.line_n
        return moved and (tenth(self.n) > tenth(self.line_n) or time.monotonic() - self.line_at >= HEARTBEAT_S)

    def _next_line(self) -> None:
        self._earlier.update(self.values)
        self._sums.clear()
        self._counts.clear()
        self.line_n, self.line_at = self.n, time.monotonic()

    def line(self) -> str:
        """The stage's state as one plain line: what a terminal's bar shows, without the bar."""
        from tqdm import tqdm

        return tqdm.format_meter(
            self.n,
            self.total,
            time.monotonic() - self.started,
            prefix=self.desc,
            unit=self.unit,
            postfix=format_values(self.values),
            bar_format=PLAIN_FORMAT,
            initial=self.initial,
        )

    def close(self) -> None:
        """End the stage: the bar stays on screen in its final state, or the last plain line is printed."""
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
            self._restore.close()
        elif self.n != self.line_n:
            print(self.line(), file=self.stream, flush=True)
