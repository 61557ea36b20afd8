"""One model per evaluation folder: a second model, adapter, problem count or sampling setting into an `out_dir` is
refused, naming the key and both values, before anything loads; only an identical request is read from the store,
and the console says so."""

import json
import logging

import pytest
from helpers.scripted_generation import FakeTokenizer, ScriptedGenerator
from omegaconf import OmegaConf
from test_eval_adapter_step import config

from atr_grpo import evaluate as evaluate_module
from atr_grpo import rundir
from atr_grpo.errors import ConfigError
from atr_grpo.provenance import weights_sha256
from atr_grpo.rundir import layout


def adapter_with_weights(path, weights=b"weights"):
    """An adapter folder with a weight file (its bytes make its sha256)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text("{}\n")
    (path / "adapter_model.safetensors").write_bytes(weights)
    return path


@pytest.fixture
def scripted(monkeypatch):
    """Evaluations answer from a script instead of a model; `scripted.loads` counts the models built."""
    monkeypatch.setattr(evaluate_module, "check_adapter_base", lambda model, path: None)
    loads = []

    def build(cfg, backend, benchmarks):
        loads.append(cfg.adapter)
        return ScriptedGenerator({"": [("\\boxed{84}", "stop")] * 2}), FakeTokenizer()

    monkeypatch.setattr(evaluate_module, "build_generator", build)
    return loads


@pytest.fixture
def nothing_loads(monkeypatch):
    """From here on, loading a model or a benchmark fails the test."""

    def no_loading(*args, **kwargs):
        raise AssertionError("something was loaded")

    monkeypatch.setattr(evaluate_module, "build_generator", no_loading)
    monkeypatch.setattr(evaluate_module.engines, "load_benchmarks", no_loading)


def folder_files(out_dir):
    """{relative path: bytes} of every file under out_dir: what a refusal must leave as it was."""
    return {str(p.relative_to(out_dir)): p.read_bytes() for p in sorted(out_dir.rglob("*")) if p.is_file()}


def refused(out_dir, *extra):
    """The message of the ConfigError a request into out_dir raises; out_dir is left as it was."""
    before = folder_files(out_dir)
    with pytest.raises(ConfigError) as caught:
        evaluate_module.evaluate(config(out_dir, *extra))
    assert folder_files(out_dir) == before
    return str(caught.value)


def test_the_folder_records_its_model_adapter_hash_problems_and_sampling(tmp_path, scripted):
    adapter = adapter_with_weights(tmp_path / "clip")
    evaluate_module.evaluate(config(tmp_path / "out", f"adapter={adapter}", "step=4", "eval.max_problems=3"))
    record = json.loads(layout.request_path(tmp_path / "out").read_text())
    assert record["model.name"] == "tiny" and record["adapter"] == str(adapter.resolve())
    assert record["adapter_sha256"] == weights_sha256(adapter) and len(record["adapter_sha256"]) == 64
    assert (record["eval.max_problems"], record["eval.n"], record["eval.k"]) == (3, 2, 2)
    assert record["eval.benchmarks"] == ["amc23"]


def test_a_second_model_into_one_folder_is_refused_naming_both_before_anything_loads(tmp_path, scripted, monkeypatch):
    out_dir = tmp_path / "out"
    evaluate_module.evaluate(config(out_dir))  # the base model, step 0
    adapter = adapter_with_weights(tmp_path / "clip")
    monkeypatch.setattr(evaluate_module, "build_generator", lambda *a: pytest.fail("a model was loaded"))
    monkeypatch.setattr(evaluate_module.engines, "load_benchmarks", lambda *a: pytest.fail("benchmarks loaded"))
    message = refused(out_dir, f"adapter={adapter}", "step=4")
    assert message.startswith(  # the folder refuses, not the config
        f"out_dir {out_dir} already holds another evaluation (the base model tiny) and takes one model and one request"
    )
    assert f"adapter: stored null (the base model), requested '{adapter.resolve()}'" in message
    assert "use another out_dir. Nothing was loaded or written" in message


def test_another_adapter_or_a_changed_one_is_refused(tmp_path, scripted, monkeypatch):
    out_dir, clip = tmp_path / "out", adapter_with_weights(tmp_path / "clip")
    evaluate_module.evaluate(config(out_dir, f"adapter={clip}", "step=4"))
    other = adapter_with_weights(tmp_path / "other")
    monkeypatch.setattr(evaluate_module, "build_generator", lambda *a: pytest.fail("a model was loaded"))
    message = refused(out_dir, f"adapter={other}", "step=40")
    assert f"holds another evaluation (tiny with adapter {clip.resolve()})" in message
    assert f"adapter: stored '{clip.resolve()}', requested '{other.resolve()}'" in message
    stored = weights_sha256(clip)
    adapter_with_weights(clip, b"trained further")  # the same folder, other weights
    message = refused(out_dir, f"adapter={clip}", "step=40")
    assert f"(adapter_sha256: stored {stored[:12]}, requested {weights_sha256(clip)[:12]}); " in message


def test_another_problem_count_is_refused_and_never_answered_from_the_store(tmp_path, scripted, monkeypatch):
    out_dir = tmp_path / "out"
    evaluate_module.evaluate(config(out_dir, "eval.max_problems=3"))
    monkeypatch.setattr(evaluate_module, "build_generator", lambda *a: pytest.fail("a model was loaded"))
    message = refused(out_dir, "eval.max_problems=2")
    assert "(eval.max_problems: stored 3, requested 2); use another out_dir" in message
    message = refused(out_dir, "eval.max_problems=3", "eval.temperature=0.5")
    assert "(eval.temperature: stored 0.3, requested 0.5); use another out_dir" in message


def test_an_identical_request_is_read_from_the_store_and_says_so_once(tmp_path, scripted, capsys, caplog):
    out_dir = tmp_path / "out"
    first = evaluate_module.evaluate(config(out_dir, "eval.max_problems=3"))
    assert scripted == [None] and "reused" not in capsys.readouterr().out
    caplog.set_level(logging.INFO)
    again = evaluate_module.evaluate(config(out_dir, "eval.max_problems=3"))
    assert "already in" not in caplog.text  # no log line repeats the `reused:` line
    assert again == first and scripted == [None]  # no model built for a result read back
    out = capsys.readouterr().out
    assert f"reused: step 0, amc23: read from {out_dir}, evaluated earlier under this same request" in out
    assert "nothing was evaluated again (force=true evaluates it anew)" in out
    assert len(rundir.read_jsonl(layout.summary_path(out_dir))) == 1


def legacy_folder(out_dir, *models):
    """A folder written before eval/request.json: the first call's config.yaml and a summary line per (step,
    model, adapter) of `models`."""
    rundir.write_text(layout.config_path(out_dir), "model:\n  name: tiny\nadapter: null\neval:\n  max_problems: null\n")
    lines = [{"step": step, "benchmark": "amc23", "model": m, "adapter": a, "mean@2": 0.5} for step, m, a in models]
    rundir.write_text(layout.summary_path(out_dir), "".join(json.dumps(line) + "\n" for line in lines))


def test_a_folder_from_before_the_record_is_read_from_its_config_and_summary_lines(tmp_path, scripted, monkeypatch):
    out_dir, clip = tmp_path / "old", adapter_with_weights(tmp_path / "clip")
    legacy_folder(out_dir, (0, "tiny", None))
    monkeypatch.setattr(evaluate_module, "build_generator", lambda *a: pytest.fail("a model was loaded"))
    assert f"adapter: stored null (the base model), requested '{clip.resolve()}'" in refused(
        out_dir, f"adapter={clip}", "step=4"
    )
    assert "(eval.max_problems: stored null (all problems), requested 3)" in refused(out_dir, "eval.max_problems=3")
    mixed = tmp_path / "mixed"
    legacy_folder(mixed, (0, "tiny", None), (4, "tiny", str(clip)))
    message = refused(mixed)
    assert (
        f"out_dir {mixed} already holds several models (the base model tiny; tiny with adapter {clip.resolve()})"
        in (message)
    )
    assert "its results cannot be extended: use another out_dir" in message


def test_a_training_run_s_folder_takes_only_its_own_checkpoints(tmp_path, scripted, monkeypatch):
    run = tmp_path / "run"
    checkpoint = adapter_with_weights(run / "checkpoints" / "checkpoint-30")
    settings = OmegaConf.to_container(OmegaConf.structured(config(run)), resolve=True)  # the run evaluated alike
    rundir.write_text(layout.config_path(run), OmegaConf.to_yaml({**settings, "trainer": {"max_steps": 30}}))
    evaluate_module.evaluate(config(run, f"adapter={checkpoint}"))
    assert [row["step"] for row in rundir.read_jsonl(layout.summary_path(run))] == [30]
    assert not layout.request_path(run).exists()  # its config.yaml says what it holds
    elsewhere = adapter_with_weights(tmp_path / "elsewhere")
    monkeypatch.setattr(evaluate_module, "build_generator", lambda *a: pytest.fail("a model was loaded"))
    message = refused(run, f"adapter={elsewhere}", "step=40")
    assert "takes its own checkpoints and its settings" in message
    assert f"adapter: stored 'a checkpoint inside {run}', requested '{elsewhere.resolve()}'" in message
    assert "(eval.n: stored 2, requested 4" in refused(run, f"adapter={checkpoint}", "eval.n=4", "eval.k=2")


def test_the_command_refuses_another_problem_count_with_exit_status_2(tmp_path):
    """`python -m atr_grpo.evaluate ... eval.max_problems=16` into a folder of 32-problem results: refused on stderr,
    before Hydra starts the job (nothing written, no model built)."""
    import subprocess
    import sys

    from conftest import REPO

    out_dir = tmp_path / "out"
    rundir.write_json(layout.request_path(out_dir), {"model.name": "tiny", "eval.max_problems": 32, "adapter": None})
    before = folder_files(out_dir)
    argv = ["model=tiny", "eval=arithmetic", f"out_dir={out_dir}", "eval.max_problems=16"]
    done = subprocess.run(
        [sys.executable, "-m", "atr_grpo.evaluate", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "(eval.max_problems: stored 32, requested 16); use another out_dir" in done.stderr
    assert folder_files(out_dir) == before and not (tmp_path / "results").exists()  # no tiny model built
