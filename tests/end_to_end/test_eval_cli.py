"""`python -m atr_grpo.evaluate` on the tiny CPU model: a base model and an adapter, contracts §3 files."""

import os
import subprocess
import sys

import pytest
from conftest import REPO, needs_vllm

from atr_grpo import rundir

FIXTURES = REPO / "tests" / "fixtures" / "eval"


def overrides(out_dir, *extra):
    return [
        "model=tiny",
        "model.tiny.pretrain_steps=0",  # the evaluator's glue is under test, not the tiny model's skill
        f"out_dir={out_dir}",
        "eval.benchmarks=[aime24,amc23]",
        f"+eval.paths.aime24={FIXTURES / 'aime24.jsonl'}",  # `+`: eval.paths starts empty
        f"+eval.paths.amc23={FIXTURES / 'amc23.jsonl'}",
        "eval.strict=false",
        "eval.n=2",
        "eval.k=2",
        "eval.max_tokens=8",
        "eval.backend=hf",
        "eval.batch_size=4",
        "eval.grader_workers=1",
        *extra,
    ]


@pytest.mark.slow
def test_the_entry_point_evaluates_a_base_model(tmp_path):
    out_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "atr_grpo.evaluate", *overrides(out_dir, "step=7")],
        cwd=tmp_path,  # the tiny model is materialised under ./results/cache
        capture_output=True,
        text=True,
        timeout=300,
        # one torch thread: the tiny model's matmuls are far slower with two threads on a busy 2-core machine
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Mean@2" in result.stdout and "average" in result.stdout
    summary = rundir.read_jsonl(out_dir / "eval" / "summary.jsonl")
    assert [(row["step"], row["benchmark"]) for row in summary] == [(7, "aime24"), (7, "amc23")]
    assert summary[0]["model"] == "tiny" and summary[0]["adapter"] is None and summary[0]["backend"] == "hf"
    assert len(rundir.read_jsonl(out_dir / "eval" / "step_000007" / "aime24.jsonl")) == 3 * 2
    assert len(rundir.read_jsonl(out_dir / "eval" / "step_000007" / "amc23.jsonl")) == 4 * 2


@pytest.fixture
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_an_adapter_is_evaluated_and_a_rerun_is_skipped(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    from atr_grpo.config_hydra import register_configs, to_object
    from atr_grpo.evaluate import evaluate
    from atr_grpo.models import load_model_and_tokenizer

    monkeypatch.chdir(tmp_path)
    register_configs()
    out_dir = tmp_path / "run"
    adapter = tmp_path / "adapter"
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = to_object(compose(config_name="evaluate", overrides=overrides(out_dir, f"adapter={adapter}", "step=3")))
    model, _ = load_model_and_tokenizer(cfg.model, for_training=True)  # a fresh LoRA adapter
    model.save_pretrained(str(adapter))

    metrics = evaluate(cfg)
    assert set(metrics) >= {
        "eval/aime24/mean@2",
        "eval/amc23/pass@2",
        "eval/average/mean@2",
        "eval/average/pass@1",
    }
    (first, _) = rundir.read_jsonl(out_dir / "eval" / "summary.jsonl")
    assert first["adapter"] == str(adapter) and first["step"] == 3
    assert evaluate(cfg) == metrics, "a second run reads the recorded values"
    assert len(rundir.read_jsonl(out_dir / "eval" / "summary.jsonl")) == 2


@pytest.mark.slow
@needs_vllm
def test_the_vllm_backend_writes_what_the_hf_backend_writes(tmp_path, smoke_sft_adapter):
    """`python -m atr_grpo.evaluate model=tiny eval=arithmetic eval.backend=vllm adapter=DIR out_dir=DIR` on CPU:
    the same files, problems, samples, fields and prompt as with eval.backend=hf; only the backend differs. The
    command runs as docs/evaluation.md gives it, without VLLM_CPU_KVCACHE_SPACE (the tests' other engines set it):
    the engine sizes its KV cache to the free memory (`engines.cpu_kv_cache_bytes`)."""
    env = {name: value for name, value in os.environ.items() if name != "VLLM_CPU_KVCACHE_SPACE"}
    common = [
        "model=tiny",
        "eval=arithmetic",
        f"adapter={smoke_sft_adapter}",
        "eval.max_problems=16",
        "eval.n=2",
        "eval.k=2",
    ]
    outputs = {}
    for backend in ("hf", "vllm"):
        out_dir = tmp_path / backend
        result = subprocess.run(
            [sys.executable, "-m", "atr_grpo.evaluate", *common, f"eval.backend={backend}", f"out_dir={out_dir}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        (row,) = rundir.read_jsonl(out_dir / "eval" / "summary.jsonl")
        samples = rundir.read_jsonl(out_dir / "eval" / "step_000000" / "arithmetic.jsonl")
        outputs[backend] = (row, samples)
    (hf_row, hf_samples), (vllm_row, vllm_samples) = outputs["hf"], outputs["vllm"]
    assert (hf_row["backend"], vllm_row["backend"]) == ("hf", "vllm")
    same = ("benchmark", "num_problems", "n", "prompt_hash", "content_hash", "temperature", "max_tokens", "adapter")
    assert {k: hf_row[k] for k in same} == {k: vllm_row[k] for k in same} and set(hf_row) == set(vllm_row)
    assert [(s["problem_id"], s["sample"]) for s in hf_samples] == [
        (s["problem_id"], s["sample"]) for s in vllm_samples
    ]
    assert len(hf_samples) == 16 * 2 and all(set(a) == set(b) for a, b in zip(hf_samples, vllm_samples))
