"""Bad input found before anything loads or is written, with the key or file named and no traceback: settings
that would be accepted without effect, a negative seed, a LoRA target or an adapter that does not fit the model,
an evaluation's bad out_dir, a damaged run file (named with its line); and a run directory that is the same run
spelled differently (an absolute path, a moved or copied folder) is continued, not refused."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, compose, train_config
from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.config_hydra import to_object
from atr_grpo.errors import ConfigError
from atr_grpo.machine import decide
from atr_grpo.training import pipeline


def cli(module, *args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def refused_in_one_line(result, message):
    """Exit status 2, the message on stderr, no traceback."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]


# --------------------------------------------------------------------------------- a launch on the wrong machine
def test_a_cpu_launch_without_an_experiment_is_refused_in_seconds_and_leaves_nothing(tmp_path):
    """Forgetting experiment=smoke on CPU: refused before Hydra makes the run's folder (no train.log) and before the
    hub is asked for the paper's model, with the experiments that run on CPU named."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "atr_grpo.train", "logger=none"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    refused_in_one_line(done, "invalid config: experiment is not set")
    assert "add experiment=smoke" in done.stderr and "experiment=demo" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_launch_sent_to_a_cluster_from_a_cpu_node_is_not_refused_for_this_nodes_lack_of_a_gpu(tmp_path):
    """`hydra/launcher=slurm` runs the jobs on the cluster's GPU nodes: the login node's missing GPU is no reason to
    refuse (here the submission itself fails, with no SLURM to submit to)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "atr_grpo.train", "-m", "hydra/launcher=slurm", "logger=none"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "experiment is not set" not in done.stderr


# --------------------------------------------------------------------------- settings accepted without effect
@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["rollout.correction_max=3.0"], ["rollout.correction_max", "rollout.correction='none'", "got 3.0"]),
        (["rollout.correction_min=0.5"], ["rollout.correction_min", "rollout.correction='none'"]),
        (["rollout.correction_level=sequence"], ["rollout.correction_level", "rollout.correction='none'"]),
        (["clipping.delta_min=0.02"], ["clipping.delta_min is only read by adaptive δ (target_kl3)"]),
        (["clipping=kl2", "clipping.delta_max=0.3"], ["clipping.delta_max is only read by adaptive δ"]),
        (["rollout.engine=hf", "rollout.vllm.mode=server"], ["rollout.vllm.mode", "with rollout.engine='hf'"]),
        (["rollout.vllm.group_port=70000"], ["rollout.vllm.group_port", "a port number", "70000"]),
        (["rollout.vllm.group_port=0"], ["rollout.vllm.group_port"]),
        (["seed=-1"], ["seed must be in [0, 2**32 - 1]", "-1"]),
        (["seed=4294967296"], ["seed must be in [0, 2**32 - 1]"]),
    ],
)
def test_settings_without_effect_and_bad_seeds_are_refused_naming_the_key(overrides, words):
    with pytest.raises(ConfigError) as err:
        train_config(["experiment=smoke", *overrides])
    for word in words:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize(
    "overrides",
    [
        ["rollout.correction=tis", "rollout.correction_max=3.0", "rollout.engine=vllm"],  # it acts: accepted
        ["clipping.target_kl3=0.01", "clipping.delta_min=0.02"],
        ["rollout.correction_max=2.0", "clipping.delta_min=0.01"],  # the defaults spelled out change nothing
        ["rollout.engine=vllm", "rollout.vllm.mode=server", "rollout.vllm.group_port=65535"],
    ],
)
def test_the_same_settings_where_they_act_are_accepted(overrides):
    train_config(["experiment=smoke", *overrides])


@pytest.mark.slow
def test_a_refused_seed_leaves_no_trace_that_blocks_the_fixed_run(tmp_path):
    run_dir = tmp_path / "run"
    refused = cli("atr_grpo.train", "experiment=smoke", "logger=none", "seed=-1", f"run_dir={run_dir}")
    refused_in_one_line(refused, "seed must be in [0, 2**32 - 1]")
    assert not run_dir.exists()
    cfg = compose(["experiment=smoke", "seed=1", f"run_dir={run_dir}"])
    train_cfg = to_object(cfg)
    state = pipeline.prepare_run_dir(train_cfg, OmegaConf.to_yaml(cfg, resolve=True), decide(train_cfg))
    assert state.resume_from is None and (run_dir / rundir.CONFIG_FILE).exists()


