"""The analysis plan: a typed file that names the endpoint, the family and the margin, checked key by key; serial
gatekeeping; the plan's commit from git, and the runs made before the plan or under an earlier version of it named;
`results all` and `compare` follow the plan."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess

import pytest
import yaml
from helpers.run_trees import read_csv
from helpers.sampled_runs import method_matrices, sampled_run

from atr_grpo.reporting import plan
from atr_grpo.results import main

SEEDS = list(range(6))
PLAN = {
    "experiment": "trial",
    "seeds": SEEDS,
    "endpoint": "final",
    "metric": "mean@8",
    "benchmark": "aime24",
    "test": "seed_sign_flip",
    "alpha": 0.05,
    "equivalence_margin": 1.0,
    "primary": ["atr", "clip"],
    "secondary": [["clip_higher", "clip"], ["gspo", "clip"]],
}


def write_plan(path, **changes):
    path.write_text(yaml.safe_dump({**PLAN, **changes}))
    return path


def git(repo, *args):
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit_all(repo, message):
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------------------------------------- the loader
def test_a_plan_loads_typed(tmp_path):
    loaded = plan.load_plan(write_plan(tmp_path / "plan.yaml"))
    assert (loaded.experiment, loaded.seeds, loaded.endpoint, loaded.alpha) == ("trial", tuple(SEEDS), "final", 0.05)
    assert loaded.primary == plan.Comparison("atr", "clip") and loaded.primary.label == "atr − clip"
    assert loaded.secondary == (plan.Comparison("clip_higher", "clip"), plan.Comparison("gspo", "clip"))
    assert loaded.level(plan.PRIMARY) == 0.05 and loaded.level(plan.SECONDARY) == pytest.approx(0.025)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"endpoint": "best"}, "endpoint is 'best'; allowed: final or auc"),
        ({"test": "welch"}, "test is 'welch'; allowed: seed_sign_flip or paired_t"),
        ({"alpha": 0.5}, r"alpha is 0.5; allowed: a number in \(0, 0.5\)"),
        ({"equivalence_margin": 0}, "equivalence_margin is 0; allowed: a number of points > 0"),
        ({"metric": "mean8"}, "metric is 'mean8'; allowed: mean@K, pass@K"),
        ({"seeds": [0, 0, 1]}, r"seeds is \[0, 0, 1\]; allowed: a non-empty list of distinct integers"),
        ({"primary": ["atr", "atr"]}, r"primary is \[.atr., .atr.\]; allowed: \[A, B\]: two different method names"),
        ({"secondary": [["atr", "clip"]]}, r"secondary is \[\[.atr., .clip.\]\]; allowed: comparisons that differ"),
        ({"secondary": [["gspo"]]}, r"secondary\[0\] is \['gspo'\]; allowed: \[A, B\]"),
        ({"margin": 1.0}, "unknown key\\(s\\) margin; allowed: experiment, seeds"),
    ],
)
def test_a_bad_plan_names_the_key_and_what_it_allows(tmp_path, changes, message):
    path = write_plan(tmp_path / "plan.yaml", **changes)
    with pytest.raises(plan.PlanError, match=message):
        plan.load_plan(path)


def test_a_plan_without_a_key_names_it(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in PLAN.items() if k != "equivalence_margin"}))
    with pytest.raises(plan.PlanError, match=r"plan.yaml: missing key\(s\) equivalence_margin"):
        plan.load_plan(path)


# ------------------------------------------------------------------------------------------ gatekeeping
def test_secondaries_are_tested_only_when_the_primary_rejects():
    """Serial gatekeeping: a secondary's adjusted p is max(p primary, its Holm p); a closed gate tests none."""
    p_primary, secondary, gate_open = plan.gatekept(0.01, [0.02, 0.001], 0.05)
    assert (p_primary, gate_open) == (0.01, True)
    assert secondary == pytest.approx([0.02, 0.01])  # Holm: [0.02, 0.002] → max with 0.01
    _, secondary, gate_open = plan.gatekept(0.2, [0.001, 0.001], 0.05)
    assert not gate_open and secondary == pytest.approx([0.2, 0.2])


# ---------------------------------------------------------------------------------------- git provenance
def _run_with_commit(root, name, commit):
    run = root / name
    run.mkdir(parents=True)
    (run / "env.json").write_text(json.dumps({} if commit is None else {"git_commit": commit}))
    return run


