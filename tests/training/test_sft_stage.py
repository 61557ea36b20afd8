"""The SFT format stage: its length filter counts tokens, it trains through TRL's own SFTTrainer in a process
that never imported Unsloth, and the trainer's identity is part of the adapter's cache key."""

import json
import sys
import time
import types

import pytest
from conftest import train_config

from atr_grpo.data.datasets import chat_length, sft_dataset
from atr_grpo.data.prompts import format_answer


@pytest.fixture
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_the_length_filter_counts_tokens_not_encoding_keys(tokenizer, tmp_path):
    """Examples longer than sft.max_length_fraction × model.max_seq_length are dropped (transformers 5 returns a
    BatchEncoding from apply_chat_template(tokenize=True), whose len() is 2 whatever the text)."""
    rows = [
        {"problem": "What is 1 + 1?", "generated_solution": "1 + 1 = 2.", "expected_answer": "2"},
        {"problem": "What is 2 + 2?", "generated_solution": "2 + 2 = 4. " * 40, "expected_answer": "4"},
    ]
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = ["sft=openmath", "sft.source=file", f"sft.path={path}", "sft.max_length_fraction=0.5"]
    cfg = train_config(["experiment=smoke", *overrides])
    short = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "1 + 1 = 2."}]
    assert chat_length(tokenizer, short, False) > 10  # a real token count
    kept = sft_dataset(cfg.sft, cfg.data, cfg.prompt, tokenizer, cfg.model.max_seq_length)  # limit 128 tokens
    assert [m[0]["content"] for m in kept["completion"]] == [format_answer("1 + 1 = 2.", "2")], (
        "the long one is dropped"
    )


def test_the_cache_key_names_the_trainer():
    from atr_grpo.training.sft import sft_cache_key, sft_fingerprint, sft_trainer_identity

    cfg = train_config(["experiment=smoke"])
    assert sft_fingerprint(cfg)["trainer"] == sft_trainer_identity()
    assert sft_trainer_identity().startswith("trl.SFTTrainer==1.15")
    assert sft_cache_key(cfg) == sft_cache_key(train_config(["experiment=smoke", "clipping=clip", "seed=3"]))


def test_an_experiment_can_give_each_run_seed_its_own_start_point():
    """`sft.seed: ${seed}` (and `model.tiny.init_seed: ${seed}`) tie the start point to the run seed: every method of
    seed s shares adapter s, and the cache keys differ by seed."""
    from atr_grpo.training.sft import sft_cache_key

    tied = ["experiment=smoke", "sft.seed=${seed}", "model.tiny.init_seed=${seed}"]
    seed3 = train_config([*tied, "seed=3"])
    assert (seed3.sft.seed, seed3.model.tiny.init_seed) == (3, 3)
    assert sft_cache_key(seed3) == sft_cache_key(train_config([*tied, "seed=3", "clipping=clip"]))
    assert sft_cache_key(seed3) != sft_cache_key(train_config([*tied, "seed=4"]))
    assert train_config(["experiment=smoke", "seed=3"]).sft.seed == 3407, "by default every seed shares one adapter"


def test_mini_starts_where_the_demo_starts():
    """The mini recipe changes only GRPO: its SFT adapter and its evaluation are the demo's, so the demo's study of
    the SFT budget (docs/experiment-log.md) is the mini recipe's too."""
    from dataclasses import asdict

    from atr_grpo.training.sft import sft_cache_key

    demo, mini = train_config(["experiment=demo"]), train_config(["experiment=mini"])
    assert sft_cache_key(mini) == sft_cache_key(demo)
    differ = {k for k, v in asdict(mini.eval).items() if asdict(demo.eval)[k] != v}
    assert differ == {"every_steps"}, differ
    assert asdict(mini.data) == asdict(demo.data)


def test_sft_refuses_to_train_where_unsloth_was_imported(monkeypatch, tmp_path):
    from atr_grpo.training.sft import train_sft

    monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
    with pytest.raises(RuntimeError, match="has not imported unsloth"):
        train_sft(train_config(["experiment=smoke"]), tmp_path)


