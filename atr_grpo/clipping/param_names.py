"""The names a rule parameter may not take, and why: each parameter becomes a field or an attribute next to others.

- The verl plugin adds one field per parameter name to verl's `PolicyLossConfig` (`integrations/verl.py`): a name
  that verl's class already has would fail at `import verl`, which only `make test-verl` runs.
- The clipping config schema (`config.ClippingConfig`) has `name` and two methods, and a δ-rule's schema adds the
  adaptive-δ keys (`clipping/adaptive_delta.py`).
- A rule stores each parameter as an attribute of itself, so a parameter may not shadow what the class defines.

`register` refuses a rule whose parameter takes one of these names (`param_name_problem`), on any machine.
"""

from __future__ import annotations

import keyword
from collections.abc import Iterable

# verl 0.9.1: the fields of `verl.workers.config.PolicyLossConfig` and what its base `BaseConfig` (a Mapping) defines
VERL_POLICY_LOSS_NAMES = (
    "loss_mode",
    "clip_cov_ratio",
    "clip_cov_lb",
    "clip_cov_ub",
    "kl_cov_ratio",
    "ppo_kl_coef",
    "dro_beta",
    "rollout_correction",
    "get",
    "items",
    "keys",
    "values",
)
# `config.ClippingConfig` (`schema_rule`: the name of the rule whose schema a config is) and the adaptive-δ keys
# (`adaptive_delta.DELTA_CONTROL_PARAMS`)
CLIPPING_CONFIG_NAMES = (
    "name",
    "schema_rule",
    "params",
    "rule",
    "delta_control_settings",
    "delta_schedule",
    "delta_final",
    "target_kl3",
    "delta_rate",
    "delta_min",
    "delta_max",
)
RESERVED = {
    "a field of verl's PolicyLossConfig, to which the verl plugin adds the rule parameters": VERL_POLICY_LOSS_NAMES,
    "a key of the clipping config": CLIPPING_CONFIG_NAMES,
}


def reserved_names() -> list[str]:
    return sorted(name for names in RESERVED.values() for name in names)


def param_name_problem(rule_name: str, param_name: str, rule_attributes: Iterable[str]) -> str | None:
    """Why `param_name` cannot name a parameter of the rule `rule_name` (whose class has `rule_attributes`), or None."""
    where = f"clipping rule {rule_name!r}: parameter name {param_name!r}"
    if not param_name.isidentifier() or keyword.iskeyword(param_name) or param_name.startswith("_"):
        return f"{where} must be a Python identifier that is not a keyword and does not start with '_'"
    for why, names in RESERVED.items():
        if param_name in names:
            return f"{where} is reserved ({why}); reserved names: {', '.join(reserved_names())}"
    if param_name in rule_attributes:
        return f"{where} would shadow the rule's attribute {param_name!r}; choose another name"
    return None
