"""Typed configuration: one dataclass per config group, registered in Hydra's ConfigStore (`config_hydra`).

This module holds the roots (`TrainConfig`, `EvaluateConfig`) and the clipping schemas, one per registered rule;
the sections are in `config_inputs` (model, prompt, data, SFT) and `config_training` (trainer, rollout, eval,
logger), their value checks in `config_checks`.

The YAML files under `conf/` extend these schemas, so a misspelled key fails when Hydra composes the
config (`atr_grpo.hydra_app` names the key and lists the allowed ones), and `__post_init__` checks values
(δ ≤ 0, ε ∉ (0, 1), batch sizes that don't divide, K > n) before anything heavy is imported or loaded.
Library code below the entry points takes these dataclasses and never imports Hydra.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.clipping.adaptive_delta import DELTA_CONTROL_PARAMS, check_delta_control, delta_rules, takes_delta
from atr_grpo.clipping.base import ClipRule, value_type
from atr_grpo.config_checks import check, check_study, check_vllm_temperature, require_exists
from atr_grpo.config_inputs import DataConfig, ModelConfig, PromptConfig, SFTConfig
from atr_grpo.config_training import (
    EvalConfig,
    LoggerConfig,
    RolloutConfig,
    TrainerConfig,
    check_truncated_sampling_engine,
)
from atr_grpo.errors import ConfigError, closest
from atr_grpo.plugins import load_rule_plugins


def unknown_key_message(full_key: str, schema: type, source: Any = None) -> str:
    """`invalid config: 'trainer.learning_rat' is not a key of trainer; did you mean 'learning_rate'? allowed keys:
    backend, learning_rate, ...` (a guess only where an allowed key is close, as for a misspelled option), and
    where the key belongs when it is a key of another rule or section (`KEY_HINTS`). `source`: the file that sets
    the key, named first when known."""
    section, _, key = full_key.rpartition(".")
    names = [f.name for f in dataclasses.fields(schema)]
    close = closest(key, names)
    guess = f" did you mean {close!r}?" if close else ""
    hint = KEY_HINTS.get(key)
    where = f"{source}: " if source else ""
    return (
        f"invalid config: {where}{full_key!r} is not a key of {section or 'the root config'};{guess} "
        f"allowed keys: {', '.join(names)}" + (f" ({hint})" if hint else "")
    )


# ------------------------------------------------------------------------------------------- clipping
@dataclass
class ClippingConfig:
    """Base of the per-rule schemas generated below from the registry (one per rule): the rule's parameters and,
    for a rule with a threshold δ, the keys of adaptive δ (`clipping/adaptive_delta.py`)."""

    name: str = MISSING
    schema_rule: ClassVar[str | None] = None  # the rule whose schema this is (set on each generated schema)

    def __post_init__(self) -> None:
        if self.schema_rule is not None and self.name != self.schema_rule:
            raise ConfigError(
                f"invalid config: clipping.name={self.name!r} in a file with the schema of {self.schema_rule!r}: a "
                f"rule's config file picks its own schema ('defaults: [/schema/clipping@_here_: {self.name}, _self_]')"
            )
        params = self.params()
        try:
            rule = build_rule(self.name, **params)
        except ValueError as err:
            raise ConfigError(f"invalid config: clipping: {err}") from None
        try:
            if takes_delta(self.name):
                check_delta_control(self.delta_control_settings(), rule.delta)
        except ValueError as err:  # the message starts with the key
            raise ConfigError(f"invalid config: clipping.{err}") from None
        self._validated = (params, rule)  # not a field: never written to config.yaml

    def rule(self) -> ClipRule:
        """The rule this config validated, built once: the one the run trains with (and whose δ reaches the loss).
        A config changed since is validated again."""
        params, rule = self._validated
        if params != self.params():
            self.__post_init__()
            params, rule = self._validated
        return rule

    def params(self) -> dict[str, Any]:
        """The rule's own parameters (what `build_rule` takes)."""
        return {param.name: getattr(self, param.name) for param in RULES[self.name].params}

    def delta_control_settings(self) -> dict[str, Any]:
        """The adaptive-δ keys (empty for a rule without δ)."""
        if not takes_delta(self.name):
            return {}
        return {param.name: getattr(self, param.name) for param in DELTA_CONTROL_PARAMS}


