"""The W&B report: its panels use the keys the runs log, it builds offline, and saving without a key fails clearly."""

from __future__ import annotations

import pytest

from atr_grpo.clipping import METRIC_KEYS
from atr_grpo.reporting.wandb_report import ReportError, build_report, panel_spec, save_report


def test_panels_show_figure_2_and_the_rule_metrics():
    keys = {key for panel in panel_spec(8) for key in panel.keys}
    assert {"reward", "entropy", "completion_length", "eval/average/mean@8"} <= keys
    assert set(METRIC_KEYS) <= keys


def test_report_builds_offline():
    pytest.importorskip("wandb_workspaces")
    report = build_report("me", "atr-grpo", "table2")
    grid = report.blocks[0]
    assert [p.title for p in grid.panels][:3] == ["return (reward)", "entropy", "completion length"]
    assert grid.runsets[0].filters == "Group = 'table2'"


def test_saving_without_an_api_key_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path))
    with pytest.raises(ReportError, match="no W&B API key"):
        save_report("me", "atr-grpo", "table2")
