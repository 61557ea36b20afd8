"""The W&B report: its panels use the keys the runs log, it builds offline, and saving without a key, in
offline mode or without the server fails with a message that says what to do."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

from atr_grpo.clipping import METRIC_KEYS
from atr_grpo.evaluation.outcomes import summary_scores
from atr_grpo.evaluation.runner import flat_metrics
from atr_grpo.reporting.render import wandb_report
from atr_grpo.reporting.render.wandb_report import ReportError, build_report, panel_spec, save_report

SCRIPT = REPO / "scripts" / "wandb_report.py"


def test_panels_show_figure_2_and_the_rule_metrics():
    keys = [key for panel in panel_spec(8) for key in panel.keys]
    assert keys[:4] == ["reward", "entropy", "completion_length", "eval/average/mean@8"]
    assert set(METRIC_KEYS) <= set(keys)


def test_the_parts_of_mean_at_k_stand_beside_it_under_the_keys_the_runs_log():
    """Mean@K, then the answered rate (with the truncated share) and the accuracy given an answer; every evaluation
    panel's key is one that `flat_metrics` logs."""
    titles = [panel.title for panel in panel_spec(8)]
    at = titles.index("Average Mean@8")
    assert titles[at + 1 : at + 3] == [
        "Average answered rate@8 (and truncated share)",
        "Average accuracy given an answer@8",
    ]
    statuses = [["correct", "wrong", "no_answer", "truncated"]] * 2
    row = {**summary_scores(statuses), "status_counts": {}}
    logged = flat_metrics({"arithmetic": row}, 4)
    for panel in panel_spec(4):
        if panel.x == "eval/step":
            assert set(panel.keys) <= set(logged), panel.title


def test_report_builds_offline_with_one_group_by_method():
    pytest.importorskip("wandb_workspaces")
    from wandb_workspaces.expr import expr_to_filters

    grid = build_report("me", "atr-grpo", "table2").blocks[0]
    assert [p.title for p in grid.panels] == [p.title for p in panel_spec(8)]
    assert [list(p.y) for p in grid.panels][3] == ["eval/average/mean@8"]
    runset = grid.runsets[0]
    parsed = expr_to_filters(runset.filters)  # the filter string is valid W&B syntax for the run's group
    assert (parsed.key.section, parsed.key.name, parsed.value) == ("run", "group", "table2")
    assert runset.groupby == ["config.method"]


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def test_saving_without_an_api_key_fails_clearly(no_credentials):
    with pytest.raises(ReportError, match="no W&B API key: run `wandb login` or set WANDB_API_KEY"):
        save_report("me", "atr-grpo", "table2")


def test_saving_in_offline_mode_fails_clearly(no_credentials, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ReportError, match="WANDB_MODE=offline: a saved report needs the W&B server"):
        save_report("me", "atr-grpo", "table2")


def test_a_failed_save_names_the_cause(no_credentials, monkeypatch):
    class Unreachable:
        def save(self):
            raise ConnectionError("no route to host")

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(wandb_report, "build_report", lambda *args: Unreachable())
    with pytest.raises(ReportError, match=r"could not save the report to me/atr-grpo \(ConnectionError: no route"):
        save_report("me", "atr-grpo", "table2")


def test_script_prints_the_panels_offline_and_explains_failures(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NETRC": str(tmp_path / "none")}
    spec = subprocess.run([sys.executable, str(SCRIPT), "--print-spec"], capture_output=True, text=True, env=env)
    assert spec.returncode == 0 and json.loads(spec.stdout)[0]["keys"] == ["reward"]
    args = [sys.executable, str(SCRIPT), "--entity", "me", "--group", "table2"]
    failed = subprocess.run(args, capture_output=True, text=True, env=env)
    assert failed.returncode == 2 and "error: no W&B API key" in failed.stderr


class ServerStandIn:
    """The W&B server as the installed wandb_workspaces reaches it through `wandb.Api()._service_api` (wandb 0.31's
    transport): answers the project lookup and the report upsert, records what was sent. No network."""

    app_url = "https://wandb.example/"

    def __init__(self):
        self.sent = []

    def execute_graphql(self, query, variables=None):
        self.sent.append(variables)
        if "ProjectInternalId" in query:
            return {"project": {"id": "p", "internalId": "UHJvamVjdDox"}}
        assert "upsertView" in query, query
        project = {"name": variables["projectName"], "entityName": variables["entityName"]}
        view = {"id": "r1", "name": variables["name"], "displayName": variables["displayName"]}
        return {"upsertView": {"view": {**view, "spec": variables["spec"], "project": project}}}


def test_saving_sends_the_panels_through_the_installed_wandb_workspaces(no_credentials, monkeypatch):
    """save_report runs wandb_workspaces' own save() and url (only the transport is stood in for): the report it
    sends plots each training panel's keys against the step the runs log (`_step`) and each evaluation panel's against
    `eval/step` (the axis both evaluation paths log), over the runs of the group, grouped by the `method` the runs put
    in their config; the URL comes back."""
    pytest.importorskip("wandb_workspaces")
    import wandb_workspaces.reports.v2.interface as interface

    server = ServerStandIn()
    api = type("Api", (), {"projects": lambda self, entity: [type("P", (), {"name": "atr-grpo"})()]})()
    api._service_api = server  # where wandb_workspaces looks for the SDK's transport
    monkeypatch.setattr(interface, "_get_api", lambda: api)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    url = save_report("me", "atr-grpo", "table2")
    assert url == "https://wandb.example/me/atr-grpo/reports/atr-grpo:-table2--r1"
    upsert = server.sent[-1]
    where = [upsert[key] for key in ("entityName", "projectName", "displayName")]
    assert where == ["me", "atr-grpo", "atr-grpo: table2"]
    grid = json.loads(upsert["spec"])["blocks"][1]["metadata"]
    panels = grid["panelBankSectionConfig"]["panels"]
    assert [p["config"]["metrics"] for p in panels] == [list(p.keys) for p in panel_spec(8)]
    axes = {p["config"]["metrics"][0]: p["config"]["xAxis"] for p in panels}
    assert axes == {key: "eval/step" if key.startswith("eval/") else "_step" for key in axes}
    assert sorted(key for key, axis in axes.items() if axis == "eval/step") == [
        "eval/average/acc_given_answer@8",
        "eval/average/answered@8",
        "eval/average/mean@8",
        "eval/average/pass@8",
    ]
    (runset,) = grid["runSets"]
    assert runset["filters"]["filters"] == [
        {"key": {"section": "run", "name": "group"}, "op": "=", "value": "table2", "disabled": False}
    ]
    assert runset["grouping"] == [{"section": "config", "name": "method.value"}]


@pytest.mark.parametrize(("machine", "found"), [("api.forge.coreweave.com", True), ("other.example", False)])
def test_a_netrc_key_counts_for_the_host_wandb_logs_in_to(no_credentials, monkeypatch, tmp_path, machine, found):
    """`wandb login` (wandb 0.31) stores the key under its default host, api.forge.coreweave.com: that key is found
    (logger.mode=auto goes online, a report can be saved); a key for another host is not."""
    from atr_grpo.wandb_auth import api_key_available

    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine {machine}\n  login user\n  password {'k' * 40}\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert api_key_available() is found