def _clipping_schema(rule_name: str) -> type:
    """`Clipping_<rule>`: the rule's parameters with their source defaults (and adaptive δ's keys for a δ-rule), a
    module attribute so it pickles. `register` has refused a parameter named like one of the schema's keys
    (`clipping/param_names.py`)."""
    params = RULES[rule_name].params + (DELTA_CONTROL_PARAMS if takes_delta(rule_name) else ())
    fields = [
        (param.name, float | None if param.default is None else value_type(param), field(default=param.default))
        for param in params
    ]
    cls = dataclasses.make_dataclass(
        f"Clipping_{rule_name}", fields, bases=(ClippingConfig,), namespace={"schema_rule": rule_name}
    )
    cls.__module__ = __name__
    globals()[cls.__name__] = cls
    return cls


load_rule_plugins()  # the rules of installed packages get a schema too
CLIPPING_SCHEMAS: dict[str, type] = {name: _clipping_schema(name) for name in sorted(RULES)}

# where a key belongs when it is not a key of the section it was given in
KEY_HINTS = {
    param.name: f"{param.name} is a key of the rules with a threshold δ: {', '.join(delta_rules())}"
    for param in DELTA_CONTROL_PARAMS
} | {"vllm_importance_sampling_correction": "the rollout correction is rollout.correction=none|tis|mis"}


# ------------------------------------------------------------------------------------------------- root
@dataclass
class TrainConfig:
    experiment: str = "default"
    # the runs compared together: its methods are named apart in it (`runs.name_methods`); the Holm family's scope
    study: str = "${experiment}"
    seed: int = 0
    method: str = "${atr_method:${clipping}}"  # the rule plus any non-default parameter, e.g. clip-eps0.3
    # a Hydra multirun appends its other overrides (`__model=qwen3-8b`), so no two jobs of a sweep share a name
    # (a name past 255 bytes is shortened to its start and a hash: rundir.fit_name)
    run_name: str = "${atr_run_name:${experiment}__${method}__s${seed}}"
    run_dir: str = "results/runs/${experiment}/${run_name}"
    # Re-launching the same config into run_dir continues from its newest checkpoint (a finished run is left
    # as is); resume=true also insists that there is a run to continue.
    resume: bool = False
    model: ModelConfig = MISSING
    prompt: PromptConfig = field(default_factory=PromptConfig)
    data: DataConfig = MISSING
    sft: SFTConfig = MISSING
    clipping: Any = MISSING
    trainer: TrainerConfig = MISSING
    rollout: RolloutConfig = MISSING
    eval: EvalConfig = MISSING
    logger: LoggerConfig = MISSING

    def __post_init__(self) -> None:
        check(0 <= self.seed < 2**32, "seed", "in [0, 2**32 - 1] (the seeds numpy and torch accept)", self.seed)
        check_study(self.study)
        tr, ro = self.trainer, self.rollout
        spg = ro.steps_per_generation or tr.gradient_accumulation_steps
        check(
            spg % tr.gradient_accumulation_steps == 0,
            "rollout.steps_per_generation",
            f"a multiple of trainer.gradient_accumulation_steps={tr.gradient_accumulation_steps} "
            "(otherwise a rollout is generated in the middle of an optimizer step)",
            spg,
        )
        generation_batch = tr.per_device_train_batch_size * spg
        check(
            generation_batch % tr.num_generations == 0,
            "trainer.per_device_train_batch_size",
            f"such that per_device_train_batch_size × steps_per_generation ({generation_batch}) is divisible "
            f"by trainer.num_generations={tr.num_generations}",
            tr.per_device_train_batch_size,
        )
        optimizer_batch = tr.per_device_train_batch_size * tr.gradient_accumulation_steps
        check(
            optimizer_batch % tr.num_generations == 0,
            "trainer.gradient_accumulation_steps",
            f"such that per_device_train_batch_size × gradient_accumulation_steps ({optimizer_batch}) is "
            f"divisible by trainer.num_generations={tr.num_generations} (whole groups per optimizer step; "
            "Unsloth would otherwise silently change the batch size)",
            tr.gradient_accumulation_steps,
        )
        total = self.trainer.max_prompt_length + self.trainer.max_completion_length
        check(
            total <= self.model.max_seq_length,
            "trainer.max_completion_length",
            f"≤ model.max_seq_length - trainer.max_prompt_length = "
            f"{self.model.max_seq_length - self.trainer.max_prompt_length}",
            tr.max_completion_length,
        )

        tiny, data = self.model.tiny, self.data
        if tiny is not None and data.source == "arithmetic" and data.chain_max > 1:
            check(
                tiny.pretrain_chain_ops < data.chain_min,
                "model.tiny.pretrain_chain_ops",
                f"< data.chain_min={data.chain_min} (longer pretraining chains could be evaluation problems)",
                tiny.pretrain_chain_ops,
            )

        check_truncated_sampling_engine(tr, ro.engine)
        if self.rollout.engine == "vllm":
            check_vllm_temperature(self.trainer.temperature, "trainer.temperature", "rollout.engine=vllm")

        target = self.clipping.delta_control_settings().get("target_kl3")
        check(
            target is None or self.optimizer_steps_per_rollout > 1,
            "clipping.target_kl3",
            "null when every update is on-policy (KL3 ≡ 0 gives the controller nothing to measure; use "
            "rollout=reuse2 or rollout.num_iterations > 1)",
            target,
        )

        per_rollout = self.optimizer_steps_per_rollout
        check(
            tr.save_steps % per_rollout == 0,
            "trainer.save_steps",
            f"a multiple of the optimizer steps per rollout ({per_rollout}): checkpoints must fall on rollout "
            "boundaries for a resumed run to continue exactly",
            tr.save_steps,
        )

    @property
    def steps_per_generation(self) -> int:
        return self.rollout.steps_per_generation or self.trainer.gradient_accumulation_steps

    @property
    def optimizer_steps_per_rollout(self) -> int:
        """How many optimizer steps share one generation batch (1 = strictly on-policy)."""
        per_generation = self.steps_per_generation // self.trainer.gradient_accumulation_steps
        return per_generation * self.rollout.num_iterations


