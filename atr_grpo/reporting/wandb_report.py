"""A saved W&B report with the Figure 2 panels for the runs of one experiment (one W&B group).

Runs of an experiment share a W&B group (logger.group defaults to the experiment) and log the same keys as
metrics.jsonl, so the panels below line the methods up side by side. Needs `wandb-workspaces` (a dev extra)
and a W&B API key; nothing here runs offline except `panel_spec`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]
    smoothing: float = 0.0  # exponential smoothing in the W&B UI (the figures use a 100-step moving average)


def panel_spec(k: int = 8) -> list[Panel]:
    """The panels, in order: Figure 2's three training curves and the evaluation average, then the rule's
    clip fraction and ratio, which the paper does not plot."""
    return [
        Panel("return (reward)", ("reward",), 0.9),
        Panel("entropy", ("entropy",), 0.9),
        Panel("completion length", ("completion_length",), 0.9),
        Panel(f"Average Mean@{k}", (f"eval/average/mean@{k}",)),
        Panel(f"Average Pass@{k}", (f"eval/average/pass@{k}",)),
        Panel("clip fraction", ("clip/frac", "clip/frac_low", "clip/frac_high"), 0.6),
        Panel("ratio w", ("ratio/mean", "ratio/min", "ratio/max"), 0.6),
    ]


class ReportError(RuntimeError):
    pass


def _api_key_available() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import wandb

        return bool(wandb.Api().api_key)
    except Exception:
        return False


def build_report(entity: str, project: str, group: str, k: int = 8) -> Any:
    """The report object (not saved): one panel grid over the runs of `group`, grouped by method."""
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError as err:
        raise ReportError("building a W&B report needs `pip install wandb-workspaces==0.4.13`") from err
    panels = [
        wr.LinePlot(title=p.title, x="Step", y=list(p.keys), smoothing_factor=p.smoothing or None)
        for p in panel_spec(k)
    ]
    runset = wr.Runset(entity=entity, project=project, name=group, filters=f"Group = '{group}'",
                       groupby=["config.method"])  # fmt: skip
    return wr.Report(
        entity=entity,
        project=project,
        title=f"atr-grpo: {group}",
        description="Return, entropy and completion length per method (Figure 2), evaluation averages, and the "
        "clipping rule's clip fraction and ratio. Built by scripts/wandb_report.py.",
        blocks=[wr.PanelGrid(runsets=[runset], panels=panels)],
    )


def save_report(entity: str, project: str, group: str, k: int = 8) -> str:
    if not _api_key_available():
        raise ReportError(
            "no W&B API key: run `wandb login` or set WANDB_API_KEY (a saved report needs the W&B server)"
        )
    report = build_report(entity, project, group, k)
    report.save()
    return str(report.url)
