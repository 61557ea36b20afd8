"""What an offline W&B run wrote, read back with wandb's own reader of its .wandb transaction log
(`wandb leet inspect --json`, in wandb-core; the installed SDK has no Python reader of that file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def offline_runs(run_dir: Path) -> list[dict]:
    """Each offline W&B run under `run_dir` (W&B's dir), in start order, as {"run": its run record, "history":
    {step: the values logged at that step}, "metrics": its define_metric records, "exit": its exit record or None,
    "path": its folder}."""
    env = dict(os.environ, WANDB_MODE="offline")  # offline: the reader sends no telemetry either
    runs = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*")):
        command = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)]
        result = subprocess.run(command, cwd=run_dir, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        records = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
        history = {}
        for record in records:
            if record["type"] == "history":
                item = record["history"]["item"]
                assert record["history"]["step"].get("num", 0) in (item["_step"], str(item["_step"]))
                history[item["_step"]] = {k: v for k, v in item.items() if not k.startswith("_")}
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        exits = [r["exit"] for r in records if r["type"] == "exit"]
        metrics = [r["metric"] for r in records if r["type"] == "metric"]
        runs.append(
            {"run": run, "history": history, "metrics": metrics, "exit": exits[-1] if exits else None, "path": path}
        )
    return sorted(runs, key=lambda r: r["run"]["start_time"])


def logged_table(run: dict, step: int, key: str) -> dict:
    """The W&B table logged under `key` at `step` of an offline run (`offline_runs`), as {"columns", "data"}: the
    history row names its file under the run's files/ folder."""
    path = run["path"] / "files" / run["history"][step][f"{key}.path"]
    return json.loads(path.read_text(encoding="utf-8"))
