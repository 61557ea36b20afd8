"""The synthetic task and the shared prompt format."""

import pytest
from conftest import compose

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


def _chain_values(problem):
    """The running values of a chain, recomputed from its question alone (left to right)."""
    tokens = problem.question.removeprefix("What is ").removesuffix("?").split()
    values = [int(tokens[0])]
    for op, operand in zip(tokens[1::2], tokens[2::2]):
        values.append(values[-1] + int(operand) if op == "+" else values[-1] - int(operand))
    return values


def test_chains_write_every_intermediate_result_and_stay_in_range():
    """A chain of lo..hi operations: its working is one `a op b = c.` per operation, each starting from the previous
    result; every operand and running value lies in [0, max_operand]; the answer is the last value."""
    train, evals = make_splits(400, 64, 49, ["+", "-"], seed=0, chain=(3, 5))
    assert (train, evals) == make_splits(400, 64, 49, ["+", "-"], seed=0, chain=(3, 5))
    assert not set(train) & set(evals) and len(set(evals)) == 64
    assert {len(p.steps) for p in train} == {3, 4, 5}
    for p in train[:100] + evals:
        values = _chain_values(p)
        assert all(0 <= v <= 49 for v in values) and all(0 <= x <= 49 for _, x in p.steps)
        statements = p.working.split(". ")
        assert len(statements) == len(p.steps)
        for (op, operand), before, after, line in zip(p.steps, values, values[1:], statements):
            assert line.rstrip(".") == f"{before} {op} {operand} = {after}"
        assert p.answer == str(values[-1])
        assert p.worked_solution == f"{p.working}\n\nThe final answer is $\\boxed{{{p.answer}}}$."


def test_a_chain_of_one_is_the_single_operation_task():
    assert make_splits(200, 20, 30, ["+", "-"], seed=5, chain=(1, 1)) == make_splits(200, 20, 30, ["+", "-"], seed=5)


def test_chains_refuse_bad_lengths_and_operations():
    with pytest.raises(ValueError, match="chain_min <= chain_max"):
        make_splits(10, 5, 9, ["+"], chain=(4, 3))
    with pytest.raises(ValueError, match="must be among '\\+', '-'"):
        make_splits(10, 5, 9, ["+", "*"], chain=(2, 3))


def test_power_task_completions_are_long_enough():
    """The power experiment's SFT targets (3-5 operations, a quarter without the boxed line) average >= 48 tokens
    of the tiny tokenizer, end-of-sequence included: the length the issue asks of every run's completions."""
    from conftest import train_config

    from atr_grpo.data.datasets import sft_dataset
    from atr_grpo.tiny_model import build_tiny_tokenizer

    cfg = train_config(["experiment=power"])
    tokenizer = build_tiny_tokenizer(cfg.model.tiny.vocab_size)
    rows = sft_dataset(cfg.sft, cfg.data, cfg.prompt, tokenizer, cfg.model.max_seq_length)
    lengths = [len(tokenizer(row[0]["content"] + "<|im_end|>")["input_ids"]) for row in rows["completion"][:400]]
    assert sum(lengths) / len(lengths) >= 48
    assert max(lengths) < cfg.trainer.max_completion_length == cfg.eval.max_tokens


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.chain_min=4", "data.chain_max=3"], "data.chain_min must be in [1, chain_max=3], got 4"),
        (["data.operations=[+,*]", "data.chain_max=3"], "data.operations[] (of a chain, data.chain_max > 1) must be"),
        (["eval.when=after"], "eval.share_start must be false unless eval.when='during', got True"),
    ],
)
def test_the_chain_task_refuses_bad_settings_naming_the_key(overrides, message):
    from conftest import train_config

    from atr_grpo.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        train_config(["experiment=power", *overrides])
    assert message in str(err.value)


class WordTokenizer:
    """A chat template that joins the messages' texts, and one token per word."""

    def apply_chat_template(self, messages, tokenize, enable_thinking):
        return " ".join(message["content"] for message in messages)

    def __call__(self, text, add_special_tokens):
        return {"input_ids": text.split()}


def test_the_sft_stage_says_the_cap_stopped_its_reading(caplog):
    """The SFT examples kept: with sft.max_examples the reading stops at the cap, and the note says so rather than
    counting the examples never read as too long."""
    import logging

    from atr_grpo.config_hydra import to_object
    from atr_grpo.data.datasets import sft_dataset

    caplog.set_level(logging.INFO)
    cfg = to_object(compose(["experiment=smoke", "data.num_train=40", "sft.max_examples=3"]))
    dataset = sft_dataset(cfg.sft, cfg.data, cfg.prompt, WordTokenizer(), cfg.model.max_seq_length)
    assert len(dataset) == 3
    note = "SFT stage: 3 examples (sft.max_examples), the first 3 of 40 read, 0 of them longer than 256 tokens"
    assert note in caplog.messages
