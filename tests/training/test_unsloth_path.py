"""The Unsloth path: our `grpo_compute_loss`, run inside unsloth_zoo's real `UnslothEfficientGRPO`
(`torch.func.grad_and_value` under a fullgraph `torch.compile`), gives the TRL path's loss and gradient for
every rule, whatever padding layout Unsloth repacks the batch into, and logs the same metrics. How unsloth_zoo is
loaded on a CPU machine: tests/helpers/compiled_loss.py.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from unittest.mock import patch

import pytest
import torch
from conftest import rules_at_risk, rules_of_each_kind, slow_beyond
from helpers import toy_rules
from helpers.compiled_loss import (
    GA,
    MAX_LEN,
    MICRO_STEP,
    SETTINGS,
    compiled_equals_trl,
    compiled_left_packed,
    efficient_grpo,
    engine_logp,
    installed,
    left_packed,
    loaded_zoo,
    random_batch,
    stand_in_providers,
    trainer_side,
    trl_path,
    unsloth_kwargs,
)

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.errors import ConfigError
from atr_grpo.losses import LossSettings, aggregate
from atr_grpo.rollout_correction import RolloutCorrection
from atr_grpo.training.extras import TRAINER_PROVIDERS
from atr_grpo.training.rule_trainer import RuleTrainerMixin
from atr_grpo.training.unsloth_loss import (
    compact_valid,
    decode_extras,
    encode_extras,
    expand_compact,
)
from atr_grpo.training.unsloth_trainer import check_trainer_settings, neutralise_overrides


@pytest.fixture(scope="module")
def zoo():
    with loaded_zoo() as zoo_loss:
        yield zoo_loss


def test_compact_layout_round_trip():
    """Per-token extras survive TRL's right padding → compact → Unsloth's left-packed layout."""
    logp, _, _, mask, full_kl = random_batch(1)
    packed, packed_mask = left_packed(full_kl, mask, pad=4)
    compact = compact_valid(full_kl, mask)
    assert torch.equal(expand_compact(compact, packed_mask), packed)
    assert torch.equal(expand_compact(compact, mask), full_kl * mask)


def test_per_sequence_and_scalar_extras_travel_as_they_are():
    """A `[B, T]` extra is compacted and comes back in the packed layout; a `[B, 1]` one (per sequence) and a 0-d
    one come back unchanged: repacking moves tokens within a row, never rows."""
    _, _, _, mask, full_kl = random_batch(1)
    per_sequence = torch.arange(1.0, mask.shape[0] + 1).unsqueeze(1)
    seed = torch.tensor(5)
    kwargs = encode_extras({"full_kl": full_kl, "sequence_scale": per_sequence, "key_seed": seed}, mask)
    packed, packed_mask = left_packed(full_kl, mask, pad=4)
    decoded = decode_extras({**kwargs, "unrelated": torch.ones(1)}, packed_mask.bool())
    assert set(decoded) == {"full_kl", "sequence_scale", "key_seed"}
    assert torch.equal(decoded["full_kl"], packed)
    assert decoded["sequence_scale"] is per_sequence and decoded["key_seed"] is seed


@pytest.mark.parametrize("name", slow_beyond(sorted(RULES), rules_of_each_kind()))
def test_compiled_unsloth_loss_equals_trl_path(zoo, name):
    compiled_equals_trl(zoo, name)


@pytest.mark.parametrize("name", slow_beyond(sorted(RULES), rules_of_each_kind()))
def test_left_packed_layout_gives_the_same_loss(zoo, name):
    compiled_left_packed(zoo, name)


class FakeTrainer(RuleTrainerMixin):
    """The attributes of a GRPOTrainer that the accumulated-loss wrapper uses."""

    def __init__(self, rule, full_kl):
        self._setup_rule(rule, SETTINGS)
        self.args = SimpleNamespace(seed=0)
        self.state = SimpleNamespace(global_step=3)
        self._step = MICRO_STEP  # TRL's count of micro-batches in an uninterrupted run
        self.current_gradient_accumulation_steps = GA
        self.accelerator = SimpleNamespace(process_index=0, unwrap_model=lambda model: model)
        self.model = SimpleNamespace(training=True)
        self.temperature = 1.0
        self._full_kl = full_kl

    def rule_extras(self, model, input_ids, attention_mask, logits_to_keep, like, has_old):
        with patch.dict(TRAINER_PROVIDERS, stand_in_providers(self._full_kl)):
            return super().rule_extras(model, input_ids, attention_mask, logits_to_keep, like, has_old)


# the paper's rule and every rule at risk in the compiled loss: extras, per-sequence or batch terms, any other trait
WRAPPED_RULES = sorted({"atr"} | rules_at_risk())


def zoo_like_accumulated_loss(zoo, logp, pad=3):
    """What zoo's grpo_accumulated_loss does with the rule's kwargs: left-pack, score (here: `logp`), then one
    UnslothEfficientGRPO call; the gradient it computed is left in `.grad`."""

    def grpo_accumulated_loss(
        trainer,
        input_ids,
        attention_mask,
        logits_to_keep,
        completion_mask,
        advantages,
        old_logps,
        ref_logps,
        n_chunks=-1,
        tool_mask=None,
        sampling_per_token_logps=None,
        **kwargs,
    ):
        packed_logp, packed_mask = left_packed(logp, completion_mask, pad)
        packed_old, _ = left_packed(old_logps, completion_mask, pad)
        packed_sampling = None
        if sampling_per_token_logps is not None:  # zoo's align_logprobs_with_mask
            packed_sampling, _ = left_packed(sampling_per_token_logps, completion_mask, pad)
        leaf = packed_logp.requires_grad_()
        zoo_args = (leaf, packed_old, None, packed_sampling, torch.empty(1), torch.zeros_like(packed_mask), packed_mask)
        outputs = zoo.UnslothEfficientGRPO.apply(*zoo_args, advantages, 0.0, None, 1, kwargs, None)
        outputs[0].backward()
        grpo_accumulated_loss.grad = leaf.grad
        return (*outputs, packed_mask)

    return grpo_accumulated_loss


def call_accumulated_loss(zoo, trainer, mask, advantages, old, **kwargs):
    return zoo.grpo_accumulated_loss(
        trainer=trainer,
        input_ids=torch.zeros(mask.shape[0], mask.shape[1] + 4, dtype=torch.long),
        attention_mask=torch.ones(mask.shape[0], mask.shape[1] + 4, dtype=torch.long),
        logits_to_keep=mask.shape[1],
        completion_mask=mask,
        advantages=advantages,
        old_logps=old,
        ref_logps=None,
        max_completion_length=MAX_LEN,
        current_gradient_accumulation_steps=GA,
        **kwargs,
    )


@pytest.mark.parametrize("name", WRAPPED_RULES)
def test_accumulated_loss_wrapper_adds_extras_and_logs_rule_metrics(zoo, monkeypatch, name):
    """The wrapper around zoo's grpo_accumulated_loss feeds the rule's extras through Unsloth's repacking and
    logs exactly the TRL path's metrics (clip/*, ratio/*, kl/*) from the tensors the compiled loss saw."""
    tighter = {p.name: 0.02 for p in RULES[name].params if p.name in ("delta", "delta_low", "delta_high")}
    rule = build_rule(name, **tighter)
    logp, old, advantages, mask, full_kl = random_batch(3)
    sampling = engine_logp(rule, old)
    want_loss, want_grad, want_metrics = trl_path(rule, logp, old, advantages, mask, full_kl, sampling=sampling)
    fake = zoo_like_accumulated_loss(zoo, logp)
    monkeypatch.setitem(zoo.__dict__, "grpo_accumulated_loss", fake)
    trainer = FakeTrainer(rule, full_kl)
    with installed(zoo.__dict__, rule):
        outputs = call_accumulated_loss(zoo, trainer, mask, advantages, old, sampling_per_token_logps=sampling)
    torch.testing.assert_close(outputs[0], want_loss, rtol=1e-5, atol=1e-7)
    grad_back, _ = left_packed(want_grad, mask, 3)
    torch.testing.assert_close(fake.grad, grad_back, rtol=1e-5, atol=1e-8)
    logged = trainer._step_stats.reduce()
    assert set(want_metrics) <= set(logged)
    for key, value in want_metrics.items():
        assert logged[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    # the planted batch does exercise the rule: it freezes tokens, or marks them in a metric of its own (KL-Cov), or
    # a rule that never freezes a token weighs them by a measure of its own that moved off 0 and 1 (VESPO's φ)
    acted = [key for key in want_metrics if key.startswith("clip/frac") and want_metrics[key] > 0]
    weighed = [key for key in want_metrics if key.startswith(f"{name}/") and want_metrics[key] not in (0.0, 1.0)]
    assert acted or weighed, want_metrics


def test_a_sequence_level_extra_reaches_the_compiled_loss(zoo, monkeypatch):
    """A rule with a `[B, 1]` extra: the wrapper passes it through zoo's repacking into the compiled loss, which
    gives the TRL path's loss, gradient and metrics; each sequence is weighed by its own value."""
    logp, old, advantages, mask, full_kl = random_batch(9)
    fake = zoo_like_accumulated_loss(zoo, logp)
    monkeypatch.setitem(zoo.__dict__, "grpo_accumulated_loss", fake)
    with toy_rules.scaled_rule(per_sequence=True) as rule:
        want_loss, want_grad, want_metrics = trl_path(rule, logp, old, advantages, mask, full_kl)
        scale = trainer_side(rule, full_kl)["sequence_scale"]
        trainer = FakeTrainer(rule, full_kl)
        with installed(zoo.__dict__, rule):
            outputs = call_accumulated_loss(zoo, trainer, mask, advantages, old)
    assert scale.shape == (mask.shape[0], 1) and scale.unique().numel() == mask.shape[0]
    plain_loss, plain_grad, _ = trl_path(build_rule("no_clip"), logp, old, advantages, mask, full_kl)
    torch.testing.assert_close(want_grad, plain_grad * scale)  # the law of the toy rule, on the TRL path
    torch.testing.assert_close(outputs[0], want_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(fake.grad, left_packed(want_grad, mask, 3)[0], rtol=1e-5, atol=1e-8)
    logged = trainer._step_stats.reduce()
    for key, value in want_metrics.items():
        assert logged[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_on_policy_runs_keep_w_equal_to_1_as_on_the_trl_path(zoo, monkeypatch):
    """rollout=on_policy with vLLM rollouts: Unsloth needs TRL's correction on, so TRL recomputes π_old in a
    separate pass (here: π_θ plus noise of 1e-3). The installed loss ignores that copy: loss, gradient and metrics
    are the TRL path's, which skips π_old (w ≡ 1, ratio/max exactly 1); the correction weighs π_θ/π_rollout.
    Installed for an off-policy run, the same copy would move the ratio."""
    from conftest import train_config

    from atr_grpo.training.rule_trainer import grpo_arg_values

    cfg = train_config(["rollout=on_policy"])
    args = grpo_arg_values(cfg, "/nowhere", "vllm")
    assert args["gradient_accumulation_steps"] % (args["steps_per_generation"] * args["num_iterations"]) == 0
    assert cfg.optimizer_steps_per_rollout == 1  # where TRL alone would skip π_old, the flag build_* passes

    correction = RolloutCorrection("tis", "token", None, 1.2)
    settings = LossSettings(loss_agg="dr_grpo", max_completion_length=MAX_LEN, correction=correction)
    rule = build_rule("atr")
    logp, _, advantages, mask, full_kl = random_batch(11)
    noise = torch.Generator().manual_seed(12)
    recomputed = logp + 1e-3 * torch.randn(logp.shape, generator=noise)
    sampling = logp + 0.15 * torch.randn(logp.shape, generator=noise)
    weight = correction.weight(logp, sampling, mask)  # π_θ/π_rollout
    want = aggregate(rule(logp, logp, advantages, mask).loss * weight, mask, "dr_grpo", MAX_LEN) / GA
    monkeypatch.setitem(zoo.__dict__, "grpo_accumulated_loss", zoo_like_accumulated_loss(zoo, logp))
    logged = {}
    for on_policy in (True, False):
        trainer = FakeTrainer(rule, full_kl)
        trainer._setup_rule(rule, settings)
        with installed(zoo.__dict__, rule, settings, on_policy=on_policy):
            outputs = call_accumulated_loss(
                zoo, trainer, mask, advantages, recomputed, sampling_per_token_logps=sampling
            )
        logged[on_policy] = (outputs[0], trainer._step_stats.reduce())
    loss, metrics = logged[True]
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-7)
    assert metrics["ratio/min"] == metrics["ratio/max"] == 1.0
    assert metrics["rollout/weight_max"] == pytest.approx(float(weight[mask.bool()].max()))
    assert logged[False][1]["ratio/max"] > 1.0  # the recomputed copy is not π_θ


# ------------------------------------------------------------------------------ adaptive δ and correction
DELTAS = (0.03, 0.05, 0.07, 0.1, 0.2, 0.4)


def test_a_new_delta_reaches_the_compiled_loss_without_recompiling(zoo):
    """δ as a 0-d tensor extra: after the first call, five more δ values compile no new graph (torch._dynamo's
    counters), and each gives the TRL path's loss and gradient of ATR built with that δ. The same δ held by the rule
    as a Python float is a guarded constant whose change recompiles (a graph per value when run alone; torch may
    make it a symbolic float after the first change), so the counter does see recompiles."""
    from torch._dynamo.utils import counters

    rule = build_rule("atr")
    logp, old, advantages, mask, full_kl = random_batch(4)
    graphs = []
    with installed(zoo.__dict__, rule):
        for delta in DELTAS:
            kwargs = {**unsloth_kwargs(rule, full_kl, mask), **encode_extras({"delta": torch.tensor(delta)}, mask)}
            outputs, grad = efficient_grpo(zoo, logp, old, advantages, mask, kwargs)
            graphs.append(counters["stats"]["unique_graphs"])
            want_loss, want_grad, _ = trl_path(build_rule("atr", delta=delta), logp, old, advantages, mask, full_kl)
            torch.testing.assert_close(outputs[0], want_loss, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-8)
    assert graphs[-1] - graphs[0] == 0, f"tensor δ recompiled: unique graphs {graphs}"

    float_rule = build_rule("atr")
    float_graphs = []
    with installed(zoo.__dict__, float_rule):
        for delta in DELTAS[:2]:
            float_rule.delta = delta
            efficient_grpo(zoo, logp, old, advantages, mask, unsloth_kwargs(float_rule, full_kl, mask))
            float_graphs.append(counters["stats"]["unique_graphs"])
    assert float_graphs[-1] - float_graphs[0] >= 1, f"float δ: unique graphs {float_graphs}"


CORRECTIONS = [RolloutCorrection("tis", "token", None, 1.2), RolloutCorrection("mis", "sequence", 0.7, 1.3)]


@pytest.mark.parametrize("correction", CORRECTIONS, ids=repr)
def test_the_compiled_loss_weighs_with_the_correction_from_zoos_sampling_log_probs(zoo, correction):
    """Given zoo's `sampling_per_token_logps` (left-packed like the rest), the compiled loss is the TRL path's rule
    loss times the correction's weight, in value and gradient; `flat_is_ratio` is that weight (Unsloth's
    `sampling/*` metrics) and `delta` the |log π_old − log π_rollout| gap."""
    rule = build_rule("atr")
    logp, old, advantages, mask, full_kl = random_batch(5)
    sampling = old + 0.15 * torch.randn(old.shape, generator=torch.Generator().manual_seed(6))
    weight = correction.weight(old, sampling, mask).expand_as(old) * mask
    leaf = logp.clone().requires_grad_()
    want = aggregate(rule(leaf, old, advantages, mask).loss * weight, mask, "dr_grpo", MAX_LEN) / GA
    (want_grad,) = torch.autograd.grad(want, leaf)
    pad = 4
    packed = {name: left_packed(value, mask, pad)[0] for name, value in (("logp", logp), ("old", old))}
    packed_sampling, packed_mask = left_packed(sampling, mask, pad)
    settings = LossSettings(loss_agg="dr_grpo", max_completion_length=MAX_LEN, correction=correction)
    with installed(zoo.__dict__, rule, settings):
        outputs, grad = efficient_grpo(
            zoo,
            packed["logp"],
            packed["old"],
            advantages,
            packed_mask,
            unsloth_kwargs(rule, full_kl, mask),
            packed_sampling,
        )
    torch.testing.assert_close(outputs[0], want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, left_packed(want_grad, mask, pad)[0], rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(outputs[4], left_packed(weight, mask, pad)[0])
    torch.testing.assert_close(outputs[3], left_packed((old - sampling).abs() * mask, mask, pad)[0])
    assert ((weight != 1) & mask.bool()).any()  # the weight does act on this batch


def test_a_rule_owning_the_correction_gets_zoos_sampling_log_probs(zoo):
    """A rule that owns the rollout correction (toy TIS, no correction of ours) receives the sampling log-ratio from
    zoo's `sampling_per_token_logps` inside the compiled loss: the loss and gradient of the reference rule under our
    TIS, and `flat_is_ratio` is 1 (no ρ of ours)."""
    logp, old, advantages, mask, full_kl = random_batch(13)
    sampling = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(14))
    tis = RolloutCorrection("tis", "token", None, toy_rules.OWNED_TIS_MAX)
    weight = tis.weight(old, sampling, mask) * mask
    leaf = logp.clone().requires_grad_()
    want = aggregate(build_rule("no_clip")(leaf, old, advantages, mask).loss * weight, mask, "dr_grpo", MAX_LEN) / GA
    (want_grad,) = torch.autograd.grad(want, leaf)
    pad = 3
    packed_logp, packed_mask = left_packed(logp, mask, pad)
    packed_old, packed_sampling = (left_packed(value, mask, pad)[0] for value in (old, sampling))
    with toy_rules.registered(toy_rules.OwnedTIS) as rule, installed(zoo.__dict__, rule):
        kwargs = unsloth_kwargs(rule, full_kl, mask)
        outputs, grad = efficient_grpo(zoo, packed_logp, packed_old, advantages, packed_mask, kwargs, packed_sampling)
    torch.testing.assert_close(outputs[0], want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, left_packed(want_grad, mask, pad)[0], rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(outputs[4], packed_mask.float())
    assert ((weight != 1) & mask.bool()).any()  # the rule's own correction does act on this batch


def test_the_wrapper_feeds_the_delta_in_force_and_the_engines_log_probs_and_logs_both(zoo, monkeypatch):
    """On the Unsloth path the trainer's δ (here 0.02, the rule built at 0.07) reaches the compiled loss through the
    wrapper's extras, and the engine's log-probs reach the correction: the loss is the TRL path's for ATR(0.02)
    weighed by ρ, and clip/delta and rollout/weight_* are logged from the tensors the compiled loss saw."""
    from atr_grpo.training.delta_control import DeltaControl

    correction = RolloutCorrection("tis", "token", None, 1.2)
    settings = LossSettings(loss_agg="dr_grpo", max_completion_length=MAX_LEN, correction=correction)
    rule = build_rule("atr")
    logp, old, advantages, mask, full_kl = random_batch(7)
    sampling = old + 0.15 * torch.randn(old.shape, generator=torch.Generator().manual_seed(8))
    weight = correction.weight(old, sampling, mask)
    leaf = logp.clone().requires_grad_()
    at_002 = build_rule("atr", delta=0.02)(leaf, old, advantages, mask)
    want = aggregate(at_002.loss * weight, mask, "dr_grpo", MAX_LEN) / GA
    monkeypatch.setitem(zoo.__dict__, "grpo_accumulated_loss", zoo_like_accumulated_loss(zoo, logp))
    trainer = FakeTrainer(rule, full_kl)
    trainer._setup_rule(rule, settings, DeltaControl(initial=0.02, total_steps=10))
    with installed(zoo.__dict__, rule, settings):
        outputs = call_accumulated_loss(zoo, trainer, mask, advantages, old, sampling_per_token_logps=sampling)
        with pytest.raises(RuntimeError, match="rollout.correction=tis, but this batch carries no log-probs"):
            call_accumulated_loss(zoo, trainer, mask, advantages, old)
    torch.testing.assert_close(outputs[0], want, rtol=1e-5, atol=1e-7)
    logged = trainer._step_stats.reduce()
    assert logged["clip/delta"] == pytest.approx(0.02)
    assert logged["clip/frac"] == pytest.approx(at_002.metrics["clip/frac"])
    assert logged["rollout/weight_max"] == pytest.approx(float(weight[mask.bool()].max()))
    assert logged["rollout/truncated_frac"] > 0


def test_neutralise_overrides_restores_every_changed_value():
    """Unsloth's config class silently changes values (e.g. scale_rewards with dr_grpo); they are set back."""

    class OverridingConfig:
        def __init__(self, **values):
            self.__dict__.update(values)
            self.scale_rewards = "none" if values["scale_rewards"] == "group" else values["scale_rewards"]
            self.vllm_importance_sampling_correction = False
            self.optim = "adamw_8bit"

    wanted = {"scale_rewards": "group", "vllm_importance_sampling_correction": True, "optim": "adamw_torch"}
    args = OverridingConfig(**wanted)
    changed = neutralise_overrides(args, wanted)
    assert sorted(c.split(":")[0] for c in changed) == sorted(wanted)
    assert {k: getattr(args, k) for k in wanted} == wanted
    assert neutralise_overrides(args, wanted) == []


def test_the_recorder_reads_zoo_arguments_by_name(zoo):
    """The stand-in binds UnslothEfficientGRPO's arguments by name; a zoo whose signature differs is refused."""
    from atr_grpo.training.unsloth_loss import _Recorder

    recorder = _Recorder(zoo.UnslothEfficientGRPO)
    assert "_mask" in recorder.signature.parameters

    class Renamed:
        @staticmethod
        def forward(ctx, new_logps, old_logps, mask, advantages):  # not zoo 2026.10.9's names
            return None

    with pytest.raises(RuntimeError, match="has no argument"):
        _Recorder(Renamed)


def test_trainer_settings_changed_after_init_are_refused():
    """Unsloth's trainer turns bf16 on inside __init__ (after the config was set back): that is an error."""
    wanted = {"beta": 0.0, "bf16": False, "fp16": False, "per_device_train_batch_size": 8}
    trainer = SimpleNamespace(beta=0.0, args=SimpleNamespace(bf16=False, fp16=False, per_device_train_batch_size=8))
    check_trainer_settings(trainer, wanted)
    trainer.args.bf16 = True
    with pytest.raises(RuntimeError, match="changed bf16 from False to True.*trainer.bf16=true"):
        check_trainer_settings(trainer, wanted)
    trainer.args.bf16, trainer.beta = False, 0.04
    with pytest.raises(RuntimeError, match="changed beta"):
        check_trainer_settings(trainer, wanted)


GRID = (None, 1.0, 2.0)


def test_every_valid_rollout_correction_gives_a_config_trl_accepts(tmp_path):
    """On the Unsloth + vLLM path TRL's correction is switched on (so that Unsloth hands the engine's log-probs to
    the loss): for every valid rollout.correction, level and thresholds, TRL's real `GRPOConfig` must accept the
    values, where passing ours through made it raise for correction=none with both thresholds null and for
    correction_min = correction_max = 1."""
    import copy
    import itertools

    import trl
    from conftest import compose

    from atr_grpo.config_hydra import to_object
    from atr_grpo.rollout_correction import CORRECTIONS as KINDS
    from atr_grpo.rollout_correction import LEVELS, correction_problem
    from atr_grpo.training.rule_trainer import grpo_arg_values
    from atr_grpo.training.unsloth_trainer import sampling_logprob_values

    composed = compose(["experiment=smoke", "rollout.engine=vllm"])  # each case sets the rollout keys on a copy
    checked = refused = 0
    for kind, level, low, high in itertools.product(KINDS, LEVELS, GRID, GRID):
        if correction_problem(kind, level, low, high) is not None:
            continue
        case = copy.deepcopy(composed)
        case.rollout.correction, case.rollout.correction_level = kind, level
        case.rollout.correction_min, case.rollout.correction_max = low, high
        try:
            cfg = to_object(case)
        except ConfigError:  # a level or thresholds set without a correction: refused at config time
            assert kind == "none" and (level, low, high) != ("token", None, 2.0)
            refused += 1
            continue
        values = {**grpo_arg_values(cfg, tmp_path, "vllm"), **sampling_logprob_values("vllm"), "use_cpu": True}
        args = trl.GRPOConfig(**values)
        assert args.vllm_importance_sampling_correction is True and args.use_vllm is True
        checked += 1
    # none takes only the default level and thresholds; per level, tis and mis take (min, max) in
    # {null, 1} × {null, 1, 2} but one (they need a threshold)
    assert (checked, refused) == (1 + 2 * (5 + 5), 2 * 6 - 1)


def test_a_vllm_server_turned_into_a_colocated_engine_is_refused():
    """Unsloth's trainer sets vllm_mode='colocate' whenever the model carries its engine: rollouts asked from a
    server would silently come from a second, colocated engine."""
    wanted = {"vllm_mode": "server"}
    trainer = SimpleNamespace(args=SimpleNamespace(vllm_mode="server"))
    check_trainer_settings(trainer, wanted)
    trainer.args.vllm_mode = "colocate"
    with pytest.raises(RuntimeError, match="changed vllm_mode from 'server' to 'colocate'.*trainer.backend=trl"):
        check_trainer_settings(trainer, wanted)


def test_loading_an_adapter_with_missing_or_unexpected_lora_keys_fails(tmp_path, tiny_model_dir):
    """The SFT adapter must fill every LoRA weight of the fresh adapter and nothing else."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from atr_grpo.training.unsloth_trainer import load_adapter_weights

    def lora_model(targets):
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets))

    lora_model(["q_proj", "v_proj"]).save_pretrained(tmp_path / "both")
    lora_model(["q_proj"]).save_pretrained(tmp_path / "q_only")
    load_adapter_weights(lora_model(["q_proj", "v_proj"]), tmp_path / "both")  # matching: fine
    with pytest.raises(RuntimeError, match="missing keys"):
        load_adapter_weights(lora_model(["q_proj", "v_proj"]), tmp_path / "q_only")
    with pytest.raises(RuntimeError, match="1.* unexpected keys|[1-9][0-9]* unexpected keys"):
        load_adapter_weights(lora_model(["q_proj"]), tmp_path / "both")


def installed_unsloth_mapper():
    """unsloth's MAP_TO_UNSLOTH_16bit, read from the installed package's mapper.py (importing unsloth needs a GPU)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("unsloth")
    if spec is None or spec.origin is None:
        pytest.skip("unsloth is installed by `make install`")
    path = Path(spec.origin).parent / "models" / "mapper.py"
    mapper_spec = importlib.util.spec_from_file_location("installed_unsloth_mapper", path)
    mapper = importlib.util.module_from_spec(mapper_spec)
    mapper_spec.loader.exec_module(mapper)
    return mapper.MAP_TO_UNSLOTH_16bit


@pytest.mark.parametrize("model", ["qwen3-1.7b", "qwen3-8b"])
def test_grpo_on_unsloth_loads_the_weights_that_sft_and_evaluation_load(monkeypatch, tmp_path, model):
    """Unsloth swaps the paper's hub id for its own mirror (unsloth/Qwen3-*) unless told `use_exact_model_name`:
    GRPO would train other weights, maybe with another chat template, than the SFT stage and the evaluation load.
    The installed unsloth does remap these names (if it stops, this test says so); the call tells it not to, and
    env.json records one name for the three stages."""
    from conftest import train_config

    from atr_grpo import rundir
    from atr_grpo.config_hydra import config_to_yaml
    from atr_grpo.machine import Decision
    from atr_grpo.training import pipeline
    from atr_grpo.training.unsloth_trainer import load_unsloth_model

    cfg = train_config([f"model={model}", f"run_dir={tmp_path / 'run'}", "rollout.engine=vllm"])
    assert installed_unsloth_mapper()[cfg.model.path.lower()] != cfg.model.path, "unsloth no longer remaps the name"

    calls = {}

    class FastLanguageModel:
        @staticmethod
        def from_pretrained(**kwargs):
            calls["from_pretrained"] = kwargs
            return SimpleNamespace(vllm_engine=object()), SimpleNamespace(pad_token="<pad>")

        @staticmethod
        def get_peft_model(model, **kwargs):
            calls["get_peft_model"] = kwargs
            return model

    monkeypatch.setitem(sys.modules, "unsloth", SimpleNamespace(FastLanguageModel=FastLanguageModel))
    load_unsloth_model(cfg, None, "vllm")
    loaded = calls["from_pretrained"]
    assert loaded["use_exact_model_name"] is True and loaded["fast_inference"] is True
    assert loaded["model_name"] == cfg.model.path

    pipeline.prepare_run_dir(cfg, config_to_yaml(cfg), Decision("unsloth", "vllm", "vllm"))
    recorded = rundir.read_json(tmp_path / "run" / rundir.ENV_FILE)["model_loaded"]
    assert recorded == {"sft": cfg.model.path, "grpo": loaded["model_name"], "evaluation": cfg.model.path}
