"""The synthetic task and the shared prompt format."""

import pytest

from atr_grpo.data.arithmetic import make_splits
from atr_grpo.data.datasets import get_field
from atr_grpo.data.prompts import DEFAULT_SYSTEM_PROMPT, build_messages, format_answer


def test_arithmetic_splits_are_deterministic_disjoint_and_correct():
    train, evals = make_splits(500, 40, 20, ["+", "-", "*"], seed=3)
    again_train, again_eval = make_splits(500, 40, 20, ["+", "-", "*"], seed=3)
    assert (train, evals) == (again_train, again_eval)
    assert len(train) == 500 and len(evals) == 40 and len(set(evals)) == 40
    assert not set(train) & set(evals), "evaluation problems must never appear in training"
    for p in train[:50] + evals:
        assert int(p.answer) == eval(f"{p.left} {p.op} {p.right}")
        assert p.question == f"What is {p.left} {p.op} {p.right}?"
    assert make_splits(500, 40, 20, ["+"], seed=4)[1] != evals


def test_arithmetic_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="leaves no training problem among the 4"):
        make_splits(3, 4, 1, ["+"])
    with pytest.raises(ValueError, match="at least one"):
        make_splits(3, 2, 5, [])


def test_worked_solution_ends_with_the_boxed_answer():
    _, evals = make_splits(10, 5, 9, ["-"], seed=0)
    p = evals[0]
    assert p.worked_solution.endswith(f"The final answer is $\\boxed{{{p.answer}}}$.")
    assert format_answer("", "7") == "The final answer is $\\boxed{7}$."


def test_messages_carry_the_system_instruction():
    assert build_messages("What is 1 + 1?") == [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "What is 1 + 1?"},
    ]
    assert build_messages("q", system_prompt="") == [{"role": "user", "content": "q"}]


def test_get_field_reaches_nested_columns():
    row = {"prompt": [{"content": "text", "role": "user"}], "reward_model": {"ground_truth": "34"}}
    assert get_field(row, "prompt.0.content") == "text"
    assert get_field(row, "reward_model.ground_truth") == "34"
    with pytest.raises(KeyError, match="answer"):
        get_field(row, "answer")
