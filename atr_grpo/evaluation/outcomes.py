"""What a score is made of: the answered rate, the accuracy given an answer and the truncated share.

Each graded sample ends in one of three ways (its grader status, `atr_grpo.evaluation.grader`):
- **answered**: the model finished and wrote a final box (`correct`, `wrong`, or `timeout` while verifying);
- **no answer**: it finished without a usable box (`no_answer`);
- **truncated**: it ran out of tokens (`truncated`), whether or not a box was in it.
Only an answered sample can be correct. So over the first K samples of P problems, with A answered and C correct
samples among the P·K:
- `answered@K` = A / (P·K), the answered rate;
- `acc_given_answer@K` = C / A, the accuracy given an answer (pooled over problems; None when A = 0);
- `truncated@K` = the truncated samples / (P·K);
and Mean@K = answered@K × acc_given_answer@K exactly.

Standard errors (`<name>_stderr`) are over problems, like Mean@K's (`metrics.standard_errors`): the SD (ddof 1) of
the per-problem rates over √P, and for the ratio C / A the linearised (delta-method) SE of a ratio of two
problem-level sums, √(Σ_i (c_i − R·a_i)² / (P (P − 1))) / ā. Each is None for one problem, or no answer.

`summary_scores` is every score an evaluation's summary line holds (the runner's and a regrade's): Mean@K, Pass@K
and the three parts, each with its standard error, for K = 1..n.

`split_gain` says how much of a change in Mean@K is the answered rate and how much the accuracy given an answer.
The two parts of a product's change depend on the order in which they are taken, so it gives both orders.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from atr_grpo.evaluation.metrics import STDERR_SUFFIX, standard_errors, summarize

ANSWERED = ("correct", "wrong", "timeout")
TRUNCATED = "truncated"
PARTS = ("answered", "acc_given_answer", "truncated")  # the metric kinds this module adds beside mean and pass


def _first_k(statuses: Sequence[Sequence[str]], k: int) -> list[Sequence[str]]:
    if not statuses:
        raise ValueError("no problems to score")
    lengths = {len(row) for row in statuses}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every problem needs the same number (>= 1) of samples, got row lengths {sorted(lengths)}")
    n = lengths.pop()
    if not 1 <= k <= n:
        raise ValueError(f"K={k} is outside 1..n={n}")
    return [row[:k] for row in statuses]


def _rate_stderr(values: list[float]) -> float | None:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def _ratio_stderr(numerators: list[int], denominators: list[int]) -> float | None:
    """The delta-method SE of Σ numerators / Σ denominators over problems; None for one problem or no answer."""
    count, total = len(numerators), sum(denominators)
    if count < 2 or total == 0:
        return None
    ratio = sum(numerators) / total
    spread = sum((c - ratio * a) ** 2 for c, a in zip(numerators, denominators)) / (count * (count - 1))
    return math.sqrt(spread) / (total / count)


def outcome_parts(statuses: Sequence[Sequence[str]], ks: Iterable[int]) -> dict[str, float | None]:
    """`answered@K`, `acc_given_answer@K`, `truncated@K` and their `_stderr`s for each K, from a problems ×
    samples matrix of grader statuses."""
    out: dict[str, float | None] = {}
    for k in sorted(set(ks)):
        rows = _first_k(statuses, k)
        answered = [sum(status in ANSWERED for status in row) for row in rows]
        correct = [sum(status == "correct" for status in row) for row in rows]
        truncated = [sum(status == TRUNCATED for status in row) for row in rows]
        total = k * len(rows)
        out[f"answered@{k}"] = sum(answered) / total
        out[f"answered@{k}{STDERR_SUFFIX}"] = _rate_stderr([a / k for a in answered])
        out[f"acc_given_answer@{k}"] = sum(correct) / sum(answered) if sum(answered) else None
        out[f"acc_given_answer@{k}{STDERR_SUFFIX}"] = _ratio_stderr(correct, answered)
        out[f"truncated@{k}"] = sum(truncated) / total
        out[f"truncated@{k}{STDERR_SUFFIX}"] = _rate_stderr([t / k for t in truncated])
    return out


def summary_scores(statuses: Sequence[Sequence[str]]) -> dict[str, float | None]:
    """Mean@K, Pass@K, `outcome_parts` and every one's `_stderr`, for K = 1..n, from a problems × samples matrix of
    grader statuses (a sample is correct when its status is `correct`)."""
    correct = [[status == "correct" for status in row] for row in statuses]
    scores = {**summarize(correct), **standard_errors(correct)}  # these refuse an empty or ragged matrix first
    return {**scores, **outcome_parts(statuses, range(1, len(statuses[0]) + 1))}


@dataclass(frozen=True)
class GainSplit:
    """Mean@K's change from (answered rate a, accuracy given an answer c) to (a2, c2), in two parts.

    `answered_first`: the answered rate moves first, at the old accuracy: (a2 − a)·c, then the accuracy,
    a2·(c2 − c). `accuracy_first`: the other order, a·(c2 − c), then (a2 − a)·c2. Each pair sums to the change.
    """

    change: float
    answered_first: tuple[float, float]
    accuracy_first: tuple[float, float]

    @property
    def answered_shares(self) -> tuple[float, float] | None:
        """The answered rate's share of the change in each order (None when nothing changed)."""
        if self.change == 0:
            return None
        return self.answered_first[0] / self.change, self.accuracy_first[1] / self.change


def split_gain(answered: float, accuracy: float, answered_2: float, accuracy_2: float) -> GainSplit:
    """The change in answered × accuracy, split by `GainSplit`'s two orders."""
    change = answered_2 * accuracy_2 - answered * accuracy
    return GainSplit(
        change=change,
        answered_first=((answered_2 - answered) * accuracy, answered_2 * (accuracy_2 - accuracy)),
        accuracy_first=(answered * (accuracy_2 - accuracy), (answered_2 - answered) * accuracy_2),
    )
