"""Experiments and plans: every experiment composes, each plan expands to the paper's runs with Table 4's values,
`--dry-run` prints one command per run, finished runs are skipped, and the SLURM launcher composes."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import shlex
import subprocess
import sys

import pytest
import yaml
from conftest import CONF, compose, train_config
from omegaconf import OmegaConf

from atr_grpo import launch, rundir
from atr_grpo.config_hydra import PLAN_KEY, config_to_yaml, to_object
from atr_grpo.errors import ConfigError
from atr_grpo.hydra_app import check_sweep
from atr_grpo.rundir import naming
from atr_grpo.rundir.naming import sweep_suffix

TRAIN_EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml") if p.stem != "passk_curve")


@pytest.mark.parametrize("name", TRAIN_EXPERIMENTS)
def test_every_training_experiment_composes(name):
    assert train_config([f"experiment={name}"]).experiment == name


def test_passk_curve_composes_with_the_evaluate_app():
    cfg = to_object(compose(["experiment=passk_curve"], config_name="evaluate"))
    assert (cfg.eval.n, cfg.eval.k, cfg.experiment, cfg.method) == (128, 8, "passk_curve", "atr")
    assert cfg.adapter.endswith("table2__atr__s0__model=qwen3-1.7b/final_adapter")


def dry_run(plan, *extra):
    """The commands `python -m atr_grpo.launch --dry-run PLAN EXTRA...` prints, one per run, split."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert launch.main(["--dry-run", plan, *extra]) == 0
    return [shlex.split(line) for line in out.getvalue().splitlines()]


def test_table2_dry_run_prints_the_14_runs():
    lines = dry_run("table2")
    assert len(lines) == 14
    pairs = {
        (next(a for a in cmd if a.startswith("model=")), next(a for a in cmd if a.startswith("clipping=")))
        for cmd in lines
    }
    assert pairs == {
        (f"model={m}", f"clipping={c}")
        for m in ("qwen3-1.7b", "qwen3-8b")
        for c in ("clip", "clip_higher", "dual_clip", "dcpo", "clip_cov", "sapo", "atr")
    }
    assert all(cmd[1:4] == ["-m", "atr_grpo.train", "-m"] for cmd in lines)


def planned(plan):
    """The commands `launch --dry-run PLAN` prints once every run's config validates: one per run, unvalidated
    (`test_each_plans_dry_run_validates_every_run_and_prints_its_command` composes them all)."""
    plan = launch.load_plan(plan)
    return [launch.command(plan.app, overrides) for overrides in plan.expand()]


def test_table3_and_ablation_counts():
    table3 = planned("table3")
    assert len(table3) == 45
    assert sum("clipping.eps=0.329" in cmd for cmd in table3) == 3
    assert {a for cmd in table3 for a in cmd if a.startswith("seed=")} == {"seed=0", "seed=1", "seed=2"}
    deltas = [a for cmd in dry_run("ablate_delta") for a in cmd if a.startswith("clipping.delta=")]
    assert deltas == [f"clipping.delta={d}" for d in ("0.05", "0.06", "0.07", "0.08", "0.09")]
    assert dry_run("passk_curve") == [[sys.executable, "-m", "atr_grpo.evaluate", "experiment=passk_curve"]]


@pytest.mark.slow
def test_rivals_dry_run_lists_7_methods_by_3_seeds_and_every_run_composes():
    """ATR vs GSPO, CISPO, DPPO-TV, DPPO-KL, atr_seq and adaptive ATR on Qwen3-1.7B, seeds 0-2: 21 commands, each a
    config that composes with the paper's protocol."""
    lines = dry_run("rivals")
    assert len(lines) == 21 and all(cmd[1:4] == ["-m", "atr_grpo.train", "-m"] for cmd in lines)
    configs = [train_config(overrides) for overrides in launch.load_plan("rivals").expand()]
    methods = {cfg.method for cfg in configs}
    assert methods == {"atr", "gspo", "cispo", "dppo_tv", "dppo_kl", "atr_seq", "atr-target_kl3_0.01"}
    assert sorted(cfg.seed for cfg in configs) == [0] * 7 + [1] * 7 + [2] * 7
    for cfg in configs:
        assert (cfg.model.name, cfg.experiment, cfg.trainer.loss_agg) == ("qwen3-1.7b", "rivals", "dr_grpo")
        assert (cfg.trainer.learning_rate, cfg.trainer.max_steps, cfg.optimizer_steps_per_rollout) == (5e-6, 1000, 2)
    adaptive = next(cfg for cfg in configs if cfg.method != cfg.clipping.name)
    assert (adaptive.clipping.delta, adaptive.clipping.target_kl3) == (0.07, 0.01)


