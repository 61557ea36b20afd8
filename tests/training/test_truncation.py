"""A completion that runs out of tokens: one definition for the reward, the loss mask and the evaluation.

The laws: under each `trainer.truncation` setting a completion with the right box and no end token at the budget
earns what the setting says, the evaluator calls the same sample "truncated" (never correct), and both trainer
paths mark and mask the same completions of a batch.
"""

from __future__ import annotations

import pytest
import torch
from conftest import train_config
from transformers import TrainerState

from atr_grpo.clipping import build_rule
from atr_grpo.config_hydra import config_from_yaml, config_to_yaml
from atr_grpo.errors import ConfigError
from atr_grpo.evaluation.grader import grade_sample
from atr_grpo.losses import LossSettings
from atr_grpo.rewards import reward_function, truncation_rule
from atr_grpo.training.rule_trainer import RuleTrainerMixin
from atr_grpo.training.unsloth_trainer import UnslothRuleTrainerMixin
from atr_grpo.truncation import Truncation, finish_reason, is_truncated, stop_token_ids

EOS, PAD, BUDGET = 9, 0, 6
RIGHT_BOX = "so the sum is \\boxed{24} and then"
CUT = [5, 5, 5, 5, 5, 5]  # BUDGET tokens, no end token
FINISHED_AT_BUDGET = [5, 5, 5, 5, 5, EOS]
SHORT = [5, 5, EOS]


def config(*overrides: str):
    return train_config(["experiment=smoke", f"trainer.max_completion_length={BUDGET}", *overrides])


def reward_of(setting: str, ids: list[int], *extra: str) -> float:
    reward = reward_function(config(f"trainer.truncation={setting}", *extra), [EOS])
    return reward(completions=[RIGHT_BOX], answer=["24"], completion_ids=[ids])[0]


def test_truncated_means_the_budget_reached_without_an_end_token():
    assert is_truncated(CUT, BUDGET, [EOS])
    assert not is_truncated(FINISHED_AT_BUDGET, BUDGET, [EOS]), "an end token as the last allowed token finishes"
    assert not is_truncated(SHORT, BUDGET, [EOS])
    assert not is_truncated(CUT, BUDGET, [EOS, 5]), "any of the end tokens ends the completion"
    assert [finish_reason(ids, BUDGET, [EOS]) for ids in (CUT, FINISHED_AT_BUDGET, SHORT)] == ["length", "stop", "stop"]


@pytest.mark.parametrize(
    ("setting", "want"),
    [("zero", 0.0), ("mask", 0.0), ("soft_overlong", -1.0), ("credit_box", 1.0)],
)
def test_each_setting_rewards_a_right_box_cut_at_the_budget_as_it_says(setting, want):
    assert reward_of(setting, CUT) == want
    # the evaluation reads the same ids with the same function, and never credits the sample
    status = grade_sample(RIGHT_BOX, "24", finish_reason(CUT, BUDGET, [EOS]))
    assert (status.status, status.correct, status.extracted) == ("truncated", False, "24")


@pytest.mark.parametrize("setting", ["zero", "mask", "credit_box"])
def test_a_finished_completion_is_graded_alike_under_every_setting(setting):
    assert reward_of(setting, FINISHED_AT_BUDGET) == reward_of(setting, SHORT) == 1.0
    assert grade_sample(RIGHT_BOX, "24", finish_reason(FINISHED_AT_BUDGET, BUDGET, [EOS])).correct


def test_soft_overlong_ramps_linearly_over_dapos_buffer():
    """DAPO Eq. 13: 0 up to budget − buffer, then −(length − (budget − buffer))/buffer, −1 at the budget."""
    rule = Truncation("soft_overlong", budget=20480, stop_ids=(EOS,))
    assert rule.overlong_buffer == 4096, "DAPO's 4,096 of 20,480 tokens"
    assert [rule.length_penalty(n) for n in (100, 16384, 18432, 20480)] == [0.0, 0.0, -0.5, -1.0]
    custom = Truncation("soft_overlong", budget=10, stop_ids=(EOS,), buffer=4, penalty=0.5)
    assert [custom.length_penalty(n) for n in (6, 7, 10)] == [0.0, -0.125, -0.5]
    assert reward_of("soft_overlong", FINISHED_AT_BUDGET, "trainer.overlong_buffer=2") == 0.0  # 1 − 1
    assert reward_of("soft_overlong", [5, 5, 5, 5, EOS], "trainer.overlong_buffer=2") == 0.5  # 1 − 1/2
    assert Truncation("zero", budget=10, stop_ids=(EOS,)).length_penalty(10) == 0.0


def test_the_reward_refuses_to_guess_truncation():
    reward = reward_function(config(), [EOS])
    with pytest.raises(ValueError, match="completion_ids"):
        reward(completions=[RIGHT_BOX], answer=["24"])


