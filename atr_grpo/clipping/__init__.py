"""The clipping registry: every policy-divergence rule of the unified framework, one call signature.

    from atr_grpo.clipping import RULES, build_rule, kl3_ratio_bounds
    rule = build_rule("atr", delta=0.07)
    out = rule(logp, old_logp, advantages, mask)       # out.loss [B, T], out.metrics {str: float}
    kl3_ratio_bounds(0.07)                             # (0.6710, 1.4222)

Rules live one family per module. Importing this package imports every module in it (a new module needs no
edit here), which registers every built-in rule. The rules other installed packages declare under the entry-point
group `atr_grpo.rules` are registered by `atr_grpo.plugins.load_rule_plugins`, which the config layer, the verl
plugin and `python -m atr_grpo.clipping` (the listing) call: importing this package reads no entry points.
"""

import importlib
import pkgutil

from atr_grpo.clipping.base import (
    LOG_RATIO_LIMIT,
    METRIC_KEYS,
    RULES,
    SAMPLE_OLD_PROBS,
    ClipOutput,
    ClipRule,
    Param,
    RuleTerms,
    TokenBatch,
    build_rule,
    make_batch,
    ratio_from_log,
    register,
    rule_at_defaults,
    rule_defaults,
)
from atr_grpo.clipping.bounds import describe_bounds, divergence_ratio_interval, kl3_ratio_bounds, lambert_w
from atr_grpo.clipping.dcpo import dcpo_ratio_bounds
from atr_grpo.clipping.general import general_operator
from atr_grpo.clipping.kl import k3

__all__ = [
    "LOG_RATIO_LIMIT",
    "METRIC_KEYS",
    "RULES",
    "SAMPLE_OLD_PROBS",
    "ClipOutput",
    "ClipRule",
    "Param",
    "RuleTerms",
    "TokenBatch",
    "build_rule",
    "dcpo_ratio_bounds",
    "describe_bounds",
    "divergence_ratio_interval",
    "general_operator",
    "k3",
    "kl3_ratio_bounds",
    "lambert_w",
    "make_batch",
    "ratio_from_log",
    "register",
    "rule_at_defaults",
    "rule_defaults",
]

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):  # not __main__ (the listing)
        importlib.import_module(f"{__name__}.{_module.name}")
