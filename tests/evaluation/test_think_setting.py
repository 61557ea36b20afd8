"""`eval.credit_inside_think`: one setting, decided in the grader, for the training reward, evaluations and regrades.

By default a box that appears only inside `<think>...</think>` scores 0 (TRL's reasoning reward, DAPO's reward);
with the setting on it counts. The config validates and records it; old run directories without it read as false.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from pathlib import Path

import pytest
from conftest import REPO, train_config
from helpers.scripted_generation import FakeTokenizer, ScriptedGenerator
from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.config_hydra import config_from_yaml, config_to_yaml
from atr_grpo.config_training import EvalConfig
from atr_grpo.errors import ConfigError
from atr_grpo.evaluation import SamplingConfig, load_benchmark, read_summary, run_evaluation
from atr_grpo.reporting import regrade
from atr_grpo.results import main as results_main
from atr_grpo.rewards import reward_function

FIXTURES = REPO / "tests" / "fixtures" / "eval"
INSIDE_ONLY = "<think>it is \\boxed{24}</think>So the answer is twenty-four."  # aime24 fixture problem 60: 24
AFTER = "<think>maybe \\boxed{23}</think>The answer is \\boxed{24}."
NEITHER = "<think>it is \\boxed{24}</think>The answer is \\boxed{23}."
EOS = 99  # an end-of-sequence id for the reward's token ids


def test_the_setting_defaults_to_no_credit_is_validated_and_recorded():
    cfg = train_config(["experiment=smoke"])
    assert cfg.eval.credit_inside_think is False
    assert "credit_inside_think: false" in config_to_yaml(cfg)
    on = train_config(["experiment=smoke", "eval.credit_inside_think=true"])
    assert on.eval.credit_inside_think is True
    assert OmegaConf.create(config_to_yaml(on)).eval.credit_inside_think is True
    assert config_from_yaml(config_to_yaml(on)).eval.credit_inside_think is True
    with pytest.raises(ConfigError, match="eval.credit_inside_think"):
        train_config(["experiment=smoke", "eval.credit_inside_think=maybe"])
    with pytest.raises(ConfigError, match=r"eval.credit_inside_think must be true or false, got 'yes'"):
        EvalConfig(credit_inside_think="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("credit", [False, True])
def test_the_training_reward_follows_the_setting(credit):
    reward = reward_function(train_config(["experiment=smoke", f"eval.credit_inside_think={credit}"]), [EOS])
    conversational = [[{"role": "assistant", "content": INSIDE_ONLY}], AFTER, NEITHER]
    ids = [[1, 2, EOS]] * 3  # finished completions
    got = reward(completions=conversational, answer=["24"] * 3, completion_ids=ids, trainer_state=None)
    assert got == [float(credit), 1.0, 0.0]
    assert reward.__name__ == "math_verify_reward"  # the metric rewards/math_verify_reward/mean keeps its name
    again = pickle.loads(pickle.dumps(reward))
    assert again(completions=[INSIDE_ONLY], answer=["24"], completion_ids=ids[:1]) == [float(credit)]


@pytest.mark.slow
def test_the_trl_trainer_is_built_with_the_configured_reward(tmp_path, tiny_model_dir):
    """The non-default value reaches the trainer's reward (the default is the unbound function's)."""
    from atr_grpo.clipping import build_rule
    from atr_grpo.training.trl_backend import build_trl_trainer

    cfg = train_config(["experiment=smoke", "eval.credit_inside_think=true"])
    trainer, _ = build_trl_trainer(cfg, build_rule("clip"), None, tmp_path, "hf")
    assert trainer.reward_func_names == ["math_verify_reward"]
    finished = [[1, trainer.eos_token_ids[0]]] * 2
    got = trainer.reward_funcs[0](completions=[INSIDE_ONLY, NEITHER], answer=["24", "24"], completion_ids=finished)
    assert got == [1.0, 0.0]


def evaluate_once(run_dir: Path, credit: bool) -> dict:
    aime24 = load_benchmark("aime24", FIXTURES / "aime24.jsonl", strict=False)
    script = {"remainder when": [(INSIDE_ONLY, "stop"), (AFTER, "stop")], "": [(NEITHER, "stop")] * 2}
    sampling = SamplingConfig(n=2, temperature=0.3, top_p=0.95, max_tokens=64, seed=0)
    return run_evaluation(
        ScriptedGenerator(script),
        FakeTokenizer(),
        [aime24],
        sampling,
        run_dir,
        0,
        k=2,
        grader_workers=0,
        credit_inside_think=credit,
        show_progress=False,
    )


@pytest.mark.parametrize("credit", [False, True])
def test_evaluation_follows_the_setting_and_records_it(tmp_path, credit):
    evaluate_once(tmp_path, credit)
    samples = rundir.read_jsonl(tmp_path / "eval" / "step_000000" / "aime24.jsonl")
    first = [(s["status"], s["extracted"]) for s in samples if s["problem_id"] == 60]
    assert first == [("correct", "24") if credit else ("no_answer", None), ("correct", "24")]
    line = read_summary(tmp_path)[(0, "aime24")]
    assert line["credit_inside_think"] is credit
    assert line["status_counts"]["correct"] == 1 + credit


def write_config(run_dir: Path, credit: bool | None) -> None:
    """A config.yaml recording the setting (None: a run from before the setting existed)."""
    evaluation = {"benchmarks": ["aime24"]} | ({} if credit is None else {"credit_inside_think": credit})
    OmegaConf.save(
        OmegaConf.create({"experiment": "think", "method": "clip", "seed": 0, "eval": evaluation}),
        run_dir / rundir.CONFIG_FILE,
    )


@pytest.mark.parametrize(
    ("evaluated_with", "recorded", "changed"),
    [(False, None, 0), (False, False, 0), (True, True, 0), (False, True, 1), (True, False, 1)],
)
def test_regrade_uses_the_setting_the_run_recorded(tmp_path, evaluated_with, recorded, changed):
    run = tmp_path / "runs" / "think__clip__s0"
    evaluate_once(run, evaluated_with)
    write_config(run, recorded)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert results_main(["regrade", "--runs", str(tmp_path / "runs"), "--workers", "0", "--no-progress"]) == 0
    assert f"{changed} of 6 verdicts changed in 1 runs" in out.getvalue()
    (line,) = rundir.read_jsonl(regrade.summary_path(run, regrade.grader_identity()["tag"]))
    assert line["credit_inside_think"] is (recorded is True) and line["changed"] == changed
