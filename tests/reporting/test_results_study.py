"""Studies: runs that share a name but not their settings are told apart, a study scopes the Holm family, two runs
of one point and seed are refused naming both, and a comparison says when it cannot show anything (identical
runs, a swept value without effect, a rule that never acted)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from helpers.run_trees import read_csv
from helpers.sampled_runs import method_matrices, sampled_run
from omegaconf import OmegaConf

from atr_grpo.reporting.analyses import no_effect
from atr_grpo.reporting.runs import RepeatedRuns, RunSet, find_runs, repeat_free
from atr_grpo.reporting.selection import of_experiment, select
from atr_grpo.results import main

RESAMPLES = "200"
SLOW, FAST = "clip", "clip · trainer.learning_rate=0.001"  # the slow runs' paths sort first: they keep the name


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def with_settings(path, **settings):
    """Set dotted keys of a run's config.yaml (`trainer__learning_rate=1e-3` sets trainer.learning_rate)."""
    config = OmegaConf.load(path / "config.yaml")
    for key, value in settings.items():
        OmegaConf.update(config, key.replace("__", "."), value, force_add=True)
    OmegaConf.save(config, path / "config.yaml")
    return path


def silence_rule(path):
    """Rewrite a run's metrics.jsonl with clip/frac 0 at every step: its rule never acted."""
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r | {"clip/frac": 0.0}) + "\n" for r in rows))


def lr_sweep(root):
    """clip at the default learning rate and at 1e-3 (two correct samples more per problem), seeds 0 and 1; their
    env.json records no launch, so the rate is set in place, as in an edited experiment file."""
    for seed in range(2):
        for rate, extra in ((1e-4, 0), (1e-3, 2)):
            path = sampled_run(
                root, "sweep", "clip", seed, method_matrices(extra, seed), name=f"clip-lr{rate:g}-s{seed}"
            )
            with_settings(path, trainer__learning_rate=rate)
    return root


def holm_p(output, benchmark="amc23", metric="mean@8"):
    """p (Holm) of one row of compare's seed table (the column found by its header)."""
    column = None
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if "p (Holm)" in cells:
            column = cells.index("p (Holm)")
        elif column is not None and cells[:2] == [benchmark, metric]:
            return float(cells[column])
    raise AssertionError(f"no {benchmark} {metric} row in\n{output}")


def test_a_learning_rate_set_in_place_names_the_runs_that_differ_from_the_first(tmp_path):
    root = lr_sweep(tmp_path / "runs")
    assert sorted({run.method for run in find_runs(root)}) == [SLOW, FAST]
    code, out, err = run_cli("compare", FAST, SLOW, "--runs", root, "--resamples", RESAMPLES)
    assert code == 0, err
    assert f"## {FAST} − {SLOW}: sweep, qwen3-1.7b (seeds 0, 1;" in out
    row = next(line for line in out.splitlines() if line.startswith("| amc23 | mean@8 |"))
    assert "| +25.00 | +25.00, +25.00 |" in row  # two more correct of 8 samples on every problem, in each seed
    code, _, err = run_cli("table3", "--runs", root, "--experiment", "sweep", "--out", tmp_path / "out")
    assert code == 0, err
    rows = read_csv(tmp_path / "out" / "table3.csv")
    assert sorted({r["method"] for r in rows}) == [SLOW, FAST]


def test_settings_that_follow_the_seed_belong_to_the_seed_not_the_method(tmp_path):
    """Sampled start points and draws (`sft.seed: ${seed}`, `eval.seed: ${seed}`) leave one method per rule; an
    SFT seed set apart from the seed is a setting of the method, and only the runs that differ in it are renamed."""
    root, paths = tmp_path / "runs", {}
    for seed in range(2):
        for method, extra in (("clip", 0), ("atr", 1)):
            paths[method, seed] = sampled_run(root, "sweep", method, seed, method_matrices(extra, seed))
            with_settings(paths[method, seed], sft__seed=seed, eval__seed=seed)
    assert sorted({run.method for run in find_runs(root)}) == ["atr", "clip"]
    code, out, err = run_cli("compare", "atr", "clip", "--runs", root, "--resamples", RESAMPLES)
    assert code == 0 and "## atr − clip: sweep, qwen3-1.7b (seeds 0, 1;" in out, err
    with_settings(paths["atr", 1], sft__seed=7)
    assert sorted({run.method for run in find_runs(root)}) == ["atr", "atr · sft.seed=7", "clip"]


