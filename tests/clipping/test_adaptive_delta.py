"""Adaptive δ for the rules with a threshold δ: the schedules' closed forms, the controller's laws and bounds, δ as a
tensor giving exactly the float δ's loss, the trainer's step hook and checkpoint file, and the configs that refuse
adaptive δ where it cannot mean anything."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import train_config
from helpers.rule_inputs import extras_for, loss_and_grad

from atr_grpo.clipping import build_rule
from atr_grpo.clipping.adaptive_delta import ERROR_CLIP, controlled_delta, delta_rules, scheduled_delta
from atr_grpo.losses import LossSettings
from atr_grpo.rundir import layout
from atr_grpo.training.delta_control import DeltaControl
from atr_grpo.training.rule_trainer import DeltaStep, RuleTrainerMixin, delta_control

TARGET = 0.01


def controller(**settings) -> DeltaControl:
    return DeltaControl(initial=0.07, total_steps=100, steps_per_rollout=2, settings={"target_kl3": TARGET, **settings})


def run_controller(control: DeltaControl, measured: float, steps: int) -> list[float]:
    """δ after each of `steps` optimizer steps that all measured `measured` (fresh and reused alike)."""
    trace = []
    for step in range(1, steps + 1):
        control.observe(measured, tokens=100)
        control.end_step(step)
        trace.append(control.delta)
    return trace


# ------------------------------------------------------------------------------------------- schedules
@pytest.mark.parametrize(
    ("schedule", "progress", "expected"),
    [
        ("linear", 0.0, 0.09),
        ("linear", 0.25, 0.09 - 0.25 * 0.06),
        ("linear", 1.0, 0.03),
        ("cosine", 0.5, 0.06),
        ("cosine", 1 / 3, 0.03 + 0.06 * 0.5 * (1 + math.cos(math.pi / 3))),
        ("constant", 0.7, 0.09),
        ("linear", 1.5, 0.03),  # past the end: δ₁
    ],
)
def test_schedules_follow_their_closed_forms(schedule, progress, expected):
    """δ = δ₁ + (δ₀ − δ₁)·f(p), f_linear = 1 − p, f_cosine = ½(1 + cos πp), p clamped to [0, 1]."""
    assert scheduled_delta(0.09, 0.03, schedule, progress) == pytest.approx(expected, abs=1e-15)


def test_a_scheduled_run_trains_its_first_step_with_delta_0_and_its_last_with_delta_1():
    control = DeltaControl(0.09, total_steps=5, settings={"delta_schedule": "linear", "delta_final": 0.03})
    used = [control.delta]
    for step in range(1, 5):
        control.end_step(step)
        used.append(control.delta)
    assert used == pytest.approx([0.09, 0.075, 0.06, 0.045, 0.03], abs=1e-15)


# ------------------------------------------------------------------------------------------ controller
def test_kl3_above_the_target_shrinks_delta_monotonically_to_delta_min():
    trace = run_controller(controller(), 2 * TARGET, 600)
    assert all(b <= a for a, b in zip(trace, trace[1:]))
    assert trace[0] == 0.07 > trace[1] and trace[-1] == pytest.approx(0.01)  # step 1 is fresh: no signal


def test_kl3_below_the_target_widens_delta_monotonically_to_delta_max():
    trace = run_controller(controller(), TARGET / 2, 600)
    assert all(b >= a for a, b in zip(trace, trace[1:]))
    assert trace[0] == 0.07 < trace[1] and trace[-1] == pytest.approx(0.5)


def test_kl3_at_the_target_leaves_delta_unchanged():
    assert set(run_controller(controller(), TARGET, 20)) == {0.07}


@pytest.mark.parametrize("measured", [0.0, 1e-9, 0.5 * TARGET, 0.99 * TARGET, 1.01 * TARGET, 3 * TARGET, 1e3])
@pytest.mark.parametrize("rate", [0.1, 1.0])
def test_one_step_moves_delta_by_at_most_exp_of_0_2_rate(measured, rate):
    """|log δ' − log δ| ≤ 0.2·η, with equality once the relative error passes ±0.2."""
    moved = math.log(controlled_delta(0.07, measured, TARGET, rate, 0.01, 0.5) / 0.07)
    assert abs(moved) <= ERROR_CLIP * rate + 1e-12
    error = measured / TARGET - 1
    expected = -rate * max(-ERROR_CLIP, min(ERROR_CLIP, error))
    assert moved == pytest.approx(expected, abs=1e-12)


