"""The paper's trainer and evaluation values have one home, the schema's defaults (atr_grpo/config_training.py).
The files of conf/trainer/ and conf/eval/ set only what differs, so the two homes cannot drift apart."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml
from conftest import REPO, train_config

from atr_grpo.config import TrainConfig

GROUPS = ("trainer", "eval")


def schema_defaults(group: str) -> dict[str, typing.Any]:
    """The default of every field of the group's schema that has one."""
    schema = typing.get_type_hints(TrainConfig)[group]
    values = {}
    for field in dataclasses.fields(schema):
        if field.default is not dataclasses.MISSING:
            values[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            values[field.name] = field.default_factory()
    return values


def read_option(group: str, option: str) -> dict[str, typing.Any]:
    return yaml.safe_load((REPO / "conf" / group / f"{option}.yaml").read_text()) or {}


def inherited(group: str, option: str) -> dict[str, typing.Any]:
    """What a file of the group would give each key if it did not set it: the values of the files its `defaults`
    list names, over the schema's defaults."""
    values = schema_defaults(group)
    for base in read_option(group, option).get("defaults", []):
        if isinstance(base, str) and base != "_self_":
            values.update(inherited(group, base))
            values.update({k: v for k, v in read_option(group, base).items() if k != "defaults"})
    return values


def restated(group: str, option: str) -> list[str]:
    """The keys a file sets to the value it would have anyway."""
    before = inherited(group, option)
    return [
        f"{key}: {value!r}"
        for key, value in read_option(group, option).items()
        if key != "defaults" and key in before and before[key] == value and type(before[key]) is type(value)
    ]


@pytest.mark.parametrize(
    "group, option",
    [(group, path.stem) for group in GROUPS for path in sorted((REPO / "conf" / group).glob("*.yaml"))],
)
def test_no_config_file_restates_a_value_it_inherits(group, option):
    """A key set to the schema's default, or to its base file's value, is a second home for that value."""
    assert restated(group, option) == [], f"conf/{group}/{option}.yaml restates; delete these lines"


def test_the_paper_files_select_the_schema_defaults():
    """conf/trainer/paper.yaml and conf/eval/paper.yaml set nothing, and the composed default run is Table 4's."""
    assert read_option("trainer", "paper") == {} and read_option("eval", "paper") == {}
    cfg = train_config([])
    assert (cfg.trainer.learning_rate, cfg.trainer.per_device_train_batch_size, cfg.trainer.num_generations) == (
        5e-6,
        8,
        8,
    )
    assert (cfg.eval.temperature, cfg.eval.top_p, cfg.eval.max_tokens, cfg.eval.k) == (0.3, 0.95, 32768, 8)
