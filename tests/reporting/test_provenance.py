"""Where a run started: the weights hash is stable and sees only the weights, env.json records the start point once,
and `results compare` / the tables refuse to pair the runs of one seed that started from different points, naming
them; seeds with start points of their own are paired with a note, and so are runs that record none."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from helpers.sampled_runs import method_matrices, sampled_run

from atr_grpo import rundir
from atr_grpo.provenance import START_KEY, check_start_points, record_start_point, weights_sha256
from atr_grpo.reporting.runs import find_runs
from atr_grpo.results import main


def start(adapter_sha: str) -> dict:
    return {
        "base_model": "tiny/abc",
        "base_model_sha256": "b" * 64,
        "sft_adapter": "tiny-arithmetic-123",
        "sft_adapter_sha256": adapter_sha,
    }


def test_weights_hash_covers_the_weights_only_in_a_stable_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, config in ((a, {"base_model_name_or_path": "/home/x"}), (b, {"base_model_name_or_path": "/y"})):
        folder.mkdir()
        (folder / "adapter_model.safetensors").write_bytes(b"weights")
        (folder / "adapter_config.json").write_text(json.dumps(config))  # machine-specific: not hashed
    assert weights_sha256(a) == weights_sha256(b)
    (b / "adapter_model.safetensors").write_bytes(b"weightz")
    assert weights_sha256(a) != weights_sha256(b)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no weight file"):
        weights_sha256(tmp_path / "empty")


def test_env_json_keeps_the_first_start_point_and_a_resume_from_another_is_flagged(tmp_path):
    rundir.write_json(tmp_path / rundir.ENV_FILE, {"git_commit": "abc"})
    assert record_start_point(tmp_path, start("1" * 64)) is None
    env = rundir.read_json(tmp_path / rundir.ENV_FILE)
    assert env["git_commit"] == "abc" and env[START_KEY] == start("1" * 64)
    assert record_start_point(tmp_path, start("1" * 64)) is None
    warning = record_start_point(tmp_path, start("2" * 64))
    assert "differs: sft_adapter_sha256" in warning
    assert rundir.read_json(tmp_path / rundir.ENV_FILE)[START_KEY] == start("1" * 64)


def tree_with_starts(root, starts):
    """clip and atr, seeds 0-1; `starts[(method, seed)]` is written into env.json (absent: not recorded)."""
    for method, extra in (("clip", 0), ("atr", 2)):
        for seed in range(2):
            path = sampled_run(root, "power", method, seed, method_matrices(extra, seed))
            if (method, seed) in starts:
                rundir.write_json(path / rundir.ENV_FILE, {START_KEY: starts[(method, seed)]})
    return root


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_runs_from_different_adapters_are_not_paired_and_are_named(tmp_path):
    same = {(m, s): start("1" * 64) for m in ("clip", "atr") for s in range(2)}
    odd = same | {("atr", 1): start("2" * 64)}
    root = tree_with_starts(tmp_path / "runs", odd)
    errors, notes = check_start_points(find_runs(root))
    assert len(errors) == 1 and not notes
    assert errors[0].startswith("power/qwen3-1.7b, seed 1: the runs started from different")
    assert "sha256 222222222222): power__atr__s1" in errors[0] and "power__clip__s1" in errors[0]
    assert "__s0" not in errors[0]  # seed 0's runs agree
    for argv in (["compare", "atr", "clip"], ["table2", "--out", str(tmp_path / "t")]):
        code, out, err = cli(*argv, "--runs", str(root), "--experiment", "power", "--resamples", "200")
        assert code == 2 and out == "" and "power__atr__s1" in err and "cannot be paired" in err
    assert not (tmp_path / "t").exists()


def test_seeds_with_start_points_of_their_own_are_paired_with_a_note(tmp_path):
    """Sampled start points: each seed trains its own adapter and its methods share it."""
    per_seed = {(m, s): start(str(s + 1) * 64) for m in ("clip", "atr") for s in range(2)}
    errors, notes = check_start_points(find_runs(tree_with_starts(tmp_path / "runs", per_seed)))
    assert errors == []
    assert notes == [
        "power/qwen3-1.7b: 2 starting points over 2 seeds; the runs of each seed share theirs, so the pairing "
        "holds and the seed spread includes the start points'"
    ]
    code, out, err = cli("compare", "atr", "clip", "--runs", str(tmp_path / "runs"), "--resamples", "200")
    assert code == 0 and "atr" in out and "note: power/qwen3-1.7b: 2 starting points over 2 seeds" in err


def test_runs_that_agree_or_record_nothing_are_compared_with_a_note(tmp_path):
    same = {(m, s): start("1" * 64) for m in ("clip", "atr") for s in range(2)}
    code, out, err = cli(
        "compare", "atr", "clip", "--runs", str(tree_with_starts(tmp_path / "a", same)), "--resamples", "200"
    )
    assert code == 0 and "atr" in out and "note:" not in err
    code, out, err = cli(
        "compare", "atr", "clip", "--runs", str(tree_with_starts(tmp_path / "b", {})), "--resamples", "200"
    )
    assert code == 0 and "atr" in out
    assert "note: power/qwen3-1.7b: 4 of 4 runs record no starting adapter" in err
