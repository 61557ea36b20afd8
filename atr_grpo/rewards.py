"""The paper's binary reward (§6.1): +1 when the completion's final boxed answer equals the gold answer.

It grades with the evaluator's `grade` (math-verify on the last box, `eval.credit_inside_think` as the evaluations
use it) and treats a truncated completion by `trainer.truncation` (`atr_grpo.truncation`): by default it earns 0,
as the evaluation scores it. Truncation is read from the completion's token ids, which TRL passes to every reward
function, with the same function the evaluation uses. A grading error or timeout scores 0 and never stops training.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from atr_grpo.truncation import Truncation

log = logging.getLogger(__name__)


def completion_text(completion: Any) -> str:
    """TRL passes conversational completions as [{"role": "assistant", "content": ...}] and plain ones as str."""
    if isinstance(completion, list):
        return "".join(str(turn.get("content", "")) for turn in completion if isinstance(turn, dict))
    return str(completion)


def _correct(completion: Any, gold: Any, credit_inside_think: bool) -> bool:
    from atr_grpo.evaluation import grade

    try:
        return grade(completion_text(completion), str(gold), credit_inside_think=credit_inside_think)
    except Exception:  # a grader failure (timeout, parser crash) is a wrong answer, not a dead run
        log.warning("reward: grading failed for one completion; scored 0", exc_info=True)
        return False


def math_verify_reward(
    completions: list[Any],
    answer: list[str],
    completion_ids: Sequence[Sequence[int]] | None = None,
    credit_inside_think: bool = False,
    truncation: Truncation | None = None,
    **_: Any,
) -> list[float]:
    """One float per completion: 1.0 if its final `\\boxed{}` equals `answer` (math-verify), else 0.0, then
    `truncation` applied to its token ids (`completion_ids`, which TRL passes).

    TRL calls this with the dataset's `answer` column as a keyword; the function name becomes the
    metric `rewards/math_verify_reward/mean`. A box only inside `<think>...</think>` scores 0 unless
    `credit_inside_think` (see `atr_grpo.evaluation.grader`).
    """
    if truncation is None:
        raise ValueError("math_verify_reward needs a truncation rule: build it with reward_function(cfg, stop_ids)")
    if completion_ids is None:
        raise ValueError("math_verify_reward needs completion_ids (TRL passes them) to tell truncated completions")
    rows = zip(completions, answer, completion_ids, strict=True)
    return [truncation.reward(_correct(c, gold, credit_inside_think), ids) for c, gold, ids in rows]


def truncation_rule(cfg: Any, stop_ids: Sequence[int]) -> Truncation:
    """`trainer.truncation` for completions of `trainer.max_completion_length` tokens ending on `stop_ids`."""
    tr = cfg.trainer
    return Truncation(
        setting=tr.truncation,
        budget=tr.max_completion_length,
        stop_ids=tuple(stop_ids),
        buffer=tr.overlong_buffer,
        penalty=tr.overlong_penalty,
    )


def reward_function(cfg: Any, stop_ids: Sequence[int]) -> Callable[..., list[float]]:
    """`math_verify_reward` with the run's `eval.credit_inside_think` and truncation rule bound (still named
    `math_verify_reward`, so the metric keeps its name, and picklable like the function itself)."""
    bound = functools.partial(
        math_verify_reward,
        credit_inside_think=bool(cfg.eval.credit_inside_think),
        truncation=truncation_rule(cfg, stop_ids),
    )
    return functools.update_wrapper(bound, math_verify_reward)