def test_runs_that_differ_only_in_where_they_ran_are_refused_naming_both(tmp_path):
    root = lr_sweep(tmp_path / "runs")
    again = sampled_run(root, "sweep", "clip", 0, method_matrices(0, 0), name="clip-lr-again-s0")
    with_settings(again, trainer__learning_rate=1e-4, trainer__num_threads=8, run_dir="elsewhere")
    first = root / "sweep" / "clip-lr0.0001-s0"
    code, _, err = run_cli("compare", FAST, SLOW, "--runs", root, "--resamples", RESAMPLES)
    assert code == 2
    assert f"{again} and {first} repeat one point" in err and f"method {SLOW}, seed 0" in err
    code, _, err = run_cli("all", "--runs", root, "--experiment", "sweep", "--out", tmp_path / "out")
    assert code == 2 and f"{again} and {first} repeat one point" in err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_run_set_is_checked_for_repeats_once_and_its_subsets_are_not_checked_again(tmp_path, monkeypatch):
    """`RunSet.checked` refuses what `refuse_repeats` refuses and keeps the order it was given; `repeat_free` returns
    what `refuse_repeats` returns for the runs it keeps, checking a plain list and never a RunSet."""
    from atr_grpo.reporting import runs as runs_module

    root = lr_sweep(tmp_path / "runs")
    read = find_runs(root)
    checked = RunSet.checked(list(reversed(read)))
    assert checked == list(reversed(read))
    calls = []
    in_path_order = lambda r: sorted(r, key=lambda run: str(run.path))  # noqa: E731
    monkeypatch.setattr(runs_module, "refuse_repeats", lambda r: calls.append(1) or in_path_order(r))
    slow = lambda run: run.method == SLOW  # noqa: E731
    assert repeat_free(checked, slow) == in_path_order(r for r in read if slow(r))
    assert isinstance(of_experiment(checked, "sweep"), RunSet) and isinstance(select(checked, root, "sweep"), RunSet)
    repeat_free(select(checked, root, "sweep"))
    assert calls == []
    repeat_free(list(read), slow)
    assert calls == [1]
    monkeypatch.undo()
    again = sampled_run(root, "sweep", "clip", 0, method_matrices(0, 0), name="clip-lr-again-s0")
    with_settings(again, trainer__learning_rate=1e-4)
    try:
        RunSet.checked(find_runs(root))
    except RepeatedRuns as err:
        assert f"{again} and {root / 'sweep' / 'clip-lr0.0001-s0'} repeat one point" in str(err)
    else:
        raise AssertionError("a repeat was not refused")


def delta_study(root, unrelated_study):
    """ATR at δ 0.05 (two correct samples more) against δ 0.09, three seeds, and an unrelated clip run per seed
    in the same experiment (three correct more), in study `unrelated_study`."""
    for seed in range(3):
        for delta, extra in ((0.05, 2), (0.09, 0)):
            path = sampled_run(root, "ablate", f"atr-delta{delta:g}", seed, method_matrices(extra, seed))
            with_settings(path, clipping__delta=delta)
        path = sampled_run(root, "ablate", "clip", seed, method_matrices(3, seed))
        with_settings(path, study=unrelated_study)
    return root


def test_a_study_scopes_the_holm_family(tmp_path):
    """Every seed favours δ 0.05: p = 2/2^3 = 0.25. Alone in its family, Holm leaves it at 0.25; with the unrelated
    clip runs in the same study (also p = 0.25), Holm doubles both to 0.5."""
    scoped = delta_study(tmp_path / "scoped", "other")
    code, out, err = run_cli("compare", "atr-delta0.05", "atr-delta0.09", "--runs", scoped, "--resamples", RESAMPLES)
    assert code == 0, err
    assert holm_p(out) == 0.25
    assert (
        "Holm family: 1 method(s) compared with atr-delta0.09 in each benchmark × metric column: atr-delta0.05." in out
    )
    shared = delta_study(tmp_path / "shared", "ablate")
    code, out, err = run_cli("compare", "atr-delta0.05", "atr-delta0.09", "--runs", shared, "--resamples", RESAMPLES)
    assert code == 0, err
    assert holm_p(out) == 0.5
    assert (
        "Holm family: 2 method(s) compared with atr-delta0.09 in each benchmark × metric column: atr-delta0.05, clip."
        in out
    )


