"""docs/experiment-log.md lists every committed run set: each results/<experiment>/runs/ folder's experiment,
its number of runs and every code commit its runs record, so that no full run of an experiment goes unreported."""

from __future__ import annotations

import json
import re
from collections import Counter

from conftest import REPO

LOG = REPO / "docs" / "experiment-log.md"


def _log_rows() -> list[list[str]]:
    rows = []
    for line in LOG.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].isdigit():
            rows.append(cells)
    return rows


def _run_commits(experiment: str) -> Counter:
    commits = Counter()
    for env in (REPO / "results" / experiment / "runs").glob("*/env.json"):
        commit = json.loads(env.read_text())["git_commit"]
        commits[commit[:7] + ("-dirty" if commit.endswith("-dirty") else "")] += 1
    return commits


def test_every_committed_run_set_is_in_the_log():
    experiments = sorted(p.parent.name for p in (REPO / "results").glob("*/runs") if p.is_dir())
    assert experiments, "no committed run sets found"
    rows = _log_rows()
    for experiment in experiments:
        commits = _run_commits(experiment)
        assert commits, f"results/{experiment}/runs holds no env.json with a git_commit"
        matches = [r for r in rows if r[1].split(",")[0] == experiment and all(c in r[3] for c in commits)]
        assert matches, f"results/{experiment}/runs (commits {dict(commits)}) is not in {LOG.name}"
        assert int(matches[0][2]) == sum(commits.values()), f"{experiment}: run count differs from {LOG.name}"


def test_the_abandoned_first_power_experiment_is_reported_with_its_rejected_test():
    text = LOG.read_text()
    row = next(r for r in _log_rows() if r[4] == "d2f7b8d")
    assert row[1].startswith("power") and "abandoned" in row[5] and "rejected" in row[5]
    section = text.split("## 2.")[1].split("## 3.")[0]
    assert re.search(r"−2\.33 points.*\[−3\.15, −1\.51\]", section.replace("\n", " "))
    assert "10 of 10" in section and "Holm p 0.0059" in section
