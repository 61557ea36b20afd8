"""The paper's binary reward (§6.1): +1 when the completion's final boxed answer equals the gold answer.

It is the same math-verify comparison as the evaluator's `grade`, so training and evaluation cannot
disagree on what "correct" means; `reward_function(cfg.eval)` binds the config's `eval.credit_inside_think`,
the setting the evaluations use too. A grading error or timeout scores 0 and never stops training.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def completion_text(completion: Any) -> str:
    """TRL passes conversational completions as [{"role": "assistant", "content": ...}] and plain ones as str."""
    if isinstance(completion, list):
        return "".join(str(turn.get("content", "")) for turn in completion if isinstance(turn, dict))
    return str(completion)


def math_verify_reward(
    completions: list[Any], answer: list[str], credit_inside_think: bool = False, **_: Any
) -> list[float]:
    """One float per completion: 1.0 if its final `\\boxed{}` equals `answer` (math-verify), else 0.0.

    TRL calls this with the dataset's `answer` column as a keyword; the function name becomes the
    metric `rewards/math_verify_reward/mean`. A box only inside `<think>...</think>` scores 0 unless
    `credit_inside_think` (see `atr_grpo.evaluation.grader`).
    """
    from atr_grpo.evaluation import grade

    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        try:
            correct = grade(completion_text(completion), str(gold), credit_inside_think=credit_inside_think)
            rewards.append(1.0 if correct else 0.0)
        except Exception:  # a grader failure (timeout, parser crash) is a wrong answer, not a dead run
            log.warning("reward: grading failed for one completion; scored 0", exc_info=True)
            rewards.append(0.0)
    return rewards


def reward_function(eval_cfg: Any) -> Callable[..., list[float]]:
    """`math_verify_reward` with the config's `eval.credit_inside_think` bound (still named `math_verify_reward`,
    so the metric keeps its name, and picklable like the function itself)."""
    bound = functools.partial(math_verify_reward, credit_inside_think=bool(eval_cfg.credit_inside_think))
    return functools.update_wrapper(bound, math_verify_reward)
