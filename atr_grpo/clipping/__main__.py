"""`python -m atr_grpo.clipping [RULE ...] [--markdown]`: list the registered clipping rules.

Each rule with its module, family, constraint, source, parameters (default, allowed range, meaning) and its
trust region at the defaults; `--markdown` prints the rule table of docs/framework.md instead.
"""

from __future__ import annotations

import argparse
import sys

from atr_grpo.clipping.listing import rule_listing, rule_table
from atr_grpo.plugins import load_rule_plugins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atr_grpo.clipping", description=__doc__.splitlines()[0])
    parser.add_argument("rules", nargs="*", help="rules to list (default: all)")
    parser.add_argument("--markdown", action="store_true", help="print the rule table of docs/framework.md")
    opts = parser.parse_args(argv)
    load_rule_plugins()
    if opts.markdown:
        print(rule_table())
        return 0
    try:
        print(rule_listing(opts.rules or None))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
