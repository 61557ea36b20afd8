"""The paper's binary reward (§6.1): +1 when the completion's final boxed answer equals the gold answer.

It is the same math-verify comparison as the evaluator's `grade`, so training and evaluation cannot
disagree on what "correct" means. A grading error or timeout scores 0 and never stops training.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def completion_text(completion: Any) -> str:
    """TRL passes conversational completions as [{"role": "assistant", "content": ...}] and plain ones as str."""
    if isinstance(completion, list):
        return "".join(str(turn.get("content", "")) for turn in completion if isinstance(turn, dict))
    return str(completion)


def math_verify_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """One float per completion: 1.0 if its final `\\boxed{}` equals `answer` (math-verify), else 0.0.

    TRL calls this with the dataset's `answer` column as a keyword; the function name becomes the
    metric `rewards/math_verify_reward/mean`.
    """
    from atr_grpo.evaluation import grade

    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        try:
            rewards.append(1.0 if grade(completion_text(completion), str(gold)) else 0.0)
        except Exception:  # a grader failure (timeout, parser crash) is a wrong answer, not a dead run
            log.warning("reward: grading failed for one completion; scored 0", exc_info=True)
            rewards.append(0.0)
    return rewards