@pytest.mark.slow
def test_a_sweep_with_a_bad_value_starts_no_job(tmp_path):
    """`-m clipping.delta=0.05,-1`: the -1 job is found before the 0.05 job trains."""
    sweep = cli(
        "atr_grpo.train",
        "-m",
        "experiment=smoke",
        "logger=none",
        "clipping.delta=0.05,-1",
        f"hydra.sweep.dir={tmp_path}",
    )
    refused_in_one_line(sweep, "sweep job 2 of 2 (experiment=smoke logger=none clipping.delta=-1)")
    assert "no job of the sweep was started" in sweep.stderr and not any(tmp_path.iterdir())


# ---------------------------------------------------------------------- the same run, spelled differently
def prepare(run_dir, overrides=()):
    cfg = compose(["experiment=smoke", f"run_dir={run_dir}", *overrides])
    train_cfg = to_object(cfg)
    return pipeline.prepare_run_dir(train_cfg, OmegaConf.to_yaml(cfg, resolve=True), decide(train_cfg))


def test_a_run_dir_given_absolute_relative_moved_or_copied_is_the_same_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prepare("runs/a")
    prepare(tmp_path / "runs" / "a")  # the absolute spelling of the same folder
    shutil.move(tmp_path / "runs" / "a", tmp_path / "moved")
    prepare(tmp_path / "moved")
    shutil.copytree(tmp_path / "moved", tmp_path / "copy")
    prepare("./copy")
    assert len(json.loads((tmp_path / "copy" / rundir.ENV_FILE).read_text())["resumes"]) == 3


