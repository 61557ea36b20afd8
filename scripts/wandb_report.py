"""Save a W&B report with the Figure 2 panels for one experiment's runs (needs a W&B API key).

python scripts/wandb_report.py --entity ME --project atr-grpo --group table2
"""

from __future__ import annotations

import argparse
import sys

from atr_grpo.reporting.wandb_report import ReportError, save_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entity", required=True)
    parser.add_argument("--project", default="atr-grpo")
    parser.add_argument("--group", required=True, help="the experiment (runs are grouped by it)")
    parser.add_argument("--k", type=int, default=8, help="the K of the evaluation keys (eval/average/mean@K)")
    opts = parser.parse_args(argv)
    try:
        print(save_report(opts.entity, opts.project, opts.group, opts.k))
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
