"""A metric's name, `mean@K` or `pass@K`: the one parser of it, and the pair a table reports by default."""

from __future__ import annotations

import re
from dataclasses import dataclass

# what a metric name must look like, as the refusals say it
EXPECTED = "mean@K or pass@K (e.g. mean@8)"
_NAME = re.compile(r"^(mean|pass)@([1-9][0-9]*)$")


class MetricError(ValueError):
    """A name that is not mean@K or pass@K."""


@dataclass(frozen=True)
class Metric:
    """The mean accuracy over K samples per problem (`mean`) or the unbiased pass@K (`pass`)."""

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

    def __str__(self) -> str:
        return f"{self.kind}@{self.k}"


def defaults(k: int) -> list[str]:
    """The metrics reported when none is asked for: mean@K, then pass@K."""
    return [str(Metric("mean", k)), str(Metric("pass", k))]
