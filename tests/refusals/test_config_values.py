"""A value or key that the config schema refuses fails at composition, before any model is loaded, with the key and
the allowed values or keys in the message; from the command line, with exit status 2 and no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, compose, train_config

from atr_grpo.errors import ConfigError

BAD = [
    # (overrides, words the error must contain)
    (["clipping=atr", "clipping.delta=0"], ["clipping", "delta", "> 0"]),
    (["clipping=kl2", "clipping.delta=-0.1"], ["delta", "> 0"]),
    (["clipping=clip", "clipping.eps=1.5"], ["eps", "(0, 1)"]),
    (["clipping=clip_higher", "clipping.eps_low=0"], ["eps_low", "(0, 1)"]),
    (["clipping=dual_clip", "clipping.c=1.1"], ["c", "1 + eps_high"]),
    (["clipping=atr", "clipping.semantics=hard"], ["semantics", "'min'", "'mask'"]),
    (["trainer.num_generations=7"], ["trainer.per_device_train_batch_size", "num_generations=7"]),
    (["trainer.per_device_train_batch_size=3"], ["trainer.gradient_accumulation_steps", "num_generations=8"]),
    (["rollout.steps_per_generation=6"], ["rollout.steps_per_generation", "multiple of"]),
    (["trainer.save_steps=25"], ["trainer.save_steps", "rollout"]),
    (["eval.k=16"], ["eval.k", "[1, eval.n=8]"]),
    (["eval.benchmarks=[amc23,gsm8k]"], ["eval.benchmarks", "'aime24'", "'arithmetic'"]),
    (["+eval.paths.gsm8k=x.jsonl"], ["eval.paths", "'amc23'"]),
    (["trainer.max_completion_length=4096"], ["trainer.max_completion_length", "model.max_seq_length"]),
    (["trainer.loss_agg=sum"], ["trainer.loss_agg", "'dr_grpo'", "'token_mean'"]),
    (["trainer.kl_estimator=k4"], ["trainer.kl_estimator", "'k1'", "'k3'"]),
    (["data.source=s3"], ["data.source", "'hub'", "'file'", "'arithmetic'"]),
    (["data.source=file"], ["data.path", "set when data.source='file'"]),
    (["data.path=dapo.parquet"], ["data.path", "data.source=file"]),
    (["sft.source=file"], ["sft.path", "set when sft.source='file'"]),
    (["sft.hub_id=null"], ["sft.hub_id", "sft.source='hub'"]),
    (["experiment=demo", "data.operations=[/]"], ["data.operations", "'+'", "'*'"]),
    (["trainer.backend=jax"], ["trainer.backend", "'unsloth'", "'trl'"]),
    (["logger.name=tensorboard"], ["logger.name", "'wandb'", "'none'"]),
    (["model.lora.dropout=1.5"], ["model.lora.dropout", "[0, 1)"]),
    (["rollout.num_iterations=0"], ["rollout.num_iterations", ">= 1"]),
    # accepted silently before: a TV band with δ >= 1 constrains nothing; an empty study; an SFT seed that fails
    # inside the SFT stage, after the run folder exists
    (["clipping=bandpo_tv", "clipping.delta=1.0"], ["rule 'bandpo_tv'", "'delta' must be a number in (0, 1)"]),
    (["study="], ["study must be a non-empty name", "got ''"]),
    (["sft.seed=-1"], ["sft.seed must be in [0, 2**32 - 1]", "got -1"]),
    (["sft.seed=4294967296"], ["sft.seed must be in [0, 2**32 - 1]", "got 4294967296"]),
    # adaptive δ: keys of the δ-rules only, and settings that contradict each other (clipping/adaptive_delta.py)
    (["clipping=clip", "clipping.target_kl3=0.01"], ["'clipping.target_kl3'", "allowed keys: name, eps", "atr"]),
    (["clipping=cispo", "+clipping.delta_schedule=linear"], ["'clipping.delta_schedule'", "threshold δ"]),
    (["clipping.delta_schedule=linear"], ["clipping.delta_final", "delta_schedule=linear"]),
    (["clipping.delta_final=0.03"], ["clipping.delta_final", "linear and cosine"]),
    (["clipping.delta_schedule=step"], ["clipping.delta_schedule", "'constant'", "'cosine'"]),
    (["clipping.target_kl3=-1"], ["clipping.target_kl3", "> 0"]),
    (["clipping.target_kl3=0.01", "clipping.delta_schedule=cosine", "clipping.delta_final=0.03"], ["choose one"]),
    (["clipping.target_kl3=0.01", "clipping.delta=0.9"], ["clipping.delta", "[0.01, 0.5]"]),
    (["clipping.target_kl3=0.01", "clipping.delta_min=0.6"], ["clipping.delta_min", "delta_max=0.5"]),
    (["clipping.target_kl3=0.01", "rollout=on_policy"], ["clipping.target_kl3", "on-policy"]),
    # the rollout correction (rollout_correction.py)
    (["rollout.correction=tis", "rollout.engine=hf"], ["rollout.correction", "'none' with rollout.engine='hf'"]),
    (["rollout.correction=is"], ["rollout.correction", "'none'", "'tis'", "'mis'"]),
    (["rollout.correction_level=batch"], ["rollout.correction_level", "'token'", "'sequence'"]),
    (["rollout.correction_max=0.9"], ["rollout.correction_max", ">= 1"]),
    (["rollout.correction_min=1.5"], ["rollout.correction_min", "(0, 1]"]),
    (["rollout.correction=mis", "rollout.correction_max=null"], ["rollout.correction_min or"]),
    (["+trainer.vllm_importance_sampling_correction=true"], ["rollout.correction=none|tis|mis"]),
]


@pytest.mark.parametrize("overrides,words", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_values_fail_with_the_key_and_the_allowed_values(overrides, words):
    with pytest.raises(ConfigError) as err:
        train_config(overrides)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_an_unknown_rule_lists_the_available_ones():
    with pytest.raises(ConfigError) as err:
        compose(["clipping=ppo_kl"])
    message = str(err.value)
    assert "clipping=ppo_kl" in message and "atr" in message and "clip_higher" in message


UNKNOWN_KEYS = [
    # (overrides, the key named, keys the message must list)
    (["trainer.lr=1e-5"], "'trainer.lr' is not a key of trainer", ["learning_rate", "num_generations", "bf16"]),
    (["clipping=atr", "clipping.eps=0.2"], "'clipping.eps' is not a key of clipping", ["name, delta, semantics"]),
    (["model.lora.rank=8"], "'model.lora.rank' is not a key of model.lora", ["r, alpha, dropout, target_modules"]),
    (["lr=1e-5"], "'lr' is not a key of the root config", ["seed", "trainer", "clipping"]),
    # `+` adds a key (Hydra's own hint for the error above); the schema refuses it all the same
    (["+trainer.lr=1e-5"], "'trainer.lr' is not a key of trainer", ["learning_rate"]),
]


@pytest.mark.parametrize("overrides,named,allowed", UNKNOWN_KEYS, ids=[" ".join(o) for o, _, _ in UNKNOWN_KEYS])
def test_a_misspelled_key_names_the_allowed_keys(overrides, named, allowed):
    """The allowed keys come from the schema's dataclass fields, so the message follows the schema."""
    with pytest.raises(ConfigError) as err:
        train_config(overrides)
    assert named in str(err.value)
    for words in allowed:
        assert words in str(err.value), (words, str(err.value))


