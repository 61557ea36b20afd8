"""What the registry says about its rules, in words: the `python -m atr_grpo.clipping` listing and the rule table
of docs/framework.md. Both are written from each rule's `summary`, `source`, `params` (default, allowed range,
doc) and `bounds_text`, so the documentation cannot drift from the code.

    python -m atr_grpo.clipping atr dcpo                      # the listing of two rules
    python -m atr_grpo.clipping --markdown                    # the rule table, printed
    python -m atr_grpo.clipping --write docs/framework.md     # the rule table, rewritten between its markers

The table holds the rules defined in this package. A rule from another package (`atr_grpo.plugins`) is in the
listing, not in the table.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

from atr_grpo.clipping.adaptive_delta import DELTA_CONTROL_PARAMS, takes_delta
from atr_grpo.clipping.base import RULES, ClipRule, rule_at_defaults
from atr_grpo.plugins import load_rule_plugins

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the repository root, which holds atr_grpo/

TABLE_HEADER = (
    "| rule (`clipping=`) | module | family | constraint / loss | defaults | trust region at the defaults | source |",
    "|---|---|---|---|---|---|---|",
)
# the lines around the rule table in a Markdown page; `--write` replaces what lies between them
TABLE_BEGIN = "<!-- rule table: written by `python -m atr_grpo.clipping --write docs/framework.md` -->"
TABLE_END = "<!-- end of the rule table -->"


def module_path(rule: type[ClipRule]) -> str:
    """'atr_grpo/clipping/kl.py': where the rule's class is defined, relative to the repository root; for a rule of
    another package (`atr_grpo.plugins`) or of a module with no file, its module's name."""
    try:
        path = Path(inspect.getfile(rule)).resolve()
    except TypeError:  # no file to show
        return rule.__module__
    return path.relative_to(PACKAGE_ROOT).as_posix() if path.is_relative_to(PACKAGE_ROOT) else rule.__module__


def format_default(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def rule_entry(name: str) -> str:
    """The listing of one rule: name, module, family, summary, source, parameters, trust region."""
    rule_class = RULES[name]
    rule = rule_at_defaults(name)
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
        rule_at_defaults(name).bounds_text() or "–",
        rule_class.source,
    ]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def package_rules() -> list[str]:
    """The registered rules defined in this package (not in a plugin's), in name order."""
    return sorted(name for name, rule in RULES.items() if rule.__module__.startswith("atr_grpo."))


def rule_table() -> str:
    """The rule table of docs/framework.md (Markdown): one row per rule of this package, in name order."""
    return "\n".join([*TABLE_HEADER, *(table_row(name) for name in package_rules())])


def table_span(lines: list[str], where: str) -> tuple[int, int]:
    """(index of TABLE_BEGIN, index of TABLE_END) in `lines`; ValueError naming `where` when either is missing."""
    try:
        begin = lines.index(TABLE_BEGIN)
        end = lines.index(TABLE_END, begin)
    except ValueError:
        raise ValueError(f"{where} has no rule table between the lines {TABLE_BEGIN!r} and {TABLE_END!r}") from None
    return begin, end


def written_table(text: str, where: str = "the page") -> str:
    """The table a page holds between its markers, without the blank lines around it."""
    lines = text.splitlines()
    begin, end = table_span(lines, where)
    return "\n".join(lines[begin + 1 : end]).strip("\n")


def with_rule_table(text: str, where: str = "the page") -> str:
    """`text` with the lines between its markers replaced by `rule_table()`, a blank line on each side (a marker
    next to a table row would end the table early or join it, depending on the renderer)."""
    lines = text.splitlines(keepends=True)
    begin, end = table_span([line.rstrip("\n") for line in lines], where)
    return "".join(lines[: begin + 1]) + "\n" + rule_table() + "\n\n" + "".join(lines[end:])


def write_rule_table(page: Path) -> bool:
    """Rewrite the rule table of `page` from the registry; True when the file changed."""
    text = page.read_text()
    updated = with_rule_table(text, str(page))
    if updated != text:
        page.write_text(updated)
    return updated != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.clipping", description="List the registered clipping rules."
    )
    parser.add_argument("rules", nargs="*", help="rules to list (default: all)")
    parser.add_argument("--markdown", action="store_true", help="print the rule table of docs/framework.md")
    parser.add_argument("--write", metavar="PAGE", type=Path, help="rewrite the rule table of PAGE between its markers")
    opts = parser.parse_args(argv)
    load_rule_plugins()  # the listing shows installed rules too (the table shows the package's own)
    try:
        if opts.write is not None:
            changed = write_rule_table(opts.write)
            print(f"{opts.write}: rule table {'rewritten' if changed else 'unchanged'} ({len(package_rules())} rules)")
        elif opts.markdown:
            print(rule_table())
        else:
            print(rule_listing(opts.rules or None))
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
