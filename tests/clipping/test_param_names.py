"""Rule parameters as configs see them: `register` refuses a name that is reserved elsewhere (verl's policy-loss config,
the clipping config, the rule's own attributes) on any machine, and a numeric parameter whose check accepts floats is
a float in the config schema even with an int default."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.toy_rules import registered
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from atr_grpo.clipping import RULES, ClipRule, Param, RuleTerms, register
from atr_grpo.clipping.base import number, positive, value_type
from atr_grpo.clipping.param_names import CLIPPING_CONFIG_NAMES, reserved_names


def rule_with(*params: Param, name: str = "test_params") -> type[ClipRule]:
    class WithParams(ClipRule):
        family = "reference"

        def terms(self, batch, **_):
            never = torch.zeros_like(batch.mask)
            return RuleTerms(loss=-batch.advantages * batch.logp, frozen_low=never, frozen_high=never)

    WithParams.name, WithParams.params = name, params
    return WithParams


def refusal(*params: Param) -> str:
    with pytest.raises(ValueError) as error:
        register(rule_with(*params))
    assert "test_params" not in RULES
    return str(error.value)


def test_a_parameter_named_like_a_verl_policy_loss_field_is_refused_listing_the_reserved_names():
    """`dro_beta` is a field of verl's PolicyLossConfig: the verl plugin would fail at `import verl`."""
    message = refusal(positive("dro_beta", 0.1))
    assert message.startswith("clipping rule 'test_params': parameter name 'dro_beta' is reserved (a field of verl's")
    assert message.endswith("reserved names: " + ", ".join(reserved_names()))
    assert "clip_cov_ratio" in message and "delta_schedule" in message


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("name", "is reserved (a key of the clipping config)"),
        ("delta_min", "is reserved (a key of the clipping config)"),
        ("get", "is reserved (a field of verl's PolicyLossConfig"),
        ("terms", "would shadow the rule's attribute 'terms'"),
        ("summary", "would shadow the rule's attribute 'summary'"),
        ("_target_", "must be a Python identifier that is not a keyword and does not start with '_'"),
        ("lambda", "must be a Python identifier that is not a keyword"),
        ("c-max", "must be a Python identifier"),
    ],
)
def test_other_unusable_parameter_names_are_refused(name, words):
    assert f"parameter name {name!r} {words}" in refusal(positive(name, 1.0))


def test_a_parameter_declared_twice_is_refused():
    assert "parameter 'c' is declared twice" in refusal(positive("c", 1.0), positive("c", 2.0))


def test_the_reserved_names_cover_the_clipping_config_schema():
    """Every field and method of the clipping config, and every adaptive-δ key, is reserved."""
    from atr_grpo.clipping.adaptive_delta import DELTA_CONTROL_PARAMS
    from atr_grpo.config import ClippingConfig

    schema = {f.name for f in dataclasses.fields(ClippingConfig)} | {p.name for p in DELTA_CONTROL_PARAMS}
    schema |= {name for name in vars(ClippingConfig) if not name.startswith("_")}
    assert schema <= set(CLIPPING_CONFIG_NAMES)


# ------------------------------------------------------------------------------------------- value types
COUNT = Param("count", 4, "an integer ≥ 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
CAP = number("cap", 10, "a number > 1", lambda v: v > 1)


def test_a_number_with_an_int_default_is_a_float_unless_its_check_wants_an_integer():
    assert value_type(CAP) is float and value_type(COUNT) is int
    assert value_type(positive("eps", 0.2)) is float and value_type(Param("flag", True, "", bool)) is bool
    with registered(rule_with(CAP, COUNT)) as rule:
        assert rule.cap == 10.0 and isinstance(rule.cap, float) and rule.count == 4 and isinstance(rule.count, int)


def test_the_config_schema_takes_a_float_for_an_int_default():
    """`clipping.cap=10.5` composes for a parameter whose default is 10; an integer parameter still refuses 2.5."""
    from atr_grpo import config

    with registered(rule_with(CAP, COUNT)):
        schema = config._clipping_schema("test_params")
        try:
            node = OmegaConf.structured(schema(name="test_params"))
            built = OmegaConf.to_object(OmegaConf.merge(node, {"cap": 10.5, "count": 3}))
            assert (built.cap, built.count) == (10.5, 3)
            with pytest.raises(ValidationError):
                OmegaConf.merge(node, {"count": 2.5})
        finally:
            del config.__dict__[schema.__name__]
