"""Save a W&B report with the Figure 2 panels for one experiment's runs (needs a W&B API key and the network).

python scripts/wandb_report.py --entity ME --project atr-grpo --group table2
python scripts/wandb_report.py --print-spec      # the panels as JSON, offline
"""

from __future__ import annotations

import argparse
import json
import sys

from atr_grpo.reporting.render.wandb_report import ReportError, save_report, spec_dict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entity", help="the W&B entity (user or team) that owns the project")
    parser.add_argument("--project", default="atr-grpo")
    parser.add_argument("--group", help="the W&B group: the experiment (e.g. table2), as logger.group defaults to")
    parser.add_argument("--k", type=int, default=8, help="the K of the evaluation keys (eval/average/mean@K)")
    parser.add_argument("--print-spec", action="store_true", help="print the panels as JSON and contact nothing")
    opts = parser.parse_args(argv)
    if opts.print_spec:
        print(json.dumps(spec_dict(opts.k), indent=2))
        return 0
    if not opts.entity or not opts.group:
        parser.error("--entity and --group are required to save a report")
    try:
        print(save_report(opts.entity, opts.project, opts.group, opts.k))
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
