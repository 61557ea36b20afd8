"""A method's name depends on its run alone: the rule's label, then the settings its launch command line changed. It
stays when runs with other settings join the study, and every command takes it in its ASCII form too."""

from __future__ import annotations

import json

from helpers.sampled_runs import method_matrices, sampled_run
from test_results_study import RESAMPLES, run_cli, with_settings

from atr_grpo import rundir
from atr_grpo.reporting.commands import figures
from atr_grpo.reporting.runs import find_runs

LONGER = "clip · trainer.max_steps=40"


def launched(path, *overrides, start="2026-12-01T10:00:00+0000"):
    """Give a run the env.json its launch writes: the command line and the start time."""
    argv = ["atr_grpo/train.py", "-m", "experiment=sweep", *overrides]
    (path / rundir.ENV_FILE).write_text(json.dumps({"argv": argv, "start_time": start}))
    return path


def two_methods(root):
    """clip and atr (one correct sample more), seeds 0 and 1, each launched with its rule and seed only."""
    for seed in range(2):
        for method, extra in (("clip", 0), ("atr", 1)):
            path = sampled_run(root, "sweep", method, seed, method_matrices(extra, seed))
            launched(path, f"clipping={method}", f"seed={seed}")
    return root


def longer_clip(root, *overrides, start="2026-12-02T10:00:00+0000"):
    """A clip run per seed at trainer.max_steps=40 (two correct samples more), launched after the others."""
    for seed in range(2):
        path = sampled_run(root, "sweep", "clip", seed, method_matrices(2, seed), name=f"clip-longer-s{seed}")
        with_settings(path, trainer__max_steps=40)
        launched(path, "clipping=clip", *overrides, f"seed={seed}", start=start)
    return root


def test_methods_keep_their_names_when_a_run_with_another_setting_joins(tmp_path):
    root = two_methods(tmp_path / "runs")
    assert sorted({run.method for run in find_runs(root)}) == ["atr", "clip"]
    longer_clip(root, "trainer.max_steps=4,40")  # a sweep's job: its own value is named
    assert sorted({run.method for run in find_runs(root)}) == ["atr", "clip", LONGER]
    code, out, err = run_cli("compare", "atr", "clip", "--runs", root, "--resamples", RESAMPLES)
    assert code == 0, err
    assert "## atr − clip: sweep, qwen3-1.7b (seeds 0, 1;" in out
    row = next(line for line in out.splitlines() if line.startswith("| amc23 | mean@8 |"))
    assert "| +12.50 | +12.50, +12.50 |" in row  # one more correct of 8 samples on every problem, in each seed


def test_a_run_whose_launch_is_not_recorded_is_named_by_what_differs_from_the_first_launched(tmp_path):
    """Without a command line (a run from before env.json kept it, or an experiment file edited between launches)
    the method launched first keeps the name and the later one adds the settings in which it differs."""
    root = longer_clip(two_methods(tmp_path / "runs"))
    assert sorted({run.method for run in find_runs(root)}) == ["atr", "clip", LONGER]
    earlier = longer_clip(two_methods(tmp_path / "earlier"), start="2026-11-30T10:00:00+0000")
    assert sorted({run.method for run in find_runs(earlier)}) == ["atr", "clip", "clip · trainer.max_steps=100"]


def test_the_launch_settings_are_the_method_keys_a_command_line_set_with_the_run_s_value():
    config = {
        "seed": 3,
        "model": {"name": "tiny", "lora": {"r": 8}},
        "clipping": {"name": "atr", "delta": 0.05},
        "trainer": {"max_steps": 40, "num_threads": 2, "learning_rate": 0.001},
        "rollout": {"name": "on_policy", "num_iterations": 1},
        "eval": {"n": 4, "every_steps": 10},
    }
    argv = ["train.py", "-m", "--config-dir=x", "experiment=mini", "seed=3", "clipping=atr", "clipping.delta=0.05"]
    argv += ["model=tiny", "model.lora.r=8", "trainer.max_steps=4,40", "+trainer.learning_rate=1e-3"]
    argv += ["trainer.num_threads=2", "rollout=on_policy", "eval.every_steps=10", "++eval.n=4", "logger=none"]
    assert rundir.launch_settings(config, argv) == [
        "eval.n=4",
        "model.lora.r=8",
        "rollout=on_policy",
        "trainer.learning_rate=0.001",
        "trainer.max_steps=40",
    ]


def test_every_command_takes_a_method_name_in_its_ascii_form(tmp_path, monkeypatch):
    assert rundir.ascii_method(LONGER) == "clip__trainer.max_steps=40"
    assert rundir.ascii_method("clip · eval.seed=–") == "clip__eval.seed=-"
    assert rundir.ascii_method("atr · δ=0.05 · ε=0.2") == "atr__delta=0.05__eps=0.2"
    root = longer_clip(two_methods(tmp_path / "runs"), "trainer.max_steps=40")
    code, out, err = run_cli("compare", "clip__trainer.max_steps=40", "clip", "--runs", root, "--resamples", RESAMPLES)
    assert code == 0, err
    assert f"## {LONGER} − clip: sweep, qwen3-1.7b (seeds 0, 1;" in out
    asked = []
    monkeypatch.setattr(figures, "build_figures", lambda *args: asked.append(args[4]) or ([], []))
    code, _, err = run_cli(
        "figures",
        "--runs",
        root,
        "--experiment",
        "sweep",
        "--methods",
        "clip__trainer.max_steps=40,atr",
        "--out",
        tmp_path / "out",
    )
    assert code == 0, err
    assert asked == [[LONGER, "atr"]]


def test_an_unknown_method_is_refused_listing_the_methods_and_their_ascii_forms(tmp_path):
    root = longer_clip(two_methods(tmp_path / "runs"), "trainer.max_steps=40")
    listing = f"methods: atr, clip, {LONGER} (ASCII: clip__trainer.max_steps=40)"
    code, out, err = run_cli("compare", "clip__trainer.max_steps=41", "clip", "--runs", root)
    assert (code, out) == (2, "")
    assert f"error: METHOD 'clip__trainer.max_steps=41': no such method; did you mean '{LONGER}'? {listing}" in err
    code, _, err = run_cli(
        "figures", "--runs", root, "--experiment", "sweep", "--methods", "atr,clp", "--out", tmp_path
    )
    assert code == 2 and f"error: --methods 'clp': no such method; did you mean 'clip'? {listing}" in err