def test_sft_prints_its_progress_line_not_log_dicts(tmp_path, tiny_model_dir, capfd):
    """The SFT stage's console is one stage line ending at its last step with the last logged loss; the
    Trainer's `{'loss': ...}` dicts are not printed, and the losses are all in sft_info.json."""
    from atr_grpo.training.sft import train_sft

    overrides = ["sft.max_examples=160", "sft.num_epochs=1"]  # 10 steps of 16: one logged loss, at step 10
    train_sft(train_config(["experiment=smoke", *overrides]), tmp_path)
    out, err = capfd.readouterr()
    assert "{'" not in out + err
    lines = [line for line in err.splitlines() if line.startswith("SFT: ")]
    info = json.loads((tmp_path / "sft_info.json").read_text())
    (logged,) = [row for row in info["log_history"] if "loss" in row]
    assert info["steps"] == 10 and "100% 10/10" in lines[-1] and lines[-1].endswith(f"loss {logged['loss']:.3g}")


def test_sft_trains_the_same_adapter_whatever_the_random_state(tmp_path, tiny_model_dir):
    """Every method and seed of a model starts GRPO from this adapter, and a fresh machine trains it again: the
    LoRA initialisation must come from `sft.seed`, not from whatever the process drew before."""
    import torch

    from atr_grpo.training.sft import train_sft

    cfg = train_config(["experiment=smoke", "sft.max_examples=32", "sft.num_epochs=1"])
    weights = []
    for index, earlier_draws in enumerate((0, 7)):
        torch.manual_seed(1234 + index)
        torch.rand(earlier_draws)
        train_sft(cfg, tmp_path / str(index))
        weights.append((tmp_path / str(index) / "adapter_model.safetensors").read_bytes())
    assert weights[0] == weights[1]


PARENT = (
    "import sys; from pathlib import Path; from atr_grpo.training.stage_process import run_stage; "
    "run_stage('sft', Path(sys.argv[1]))"
)


def test_an_sft_stage_dies_with_the_process_that_started_it(tmp_path, tiny_model_dir):
    """`kill -9` of a run during SFT: its SFT process is gone within seconds, so nothing trains on beside a relaunch
    into the same staging folder (here a 300-epoch stage, which would run for minutes)."""
    import signal
    import subprocess

    import psutil

    from atr_grpo.config_hydra import config_to_yaml
    from atr_grpo.training.stage_process import RUN_CONFIG

    staging = tmp_path / "sft.partial"
    staging.mkdir()
    (staging / RUN_CONFIG).write_text(config_to_yaml(train_config(["experiment=smoke", "sft.num_epochs=300"])))
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(staging)])
    stages: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not stages and time.monotonic() < deadline:
            time.sleep(0.1)
            stages = psutil.Process(parent.pid).children()
        assert len(stages) == 1, stages
        time.sleep(3)  # the stage runs (the kill below comes after its start-up, not before)
        assert stages[0].is_running()
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        gone, alive = psutil.wait_procs(stages, timeout=15)
        assert gone and not alive, "the SFT stage outlived the run that started it"
    finally:
        parent.kill()
        for stage in stages:  # the ones this test started, still running if it failed
            if stage.is_running():
                stage.kill()


def test_a_stage_whose_parent_ended_before_it_started_does_not_run(tmp_path):
    """The parent named in its environment is not its parent (it ended, the stage was given to another): exit 1."""
    import os
    import subprocess

    from atr_grpo.training.stage_process import PARENT_ENV, STAGE_MODULE

    env = {**os.environ, PARENT_ENV: str(os.getppid())}  # the stage's parent is this process, not its parent
    result = subprocess.run(
        [sys.executable, "-m", STAGE_MODULE, "sft", str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert result.returncode == 1 and "the process that started this stage has ended" in result.stderr, result.stderr
