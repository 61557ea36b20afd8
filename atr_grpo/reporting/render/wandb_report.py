"""A saved W&B report with the Figure 2 panels, and the parts of Mean@K beside it, for the runs of one experiment
(one W&B group).

Runs of an experiment share a W&B group (logger.group defaults to the experiment) and log the same keys as
metrics.jsonl, so the panels below line the methods up side by side. Saving needs `wandb-workspaces` (a dev
extra), a W&B API key and the network; `panel_spec` and `build_report` work offline.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from atr_grpo.evaluation.runner import EVAL_STEP
from atr_grpo.wandb_auth import api_key_available


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]
    smoothing: float = 0.0  # exponential smoothing in the W&B UI (the PNG figures use a 100-step moving average)
    log_y: bool = False
    x: str = "Step"  # W&B's own step (the training step); evaluations use their own axis, `eval/step`


def panel_spec(k: int = 8) -> list[Panel]:
    """The panels, in order: Figure 2's three training curves and its evaluation average; beside it the two parts of
    Mean@K (Mean@K = answered rate × accuracy given an answer, `evaluation.outcomes`), the answered rate with the
    truncated share; then Pass@K and the rule's clip fraction, ratio and mean KL3, which the paper does not plot."""
    return [
        Panel("return (reward)", ("reward",), 0.9),
        Panel("entropy", ("entropy",), 0.9),
        Panel("completion length", ("completion_length",), 0.9),
        Panel(f"Average Mean@{k}", (f"eval/average/mean@{k}",), x=EVAL_STEP),
        Panel(
            f"Average answered rate@{k} (and truncated share)",
            (f"eval/average/answered@{k}", f"eval/average/truncated@{k}"),
            x=EVAL_STEP,
        ),
        Panel(f"Average accuracy given an answer@{k}", (f"eval/average/acc_given_answer@{k}",), x=EVAL_STEP),
        Panel(f"Average Pass@{k}", (f"eval/average/pass@{k}",), x=EVAL_STEP),
        Panel("clip fraction", ("clip/frac", "clip/frac_low", "clip/frac_high"), 0.6),
        Panel("ratio w", ("ratio/mean", "ratio/min", "ratio/max"), 0.6, log_y=True),
        Panel("trust-region size (mean KL3)", ("kl/kl3_mean",), 0.6),
    ]


def spec_dict(k: int = 8) -> list[dict[str, Any]]:
    """The panels as plain data (`scripts/wandb_report.py --print-spec`), for building the report by hand."""
    return [asdict(panel) for panel in panel_spec(k)]


class ReportError(RuntimeError):
    pass


def build_report(entity: str, project: str, group: str, k: int = 8) -> Any:
    """The report object (not saved): one panel grid over the runs of `group`, grouped by method."""
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError as err:
        raise ReportError(
            "building a W&B report needs `pip install wandb-workspaces==0.4.13` (the dev extra); "
            "`scripts/wandb_report.py --print-spec` prints the panels to build by hand"
        ) from err
    panels = [
        wr.LinePlot(title=p.title, x=p.x, y=list(p.keys), smoothing_factor=p.smoothing or None, log_y=p.log_y)
        for p in panel_spec(k)
    ]
    runset = wr.Runset(
        entity=entity, project=project, name=group, filters=f"Group = '{group}'", groupby=["config.method"]
    )
    return wr.Report(
        entity=entity,
        project=project,
        title=f"atr-grpo: {group}",
        description="Return, entropy and completion length per method (Figure 2), evaluation averages with the "
        "answered rate and the accuracy given an answer that make up Mean@K, and the clipping rule's clip fraction, "
        "ratio and mean KL3. Built by scripts/wandb_report.py.",
        blocks=[wr.PanelGrid(runsets=[runset], panels=panels)],
    )


def save_report(entity: str, project: str, group: str, k: int = 8) -> str:
    """Save the report on the W&B server; returns its URL. Fails with a ReportError that says what to do."""
    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("offline", "disabled", "dryrun"):
        raise ReportError(f"WANDB_MODE={mode}: a saved report needs the W&B server; unset WANDB_MODE to save it")
    if not api_key_available():
        raise ReportError("no W&B API key: run `wandb login` or set WANDB_API_KEY (a saved report needs the server)")
    report = build_report(entity, project, group, k)
    try:
        report.save()
    except Exception as err:  # network, permissions, unknown entity: all end here, with the cause attached
        raise ReportError(
            f"could not save the report to {entity}/{project} ({type(err).__name__}: {err}); "
            "check the network, the entity and project names, and the API key"
        ) from err
    return str(report.url)