def test_every_table2_run_uses_the_papers_protocol():
    plan = launch.load_plan("table2")
    for overrides in plan.expand():
        cfg = train_config(overrides)
        assert (cfg.trainer.learning_rate, cfg.trainer.per_device_train_batch_size) == (5e-6, 8)
        assert (cfg.trainer.gradient_accumulation_steps, cfg.trainer.num_generations) == (4, 8)
        assert (cfg.model.lora.r, cfg.model.lora.alpha, cfg.trainer.max_steps) == (32, 64, 1000)
        assert (cfg.eval.every_steps, cfg.eval.k, cfg.eval.temperature, cfg.eval.top_p) == (50, 8, 0.3, 0.95)
        assert cfg.eval.benchmarks == ["amc23", "aime24", "aime25"] and cfg.trainer.loss_agg == "dr_grpo"
        assert cfg.optimizer_steps_per_rollout == 2  # the clipping rule can act


def test_slurm_mode_groups_the_grid_into_one_job_array():
    lines = dry_run("table2", "hydra/launcher=slurm")
    assert len(lines) == 1
    assert "model=qwen3-1.7b,qwen3-8b" in lines[0] and "hydra/launcher=slurm" in lines[0]
    table3 = launch.load_plan("table3").sweeps(["hydra/launcher=slurm"])
    assert len(table3) == 15 and all("seed=0,1,2" in sweep for sweep in table3)  # one array of 3 seeds per method