CLI_ERRORS = [
    # (app and arguments, words stderr must contain): a value the schema refuses, and misspelled keys (Hydra's
    # composition errors, which reach `run_app` rather than Hydra's own exit status 1)
    (["train", "experiment=smoke", "clipping.delta=0"], ["clipping", "delta", "> 0"]),
    (["train", "experiment=smoke", "trainer.lr=1e-5"], ["'trainer.lr' is not a key of trainer", "learning_rate"]),
    (["evaluate", "model=tiny", "eval.temp=0.5"], ["'eval.temp' is not a key of eval", "temperature, top_p"]),
]


@pytest.mark.parametrize(  # each case starts Python: test-fast keeps the first
    "args,words",
    [
        pytest.param(*case, id=" ".join(case[0]), marks=pytest.mark.slow if i else ())
        for i, case in enumerate(CLI_ERRORS)
    ],
)
def test_the_cli_reports_bad_input_and_exits_2_without_a_traceback(args, words, tmp_path):
    """Exit status 2 and the message, before a run starts: Hydra has made the run directory by the time a
    value is checked, but no run file is written."""
    app, *overrides = args
    out = tmp_path / "run"
    target = [f"run_dir={out}"] if app == "train" else [f"out_dir={out}"]
    done = subprocess.run(
        [sys.executable, "-m", f"atr_grpo.{app}", *overrides, *target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr, (word, done.stderr)
    assert not (out / "config.yaml").exists()