@dataclass
class EvaluateConfig:
    """`python -m atr_grpo.evaluate`: a base model or an adapter, standalone."""

    model: ModelConfig = MISSING
    prompt: PromptConfig = field(default_factory=PromptConfig)
    eval: EvalConfig = MISSING
    adapter: str | None = None  # a LoRA adapter directory (e.g. a run's checkpoint); null = the base model
    # a synthetic task other than conf/data/arithmetic.yaml's, for the `arithmetic` benchmark (`+data=arithmetic
    # data.max_operand=...`); null: that file's task
    data: DataConfig | None = None
    out_dir: str = MISSING  # a run directory to write eval/ into
    experiment: str = "evaluate"  # labels for the tables (python -m atr_grpo.results), e.g. passk_curve
    study: str = "${experiment}"  # the runs compared together (see TrainConfig.study)
    method: str = "base"
    # the training step of the evaluated model in summary.jsonl: 0 for the base model; for an adapter, read from where
    # its run saved it (`checkpoints.adapter_step`) unless given; an adapter from elsewhere needs step=N (>= 0)
    step: int | None = None
    force: bool = False  # re-evaluate (step, benchmark) pairs already in summary.jsonl

    def check_inputs(self) -> None:
        """What must exist when the evaluation runs (a plan may name an adapter a previous run will write)."""
        from pathlib import Path

        if self.adapter is not None:
            require_exists("adapter", self.adapter)
        check(not Path(self.out_dir).is_file(), "out_dir", "a directory to write eval/ into, not a file", self.out_dir)
        check(self.step is None or self.step >= 0, "step", "a training step >= 0", self.step)
        check_study(self.study)
