"""What a completion that runs out of tokens is worth: one definition for the reward and the evaluation.

A completion is **truncated** when it holds `budget` tokens and none of them ends the sequence. Only token ids
decide this, never the text (`is_truncated`). The training reward, the loss mask and every evaluation backend
call this one function, so a sample the evaluation calls "truncated" is the one the reward treats as truncated.

The evaluation never credits a truncated sample: an unfinished answer is not a final answer. Training chooses
what such a completion earns with `trainer.truncation`:

| setting | reward of a truncated completion | in the loss | as in |
|---|---|---|---|
| `zero` (default) | 0, as the evaluation scores it | yes | |
| `mask` | 0, as the evaluation scores it | no | TRL `mask_truncated_completions`, DAPO overlong filtering |
| `soft_overlong` | 0, plus DAPO's length penalty | yes | DAPO soft overlong punishment |
| `credit_box` | its last box is graded (the ablation) | yes | this toolkit before the setting existed |

Under `mask`, the truncated completion still counts in its group's mean reward with its 0. So its siblings'
advantages are measured against a baseline that counts the cut sample as a failure, as in TRL and DAPO; only
its own tokens leave the loss. Dropping it from the baseline too would change the estimator's baseline from
group to group, by how many samples ran out.

Under `soft_overlong`, every completion longer than `budget − buffer` tokens loses
`penalty · (length − (budget − buffer)) / buffer`, up to `penalty` at the budget (DAPO's Eq. 13, with its
buffer of 4,096 of 20,480 tokens, a fifth of the budget, and its factor 1.0).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

TRUNCATION_SETTINGS = ("zero", "mask", "soft_overlong", "credit_box")
DAPO_BUFFER_SHARE = 4096 / 20480  # DAPO: overlong_buffer 4,096 tokens of a 20,480-token budget
DAPO_PENALTY = 1.0  # DAPO: overlong_penalty_factor


def is_truncated(token_ids: Sequence[int], budget: int, stop_ids: Iterable[int]) -> bool:
    """True when the completion holds `budget` tokens or more and no end-of-sequence token."""
    stops = set(stop_ids)
    return len(token_ids) >= budget and not any(token in stops for token in token_ids)


def finish_reason(token_ids: Sequence[int], budget: int, stop_ids: Iterable[int]) -> str:
    """The evaluation's name for it: "length" when truncated, else "stop"."""
    return "length" if is_truncated(token_ids, budget, stop_ids) else "stop"


def stop_token_ids(model_or_config: Any, tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a completion: the generation config's `eos_token_id` (one or several) and the tokenizer's.

    TRL's trainer and the HF evaluation stop generating on the same set.
    """
    config = getattr(model_or_config, "generation_config", model_or_config)
    ids: set[int] = set()
    for source in (config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        ids.update([value] if isinstance(value, int) else list(value or []))
    if not ids:
        raise ValueError("neither the model's generation_config nor the tokenizer defines an eos_token_id")
    return tuple(sorted(ids))


def default_buffer(budget: int) -> int:
    """DAPO's buffer scaled to `budget`: a fifth of it, at least one token."""
    return max(1, round(budget * DAPO_BUFFER_SHARE))


@dataclass(frozen=True)
class Truncation:
    """`trainer.truncation` applied to completions of at most `budget` tokens that stop on `stop_ids`."""

    setting: str
    budget: int
    stop_ids: tuple[int, ...]
    buffer: int | None = None  # soft_overlong: None = DAPO's share of the budget
    penalty: float = DAPO_PENALTY

    def __post_init__(self) -> None:
        if self.setting not in TRUNCATION_SETTINGS:
            raise ValueError(f"trainer.truncation must be one of {TRUNCATION_SETTINGS}, got {self.setting!r}")
        if not self.stop_ids:
            raise ValueError("a truncation rule needs the ids that end a completion")

    @property
    def masks_loss(self) -> bool:
        return self.setting == "mask"

    @property
    def overlong_buffer(self) -> int:
        return self.buffer if self.buffer is not None else default_buffer(self.budget)

    def truncated(self, token_ids: Sequence[int]) -> bool:
        return is_truncated(token_ids, self.budget, self.stop_ids)

    def length_penalty(self, length: int) -> float:
        """DAPO's soft overlong punishment (≤ 0) of a completion of `length` tokens; 0 for other settings."""
        if self.setting != "soft_overlong":
            return 0.0
        start = self.budget - self.overlong_buffer
        return -self.penalty * min(max(length - start, 0), self.overlong_buffer) / self.overlong_buffer

    def reward(self, correct: bool, token_ids: Sequence[int]) -> float:
        """The reward of a completion whose last box is `correct` (graded as if it had finished)."""
        credited = correct and (self.setting == "credit_box" or not self.truncated(token_ids))
        return (1.0 if credited else 0.0) + self.length_penalty(len(token_ids))
