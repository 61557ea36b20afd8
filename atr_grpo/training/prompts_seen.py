"""Which training prompts a run has generated from: each step's prompt ids, saved in every checkpoint.

The trainer adds the ids (`data.datasets.PROMPT_ID`, a hash of the problem's text) of each generation batch under
the optimizer step that first trains on it, gathered from every process. Each checkpoint holds the record up to its
step (`layout.PROMPTS_SEEN_FILE`); a resumed run loads it and regenerates the later steps as the uninterrupted run
did, so both end with the same count and hash. At the end of training `summary()` goes into the train summary:
how many distinct prompts the run saw, and a hash of their sorted ids that says whether two runs saw the same ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

DISTINCT_KEY = "prompts/distinct"  # the number of distinct training prompts generated from
HASH_KEY = "prompts/ids_sha256"  # sha256 of the sorted distinct ids, one per line


@dataclass
class PromptsSeen:
    """Each optimizer step's distinct prompt ids (the step that first trains on a generation batch)."""

    by_step: dict[int, list[str]] = field(default_factory=dict)

    def add(self, step: int, ids: Iterable[str]) -> None:
        self.by_step[step] = sorted(set(self.by_step.get(step, [])) | set(ids))

    def distinct(self) -> list[str]:
        return sorted(set().union(*self.by_step.values()))

    def summary(self) -> dict[str, Any]:
        ids = self.distinct()
        return {DISTINCT_KEY: len(ids), HASH_KEY: hashlib.sha256("\n".join(ids).encode()).hexdigest()}

    def state_dict(self) -> dict[str, Any]:
        return {"by_step": {str(step): ids for step, ids in sorted(self.by_step.items())}}

    def load_state_dict(self, state: dict[str, Any], up_to: int | None = None) -> None:
        """The record of a checkpoint at step `up_to` (steps after it are trained again, and recorded again; None:
        every step of the record)."""
        steps = {int(step): list(ids) for step, ids in state["by_step"].items()}
        self.by_step = {step: ids for step, ids in steps.items() if up_to is None or step <= up_to}