def test_paths_in_a_config_compare_resolved_and_other_values_still_count(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text("{}\n")
    source = ["data.source=file", "data.path=train.jsonl"]
    prepare("run", source)
    prepare("run", ["data.source=file", f"data.path={tmp_path / 'train.jsonl'}"])
    before = sorted(p.name for p in (tmp_path / "run").iterdir()), (tmp_path / "run" / rundir.ENV_FILE).read_text()
    with pytest.raises(pipeline.RunDirError, match=r"differing keys: clipping.delta, method, run_name\)"):
        prepare(tmp_path / "run", [*source, "clipping.delta=0.05"])
    after = sorted(p.name for p in (tmp_path / "run").iterdir()), (tmp_path / "run" / rundir.ENV_FILE).read_text()
    assert after == before  # a refused resume leaves the directory as it was


# ------------------------------------------------------------------------------ LoRA targets and adapters
def test_a_lora_target_that_matches_no_module_is_refused_naming_it(tiny_model_dir):
    from atr_grpo.model_checks import check_lora_targets

    cfg = train_config(["experiment=smoke", "model.lora.target_modules=[q_proj,k_prj]"])
    with pytest.raises(ConfigError, match="model.lora.target_modules: 'k_prj' match no module .* k_proj"):
        check_lora_targets(cfg.model)
    check_lora_targets(train_config(["experiment=smoke"]).model)  # the default targets all exist


def other_tiny_adapter(tmp_path, **architecture):
    """A LoRA adapter saved from a tiny Qwen3 of another architecture (random weights, nothing pretrained)."""
    from peft import get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from atr_grpo.models import peft_lora_config

    base = dict(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(Qwen3Config(**(base | architecture)))
    lora = train_config(["experiment=smoke"]).model.lora
    adapter = tmp_path / "adapter"
    get_peft_model(model, peft_lora_config(lora)).save_pretrained(adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": "org/other-tiny"}))
    return adapter


@pytest.mark.parametrize(
    ("architecture", "problem"),
    [
        ({"num_hidden_layers": 3}, "the model has no module model.layers.2."),  # shapes fit: part would be dropped
        ({"hidden_size": 96}, "has 96 features where"),  # shapes differ: PEFT's size mismatch
    ],
)
def test_an_adapter_of_another_base_model_is_refused_naming_both(tmp_path, tiny_model_dir, architecture, problem):
    from atr_grpo.model_checks import check_adapter_base

    adapter = other_tiny_adapter(tmp_path, **architecture)
    model = train_config(["experiment=smoke"]).model
    with pytest.raises(ConfigError) as err:
        check_adapter_base(model, adapter)
    message = str(err.value)
    assert "was trained on org/other-tiny" in message and "model=tiny" in message and problem in message


def test_an_adapter_of_the_same_architecture_is_accepted(tmp_path, tiny_model_dir):
    from atr_grpo.model_checks import check_adapter_base

    check_adapter_base(train_config(["experiment=smoke"]).model, other_tiny_adapter(tmp_path))


# ----------------------------------------------------------------------------------------- evaluation
@pytest.mark.slow
def test_a_refused_evaluation_writes_nothing_into_out_dir(tmp_path, tiny_model_dir):
    out = tmp_path / "eval"
    refused = cli("atr_grpo.evaluate", "model=tiny", "eval=arithmetic", f"out_dir={out}", "adapter=/no/such/adapter")
    refused_in_one_line(refused, "adapter must be an existing file or directory")
    assert not out.exists()
    (tmp_path / "a-file").write_text("mine\n")
    refused = cli("atr_grpo.evaluate", "model=tiny", "eval=arithmetic", f"out_dir={tmp_path / 'a-file'}")
    refused_in_one_line(refused, "out_dir must be a directory to write eval/ into, not a file")
    assert (tmp_path / "a-file").read_text() == "mine\n"


# ------------------------------------------------------------------------ run files changed from outside
def test_a_corrupted_config_or_env_file_is_named_and_the_run_left_as_it_was(tmp_path):
    prepare(tmp_path / "run")
    for name, damage in ((rundir.CONFIG_FILE, "seed: [1\n"), (rundir.ENV_FILE, '{"world_size": ')):
        path = tmp_path / "run" / name
        good = path.read_text()
        path.write_text(good + damage if name == rundir.CONFIG_FILE else damage)
        before = path.read_text()
        with pytest.raises(rundir.RunFileError, match=f"^{path}: not (a readable config|valid JSON)") as err:
            prepare(tmp_path / "run")
        assert "\n" not in str(err.value) and path.read_text() == before
        path.write_text(good)


def test_an_empty_config_file_is_named_as_damaged_not_as_another_run(tmp_path):
    prepare(tmp_path / "run")
    path = tmp_path / "run" / rundir.CONFIG_FILE
    path.write_text("")
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    with pytest.raises(rundir.RunFileError, match=f"^{path}: damaged: empty"):
        prepare(tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before and path.read_text() == ""


def test_a_launch_names_a_finished_runs_empty_config_and_starts_nothing(tmp_path, monkeypatch, capsys):
    from atr_grpo import launch

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rundir.write_json(run_dir / rundir.DONE_FILE, {"step": 2})
    (run_dir / rundir.CONFIG_FILE).write_text("")
    monkeypatch.setattr(launch, "run_dir_of", lambda overrides, root=None: run_dir)
    monkeypatch.setattr(launch.subprocess, "run", lambda *a, **k: pytest.fail("nothing may be started"))
    plan = launch.Plan("toy", "train", ["experiment=smoke"], [[]], {})
    assert launch.run_plan(plan, [], dry_run=False).exit_code == 2
    assert f"error: {run_dir / rundir.CONFIG_FILE}: damaged: empty" in capsys.readouterr().err


def test_corrupted_jsonl_files_are_named_with_their_line(tmp_path):
    from atr_grpo.training.run_logger import truncate_metrics

    path = tmp_path / rundir.METRICS_FILE
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(rundir.RunFileError, match=f"{path}:2: not valid JSON"):
        truncate_metrics(tmp_path, 1)
    summary = rundir.summary_path(tmp_path)
    summary.parent.mkdir()
    summary.write_text('{"step": 0}\n[1, \n{"step": 2}\n')
    with pytest.raises(rundir.RunFileError, match=f"{summary}:2: not valid JSON"):
        rundir.read_jsonl(summary)


@pytest.mark.slow
def test_the_train_entry_point_names_a_corrupted_run_file_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    prepare(run_dir, ["logger=none"])
    (run_dir / rundir.ENV_FILE).write_text("{")
    result = cli("atr_grpo.train", "experiment=smoke", "logger=none", f"run_dir={run_dir}")
    refused_in_one_line(result, f"{run_dir / rundir.ENV_FILE}: not valid JSON")


def test_benchmarks_the_hub_cannot_give_name_the_key_for_a_local_copy(monkeypatch):
    """eval=paper offline: the hub's ConnectionError becomes one line naming the benchmark and eval.paths."""
    import datasets

    from atr_grpo.evaluation import engines

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'math-ai/aime24' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    cfg = train_config(["experiment=smoke", "eval=paper"])
    with pytest.raises(ConfigError, match="eval.benchmarks: benchmark '.*': cannot load .* eval.paths.") as err:
        engines.load_benchmarks(cfg.eval, cfg.data)
    assert "OfflineModeIsEnabled" in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------- the results CLI
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pack", "--runs", "/no/such/runs"], "--runs /no/such/runs is not a directory"),
        (["regrade", "--runs", "results/mini/runs", "--timeout", "-1"], "--timeout: must be a number of seconds > 0"),
    ],
)
def test_the_results_commands_refuse_bad_arguments(argv, message, capsys, monkeypatch):
    from atr_grpo import results

    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exit_:
        results.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_compare_names_the_experiment_filter_that_found_nothing(capsys, monkeypatch):
    from atr_grpo import results

    monkeypatch.chdir(REPO)
    argv = ["compare", "atr", "clip", "--runs", "results/mini/runs", "--experiment", "minj", "--resamples", "100"]
    assert results.main(argv) == 2
    assert "(among the runs of --experiment 'minj')" in capsys.readouterr().err


MINI_RUNS = REPO / "results" / "mini" / "runs"


def torn_runs(tmp_path, relative, last, names=("mini__atr-delta0.05__s0", "mini__clip__s0")):
    """Copies of committed mini runs, the first with one line of `relative` cut off: its last line (as a killed
    write leaves it) or its second (a torn line written over since). Returns the file and the line's number."""
    for name in names:
        shutil.copytree(MINI_RUNS / name, tmp_path / "runs" / name)
    path = tmp_path / "runs" / names[0] / relative
    if path.suffix == ".gz":  # a per-sample file as evaluation writes it
        path.with_suffix("").write_bytes(gzip.decompress(path.read_bytes()))
        path.unlink()
        path = path.with_suffix("")
    lines = path.read_text().splitlines(keepends=True)
    number = len(lines) if last else 2
    lines[number - 1] = lines[number - 1][:20] + ("" if last else "\n")
    path.write_text("".join(lines))
    return path, number


REGRADE = ["regrade", "--no-progress", "--workers", "1"]


@pytest.mark.parametrize(
    ("relative", "last", "argv"),
    [
        ("metrics.jsonl", True, ["clip_binding"]),
        ("eval/summary.jsonl", False, ["compare", "atr-delta0.05", "clip", "--resamples", "100"]),
        *(
            pytest.param(*case, marks=pytest.mark.slow)
            for case in [
                ("metrics.jsonl", False, ["clip_binding"]),
                ("eval/summary.jsonl", True, ["endpoints"]),
                ("eval/summary.jsonl", False, REGRADE),
                ("eval/step_000048/arithmetic.jsonl.gz", True, REGRADE),
            ]
        ),
    ],
)
def test_the_results_commands_name_a_torn_line_of_a_run_file(tmp_path, capsys, relative, last, argv):
    """Exit status 2 and the file and line named, whatever the command and wherever the torn line is; nothing
    is left out silently (a torn last line, once skipped, made the tables miss a step or a sample)."""
    from atr_grpo import results

    path, number = torn_runs(tmp_path, relative, last)
    out = ["--out", str(tmp_path / "tables")] if argv[0] in results.TABLES else []
    assert results.main([*argv, "--runs", str(tmp_path / "runs"), *out]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}:{number}: not valid JSON" in err and "Traceback" not in err, err
    assert not (tmp_path / "tables").exists()


def test_a_kernel_choice_torch_would_ignore_is_refused_before_the_run_dir(tmp_path, monkeypatch):
    """ATEN_CPU_CAPABILITY=avx-512 (torch takes avx512): torch would warn, compute on the native path, and env.json
    would record the value as if it had been used."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx-512")
    cfg = compose(["experiment=smoke", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"ATEN_CPU_CAPABILITY='avx-512' .* \(default, avx2, avx512, vsx"):
        pipeline.run_pipeline(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True))
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    pipeline.preflight(to_object(cfg))


def test_an_evaluation_with_an_empty_study_is_refused(tmp_path):
    """`study=` would file the evaluation under no study, or silently under its experiment's."""
    cfg = to_object(compose(["model=tiny", "eval=arithmetic", f"out_dir={tmp_path}", "study="], "evaluate"))
    with pytest.raises(ConfigError, match="study must be a non-empty name"):
        cfg.check_inputs()


@pytest.mark.slow
def test_numeric_paths_passes_on_a_runs_refusal_without_a_traceback(tmp_path):
    """scripts/numeric_paths.py --set with a bad key: the run's one-line refusal, then one line naming the run."""
    script = [sys.executable, "scripts/numeric_paths.py", "demo", "--out", str(tmp_path), "--paths", "native"]
    refused = subprocess.run(
        [*script, "--seeds", "0", "--set", "trainer.learning_rat=1e-4"], cwd=REPO, capture_output=True, text=True
    )
    refused_in_one_line(refused, "'trainer.learning_rat' is not a key of trainer")
    assert refused.stderr.strip().splitlines()[-1] == (
        "stopped: native demo-s0: `python -m atr_grpo.train` exited with status 2 (above)"
    )
