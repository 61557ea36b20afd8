"""A metric's name, `mean@K`, `pass@K` or one of a score's parts (`answered@K`, `acc_given_answer@K`,
`truncated@K`, `evaluation.outcomes`): the one parser of it, and the names a table or `compare` reports by default."""

from __future__ import annotations

import re
from dataclasses import dataclass

from atr_grpo.evaluation.outcomes import PARTS

KINDS = ("mean", "pass", *PARTS)
# what a metric name must look like, as the refusals say it
EXPECTED = "mean@K, pass@K, answered@K, acc_given_answer@K or truncated@K (e.g. mean@8)"
_NAME = re.compile(rf"^({'|'.join(KINDS)})@([1-9][0-9]*)$")
RATIO = "acc_given_answer"  # Σ correct / Σ answered: a run's value is not a mean of per-problem values


class MetricError(ValueError):
    """A name that is not one of KINDS at a positive K."""


@dataclass(frozen=True)
class Metric:
    """The mean accuracy over K samples per problem (`mean`), the unbiased pass@K (`pass`), or a part of Mean@K
    over the first K samples: the answered rate, the accuracy given an answer, the truncated share."""

    kind: str
    k: int

    @classmethod
    def parse(cls, name: object) -> Metric:
        """`Metric.parse("mean@8")` is Metric("mean", 8); MetricError for any other shape of name."""
        found = _NAME.match(name) if isinstance(name, str) else None
        if found is None:
            raise MetricError(f"{name!r}: expected {EXPECTED}")
        return cls(found[1], int(found[2]))

    @classmethod
    def is_name(cls, name: object) -> bool:
        return isinstance(name, str) and _NAME.match(name) is not None

    @property
    def is_part(self) -> bool:
        """One of Mean@K's parts (`evaluation.outcomes`), read from the samples' grader statuses."""
        return self.kind in PARTS

    @property
    def is_ratio(self) -> bool:
        """The accuracy given an answer: a ratio of two sums over problems, so no problem has a score of its own
        that averages to the run's value, and no problem-level test or interval reads it."""
        return self.kind == RATIO

    def __str__(self) -> str:
        return f"{self.kind}@{self.k}"


def defaults(k: int) -> list[str]:
    """The metrics reported when none is asked for: mean@K, then pass@K."""
    return [str(Metric("mean", k)), str(Metric("pass", k))]


def parts(k: int) -> list[str]:
    """Mean@K's parts at K, as `compare` prints them beside it: answered rate, accuracy given an answer, truncated."""
    return [str(Metric(kind, k)) for kind in PARTS]