def test_only_steps_that_reuse_a_rollout_move_delta():
    """The first step after a generation is on-policy (KL3 ≡ 0 whatever δ is): it must not widen δ."""
    control = controller()
    deltas = []
    for step in (1, 2, 3, 4):  # two optimizer steps per rollout: 1 and 3 fresh, 2 and 4 reused
        control.observe(0.0 if step % 2 else 2 * TARGET, tokens=50)
        control.end_step(step)
        deltas.append(control.delta)
    shrink = math.exp(-0.1 * ERROR_CLIP)
    assert deltas == pytest.approx([0.07, 0.07 * shrink, 0.07 * shrink, 0.07 * shrink**2], rel=1e-12)


def test_the_measured_kl3_is_the_token_weighted_mean_pooled_over_processes():
    """Micro-batches pool by token count, processes through the all-reduce: m = Σ kl3·n / Σ n over everything."""
    control = controller(delta_rate=1.0)
    control.observe(0.0104, tokens=300)  # alone it would be +4 %
    control.observe(0.0094, tokens=100)
    other_process = torch.tensor([0.0100 * 600, 600], dtype=torch.float64)

    def all_reduce(tensor, op):
        assert op == "sum"
        return tensor + other_process

    control.end_step(2, all_reduce)
    measured = (0.0104 * 300 + 0.0094 * 100 + 0.0100 * 600) / 1000
    assert control.delta == pytest.approx(0.07 * math.exp(-(measured / TARGET - 1)), rel=1e-12)


def test_the_state_round_trips_and_another_runs_state_is_refused():
    control = controller()
    run_controller(control, 3 * TARGET, 6)
    restored = controller()
    restored.load_state_dict(control.state_dict())
    assert restored.delta == control.delta != 0.07
    with pytest.raises(ValueError, match="differ from this run"):
        controller(target_kl3=0.02).load_state_dict(control.state_dict())


# -------------------------------------------------------------------------------------- δ as a tensor
@pytest.mark.parametrize("name", delta_rules())
@pytest.mark.parametrize("delta", [0.02, 0.07, 0.3])
def test_a_tensor_delta_gives_exactly_the_rule_built_with_that_delta(name, delta):
    """Every δ-rule: terms(batch, delta=tensor) is bitwise the rule constructed with that δ, in loss and gradient."""
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(6, 10, generator=g) * 3
    logp = old + torch.randn(6, 10, generator=g) * 0.5
    mask = torch.rand(6, 10, generator=g) > 0.2
    advantages = torch.randn(6, generator=g)
    built = build_rule(name, delta=delta)
    extras = extras_for(built, logp)
    want, want_grad = loss_and_grad(built, logp, old, advantages, mask, **extras)
    default = build_rule(name)  # δ = 0.07: the tensor must override it
    got, got_grad = loss_and_grad(default, logp, old, advantages, mask, delta=torch.tensor(delta), **extras)
    assert torch.equal(got.loss, want.loss) and torch.equal(got_grad, want_grad)
    assert got.metrics == want.metrics


# ------------------------------------------------------------------------------------- the trainer glue
class TrainerStandIn:
    """What the mixin's δ and checkpoint hooks use of a transformers Trainer: state, args, callbacks, checkpoint
    folders (written where `_get_output_dir` says, as transformers does), the barrier between processes."""

    def __init__(self, output_dir):
        self.state = SimpleNamespace(global_step=0)
        self.args = SimpleNamespace(should_save=True, output_dir=str(output_dir), seed=0, save_total_limit=None)
        self.accelerator = SimpleNamespace(wait_for_everyone=lambda: None)
        self.callback_handler = SimpleNamespace(callbacks=[])
        self.trained_from = None

    def add_callback(self, callback):
        self.callback_handler.callbacks.append(callback)

    def _get_output_dir(self, trial):
        return self.args.output_dir

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        self.trained_from = resume_from_checkpoint

    def _save_checkpoint(self, model, trial):
        (Path(self._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}").mkdir(parents=True)


class StepTrainer(RuleTrainerMixin, TrainerStandIn):
    def __init__(self, control, output_dir):
        self._setup_rule(build_rule("atr"), LossSettings(max_completion_length=8), control)
        TrainerStandIn.__init__(self, output_dir)


def micro_batch(seed, shift):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 6, generator=g) * 2
    return old + shift, old, torch.randn(4, generator=g), torch.ones(4, 6, dtype=torch.bool)