def test_runs_that_do_not_descend_from_the_plans_commit_are_named(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    before = commit_all(repo, "code")
    path = write_plan(repo / "plan.yaml")
    first_plan = commit_all(repo, "plan")
    (repo / "code.py").write_text("x = 2\n")
    after = commit_all(repo, "code after the plan")
    assert plan.plan_commit(path) == plan.PlanCommit(first_plan, False)
    runs = tmp_path / "runs"
    paths = [
        _run_with_commit(runs, "r_before", before),
        _run_with_commit(runs, "r_at_plan", first_plan + "-dirty"),
        _run_with_commit(runs, "r_after", after),
        _run_with_commit(runs, "r_no_git", None),
        _run_with_commit(runs, "r_elsewhere", "0123456789abcdef0123456789abcdef01234567"),
    ]
    flagged = plan.runs_against_plan(paths, path, first_plan)
    assert flagged == [
        "cannot verify (env.json records no git commit): r_no_git",
        "cannot verify (the run's git commit is not in this repository): r_elsewhere",
        f"made before the plan existed (its commit does not descend from the plan's {first_plan[:12]}): r_before",
    ]
    write_plan(repo / "plan.yaml", equivalence_margin=2.0)
    assert plan.plan_commit(path).uncommitted
    changed = commit_all(repo, "the plan changed")
    assert plan.plan_commit(path) == plan.PlanCommit(changed, False)
    flagged = plan.runs_against_plan(paths, path, changed)
    earlier = f"made under an earlier version of the plan (its commit does not descend from the plan's {changed[:12]})"
    assert f"{earlier}: r_after, r_at_plan" in flagged


def test_an_uncommitted_plan_is_refused(tmp_path):
    git(tmp_path, "init", "-q")
    path = write_plan(tmp_path / "plan.yaml")
    with pytest.raises(plan.PlanError, match="the plan is not committed in git"):
        plan.plan_commit(path)


# ------------------------------------------------------------------------------- the tables follow the plan
@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """6 seeds: atr 2 samples per problem above clip in every seed, clip_higher equal to clip, gspo one below in
    seeds 0-2 and one above in 3-5; the plan committed, then every run but one (made before it)."""
    root = tmp_path_factory.mktemp("experiment")
    git(root, "init", "-q")
    (root / "code.py").write_text("x = 1\n")
    before = commit_all(root, "code")
    write_plan(root / "plan.yaml")
    planned = commit_all(root, "plan")
    extras = {"clip": 2, "clip_higher": 2, "atr": 4}
    for seed in SEEDS:
        for method, extra in [*extras.items(), ("gspo", 1 if seed < 3 else 3)]:
            path = sampled_run(root / "runs", "trial", method, seed, method_matrices(extra, seed))
            commit = before if (method, seed) == ("gspo", 5) else planned
            (path / "env.json").write_text(json.dumps({"git_commit": commit}))
    return root, planned


def test_results_all_writes_the_plan_table_and_names_runs_made_before_the_plan(experiment, tmp_path):
    root, planned = experiment
    out = tmp_path / "tables"
    code, _, err = run_cli("all", "--runs", root / "runs", "--out", out, "--resamples", 200)
    assert code == 0
    assert "WARNING:" in err and "made before the plan existed" in err and "trial__gspo__s5" in err
    rows = {r["comparison"]: r for r in read_csv(out / "plan.csv")}
    atr, clip_higher, gspo = rows["atr − clip"], rows["clip_higher − clip"], rows["gspo − clip"]
    assert (atr["role"], atr["difference"], atr["p"], atr["p_adjusted"]) == ("primary", "25.00", "0.03125", "0.03125")
    assert atr["verdict"].startswith("differs: atr above clip") and atr["power_observed"] == "nan"
    assert clip_higher["verdict"].startswith("equivalent within ±1 points") and clip_higher["level"] == "0.025"
    assert (gspo["difference"], gspo["p"], gspo["p_adjusted"]) == ("0.00", "1", "1")
    assert gspo["verdict"].startswith("not established") and float(gspo["power_observed"]) < 0.05
    text = (out / "plan.md").read_text()
    assert f"git commit {planned}" in text and "FLAGGED against the plan: made before the plan existed" in text


def test_compare_prints_the_plans_family_mde_power_and_tost(experiment):
    root, planned = experiment
    code, printed, _ = run_cli(
        "compare", "gspo", "clip", "--runs", root / "runs", "--resamples", 200, "--metric", "mean@8"
    )
    assert code == 0
    assert f"## Analysis plan: plan.yaml of trial (commit {planned[:12]})" in printed
    assert "aime24 mean@8: the analysis plan's secondary comparison" in printed
    (row,) = [line for line in printed.splitlines() if line.startswith("| qwen3-1.7b | secondary | gspo − clip |")]
    assert "| 0.025 |" in row and "not established" in row  # the level Holm gives it among 2 secondaries
    (cell,) = [line for line in printed.splitlines() if line.startswith("| aime24 | mean@8 |")][:1]
    assert cell.split("|")[10].strip() == "1"  # p (Holm) is the plan's gatekept p
    # the cells the plan does not name keep the methods' family; the planned cell's family is the plan's comparisons
    (family,) = [line for line in printed.splitlines() if line.startswith("Holm family: ")]
    assert family.endswith("column the analysis plan does not name: atr, clip_higher, gspo.")
    assert "Its family is the plan's (atr − clip, clip_higher − clip, gspo − clip; serial gatekeeping)" in printed


def test_a_plan_its_runs_cannot_answer_names_what_is_missing(experiment, tmp_path):
    root, _ = experiment
    other = write_plan(tmp_path / "plan.yaml", seeds=[0, 1, 2, 3, 4, 5, 6])
    git(tmp_path, "init", "-q")
    commit_all(tmp_path, "plan")
    code, _, err = run_cli("compare", "atr", "clip", "--runs", root / "runs", "--plan", other, "--resamples", 200)
    assert code == 2
    assert "atr has seeds [0, 1, 2, 3, 4, 5], the plan [0, 1, 2, 3, 4, 5, 6] (missing: [6]" in err


def test_a_plan_is_read_as_utf8_and_a_bad_byte_names_the_file_and_line(tmp_path):
    path = write_plan(tmp_path / "plan.yaml")
    path.write_bytes(path.read_bytes() + b"# \xe9t\xe9\n")
    lines = path.read_bytes().count(b"\n")
    with pytest.raises(plan.PlanError, match=rf"plan.yaml:{lines}: byte \d+ is not UTF-8; save the plan as UTF-8"):
        plan.load_plan(path)


def _study_runs(tmp_path, studies):
    """atr and clip of 6 seeds, each method's runs in its own study (`study` in config.yaml); the plan committed."""
    git(tmp_path, "init", "-q")
    for seed in SEEDS:
        for method, extra in (("atr", 4), ("clip", 2)):
            path = sampled_run(tmp_path / "runs", "trial", method, seed, method_matrices(extra, seed))
            config = yaml.safe_load((path / "config.yaml").read_text())
            (path / "config.yaml").write_text(yaml.safe_dump({**config, "study": studies[method]}))
    return tmp_path / "runs"


def test_a_plan_does_not_pair_methods_of_two_studies(tmp_path):
    runs = _study_runs(tmp_path, {"atr": "lr1e-3", "clip": "lr1e-4"})
    write_plan(tmp_path / "plan.yaml", secondary=[])
    commit_all(tmp_path, "plan")
    code, _, err = run_cli("all", "--runs", runs, "--out", tmp_path / "tables", "--resamples", 200)
    assert code == 2 and not (tmp_path / "tables" / "plan.csv").exists()
    assert "belong to several studies (lr1e-3, lr1e-4), and a plan's methods are compared within one" in err
    write_plan(tmp_path / "plan.yaml", secondary=[], study="lr1e-3")
    commit_all(tmp_path, "the plan names its study")
    code, _, err = run_cli("all", "--runs", runs, "--out", tmp_path / "tables", "--resamples", 200)
    assert code == 2 and "no runs of method 'clip' in study lr1e-3 (methods: atr)" in err


def test_a_plan_may_name_a_method_in_its_ascii_form(tmp_path):
    """`atr__trainer.learning_rate=0.001` in plan.yaml is the method `atr · trainer.learning_rate=0.001`."""
    runs = _study_runs(tmp_path, {"atr": "trial", "clip": "trial"})
    for path in sorted(runs.glob("trial/*atr*")):
        config = yaml.safe_load((path / "config.yaml").read_text())
        config["trainer"]["learning_rate"] = 0.001
        (path / "config.yaml").write_text(yaml.safe_dump(config))
        argv = ["train.py", "experiment=trial", "clipping=atr", "trainer.learning_rate=0.001"]
        (path / "env.json").write_text(json.dumps({"argv": argv}))
    write_plan(tmp_path / "plan.yaml", primary=["atr__trainer.learning_rate=0.001", "clip"], secondary=[])
    commit_all(tmp_path, "plan")
    code, _, err = run_cli("all", "--runs", runs, "--out", tmp_path / "tables", "--resamples", 200)
    assert code == 0, err
    (row,) = read_csv(tmp_path / "tables" / "plan.csv")
    assert (row["comparison"], row["role"], row["difference"]) == (
        "atr · trainer.learning_rate=0.001 − clip",
        "primary",
        "25.00",
    )