def test_a_table_of_methods_takes_one_study(tmp_path):
    root = delta_study(tmp_path / "runs", "other")
    code, _, err = run_cli("table3", "--runs", root, "--experiment", "ablate", "--out", tmp_path / "out")
    assert code == 2 and "belong to several studies (ablate, other); --study NAME tabulates one" in err
    code, _, err = run_cli(
        "table3", "--runs", root, "--study", "ablate", "--out", tmp_path / "out", "--resamples", RESAMPLES
    )
    assert code == 0, err
    assert sorted({r["method"] for r in read_csv(tmp_path / "out" / "table3.csv")}) == [
        "atr-delta0.05",
        "atr-delta0.09",
    ]


def test_a_misspelled_study_names_the_closest_study(tmp_path, capsys):
    root = delta_study(tmp_path / "runs", "other")
    with pytest.raises(SystemExit):
        main(["table3", "--runs", str(root), "--study", "ablat", "--out", str(tmp_path / "out")])
    assert f"--study 'ablat': no run of it under {root}; did you mean 'ablate'? studies found: ablate, other" in (
        capsys.readouterr().err
    )


def test_comparing_identical_runs_says_they_are_identical_and_names_the_swept_value(tmp_path):
    root = tmp_path / "runs"
    for seed in range(2):
        for delta in (0.05, 0.09):
            path = sampled_run(root, "ablate", f"atr-delta{delta:g}", seed, method_matrices(1, seed))
            with_settings(path, clipping__delta=delta)
    code, out, err = run_cli("compare", "atr-delta0.05", "atr-delta0.09", "--runs", root, "--resamples", RESAMPLES)
    assert code == 0, err
    expected = (
        "identical: atr-delta0.05 and atr-delta0.09 gave the same evaluations and training metrics for every seed "
        "(seeds 0, 1), so no test can show a difference; they differ only in clipping.delta (clipping.delta=0.05, "
        "clipping.delta=0.09): the swept value had no effect"
    )
    assert f"**warning: {expected}**" in out
    assert f"warning: {expected}" in err
    code, _, err = run_cli("all", "--runs", root, "--out", tmp_path / "out", "--resamples", RESAMPLES)
    assert code == 0 and f"warning: ablate/qwen3-1.7b: {expected}" in err


def test_runs_that_differ_in_one_sample_are_not_identical(tmp_path):
    root = tmp_path / "runs"
    a = sampled_run(root, "ablate", "atr-delta0.05", 0, method_matrices(1, 0))
    b = sampled_run(root, "ablate", "atr-delta0.09", 0, method_matrices(1, 0))
    sample_file = b / "eval" / "step_000100" / "amc23.jsonl"
    text = sample_file.read_text()
    sample_file.write_text(text.replace("So the answer", "Hence the answer", 1))  # same verdict, other text
    first, second = find_runs(root)
    assert (first.path, second.path) == (a, b)
    assert not no_effect.identical(first, second)
    assert no_effect.pair_warnings([first], [second]) == []


def test_a_rule_that_never_acted_is_named(tmp_path):
    root = delta_study(tmp_path / "runs", "other")
    for seed in range(3):
        silence_rule(root / "ablate" / f"ablate__atr-delta0.09__s{seed}__model=qwen3-1.7b")
    code, out, err = run_cli("compare", "atr-delta0.05", "atr-delta0.09", "--runs", root, "--resamples", RESAMPLES)
    assert code == 0, err
    line = "never acted: the rule of atr-delta0.09 never acted (clip/frac is 0 at every logged step of seeds 0, 1, 2)"
    assert f"**warning: {line}**" in out and "identical" not in out
    assert "atr-delta0.05 never acted" not in out


def test_a_soft_rule_is_never_reported_as_idle(tmp_path):
    """SAPO freezes no token (clip/frac is 0 by construction): its act metric is None, so it is not named."""
    path = sampled_run(tmp_path / "runs", "rivals", "sapo", 0, method_matrices(1, 0))
    silence_rule(path)
    (run,) = find_runs(tmp_path / "runs")
    assert no_effect.act_metric(run) is None and no_effect.never_acted(run) is None
    with_settings(path, clipping__name="clip")
    (run,) = find_runs(tmp_path / "runs")
    assert no_effect.never_acted(run) == "clip/frac"