def test_the_trainer_passes_delta_as_a_tensor_logs_it_and_moves_it_after_each_step(tmp_path):
    """rule_extras carries the δ in force; record_loss logs it as clip/delta and feeds kl/kl3_mean to the
    controller; the step hook (added by train) moves δ after a reused step and the checkpoint saves it."""
    from atr_grpo.losses import grpo_loss

    trainer = StepTrainer(controller(delta_rate=1.0), tmp_path)
    trainer.train()
    (hook,) = trainer.callback_handler.callbacks
    assert isinstance(hook, DeltaStep)
    logged = []
    for step, shift in ((1, 0.0), (2, 0.3)):  # a fresh step, then a reused one far beyond the target
        like = torch.zeros(4, 6)
        extras = trainer.rule_extras(None, None, None, 6, like, has_old=True)
        assert extras["delta"].dim() == 0 and extras["delta"].item() == pytest.approx(trainer.delta_control.delta)
        logp, old, advantages, mask = micro_batch(step, shift)
        result = grpo_loss(trainer.rule, logp, old, advantages, mask, trainer.loss_settings, extras=extras)
        trainer.record_loss(result)
        logged.append(trainer._step_stats.reduce())
        trainer.state.global_step = step
        hook.on_step_end(trainer.args, trainer.state, None)
    assert [row["clip/delta"] for row in logged] == pytest.approx([0.07, 0.07])
    assert logged[1]["kl/kl3_mean"] > 1.2 * TARGET
    assert trainer.delta_control.delta == pytest.approx(0.07 * math.exp(-ERROR_CLIP), rel=1e-12)
    trainer._save_checkpoint(None, None)
    saved = tmp_path / "checkpoint-2" / layout.DELTA_STATE_FILE
    assert saved.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]  # renamed into place

    resumed = StepTrainer(controller(delta_rate=1.0), tmp_path)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.delta_control.delta == trainer.delta_control.delta
    assert resumed.trained_from == str(tmp_path / "checkpoint-2")
    saved.unlink()
    with pytest.raises(FileNotFoundError, match="cannot be restored"):
        StepTrainer(controller(), tmp_path).train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


@pytest.mark.parametrize("content", ['{"delta": 0.0', '{"delta": 0.05}', "[1, 2]"])
def test_a_damaged_delta_state_is_named_in_one_line(tmp_path, content):
    """Cut off, or valid JSON that is not this run's δ state: a RunFileError naming the file, not a traceback."""
    from atr_grpo.rundir import RunFileError

    (tmp_path / "checkpoint-2").mkdir()
    path = tmp_path / "checkpoint-2" / layout.DELTA_STATE_FILE
    path.write_text(content)
    with pytest.raises(RunFileError, match=f"^{path}: ") as err:
        StepTrainer(controller(), tmp_path).train(resume_from_checkpoint=str(path.parent))
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------- configs
def test_a_run_of_a_delta_rule_gets_its_delta_control_and_other_rules_none():
    cfg = train_config(["experiment=smoke", "clipping=atr_seq", "clipping.target_kl3=0.02", "clipping.delta=0.05"])
    control = delta_control(cfg)
    assert (control.initial, control.settings["target_kl3"], control.steps_per_rollout) == (0.05, 0.02, 2)
    assert control.total_steps == cfg.trainer.max_steps and control.adapts
    assert not delta_control(train_config(["experiment=smoke"])).adapts
    assert delta_control(train_config(["experiment=smoke", "clipping=gspo"])) is None


def test_adaptive_runs_are_named_by_their_delta_settings():
    """Run names tell a controlled or scheduled run from a constant-δ one (a target key ending in a digit gets `_`)."""
    assert train_config(["clipping.target_kl3=0.01"]).method == "atr-target_kl3_0.01"
    scheduled = ["clipping=kl2", "clipping.delta_schedule=cosine", "clipping.delta_final=0.03"]
    assert train_config(scheduled).method == "kl2-delta_schedulecosine-delta_final0.03"


def test_a_non_finite_kl3_is_left_out_of_the_update_and_said_so(caplog):
    """A NaN kl/kl3_mean (a broken batch) must neither turn δ into NaN nor pass unnoticed."""
    control = controller(delta_rate=1.0)
    control.observe(math.nan, tokens=100)
    control.observe(2 * TARGET, tokens=100)
    with caplog.at_level("WARNING", logger="atr_grpo.training.delta_control"):
        control.end_step(2)
    assert control.delta == pytest.approx(0.07 * math.exp(-ERROR_CLIP), rel=1e-12)
    assert "step 2: 1 micro-batches with a non-finite kl/kl3_mean" in caplog.text