def test_the_setting_is_checked_and_recorded():
    cfg = config()
    assert cfg.trainer.truncation == "zero", "the default scores a truncated completion as the evaluation does"
    assert "truncation: zero" in config_to_yaml(cfg)
    assert config_from_yaml(config_to_yaml(config("trainer.truncation=mask"))).trainer.truncation == "mask"
    refusals = {
        "trainer.truncation=maybe": r"trainer.truncation must be one of 'zero', 'mask', 'soft_overlong', 'credit_box'",
        "trainer.overlong_buffer=2": r"trainer.overlong_buffer must be null unless truncation=soft_overlong",
        "trainer.overlong_penalty=2": r"trainer.overlong_penalty must be 1.0 unless truncation=soft_overlong",
    }
    for override, message in refusals.items():
        with pytest.raises(ConfigError, match=message):
            config(override)
    with pytest.raises(ConfigError, match=r"trainer.overlong_buffer must be null or in \[1, .* = 6\], got 7"):
        config("trainer.truncation=soft_overlong", "trainer.overlong_buffer=7")


def test_a_config_from_before_the_setting_is_refused_not_reinterpreted():
    text = config_to_yaml(config()).replace("truncation: zero", "mask_truncated_completions: false")
    with pytest.raises(ConfigError, match="predates trainer.truncation"):
        config_from_yaml(text)


class Generated:
    """The GRPOTrainer method the mixin wraps: a scored rollout batch as TRL returns it (mask up to the first EOS)."""

    def _generate_and_score_completions(self, inputs):
        ids = torch.tensor([CUT, FINISHED_AT_BUDGET, [*SHORT, PAD, PAD, PAD]])
        mask = torch.tensor([[1] * 6, [1] * 6, [1, 1, 1, 0, 0, 0]])
        return {"completion_ids": ids, "completion_mask": mask, "advantages": torch.tensor([0.5, -0.2, -0.3])}

    def compute_loss(self, model, inputs, *args, **kwargs):
        return torch.tensor(0.0)


class TRLPath(RuleTrainerMixin, Generated):
    pass


class UnslothPath(UnslothRuleTrainerMixin, RuleTrainerMixin, Generated):
    pass


def built(path, setting: str):
    trainer = path.__new__(path)
    truncation = truncation_rule(config(f"trainer.truncation={setting}"), [EOS])
    RuleTrainerMixin._setup_rule(
        trainer, build_rule("clip"), LossSettings(max_completion_length=BUDGET), None, truncation
    )
    trainer.model = type("Model", (), {"training": True})()
    trainer.state = TrainerState()  # the mixin records each generation batch's prompts under the step it trains
    trainer.accelerator = type("Accelerator", (), {"num_processes": 1})()
    return trainer


@pytest.mark.parametrize("setting", ["zero", "mask", "soft_overlong", "credit_box"])
def test_both_trainer_paths_mark_and_mask_the_same_completions(setting):
    batches = [built(path, setting)._generate_and_score_completions([]) for path in (TRLPath, UnslothPath)]
    for batch in batches:
        assert batch["truncated"].tolist() == [True, False, False]
        assert batch["completion_mask"].sum(dim=1).tolist() == [6, 6, 3], "the model still reads every completion"
        loss_mask = batch["completion_mask"] * batch.get("tool_mask", 1)  # what both paths' losses use
        kept = [0, 1, 1] if setting == "mask" else [1, 1, 1]  # only `mask` drops the cut completion's tokens
        assert loss_mask.sum(dim=1).tolist() == [6 * kept[0], 6, 3]
    for key in ("completion_mask", "tool_mask"):
        assert torch.equal(batches[0].get(key, torch.ones(1)), batches[1].get(key, torch.ones(1)))


def test_each_training_step_records_the_truncated_fraction():
    trainer = built(TRLPath, "zero")
    batch = trainer._generate_and_score_completions([])
    trainer.compute_loss(None, batch)
    trainer.compute_loss(None, {**batch, "truncated": torch.tensor([False, False, False])})
    assert trainer._step_stats.reduce()["completions/truncated_frac"] == pytest.approx(1 / 6)


def test_each_training_step_counts_its_completions_by_finish_reason():
    """`length` (ran out of tokens) and `stop` (ended at a stop token) are counts over the step's micro-batches, the
    truncated share's numerator and its complement."""
    trainer = built(TRLPath, "zero")
    batch = trainer._generate_and_score_completions([])
    trainer.compute_loss(None, batch)  # one cut, two that stopped
    trainer.compute_loss(None, {**batch, "truncated": torch.tensor([True, True, False])})
    logged = trainer._step_stats.reduce()
    assert (logged["completions/finish_length"], logged["completions/finish_stop"]) == (3, 3)
    assert logged["completions/truncated_frac"] == pytest.approx(3 / 6)


def test_a_trainer_that_stops_on_other_tokens_is_refused():
    trainer = built(TRLPath, "zero")
    trainer.eos_token_ids = [EOS, 7]
    with pytest.raises(RuntimeError, match=r"stops completions on token ids \[7, 9\], the truncation rule on \[9\]"):
        trainer.check_stop_ids()


def test_stop_ids_come_from_the_generation_config_and_the_tokenizer():
    generation = type("Generation", (), {"eos_token_id": [3, 4]})()
    model = type("Model", (), {"generation_config": generation})()
    assert stop_token_ids(model, type("Tok", (), {"eos_token_id": 2})()) == (2, 3, 4)
    with pytest.raises(ValueError, match="eos_token_id"):
        stop_token_ids(None, None)
