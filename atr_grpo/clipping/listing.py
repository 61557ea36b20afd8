"""What the registry says about its rules, in words: the `python -m atr_grpo.clipping` listing and docs/framework.md's
rule table, both written from each rule's `summary`, `source`, `params` (default, allowed range, doc) and
`bounds_text`, so that the documentation cannot drift from the code.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from atr_grpo.clipping.adaptive_delta import DELTA_CONTROL_PARAMS, takes_delta
from atr_grpo.clipping.base import RULES, ClipRule, build_rule

TABLE_HEADER = (
    "| rule (`clipping=`) | module | family | constraint / loss | defaults | trust region at the defaults | source |",
    "|---|---|---|---|---|---|---|",
)


def module_path(rule: type[ClipRule]) -> str:
    """'atr_grpo/clipping/kl.py': where the rule's class is defined, relative to the repository root; for a rule of
    another package (`atr_grpo.plugins`), its module's name."""
    path = Path(inspect.getfile(rule)).resolve()
    package_root = Path(__file__).resolve().parents[2]
    return path.relative_to(package_root).as_posix() if path.is_relative_to(package_root) else rule.__module__


def format_default(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def rule_entry(name: str) -> str:
    """The listing of one rule: name, module, family, summary, source, parameters, trust region."""
    rule_class = RULES[name]
    rule = build_rule(name)
    lines = [f"{name}  ({module_path(rule_class)}, family {rule_class.family})", f"  {rule_class.summary}"]
    lines.append(f"  source: {rule_class.source}")
    if rule_class.params:
        lines.append("  parameters:")
        width = max(len(f"{p.name} = {format_default(p.default)}") for p in rule_class.params)
        for param in rule_class.params:
            head = f"{param.name} = {format_default(param.default)}"
            lines.append(f"    {head:<{width}}  {param.allowed}; {param.doc}")
    bounds = rule.bounds_text()
    if bounds:
        lines.append(f"  trust region at the defaults: {bounds}")
    if rule_class.native_aggregation is not None:
        lines.append(f"  native aggregation: {rule_class.native_aggregation} (with loss_agg=native)")
    if rule_class.needs:
        lines.append(f"  needs the extras: {', '.join(rule_class.needs)}")
    if takes_delta(name):
        keys = ", ".join(f"{p.name} = {format_default(p.default)}" for p in DELTA_CONTROL_PARAMS)
        lines.append(f"  adaptive δ (clipping/adaptive_delta.py): {keys}")
    if rule_class.acts_on_policy:
        lines.append("  acts on strictly on-policy updates (w ≡ 1) as well")
    return "\n".join(lines)


def rule_listing(names: list[str] | None = None) -> str:
    """Every registered rule (or the named ones), in name order, separated by blank lines."""
    chosen = sorted(RULES) if names is None else names
    unknown = [name for name in chosen if name not in RULES]
    if unknown:
        raise ValueError(f"unknown clipping rule {unknown[0]!r}; allowed: {', '.join(sorted(RULES))}")
    return "\n\n".join(rule_entry(name) for name in chosen)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table_row(name: str) -> str:
    """One row of docs/framework.md's rule table."""
    rule_class = RULES[name]
    defaults = ", ".join(f"`{p.name}={format_default(p.default)}`" for p in rule_class.params) or "–"
    cells = [
        f"`{name}`",
        f"`{Path(module_path(rule_class)).name}`",
        rule_class.family,
        rule_class.summary,
        defaults,
        build_rule(name).bounds_text() or "–",
        rule_class.source,
    ]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def rule_table() -> str:
    """The rule table of docs/framework.md (Markdown), one row per registered rule in name order."""
    return "\n".join([*TABLE_HEADER, *(table_row(name) for name in sorted(RULES))])
