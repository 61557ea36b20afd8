"""`model.tiny.pretrain_chain_ops`: worked multi-step questions in the tiny model's pretraining text, never the
evaluation's chains, and the default leaves the base model (and its cache key) as it was."""

import json
import random
import re
from pathlib import Path

import pytest

from atr_grpo.config_inputs import TinyModelConfig
from atr_grpo.errors import ConfigError
from atr_grpo.tiny_model import _pretraining_document, tiny_fingerprint
from tests.conftest import train_config

REPO = Path(__file__).resolve().parents[2]
QUESTION = re.compile(r"What is ((?:\d+ [+-] )+\d+)\? ((?:\d+ [+-] \d+ = -?\d+\. ?)+)")


def _questions(cfg: TinyModelConfig, documents: int = 400) -> list[tuple[str, str]]:
    rng = random.Random(0)
    text = " ".join(_pretraining_document(rng, cfg) for _ in range(documents))
    return QUESTION.findall(text)


def _check_working(question: str, working: str) -> int:
    """The number of operations; asserts that each line starts from the previous result and is right (the
    statements that may follow the working are other sentences of the document)."""
    tokens = question.split()
    value, steps = int(tokens[0]), list(zip(tokens[1::2], map(int, tokens[2::2])))
    lines = working.strip().split(". ")
    assert len(lines) >= len(steps), (question, working)
    for (op, operand), line in zip(steps, lines[: len(steps)]):
        result = value + operand if op == "+" else value - operand
        assert line.rstrip(".") == f"{value} {op} {operand} = {result}"
        value = result
    return len(steps)


def test_chains_of_one_to_n_operations_each_worked_out_correctly():
    counts = [_check_working(q, w) for q, w in _questions(TinyModelConfig(pretrain_chain_ops=2))]
    assert set(counts) == {1, 2}
    assert 0.3 < counts.count(2) / len(counts) < 0.7  # lengths drawn uniformly in [1, 2]


def test_the_default_pretrains_on_single_statements_only():
    counts = [_check_working(q, w) for q, w in _questions(TinyModelConfig())]
    assert counts and set(counts) == {1}


def test_the_default_keeps_the_base_model_committed_runs_name():
    """The new key at its default stays out of the fingerprint: the power runs' base model is still found."""
    env = json.loads((REPO / "results/power/runs/power__atr__s0/env.json").read_text())
    cfg = train_config(["experiment=power"]).model.tiny
    assert env["start_point"]["base_model"] == f"tiny/{tiny_fingerprint(cfg)}"
    assert tiny_fingerprint(TinyModelConfig(pretrain_chain_ops=2)) != tiny_fingerprint(TinyModelConfig())


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["model.tiny.pretrain_chain_ops=3"], "model.tiny.pretrain_chain_ops must be < data.chain_min=3"),
        (["model.tiny.pretrain_chain_ops=0"], "model.tiny.pretrain_chain_ops must be"),
        (
            ["model.tiny.pretrain_chain_ops=2", "model.tiny.pretrain_operations=[+,*]"],
            "model.tiny.pretrain_operations[] (with pretrain_chain_ops > 1)",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        train_config(["experiment=power", *overrides])
    assert needle in str(err.value)


def test_another_numeric_path_builds_its_own_base_model(monkeypatch):
    """The kernel choice is part of the base model's cache key; the native path's key is unchanged."""
    from atr_grpo.numeric_paths import KERNEL_VARIABLES, NUMERIC_PATHS

    for name in KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    native = tiny_fingerprint(TinyModelConfig())
    for name, value in NUMERIC_PATHS["avx2"].items():
        monkeypatch.setenv(name, value)
    avx2 = tiny_fingerprint(TinyModelConfig())
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert len({native, avx2, tiny_fingerprint(TinyModelConfig())}) == 3
    for name in KERNEL_VARIABLES:
        monkeypatch.delenv(name)
    assert tiny_fingerprint(TinyModelConfig()) == native == "8c221fc01d5d"
