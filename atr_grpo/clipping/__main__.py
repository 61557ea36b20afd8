"""`python -m atr_grpo.clipping [RULE ...] [--markdown] [--write PAGE]`: list the registered clipping rules.

Each rule with its module, family, constraint, source, parameters (default, allowed range, meaning) and its trust
region at the defaults. `--markdown` prints the rule table of docs/framework.md; `--write docs/framework.md`
rewrites it there. The text is written by `atr_grpo.rule_docs`.
"""

import sys

from atr_grpo.rule_docs import main

if __name__ == "__main__":
    sys.exit(main())