def test_slurm_launcher_composes_from_the_environment(monkeypatch):
    monkeypatch.setenv("ATR_SLURM_PARTITION", "a100")
    cfg = compose(["hydra/launcher=slurm", "hydra.launcher.timeout_min=600"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.partition, launcher.gpus_per_node, launcher.timeout_min) == ("a100", 1, 600)
    assert launcher.max_num_timeout > 0  # preempted or timed-out runs are requeued


def test_run_names_in_a_sweep_carry_the_overrides_they_do_not_show():
    assert sweep_suffix(["experiment=table2", "model=qwen3-8b", "clipping=atr", "seed=1"]) == "__model=qwen3-8b"
    assert sweep_suffix(["clipping.delta=0.05", "trainer.learning_rate=1e-5"]) == "__trainer.learning_rate=1e-5"
    assert sweep_suffix(["clipping=clip", "clipping.eps=0.3", "seed=2", "logger=none"]) == ""
    target = launch.run_dir_of(["experiment=table2", "model=qwen3-8b", "clipping=clip", "clipping.eps=0.3"])
    assert target.as_posix() == "results/runs/table2/table2__clip-eps0.3__s0__model=qwen3-8b"


def test_finished_runs_are_skipped_and_failures_reported(tmp_path, monkeypatch, capsys):
    """Skipped: trained with every scheduled evaluation recorded. Launched again: fresh runs, and trained runs
    whose evaluations are missing (a failed evaluation is not a finished run)."""
    plan = launch.Plan("toy", "train", ["experiment=smoke"], [[]], {"clipping.delta": ["0.05", "0.07", "0.09"]})
    finished, unevaluated = tmp_path / "finished", tmp_path / "unevaluated"
    evaluation = {"enabled": True, "every_steps": 2, "at_start": False, "benchmarks": ["arithmetic"]}
    for run in (finished, unevaluated):
        run.mkdir()
        rundir.write_json(run / rundir.DONE_FILE, {"step": 2})
        (run / rundir.CONFIG_FILE).write_text(json.dumps({"eval": evaluation, "trainer": {"max_steps": 2}}))
    rundir.append_jsonl(rundir.summary_path(finished), {"step": 2, "benchmark": "arithmetic"})
    targets = {"0.05": finished, "0.07": unevaluated, "0.09": tmp_path / "fresh"}
    monkeypatch.setattr(launch, "run_dir_of", lambda o, root=None: targets[o[-1].split("=")[1]])
    calls = []

    def fake_run(cmd, cwd):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(launch.subprocess, "run", fake_run)
    assert launch.launch(plan, [], dry_run=False) == 1
    assert [call[-1] for call in calls] == ["clipping.delta=0.07", "clipping.delta=0.09"]
    out = capsys.readouterr()
    assert "finished already, skipped" in out.out
    assert "toy: 1 of 3 runs ok; re-ran 2 (2 failed), 1 already finished and not re-run" in out.out
    assert "; the 2 launched took 0.0 min of wall time, 1 at once" in out.out
    assert "failed:" in out.err


def test_a_launch_that_finds_every_run_finished_says_that_nothing_was_re_run(tmp_path, monkeypatch, capsys):
    plan = launch.Plan("toy", "train", ["experiment=smoke"], [[]], {"seed": ["0", "1"]})
    monkeypatch.setattr(launch, "run_complete", lambda target: True)
    monkeypatch.setattr(launch.subprocess, "run", lambda *a, **k: pytest.fail("nothing may be started"))
    tally = launch.run_plan(plan, [], dry_run=False)
    assert (tally.exit_code, len(tally.finished), tally.launched) == (0, 2, [])
    out = capsys.readouterr().out
    assert "re-ran 0, 2 already finished and not re-run" in out and "nothing was re-run" in out


def test_runs_into_another_folder_keep_their_names(tmp_path):
    """--runs DIR: each run's directory is DIR/<its usual name>, through a run_dir override on its command."""
    lines = dry_run("ablate_delta", "--runs", str(tmp_path))
    assert len(lines) == 5 and all(cmd[-1] == f"run_dir={tmp_path}/${{run_name}}" for cmd in lines)
    overrides = launch.load_plan("power").expand()[5]
    assert launch.run_dir_of(overrides, tmp_path) == tmp_path / "power__clip__s5"
    assert launch.run_dir_of(overrides).as_posix() == "results/power/runs/power__clip__s5"


def test_power_plan_is_4_methods_by_10_seeds_with_one_thread_each():
    """The 40 runs cross the four methods with seeds 0-9; each method's run (seed 9 here: every run composes in
    the dry-run test) trains on one thread with the power experiment's data and shared start."""
    runs = launch.load_plan("power").expand()
    assert len(runs) == 40 and len({tuple(run) for run in runs}) == 40
    assert {o for run in runs for o in run if o.startswith("seed=")} == {f"seed={s}" for s in range(10)}
    configs = [train_config(run) for run in runs if run[-1] == "seed=9"]
    assert sorted(cfg.method for cfg in configs) == ["atr", "clip", "clip_higher", "gspo"]
    for cfg in configs:
        assert (cfg.seed, cfg.trainer.num_threads, cfg.data.num_eval, cfg.eval.share_start) == (9, 1, 256, True)
        assert (cfg.data.chain_min, cfg.data.chain_max) == (3, 5) and cfg.optimizer_steps_per_rollout > 1
    assert next(cfg for cfg in configs if cfg.method == "atr").clipping.delta == 0.07


def test_jobs_run_at_once_with_each_line_labelled(tmp_path, monkeypatch, capsys):
    """--jobs 2: two commands overlap in time (each waits for the other's file), each output line prefixed."""
    plan = launch.Plan("toy", "train", ["experiment=smoke"], [[]], {"seed": ["0", "1"]})
    monkeypatch.setattr(launch, "run_complete", lambda target: False)
    script = (
        "import pathlib, sys, time; me, other = sys.argv[1:3]; pathlib.Path(me).touch(); end = time.time() + 60\n"
        "while not pathlib.Path(other).exists() and time.time() < end: time.sleep(0.05)\n"
        "print('saw', pathlib.Path(other).exists())"
    )
    files = {"seed=0": (tmp_path / "a", tmp_path / "b"), "seed=1": (tmp_path / "b", tmp_path / "a")}
    monkeypatch.setattr(launch, "command", lambda app, o: [sys.executable, "-c", script, *map(str, files[o[-1]])])
    tally = launch.run_plan(plan, [], dry_run=False, jobs=2)
    assert tally.exit_code == 0 and len(tally.launched) == 2
    out = capsys.readouterr().out
    assert "[smoke__atr__s0] saw True" in out and "[smoke__atr__s1] saw True" in out


def test_an_unknown_plan_is_one_line_that_lists_the_experiments_with_a_plan(capsys):
    with_plan = sorted(
        path.stem for path in (CONF / "experiment").glob("*.yaml") if "plan" in yaml.safe_load(path.read_text())
    )
    assert with_plan == PLANS
    listing = f"; the experiments with a plan: {', '.join(with_plan)}"
    assert launch.main(["table9"]) == 2
    assert capsys.readouterr().err == f"error: unknown plan 'table9'{listing}\n"
    assert launch.main(["smoke"]) == 2  # an experiment, without a plan
    assert (
        capsys.readouterr().err
        == f"error: unknown plan 'smoke': conf/experiment/smoke.yaml has no plan: key{listing}\n"
    )


def test_a_plan_with_an_unknown_key_is_refused(tmp_path, monkeypatch):
    (tmp_path / "toy.yaml").write_text("experiment: toy\nplan:\n  grid: {seed: [0, 1]}\n  common: [seed=2]\n")
    monkeypatch.setattr(launch, "EXPERIMENTS", tmp_path)
    with pytest.raises(launch.PlanError, match=r"unknown keys under plan: \['common'\]; allowed: \['app', 'runs'"):
        launch.load_plan("toy")


# The grids as conf/plan/*.yaml held them before they moved into the experiments' `plan:` keys: app, runs, grid
# (every run began with experiment=<name>). The launcher must expand each experiment to exactly these runs.
PLANS_BEFORE_THE_FOLD = {
    "ablate_delta": ("train", [[]], {"clipping.delta": ["0.05", "0.06", "0.07", "0.08", "0.09"]}),
    "mini": (
        "train",
        [["clipping=" + c] for c in ("clip", "clip_higher", "dual_clip", "dcpo", "clip_cov", "sapo", "atr")]
        + [["clipping=atr", f"clipping.delta={d}"] for d in ("0.05", "0.06", "0.08", "0.09")],
        {"seed": ["0", "1", "2"]},
    ),
    "passk_curve": ("evaluate", [[]], {}),
    "power": (
        "train",
        [["clipping=" + c] for c in ("clip", "clip_higher", "atr", "gspo")],
        {"seed": list("0123456789")},
    ),
    "rivals": (
        "train",
        [["clipping=" + c] for c in ("atr", "gspo", "cispo", "dppo_tv", "dppo_kl", "atr_seq")]
        + [["clipping=atr", "clipping.target_kl3=0.01"]],
        {"seed": ["0", "1", "2"]},
    ),
    "table2": (
        "train",
        [[]],
        {
            "model": ["qwen3-1.7b", "qwen3-8b"],
            "clipping": ["clip", "clip_higher", "dual_clip", "dcpo", "clip_cov", "sapo", "atr"],
        },
    ),
    "table3": (
        "train",
        [["clipping=clip", f"clipping.eps={e}"] for e in ("0.1", "0.2", "0.3", "0.4", "0.5", "0.329", "0.422")]
        + [["clipping=clip_higher"]]
        + [["clipping=clip_higher", "clipping.eps_low=0.329", f"clipping.eps_high={h}"] for h in ("0.5", "0.6")]
        + [["clipping=" + c] for c in ("kl1", "kl2", "full_kl", "is_kl3", "atr")],
        {"seed": ["0", "1", "2"]},
    ),
}


# Every experiment with a plan; power2's, which narrows the grid for one entry, is expanded in test_launch_narrowed.py.
PLANS = sorted([*PLANS_BEFORE_THE_FOLD, "power2", "power3"])


@pytest.mark.parametrize("name", sorted(PLANS_BEFORE_THE_FOLD))
def test_every_experiment_with_a_plan_expands_to_the_runs_of_its_former_plan_file(name):
    app, runs, grid = PLANS_BEFORE_THE_FOLD[name]
    points = [[f"{k}={v}" for k, v in zip(grid, point)] for point in itertools.product(*grid.values())]
    plan = launch.load_plan(name)
    assert plan.app == app
    assert plan.expand(["x=1"]) == [[f"experiment={name}", *run, *point, "x=1"] for run in runs for point in points]


@pytest.mark.slow
@pytest.mark.parametrize("name", PLANS)
def test_each_plans_dry_run_validates_every_run_and_prints_its_command(name):
    """Every run of every plan composes and validates (the dry run refuses otherwise), and gets a run directory of
    its own."""
    assert dry_run(name) == planned(name)
    plan = launch.load_plan(name)
    if plan.app == "train":
        runs = plan.expand()
        assert len({launch.run_dir_of(overrides) for overrides in runs}) == len(runs)


def test_table2_dry_run_prints_these_14_commands():
    """`make reproduce-table2 DRY_RUN=1` is `launch --dry-run table2`: the same 14 lines, in this order."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert launch.main(["--dry-run", "table2"]) == 0
    methods = ("clip", "clip_higher", "dual_clip", "dcpo", "clip_cov", "sapo", "atr")
    assert out.getvalue() == "".join(
        f"{shlex.quote(sys.executable)} -m atr_grpo.train -m experiment=table2 model={model} clipping={method}\n"
        for model in ("qwen3-1.7b", "qwen3-8b")
        for method in methods
    )


def test_the_plan_key_reaches_neither_the_config_objects_nor_the_run_files():
    """An experiment's `plan:` composes (the schema takes it in one place, config_hydra.PLAN_KEY) and is dropped on
    validation: no attribute, and the YAML a run writes from the composed config has no `plan`."""
    cfg = compose(["experiment=table2"])
    assert OmegaConf.to_container(cfg.plan)["grid"]["model"] == ["qwen3-1.7b", "qwen3-8b"]
    train_cfg = to_object(cfg)
    assert PLAN_KEY not in cfg and not hasattr(train_cfg, PLAN_KEY)
    assert "plan" not in yaml.safe_load(OmegaConf.to_yaml(cfg, resolve=True))
    assert "plan" not in yaml.safe_load(config_to_yaml(train_cfg))
    evaluate_cfg = compose(["experiment=passk_curve"], config_name="evaluate")
    assert evaluate_cfg.plan.app == "evaluate" and not hasattr(to_object(evaluate_cfg), PLAN_KEY)
    with pytest.raises(ConfigError, match="plann"):  # any other unknown key is still refused
        to_object(compose(["experiment=table2", "+plann=1"]))


@pytest.mark.parametrize("override", ["plan.grid.seed=[0,1]", "+plan=x", "~plan"])
def test_a_plan_set_for_one_run_is_refused_rather_than_dropped(override):
    with pytest.raises(ConfigError, match="plan is an experiment's list of runs, read by `python -m atr_grpo.launch"):
        check_sweep("train", ["experiment=table2", override])


def test_overrides_that_do_not_compose_stop_the_launch_with_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(launch.subprocess, "run", lambda *a, **k: pytest.fail("nothing may be started"))
    assert launch.main(["ablate_delta", "trainer.lr=1e-5"]) == 2
    assert "'trainer.lr' is not a key of trainer" in capsys.readouterr().err


# a dozen valid overrides whose `key=value`s no run name shows: their suffix alone passes 255 bytes
TWELVE = [
    "trainer.learning_rate=1e-4",
    "trainer.weight_decay=0.002",
    "trainer.adam_beta1=0.85",
    "trainer.adam_beta2=0.98",
    "trainer.max_grad_norm=0.5",
    "trainer.warmup_ratio=0.05",
    "trainer.logging_steps=2",
    "trainer.max_prompt_length=200",
    "eval.temperature=0.6",
    "eval.top_p=0.9",
    "eval.seed=3",
    "data.generator_seed=1",
]


@pytest.mark.slow
def test_the_committed_mini_runs_keep_their_names():
    """Names that fit stay exactly as before: the 33 run directories of results/mini/runs/."""
    names = {launch.run_dir_of(job).name for job in launch.load_plan("mini").expand()}
    assert names == {p.name for p in (CONF.parent / "results" / "mini" / "runs").iterdir()}


@pytest.mark.slow
def test_a_twelve_override_sweep_gets_names_that_fit_a_file_name():
    """`launch mini` with 12 more overrides: 33 distinct names of at most 255 bytes (the full ones pass it), each
    the readable start of the full name and 8 hex digits of its hash; and the plan launches."""
    jobs = launch.load_plan("mini").expand(TWELVE)
    names = [launch.run_dir_of(job).name for job in jobs]
    assert len(set(names)) == 33 and max(len(name.encode()) for name in names) <= 255
    for job, name in zip(jobs, names):
        cfg = train_config(job)
        full = f"mini__{cfg.method}__s{cfg.seed}" + sweep_suffix(swept(job))
        assert len(full.encode()) > 255  # unshortened: "File name too long"
        start, _, digest = name.rpartition("__")
        assert full.startswith(start) and len(start) > 200
        assert digest == hashlib.sha256(full.encode()).hexdigest()[:8]
    assert len(dry_run("mini", *TWELVE)) == 33  # every job validated, and launched


def swept(job):
    """The overrides Hydra's basic sweeper hands the one job of `python -m atr_grpo.train -m <job>`."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    ((only,),) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(job), None)
    return only


def test_a_multirun_job_resolves_the_name_the_launcher_expects(monkeypatch):
    job = ["experiment=mini", "clipping=atr", "clipping.delta=0.05", "seed=1", *TWELVE]
    expected = launch.run_dir_of(job).name
    monkeypatch.setattr(naming, "multirun_suffix", lambda: sweep_suffix(swept(job)))  # as inside the Hydra job
    assert compose(job).run_name == expected and len(expected.encode()) == 255


def test_the_launcher_expects_the_value_as_the_sweeper_spells_it():
    """`trainer.learning_rate=2.0e-4` reaches the job as `0.0002`, which its run name shows: the launcher looks
    for that folder, so a finished run is found and not launched again (a clone's `make reproduce-power3`)."""
    job = ["experiment=power3", "clipping=clip", "trainer.learning_rate=2.0e-4", "seed=10"]
    assert swept(job)[2] == "trainer.learning_rate=0.0002"
    target = launch.run_dir_of(job)
    assert target.name == "power3__clip__s10__trainer.learning_rate=0.0002"
    assert target.name in {p.name for p in (CONF.parent / "results" / "power3" / "runs").iterdir()}


def test_long_names_keep_their_start_and_get_a_stable_hash():
    assert rundir.fit_name("mini__atr-delta0.05__s0") == "mini__atr-delta0.05__s0"
    assert rundir.fit_name("x" * 255) == "x" * 255
    long = "power__atr__s0__" + ",".join(f"trainer.key{i}=value{i}" for i in range(20))
    fitted = rundir.fit_name(long)
    assert len(fitted.encode()) == 255 and fitted.startswith(long[:245]) and fitted == rundir.fit_name(long)
    assert fitted != rundir.fit_name(long.replace("value19", "value18"))  # differs past the kept start
    assert len(rundir.fit_name("é" * 200).encode()) <= 255  # cut on a character boundary


def test_a_plan_with_a_misspelled_override_is_refused_before_any_run(capsys):
    assert launch.main(["--dry-run", "mini", "trainer.lr=1e-4"]) == 2
    err = capsys.readouterr().err
    assert "'trainer.lr' is not a key of trainer" in err and "Traceback" not in err


def test_a_launch_says_how_long_its_runs_took(monkeypatch, capsys):
    plan = launch.Plan("toy", "train", ["experiment=smoke"], [[]], {"seed": ["0", "1", "2"]})
    monkeypatch.setattr(launch, "run_complete", lambda target: False)
    started = []  # two at once: every command goes through _run_command, which prefixes its output lines
    monkeypatch.setattr(launch, "_run_command", lambda cmd, label: started.append(label) or 0)
    clock = iter([1000.0, 1000.0 + 6 * 60 + 18])  # the pool's start and end: 6.3 min
    monkeypatch.setattr(launch.time, "monotonic", lambda: next(clock))
    tally = launch.run_plan(plan, [], dry_run=False, jobs=2)
    assert (tally.seconds, tally.jobs, len(tally.launched)) == (378.0, 2, 3) and len(started) == 3
    assert (
        "toy: 3 of 3 runs ok; re-ran 3, 0 already finished and not re-run; the 3 launched took 6.3 min of wall time, "
        "2 at once" in capsys.readouterr().out
    )