def test_a_metric_only_one_rule_logs_does_not_make_runs_differ(tmp_path):
    """Dual-clip logs clip/frac_dual, clip does not: runs that agree on every metric both log are identical."""
    root = tmp_path / "runs"
    sampled_run(root, "rivals", "clip", 0, method_matrices(1, 0))
    dual = sampled_run(root, "rivals", "dual_clip", 0, method_matrices(1, 0))
    rows = [json.loads(line) for line in (dual / "metrics.jsonl").read_text().splitlines()]
    (dual / "metrics.jsonl").write_text("".join(json.dumps(r | {"clip/frac_dual": 0.0}) + "\n" for r in rows))
    clip, dual_clip = find_runs(root)
    assert no_effect.identical(clip, dual_clip)
    rows[1]["entropy"] += 1e-9  # one logged value of one step differs
    (dual / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    clip, dual_clip = find_runs(root)
    assert not no_effect.identical(clip, dual_clip)


def test_the_per_run_tables_keep_two_studies_of_one_experiment_apart(tmp_path):
    """Two studies of one experiment may both hold a method called `clip`: the endpoints table gives each its
    own row, named `<experiment> / <study>`."""
    from helpers.run_trees import evals_of, make_run
    from omegaconf import OmegaConf

    from atr_grpo.reporting.analyses.endpoints import endpoints_table
    from atr_grpo.reporting.runs import find_runs

    for study, value in (("lr_sweep", 0.2), ("g_sweep", 0.4)):
        for seed in (0, 1):
            path = make_run(
                tmp_path,
                "smoke",
                "tiny",
                "clip",
                {"name": "clip"},
                seed,
                evals_of({0: (0.1,) * 3, 100: (value,) * 3}),
                name=f"{study}-s{seed}",
            )
            config = OmegaConf.load(path / "config.yaml")
            config.study = study
            OmegaConf.save(config, path / "config.yaml")
    rows = [
        r for r in endpoints_table(find_runs(tmp_path)).rows if r["benchmark"] == "average" and r["metric"] == "mean@8"
    ]
    assert sorted((r["experiment"], r["method"], r["final"]) for r in rows) == [
        ("smoke / g_sweep", "clip", 40.0),
        ("smoke / lr_sweep", "clip", 20.0),
    ]


def test_each_results_command_checks_its_runs_for_repeats_once(tmp_path, monkeypatch):
    """`results all`, `figures` and `compare` check the run set they read once (`selection.checked_runs`, or
    compare's first pass); their analyses take the checked set without checking it again."""
    from atr_grpo.reporting import runs as runs_module

    root = lr_sweep(tmp_path / "runs")
    checked = []
    real = runs_module.refuse_repeats
    monkeypatch.setattr(runs_module, "refuse_repeats", lambda r: checked.append(len(r)) or real(r))
    runs = len(find_runs(root))
    for argv in (
        ("all", "--runs", root, "--experiment", "sweep", "--out", tmp_path / "tables", "--resamples", RESAMPLES),
        ("figures", "--runs", root, "--experiment", "sweep", "--out", tmp_path / "figures"),
        ("compare", SLOW, FAST, "--runs", root, "--resamples", RESAMPLES),
    ):
        checked.clear()
        code, _, err = run_cli(*argv)
        assert code == 0, err
        assert checked == [runs], argv[0]


def alike_study(root, methods=("atr", "clip")):
    """Two seeds of each method, all drawing the same evaluation samples; their training metrics differ slightly."""
    for seed in range(2):
        for shift, method in enumerate(methods):
            path = sampled_run(root, "smoke", method, seed, method_matrices(1, seed))
            rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
            lines = [json.dumps(r | {"entropy": r["entropy"] + 1e-6 * shift}) + "\n" for r in rows]
            (path / "metrics.jsonl").write_text("".join(lines))
    return root


def test_methods_that_drew_the_same_evaluation_samples_show_no_mde_and_name_a_short_run(tmp_path):
    """Two seeds, the same samples on both sides, training metrics slightly apart: the comparison says no test can
    show a difference, with the likely cause, and its interval and MDE are – (not [+0.00, +0.00] and 0.00)."""
    root = alike_study(tmp_path / "runs")
    code, out, err = run_cli("compare", "atr", "clip", "--runs", root, "--resamples", RESAMPLES)
    assert code == 0, err
    expected = (
        "identical evaluations: atr and clip drew byte-identical evaluation samples for every seed (seeds 0, 1), "
        "though their training metrics differ, so no test can show a difference and no MDE is given; likely cause: "
        "too few training steps (100 steps) for the rules to act on what the policy samples"
    )
    assert f"**warning: {expected}**" in out and f"warning: {expected}" in err
    row = next(line for line in out.splitlines() if line.startswith("| amc23 | mean@8 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4:7] == ["+0.00", "+0.00, +0.00", "–"]  # difference, per seed, CI
    assert cells[7:9] == ["–", "0.5"]  # p (seeds): no test applies; smallest p: what the design allows
    assert cells[9:12] == ["–", "", "–"]  # p (Holm), †, p (paired t)
    assert cells[-2:] == ["–", "–"]  # MDE, power
    assert "No spread: the per-seed differences of amc23 mean@8, aime24 mean@8" in out
    assert (
        "with 2 seeds (all 2^S sign patterns) the smallest attainable p is 0.5, so no difference can be marked" in out
    )


def test_methods_that_all_drew_the_same_samples_are_named_in_one_warning(tmp_path):
    """Three methods alike: one warning names them all, not one per pair."""
    root = alike_study(tmp_path / "runs", ("atr", "clip", "my_clip"))
    code, _, err = run_cli("timing", "--runs", root, "--out", tmp_path / "out")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "identical evaluations" in line]
    assert warnings == [
        "warning: smoke/qwen3-1.7b: identical evaluations: atr, clip and my_clip drew byte-identical evaluation "
        "samples for every seed (seeds 0, 1), though their training metrics differ, so no test can show a difference "
        "and no MDE is given; likely cause: too few training steps (100 steps) for the rules to act on what the "
        "policy samples"
    ]


def test_methods_that_drew_the_same_samples_get_no_probability_of_improvement_or_problem_test(tmp_path):
    """P(A > B) = ½ in [½, ½] and p (problems) = 1 would read as evidence of no difference: they are –."""
    root = alike_study(tmp_path / "runs")
    code, out, err = run_cli("compare", "atr", "clip", "--runs", root, "--resamples", RESAMPLES)
    assert code == 0, err
    assert "| amc23 | mean@8 | 37.50 | 37.50 | – | – | – | 30 |" in out


def test_a_table_of_methods_that_drew_the_same_samples_bolds_no_tie_and_says_why(tmp_path):
    root = alike_study(tmp_path / "runs")
    out = tmp_path / "out"
    code, _, err = run_cli("table3", "--runs", root, "--study", "smoke", "--out", out, "--resamples", RESAMPLES)
    assert code == 0, err
    md = (out / "table3.md").read_text()
    assert "**" not in md and "textbf" not in (out / "table3.tex").read_text()
    assert (
        "_warning: smoke/qwen3-1.7b: identical evaluations: atr and clip drew byte-identical evaluation samples for "
        "every seed (seeds 0, 1)"
    ) in md


def test_equal_nonzero_differences_get_no_interval_and_no_mde(tmp_path):
    """Both seeds gain the same +12.5 points: the t-interval and the MDE are undefined, not a point and 0."""
    root = tmp_path / "runs"
    for seed in range(2):
        sampled_run(root, "smoke", "atr", seed, method_matrices(2, 0))
        sampled_run(root, "smoke", "clip", seed, method_matrices(1, 0))
    code, out, err = run_cli("compare", "atr", "clip", "--runs", root, "--resamples", RESAMPLES, "--metric", "mean@8")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("| amc23 | mean@8 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4:7] == ["+12.50", "+12.50, +12.50", "–"]
    assert cells[-2] == "–"
    assert "identical" not in out


def test_all_builds_the_tables_of_methods_once_per_study_into_a_folder_each(tmp_path):
    """Experiment `ablate` holds two studies: `all` writes table3 (and the other tables of methods) for each, into
    OUT/<study>/, and the per-run tables into OUT as before."""
    root = delta_study(tmp_path / "runs", "other")
    out = tmp_path / "out"
    code, out_text, err = run_cli(
        "all", "--runs", root, "--experiment", "ablate", "--out", out, "--resamples", RESAMPLES
    )
    assert code == 0, err
    assert not (out / "table3.csv").exists() and (out / "endpoints.csv").exists()
    assert sorted({r["method"] for r in read_csv(out / "ablate" / "table3.csv")}) == ["atr-delta0.05", "atr-delta0.09"]
    assert sorted({r["method"] for r in read_csv(out / "other" / "table3.csv")}) == ["clip"]
    assert (out / "ablate" / "delta.csv").exists() and (out / "ablate" / "seeds.md").exists()
    assert f"{out / 'ablate' / 'table3.csv'}" in out_text.splitlines()
    assert "skipped table3" not in err and "belong to several studies" not in err
    assert "skipped delta of study other: " in err
