"""The committed CPU mini-reproduction (`make reproduce-mini`, results/mini/) is what its run files say.

The tables in results/mini/tables/ are rebuilt from the committed run files in results/mini/runs/ and must be
identical byte for byte (the bootstrap is seeded); `compare` and `regrade` work on those runs as committed, and
`compare atr clip` prints the committed seeds table's numbers.
"""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import REPO
from helpers.committed_results import files_under, kept_by_git, table_cells

from atr_grpo import results

MINI = REPO / "results" / "mini"
RUNS = MINI / "runs"
METHODS = ("clip", "clip_higher", "dual_clip", "dcpo", "clip_cov", "sapo", "atr")  # Table 2's rows
SEEDS = (0, 1, 2)


def test_the_committed_runs_are_the_plans_runs_without_weights():
    names = sorted(path.name for path in RUNS.iterdir() if path.is_dir())
    expected = [f"mini__{m}__s{s}" for m in METHODS for s in SEEDS]
    expected += [f"mini__atr-delta{d}__s{s}" for d in ("0.05", "0.06", "0.08", "0.09") for s in SEEDS]
    assert names == sorted(expected)
    for run in names:
        files = kept_by_git(RUNS / run)
        assert {"config.yaml", "env.json", "metrics.jsonl", "eval/summary.jsonl"} <= set(files), run
        steps = [json.loads(line)["step"] for line in (RUNS / run / "eval" / "summary.jsonl").open()]
        assert steps == [0, 48, 96, 144, 192], run
        assert [f for f in files if f.startswith("eval/step_")] == [
            f"eval/step_{step:06d}/arithmetic.jsonl.gz" for step in steps
        ], run  # every sample kept, compressed, for `regrade`
        assert not [f for f in files if f.endswith((".safetensors", ".bin", ".pt", ".pth"))], run


@pytest.mark.slow
def test_the_committed_tables_rebuild_byte_for_byte(tmp_path):
    out = tmp_path / "tables"
    assert results.main(["all", "--runs", str(RUNS), "--experiment", "mini", "--out", str(out)]) == 0
    committed = files_under(MINI / "tables")
    assert {"table2.csv", "table2.md", "table3.csv", "seeds.csv", "seeds.md", "delta.csv", "clip_binding.csv"} <= set(
        committed
    )
    assert files_under(out) == committed
    for name in committed:
        assert (out / name).read_bytes() == (MINI / "tables" / name).read_bytes(), name


def test_compare_pairs_atr_with_clip_on_the_committed_runs_as_the_seeds_table_does(capsys):
    """The seed level with 3 seeds: p = 0.25 (all three seed pairs favour clip), which is also the smallest p
    3 seeds allow, so no mark; the numbers are the committed seeds table's, cell for cell."""
    assert (
        results.main(["compare", "atr", "clip", "--runs", str(RUNS), "--experiment", "mini", "--metric", "mean@8"]) == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("## atr − clip: mini, tiny (seeds 0, 1, 2; evaluation steps 192)")
    seed_level, robust = [table_cells(line) for line in out.splitlines() if line.startswith("| arithmetic | mean@8 |")]
    atr, clip, difference = float(seed_level[2]), float(seed_level[3]), float(seed_level[4])
    per_seed = [float(x) for x in seed_level[5].split(",")]
    low, high = (float(x) for x in seed_level[6].strip("[]").split(","))
    assert abs(atr - clip - difference) < 0.011 and abs(sum(per_seed) / 3 - difference) < 0.011
    assert low < difference < high and all(d < 0 for d in per_seed)
    assert seed_level[7:11] == ["0.25", "0.25", "1", ""]  # p, smallest p, Holm over the 10 methods, no †
    assert float(seed_level[12]) > abs(difference)  # the MDE: 3 seeds cannot see a difference this small
    assert "Holm family: 10 method(s) compared with clip" in out
    (committed,) = [
        table_cells(line)
        for line in (MINI / "tables" / "seeds.md").read_text().splitlines()
        if line.startswith("| tiny | atr | arithmetic | mean@8 |")
    ]
    assert committed[7:17] == seed_level[4:14] and committed[17:20] == robust[4:7] and committed[6] == robust[2]


@pytest.mark.slow
def test_regrade_of_unchanged_code_changes_no_verdict(tmp_path, capsys):
    run = tmp_path / "runs" / "mini__atr__s0"
    shutil.copytree(RUNS / "mini__atr__s0", run)
    assert results.main(["regrade", "--runs", str(tmp_path / "runs"), "--no-progress", "--workers", "1"]) == 0
    assert "0 of 5120 verdicts changed in 1 runs" in capsys.readouterr().out
