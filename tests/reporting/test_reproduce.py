"""`python -m atr_grpo.reproduce`: the plan, then tables, figures and pack from the runs it leaves; the last line
says how many runs were re-run (0 when the committed runs were all finished), and --rerun writes into a fresh
folder, never into the committed one."""

from __future__ import annotations

from pathlib import Path

import pytest

from atr_grpo import launch, reproduce, results


@pytest.fixture
def recorded(monkeypatch):
    """The launch (every run found finished unless `rerun`) and the results commands, recorded instead of run."""
    calls = {"launch": [], "results": []}

    def run_plan(plan, extra, dry_run, jobs=1, runs_root=None):
        calls["launch"].append((plan.name, jobs, runs_root))
        tally = launch.Tally(plan.name, 40)
        if runs_root is None:
            tally.finished = [Path(f"results/power/runs/r{i}") for i in range(40)]
        else:
            tally.launched = [f"cmd {i}" for i in range(40)]
        return tally

    monkeypatch.setattr(launch, "run_plan", run_plan)
    monkeypatch.setattr(results, "main", lambda argv: calls["results"].append(argv) or 0)
    return calls


def test_without_rerun_the_tables_are_rebuilt_and_the_line_says_nothing_was_re_run(recorded, capsys):
    code = reproduce.main(
        ["power", "--runs", "results/power/runs", "--out", "results/power", "--jobs", "2", "--methods", "clip,atr"]
    )
    assert code == 0 and recorded["launch"] == [("power", 2, None)]
    assert [argv[0] for argv in recorded["results"]] == ["all", "figures", "pack"]
    assert recorded["results"][0] == [
        "all",
        "--runs",
        "results/power/runs",
        "--experiment",
        "power",
        "--out",
        "results/power/tables",
    ]
    assert recorded["results"][1][-2:] == ["--methods", "clip,atr"]
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        "power: rebuilt tables from 40 runs in results/power/runs (40 finished before this command, "
        "not re-run); re-ran 0"
    )


def test_rerun_runs_everything_into_a_fresh_folder(recorded, tmp_path, capsys):
    assert reproduce.main(["power", "--runs", "results/power/runs", "--out", str(tmp_path), "--rerun"]) == 0
    assert recorded["launch"] == [("power", 1, tmp_path / "runs")]
    assert recorded["results"][0][:3] == ["all", "--runs", str(tmp_path / "runs")]
    assert capsys.readouterr().out.splitlines()[-1].endswith("(0 finished before this command, not re-run); re-ran 40")


def test_rerun_refuses_the_committed_folder(recorded, capsys):
    with pytest.raises(SystemExit):
        reproduce.main(["power", "--runs", "results/power/runs", "--out", "results/power", "--rerun"])
    assert "--rerun needs a fresh folder" in capsys.readouterr().err and recorded["launch"] == []


def test_a_plan_with_a_final_evaluation_runs_it_between_the_runs_and_the_tables(recorded, monkeypatch, tmp_path):
    """plan.yaml beside --runs names a final evaluation: `final_eval` runs on the runs, at the jobs given, before
    any table; when it fails, no table is built and its status is the command's."""
    import yaml
    from helpers.plans import plan_with_final_evaluation

    from atr_grpo import final_eval

    plan = plan_with_final_evaluation()
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    runs = tmp_path / "runs"
    calls = []
    monkeypatch.setattr(final_eval, "main", lambda argv: calls.append((argv, len(recorded["results"]))) or 0)
    assert reproduce.main(["power", "--runs", str(runs), "--out", str(tmp_path), "--jobs", "2"]) == 0
    assert calls == [(["--runs", str(runs), "--plan", str(tmp_path / "plan.yaml"), "--jobs", "2"], 0)]
    assert [argv[0] for argv in recorded["results"]] == ["all", "figures", "pack"]
    recorded["results"].clear()
    monkeypatch.setattr(final_eval, "main", lambda argv: 1)
    assert reproduce.main(["power", "--runs", str(runs), "--out", str(tmp_path)]) == 1
    assert recorded["results"] == []
