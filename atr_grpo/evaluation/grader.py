"""Is a completion's final answer equal to the gold answer?

The rules, chosen so that no harness convention can silently change a score:

- **The prediction is the completion's final `\\boxed{...}`**, found by brace matching from the last
  `\\boxed{`, so nested braces (`\\boxed{\\frac{1}{2}}`) and several boxes (the last one wins, however
  close together) work. There is no fallback to "the last number in the text": a completion without a
  box has no answer. If the last box never closes, the answer is malformed and counts as no answer
  (an earlier box is not credited: the model moved on from it).
- **The box is parsed with math-verify's LaTeX extractor** (which drops `\\text{...}` units, `\\!`, `$`,
  `\\dfrac`, ...), falling back to its plain-expression extractor. Only the box is given to math-verify,
  so its habit of joining nearby boxes into a set (`{5, 7}`) cannot happen here.
- **Only the answer part of a completion counts.** A completion with a `</think>` is answered after its last
  `</think>`; one that opens `<think>` and never closes it gave no answer. So a box that appears only inside
  the thinking scores 0, as in TRL's reasoning-accuracy reward (`credit_inside_think=True`, the config's
  `eval.credit_inside_think`, grades the whole text instead). A completion without think tags is all answer.
- **The gold is read as what it is** (`atr_grpo.evaluation.gold`, where the rules and their reasons are). A bare
  number or fraction (`33`, `1,000`, `50%`) goes through math-verify's expression extractor; any other gold (`2x+3`,
  `(3, -1)`, `5, 7`, `\\frac{1}{2}`) is parsed whole as LaTeX, never mined for a number in it. A clock time is read
  as a time. Math delimiters, a final full stop and a stray final backslash come off the gold; `1\\,000`,
  `\\mathrm{e}`, `\\text{ and }`, `45°` and `0.\\overline{3}` are made plain in gold and box alike. `1,22` is read
  both as 1.22 and as the list {1, 22}, in gold and box alike. A bare list is unordered, a tuple ordered. They are
  compared with `verify(gold, prediction)` (gold first: the function is not symmetric). A gold that parses to nothing
  raises `GoldParseError`.
- **A truncated sample (finish_reason "length") is never correct**, even if it holds a box: an
  unfinished answer is not a final answer (and the model may have been about to revise it). The last
  box of its answer part is still recorded in `extracted` for inspection.
- **Every answer runs under a time limit.** math-verify's own limits use `signal.alarm`, which fails
  outside a process's main thread and is cancelled by nested use; we switch them off and arm one
  interval timer around the whole answer instead. Its exception derives from `BaseException`, so the
  `except Exception` blocks inside math-verify cannot swallow it. Off the main thread no timer can be
  armed; `grade_samples` therefore runs answers in worker processes, and also bounds their wall time
  from outside (see `atr_grpo.evaluation.pool`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from atr_grpo.evaluation.gold import GoldParseError as GoldParseError
from atr_grpo.evaluation.gold import (
    clock_time,
    decimal_comma,
    math_verify_api,
    normalize_answer,
    parse_gold,
    parse_with,
)
from atr_grpo.evaluation.gold import join_thin_space_thousands as join_thin_space_thousands

if TYPE_CHECKING:
    from atr_grpo.evaluation.pool import Progress

log = logging.getLogger(__name__)

STATUSES = ("correct", "wrong", "no_answer", "truncated", "timeout")
FINISH_REASONS = ("stop", "length")
DEFAULT_TIMEOUT = 5.0  # seconds per answer, as math-verify's own default
_BOX = "\\boxed"


class GradingTimeout(BaseException):
    """Raised by the answer timer. A BaseException so that `except Exception` in libraries lets it through."""


@dataclass(frozen=True)
class GradeResult:
    status: str  # one of STATUSES
    correct: bool
    extracted: str | None  # the answer part's final box (also for truncated samples), None without a box


# ------------------------------------------------------------------------------------------ extraction
def _group_end(text: str, open_index: int) -> int | None:
    """Index of the `}` closing the `{` at `open_index`; escaped braces (`\\{`, `\\}`) don't count."""
    depth, i, end = 0, open_index, len(text)
    while i < end:
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text`; None if there is none or it never closes."""
    pos = text.rfind(_BOX)
    while pos != -1:
        after = pos + len(_BOX)
        j = after
        while j < len(text) and text[j] in " \t\n":
            j += 1
        if j < len(text) and text[j] == "{":
            close = _group_end(text, j)
            return None if close is None else text[j + 1 : close]
        # `\boxed` not followed by a group (prose, `\boxedx`): look further left
        pos = text.rfind(_BOX, 0, pos)
    return None


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def answer_part(completion: str, credit_inside_think: bool = False) -> str:
    """The text that may hold the final answer: after the last `</think>`; nothing when `<think>` never
    closes (the model was still thinking); all of it without think tags, or with `credit_inside_think`."""
    if credit_inside_think:
        return completion
    close = completion.rfind(_THINK_CLOSE)
    if close != -1:
        return completion[close + len(_THINK_CLOSE) :]
    return "" if _THINK_OPEN in completion else completion


def _clean_box(content: str) -> str:
    """Strip what a model puts around the value inside the box: spaces, `$...$`, a final full stop."""
    answer = content.strip()
    while len(answer) >= 2 and answer[0] == "$" and answer[-1] == "$":
        answer = answer[1:-1].strip()
    return answer.rstrip(".").strip()


# ------------------------------------------------------------------------------------------ parsing
def parse_prediction(answer: str, gold: Sequence = ()) -> list:
    """The parsed content of a box: LaTeX extraction (with its normalisations), else a plain expression.

    The box gets the gold's plain notations first (`atr_grpo.evaluation.gold.normalize_answer`). Against a clock-time
    gold (`parse_gold` gives a string) the box is read as a time, and is nothing else. A box such as `1,22` is read
    both as the list {1, 22} and as the decimal 1.22, like such a gold.
    """
    answer = normalize_answer(answer)
    if gold and isinstance(gold[0], str):
        clock = clock_time(answer)
        return [] if clock is None else [clock]
    _, _, expr, latex = math_verify_api()
    parsed = parse_with(f"\\boxed{{{answer}}}", latex) or parse_with(answer, expr)
    decimal = decimal_comma(answer)
    return parsed if decimal is None else parsed + parse_with(decimal, expr)


# ------------------------------------------------------------------------------------------ time limit
def can_time_limit() -> bool:
    """Whether an in-process answer timer can be armed here (main thread of a POSIX process)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise GradingTimeout in this block after `seconds` (a no-op off the main thread or for None).

    The timer re-fires every 50 ms after the first expiry, so that a library swallowing one interrupt
    (with a bare `except:`) is interrupted again. An interrupt that lands in code no caller can catch it from (a
    finalizer, a weakref or gc callback: Python hands it to `sys.unraisablehook`) is dropped there, and the next
    firing interrupts the block; the hook that handles anything else raised there runs to its end.
    """
    if seconds is None or not can_time_limit():
        yield
        return
    armed = True
    in_outer_hook = False

    def on_alarm(signum: int, frame: object) -> None:
        if armed and not in_outer_hook:
            raise GradingTimeout

    outer_hook = sys.unraisablehook

    def on_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
        nonlocal in_outer_hook
        if isinstance(unraisable.exc_value, GradingTimeout):
            log.debug("the answer timer fired in %r, which cannot raise; it fires again", unraisable.object)
            return
        in_outer_hook = True
        try:
            outer_hook(unraisable)
        finally:
            in_outer_hook = False

    sys.unraisablehook = on_unraisable
    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    started = time.monotonic()
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        sys.unraisablehook = outer_hook
        if previous_delay > 0:  # give an outer timer back what is left of it
            left = max(previous_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, previous_interval)


# ------------------------------------------------------------------------------------------ grading
def grade_sample(
    completion: str,
    gold: str,
    finish_reason: str | None = "stop",
    timeout: float | None = DEFAULT_TIMEOUT,
    credit_inside_think: bool = False,
) -> GradeResult:
    """Grade one sample: correct, wrong, no_answer, truncated or timeout (see the module docstring)."""
    if finish_reason not in (*FINISH_REASONS, None):
        raise ValueError(f"finish_reason must be one of {FINISH_REASONS} (or None), got {finish_reason!r}")
    box = last_boxed(answer_part(completion, credit_inside_think))
    if finish_reason == "length":
        return GradeResult("truncated", False, box)
    if box is None:
        return GradeResult("no_answer", False, None)
    answer = _clean_box(box)
    if not answer:
        return GradeResult("no_answer", False, box)
    _, verify, _, _ = math_verify_api()
    try:
        with time_limit(timeout):
            gold_parsed = list(parse_gold(gold))
            predicted = parse_prediction(answer, gold_parsed)
            correct = bool(predicted) and bool(verify(gold_parsed, predicted, timeout_seconds=None))
    except GradingTimeout:
        return GradeResult("timeout", False, box)
    return GradeResult("correct" if correct else "wrong", correct, box)


def grade(completion: str, gold: str, credit_inside_think: bool = False) -> bool:
    """True when the final `\\boxed{}` of the completion's answer part is math-verify-equivalent to `gold`.

    In-process, under a signal timer in the main thread (no timer in other threads); use `grade_many`
    for batches and for a hard wall-time bound.
    """
    return grade_sample(completion, gold, "stop", credit_inside_think=credit_inside_think).correct


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def grade_samples(
    items: Sequence[tuple[str, str, str | None]],
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Progress | None = None,
    credit_inside_think: bool = False,
) -> list[GradeResult]:
    """Grade (completion, gold, finish_reason) triples, in order, in `workers` processes.

    workers: None = one per usable CPU; 0 = in this process (signal timer only, no outer bound).
    Each answer has `timeout` seconds inside its worker; a worker still busy well after that (a C-level
    call ignoring the signal) is killed and replaced, and its answer counts as "timeout".
    progress: an object with `update(int)` (e.g. a tqdm bar), called with 1 as each answer completes.
    credit_inside_think: grade a box inside `<think>...</think>` too (see the module docstring).
    """
    from atr_grpo.evaluation.pool import run_with_deadline

    jobs = [(str(c), str(g), f, timeout, credit_inside_think) for c, g, f in items]
    workers = usable_cpus() if workers is None else workers
    if workers <= 0 or not jobs:
        results = []
        for job in jobs:
            results.append(_grade_job(job))
            if progress is not None:
                progress.update(1)
        return results
    _grade_job(("\\boxed{1}", "1", "stop", timeout, False))  # import and warm math-verify once, before forking
    return run_with_deadline(
        _grade_job,
        jobs,
        workers=min(workers, len(jobs)),
        deadline_s=outer_deadline(timeout),
        on_failure=_failed_job,
        progress=progress,
    )


def outer_deadline(timeout: float) -> float:
    """Wall time after which a worker is killed: the inner timer plus room for it to unwind."""
    return 2.0 * timeout + 1.0


_Job = tuple[str, str, str | None, float, bool]  # completion, gold, finish_reason, timeout, credit_inside_think


def _grade_job(job: _Job) -> GradeResult:
    completion, gold, finish_reason, timeout, credit_inside_think = job
    return grade_sample(completion, gold, finish_reason, timeout, credit_inside_think)


def _failed_job(job: _Job, reason: str) -> GradeResult:
    """A worker that was killed at the deadline or died: the answer could not be graded in time."""
    log.warning("grading %s: counted as timeout (gold %r)", reason, job[1])
    return GradeResult("timeout", False, last_boxed(answer_part(job[0], job[4])))


def grade_many(
    pairs: Sequence[tuple[str, str]], workers: int | None = None, credit_inside_think: bool = False
) -> list[bool]:
    """`grade` over (completion, gold) pairs in worker processes; a timeout is wrong."""
    items = [(c, g, "stop") for c, g in pairs]
    return [r.correct for r in grade_samples(items, workers=workers, credit_inside_think=credit_inside_think)]


def status_counts(results: Sequence[GradeResult]) -> dict[str, int]:
    """How many results have each status (every status present, zeros included)."""
    counts = Counter(result.status for result in results)
    return {status: counts.get(status, 0) for status in STATUSES}
