"""The clip-binding report: from metrics.jsonl and the rollout settings, the fraction of steps on which the rule
froze tokens, its clip fraction on the steps whose weights computed π_old (the first after each generation)
against the others, the ratio's noise floor on those steps, and the rollout-engine mismatch when logged."""

from __future__ import annotations

import json
import math

import pytest
from helpers.run_trees import read_csv
from omegaconf import OmegaConf

from atr_grpo.reporting.analyses.binding import binding_table
from atr_grpo.reporting.runs import find_runs
from atr_grpo.results import main


def binding_run(root, name, rollout, steps, logging_steps=1, rollout_logged=False):
    """Steps 1..steps; with `rollout` = (steps_per_generation, num_iterations) and 2 accumulation steps, fresh
    steps have |w − 1| ≤ 0.002 + step / 1e4 and freeze nothing, the others spread to [0.7, 1.5] and freeze 5%."""
    path = root / name
    path.mkdir(parents=True)
    spg, iterations = rollout
    config = {
        "experiment": "table2",
        "method": name,
        "seed": 0,
        "model": {"name": "m"},
        "trainer": {"gradient_accumulation_steps": 2, "logging_steps": logging_steps, "max_steps": steps},
        "rollout": {"steps_per_generation": spg, "num_iterations": iterations},
    }
    OmegaConf.save(OmegaConf.create(config), path / "config.yaml")
    per_rollout = (spg or 2) // 2 * iterations
    rows = []
    for step in range(1, steps + 1):
        fresh = (step - 1) % per_rollout == 0
        noise = 0.002 + step / 1e4
        row = {
            "step": step,
            "clip/frac": 0.0 if fresh else 0.05,
            "ratio/min": 1 - noise if fresh else 0.7,
            "ratio/max": 1 + noise / 2 if fresh else 1.5,
        }
        if rollout_logged:
            row.update(
                {
                    "rollout/logp_abs_diff_mean": 0.01,
                    "rollout/logp_abs_diff_max": 0.5,
                    "rollout/ratio_out_of_band_frac": 0.001 * step,
                }
            )
        rows.append(row)
    rows.append({"step": steps + 1, "reward": 0.3})  # a line without clip metrics is not a step that could clip
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_reused_rollouts_split_fresh_and_reused_steps(tmp_path):
    """reuse2 (steps_per_generation = 4 = 2 × accumulation): odd steps are fresh. Their spreads max(w_max − 1,
    1 − w_min) = 0.002 + s / 1e4 for s = 1, 3, ..., 9: median 0.0025, max 0.0029."""
    binding_run(tmp_path, "atr", (4, 1), 10, rollout_logged=True)
    (row,) = binding_table(find_runs(tmp_path)).rows
    assert (row["steps"], row["steps_per_rollout"]) == (10, 2)
    assert row["binding_steps"] == 0.5 and row["clip_frac"] == pytest.approx(0.025)
    assert (row["clip_frac_fresh"], row["clip_frac_reused"]) == (0.0, 0.05)
    assert row["noise_floor"] == pytest.approx(0.0025) and row["noise_floor_max"] == pytest.approx(0.0029)
    assert row["logp_abs_diff_max"] == 0.5 and row["ratio_out_of_band_frac"] == pytest.approx(0.0055)


def test_num_iterations_multiplies_the_steps_per_rollout(tmp_path):
    binding_run(tmp_path, "clip", (4, 2), 12)  # 2 steps per generation × 2 passes: steps 1, 5, 9 are fresh
    (row,) = binding_table(find_runs(tmp_path)).rows
    assert row["steps_per_rollout"] == 4 and row["binding_steps"] == pytest.approx(9 / 12)
    assert row["noise_floor_max"] == pytest.approx(0.002 + 9 / 1e4)


def test_on_policy_runs_have_every_step_fresh(tmp_path):
    binding_run(tmp_path, "clip", (None, 1), 6)
    (row,) = binding_table(find_runs(tmp_path)).rows
    assert row["steps_per_rollout"] == 1 and row["binding_steps"] == 0.0
    assert math.isnan(row["clip_frac_reused"]) and math.isnan(row["logp_abs_diff_mean"])


def test_averaged_logging_gives_no_noise_floor_and_says_why(tmp_path):
    binding_run(tmp_path, "clip", (4, 1), 10, logging_steps=5)
    table = binding_table(find_runs(tmp_path))
    assert math.isnan(table.rows[0]["noise_floor"]) and table.rows[0]["clip_frac"] == pytest.approx(0.025)
    assert any("no noise floor: trainer.logging_steps = 5" in line for line in table.missing)


def test_cli_writes_the_table_and_marks_unlogged_rollout_metrics(tmp_path):
    binding_run(tmp_path / "runs", "atr", (4, 1), 10)
    binding_run(tmp_path / "runs", "sapo", (4, 1), 10, rollout_logged=True)
    assert main(["clip_binding", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    rows = read_csv(tmp_path / "out" / "clip_binding.csv")
    assert [(r["method"], r["noise_floor"], r["logp_abs_diff_mean"]) for r in rows] == [
        ("atr", "0.0025", "nan"),
        ("sapo", "0.0025", "0.01"),
    ]
    md = (tmp_path / "out" / "clip_binding.md").read_text()
    row = "| table2 | m | atr | 0 | 10 | 2 | 0.5 | 0.025 | 0 | 0.05 | 0.0025 | 0.0029 | not logged | not logged |"
    assert row in md
    assert "noise_floor = median over those first steps" in md
