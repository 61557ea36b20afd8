"""Typed configuration: one dataclass per config group, registered in Hydra's ConfigStore.

The YAML files under `conf/` extend these schemas, so a misspelled key fails when Hydra composes the
config (`atr_grpo.hydra_app` names the key and lists the allowed ones), and `__post_init__` checks values
(δ ≤ 0, ε ∉ (0, 1), batch sizes that don't divide, K > n) before anything heavy is imported or loaded.
Library code below the entry points takes these dataclasses and never imports Hydra.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf, flag_override, open_dict
from omegaconf.errors import OmegaConfBaseException

from atr_grpo import rundir
from atr_grpo.benchmarks import BENCHMARKS
from atr_grpo.cache import cache_dir
from atr_grpo.clipping import RULES, build_rule
from atr_grpo.clipping.adaptive_delta import DELTA_CONTROL_PARAMS, check_delta_control, delta_rules, takes_delta
from atr_grpo.data.arithmetic import CHAIN_OPERATIONS, OPERATIONS
from atr_grpo.data.prompts import DEFAULT_SYSTEM_PROMPT
from atr_grpo.distributed import log_suffix
from atr_grpo.errors import ConfigError
from atr_grpo.losses import AGGREGATION_CHOICES, KL_ESTIMATORS
from atr_grpo.rollout_correction import RolloutCorrection, correction_problem

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

# where data.datasets reads rows from: data.source / sft.source (sft.source may also be "none")
SOURCES = ("hub", "file", "arithmetic")


def _check(ok: bool, key: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"invalid config: {key} must be {allowed}, got {value!r}")


def _positive(key: str, value: float) -> None:
    _check(value > 0, key, "> 0", value)


def _one_of(key: str, value: Any, options: tuple[str, ...]) -> None:
    _check(value in options, key, "one of " + ", ".join(repr(o) for o in options), value)


def unknown_key_message(full_key: str, schema: type) -> str:
    """`invalid config: 'trainer.lr' is not a key of trainer; allowed keys: backend, learning_rate, ...`, and where
    the key belongs when it is a key of another rule or section (`KEY_HINTS`)."""
    section = full_key.rpartition(".")[0] or "the root config"
    allowed = ", ".join(f.name for f in dataclasses.fields(schema))
    hint = KEY_HINTS.get(full_key.rpartition(".")[2])
    return f"invalid config: {full_key!r} is not a key of {section}; allowed keys: {allowed}" + (
        f" ({hint})" if hint else ""
    )


def _source_checks(section: str, source: str, hub_id: str | None, path: str | None) -> None:
    """`hub` needs a hub id, `file` a path; a path with `hub` would be ignored, so it is refused."""
    if source == "hub":
        _check(hub_id is not None, f"{section}.hub_id", f"set when {section}.source='hub'", hub_id)
        _check(path is None, f"{section}.path", f"null when {section}.source='hub' (or {section}.source=file)", path)
    elif source == "file":
        _check(path is not None, f"{section}.path", f"set when {section}.source='file'", path)


def _exists(key: str, path: str) -> None:
    from pathlib import Path

    _check(Path(path).expanduser().exists(), key, "an existing file or directory", path)


def _looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id (`org/name`): absolute, relative with ./ or ../, or ~."""
    return path.startswith(("/", "./", "../", "~"))


# vLLM 0.31 refuses a sampling temperature above 2 (vllm/sampling_params.py)
VLLM_MAX_TEMPERATURE = 2.0


# ------------------------------------------------------------------------------------------------ model
@dataclass
class LoraConfig:
    r: int = 32  # Table 4
    alpha: int = 64  # Table 4
    dropout: float = 0.0  # 0 so that recomputed π_old log-probs are exact and stale ratios are real
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    def __post_init__(self) -> None:
        _positive("model.lora.r", self.r)
        _positive("model.lora.alpha", self.alpha)
        _check(0 <= self.dropout < 1, "model.lora.dropout", "in [0, 1)", self.dropout)
        if self.dropout > 0:
            warnings.warn(
                "model.lora.dropout > 0: recomputed π_old log-probs see a different dropout mask, so the "
                "ratio w differs from 1 even on-policy and clipping acts on noise",
                stacklevel=2,
            )


@dataclass
class TinyModelConfig:
    """A small Qwen3 built from this config with a locally trained tokenizer: nothing is downloaded."""

    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32  # vLLM's CPU attention supports 32, not 16
    max_position_embeddings: int = 512
    init_seed: int = 0
    # A short full-parameter "pretraining" on plain arithmetic statements ("12 + 35 = 47."), the stand-in
    # for what a real base model has seen: it knows some arithmetic, imperfectly, and not the answer format.
    pretrain_steps: int = 900
    pretrain_batch_size: int = 32
    pretrain_learning_rate: float = 3e-3
    pretrain_max_operand: int = 49
    pretrain_operations: list[str] = field(default_factory=lambda: ["+", "-"])


@dataclass
class ModelConfig:
    name: str = MISSING  # short name used in run names and tables (qwen3-1.7b, qwen3-8b, tiny)
    path: str | None = None  # hub id or local directory; null for the locally built tiny model
    max_seq_length: int = 2048  # Table 4
    dtype: str = "auto"  # auto: bfloat16 on GPU, float32 on CPU
    load_in_4bit: bool = False  # the paper trains 16-bit LoRA
    lora: LoraConfig = field(default_factory=LoraConfig)
    tiny: TinyModelConfig | None = None

    def __post_init__(self) -> None:
        _check(self.path is not None or self.tiny is not None, "model.path", "set (or model=tiny)", self.path)
        _positive("model.max_seq_length", self.max_seq_length)
        _one_of("model.dtype", self.dtype, ("auto", "bfloat16", "float16", "float32"))
        if self.path is not None and _looks_local(self.path):
            _exists("model.path", self.path)


# ----------------------------------------------------------------------------------------------- prompt
@dataclass
class PromptConfig:
    system: str = DEFAULT_SYSTEM_PROMPT
    enable_thinking: bool = False  # Qwen3 chat templates: no <think> block (2,048-token training budget)


# ------------------------------------------------------------------------------------------------- data
@dataclass
class DataConfig:
    name: str = MISSING  # a label for the run's records (dapo_math, arithmetic, ...)
    source: str = "hub"  # hub: hub_id/hub_config/split | file: path | arithmetic: generated by the package
    hub_id: str | None = None
    hub_config: str | None = None
    split: str = "train"
    path: str | None = None  # a local .jsonl/.json/.parquet (source: file)
    problem_field: str = "prompt"  # dotted paths reach nested fields, e.g. prompt.0.content
    answer_field: str = "solution"
    max_examples: int | None = None
    # synthetic arithmetic task (the CPU demo), generated by the package
    num_train: int = 0
    num_eval: int = 0
    max_operand: int = 0
    operations: list[str] = field(default_factory=list)
    generator_seed: int = 0  # fixed, so the evaluation problems do not change with the run's seed
    # operations per problem, drawn in [chain_min, chain_max]; above 1 every intermediate result is written out
    chain_min: int = 1
    chain_max: int = 1

    def __post_init__(self) -> None:
        _one_of("data.source", self.source, SOURCES)
        _source_checks("data", self.source, self.hub_id, self.path)
        if self.source == "arithmetic":
            _positive("data.num_train", self.num_train)
            _positive("data.max_operand", self.max_operand)
            for op in self.operations:
                _one_of("data.operations[]", op, OPERATIONS)
            _check(
                1 <= self.chain_min <= self.chain_max,
                "data.chain_min",
                f"in [1, chain_max={self.chain_max}]",
                self.chain_min,
            )
            if self.chain_max > 1:
                for op in self.operations:
                    _one_of("data.operations[] (of a chain, data.chain_max > 1)", op, CHAIN_OPERATIONS)
        if self.path is not None:
            _exists("data.path", self.path)


# -------------------------------------------------------------------------------------------------- sft
@dataclass
class SFTConfig:
    """The short SFT "format" stage before GRPO (App. B; settings of Unsloth's Qwen3 GRPO notebook)."""

    name: str = MISSING  # a label, also the SFT cache entry's prefix (openmath, arithmetic, none, ...)
    source: str = "hub"  # hub | file | arithmetic (worked problems of the data config's task) | none: no SFT
    hub_id: str | None = None
    split: str = "cot"
    path: str | None = None  # a local .jsonl/.json/.parquet (source: file)
    problem_field: str = "problem"
    solution_field: str = "generated_solution"
    answer_field: str = "expected_answer"
    numeric_answers_only: bool = True
    max_length_fraction: float = 0.5  # keep examples whose rendered length ≤ this × model.max_seq_length
    max_examples: int | None = None
    # synthetic task only: the fraction of demonstrations that stop after the working, without the boxed
    # final answer (inconsistent demonstrations, as real SFT data often are; the reward only credits boxes)
    unboxed_fraction: float = 0.0
    num_epochs: float = 2.0
    learning_rate: float = 2e-4
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    weight_decay: float = 0.01
    warmup_steps: int = 5
    lr_scheduler_type: str = "linear"
    seed: int = 3407  # fixed (notebook value): every method and seed of a model starts from one adapter
    cache_dir: str = "${atr_cache:sft}"  # <cache root>/sft (atr_grpo/cache.py); adapters keyed by a config hash

    def __post_init__(self) -> None:
        _one_of("sft.source", self.source, (*SOURCES, "none"))
        _source_checks("sft", self.source, self.hub_id, self.path)
        _positive("sft.num_epochs", self.num_epochs)
        _positive("sft.learning_rate", self.learning_rate)
        _check(
            0 < self.max_length_fraction <= 1,
            "sft.max_length_fraction",
            "in (0, 1]",
            self.max_length_fraction,
        )
        _check(0 <= self.unboxed_fraction < 1, "sft.unboxed_fraction", "in [0, 1)", self.unboxed_fraction)
        if self.path is not None:
            _exists("sft.path", self.path)

    @property
    def enabled(self) -> bool:
        return self.source != "none"


# ---------------------------------------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    backend: str = "auto"  # auto: unsloth on a CUDA machine with unsloth installed, else trl
    learning_rate: float = 5e-6  # Table 4
    weight_decay: float = 1e-3  # Table 4
    optim: str = "adamw_torch"  # AdamW (Table 4); set explicitly because Unsloth defaults to adamw_8bit
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    lr_scheduler_type: str = "linear"
    warmup_ratio: float = 0.1  # fraction of max_steps (passed as transformers 5 `warmup_steps` < 1)
    max_grad_norm: float = 1.0
    per_device_train_batch_size: int = 8  # Table 4
    # Table 4. Micro-batches per optimizer step over all processes: N launched processes accumulate GA/N each, so
    # per_device_train_batch_size × gradient_accumulation_steps is the global batch on any number of processes
    gradient_accumulation_steps: int = 4
    num_generations: int = 8  # group size G, Table 4
    temperature: float = 1.0  # Table 4
    top_p: float = 1.0  # Table 4
    top_k: int = -1  # Table 4; -1 = off
    max_steps: int = 1000  # §6.1
    beta: float = 0.0  # KL to the reference policy, App. B
    kl_estimator: str = "k3"  # only used when beta > 0 (RPG paper's estimators)
    kl_importance_weight: bool = True  # the w-correction that makes k3's off-policy gradient unbiased
    max_prompt_length: int = 512
    max_completion_length: int = 1536  # = model.max_seq_length - max_prompt_length; also Dr.GRPO's constant
    loss_agg: str = "dr_grpo"  # Dr.GRPO backbone (§6.1); token_mean and seq_mean as ablations
    scale_rewards: str = "none"  # Dr.GRPO: advantages are R - mean(R), no std division
    mask_truncated_completions: bool = False
    logging_steps: int = 1
    save_steps: int = 50
    save_total_limit: int | None = 3
    bf16: bool | None = None  # null: true on a CUDA GPU, false on CPU
    gradient_checkpointing: bool | None = None  # null: on for GPU backends, off on CPU
    log_completions: bool = False
    num_threads: int | None = None  # torch CPU threads (None: leave torch's choice)
    # launched runs (torchrun / accelerate launch): seconds any collective may wait, the barrier where the other
    # processes wait for the main one's evaluation (eval.when=during) included (transformers' default)
    ddp_timeout: int = 1800

    def __post_init__(self) -> None:
        _one_of("trainer.backend", self.backend, ("auto", "unsloth", "trl"))
        _positive("trainer.learning_rate", self.learning_rate)
        _check(self.weight_decay >= 0, "trainer.weight_decay", ">= 0", self.weight_decay)
        _check(0 <= self.warmup_ratio < 1, "trainer.warmup_ratio", "in [0, 1)", self.warmup_ratio)
        _positive("trainer.per_device_train_batch_size", self.per_device_train_batch_size)
        _positive("trainer.gradient_accumulation_steps", self.gradient_accumulation_steps)
        group = self.num_generations
        _check(group >= 2, "trainer.num_generations", ">= 2 (a group needs a baseline)", group)
        _check(0 < self.temperature <= 10, "trainer.temperature", "in (0, 10]", self.temperature)
        _check(0 < self.top_p <= 1, "trainer.top_p", "in (0, 1]", self.top_p)
        _check(self.top_k == -1 or self.top_k > 0, "trainer.top_k", "-1 (off) or > 0", self.top_k)
        _positive("trainer.max_steps", self.max_steps)
        _check(self.beta >= 0, "trainer.beta", ">= 0", self.beta)
        _one_of("trainer.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _one_of("trainer.loss_agg", self.loss_agg, AGGREGATION_CHOICES)
        _one_of("trainer.scale_rewards", self.scale_rewards, ("none", "group", "batch"))
        _positive("trainer.max_prompt_length", self.max_prompt_length)
        _positive("trainer.max_completion_length", self.max_completion_length)
        _positive("trainer.save_steps", self.save_steps)
        _positive("trainer.ddp_timeout", self.ddp_timeout)


@dataclass
class VLLMRolloutConfig:
    """TRL's vLLM rollouts (rollout.engine=vllm): an engine colocated with training, or a `trl vllm-serve` server."""

    mode: str = "colocate"  # colocate | server
    gpu_memory_utilization: float = 0.5  # share of GPU memory for the colocated engine (Unsloth's notebook)
    enable_sleep_mode: bool = False  # colocate: free the engine's memory between generations (slower)
    server_base_url: str | None = None  # server: e.g. http://10.0.0.2:8000 (else host and port)
    server_host: str = "0.0.0.0"
    server_port: int = 8000
    server_timeout: float = 240.0  # seconds to wait for the server at start-up
    group_port: int = 51216  # server: the port of the weight-sync communicator

    def __post_init__(self) -> None:
        _one_of("rollout.vllm.mode", self.mode, ("colocate", "server"))
        _check(
            0 < self.gpu_memory_utilization < 1,
            "rollout.vllm.gpu_memory_utilization",
            "in (0, 1)",
            self.gpu_memory_utilization,
        )
        _check(0 < self.server_port < 65536, "rollout.vllm.server_port", "a port number", self.server_port)
        _check(0 < self.group_port < 65536, "rollout.vllm.group_port", "a port number (1-65535)", self.group_port)
        _check(self.server_timeout > 0, "rollout.vllm.server_timeout", "> 0", self.server_timeout)


@dataclass
class RolloutConfig:
    """How rollouts are sampled and how stale π_old is. TRL generates `steps_per_generation` micro-batches at
    once and reuses each generation batch `num_iterations` times; only the first optimizer step after a
    generation is on-policy (w ≡ 1, every ratio rule gives the same gradient)."""

    name: str = MISSING
    steps_per_generation: int | None = None  # micro-batches per generation; null = gradient_accumulation_steps
    num_iterations: int = 1
    # who samples the rollouts: auto = vLLM on a CUDA machine where it is installed, else transformers
    engine: str = "auto"  # auto | hf | vllm
    vllm: VLLMRolloutConfig = field(default_factory=VLLMRolloutConfig)
    # the importance weight ρ of π_old/π_rollout on each token's loss (atr_grpo/rollout_correction.py): none |
    # tis (truncated) | mis (masked), per token or per sequence, with thresholds C_min / C_max (null: unbounded)
    correction: str = "none"
    correction_level: str = "token"  # token | sequence
    correction_min: float | None = None  # C_min: none in verl's TIS, TRL's default
    correction_max: float | None = 2.0  # C_max: verl's rollout_is_threshold default (TRL's: 3.0)

    def __post_init__(self) -> None:
        _check(self.num_iterations >= 1, "rollout.num_iterations", ">= 1", self.num_iterations)
        if self.steps_per_generation is not None:
            _positive("rollout.steps_per_generation", self.steps_per_generation)
        _one_of("rollout.engine", self.engine, ("auto", "hf", "vllm"))
        problem = correction_problem(self.correction, self.correction_level, self.correction_min, self.correction_max)
        if problem is not None:
            raise ConfigError(f"invalid config: {problem}")
        if self.correction == "none":  # the correction's settings would be accepted and never read
            for key in ("correction_level", "correction_min", "correction_max"):
                default = ROLLOUT_DEFAULTS[key]
                _check(
                    getattr(self, key) == default,
                    f"rollout.{key}",
                    f"left at its default {default!r} with rollout.correction='none' (set rollout.correction=tis "
                    "or mis for it to act)",
                    getattr(self, key),
                )
        check_correction_engine(self.correction, self.engine)
        check_server_engine(self.vllm.mode, self.engine)

    def rollout_correction(self) -> RolloutCorrection:
        return RolloutCorrection(self.correction, self.correction_level, self.correction_min, self.correction_max)


ROLLOUT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RolloutConfig)}


def check_server_engine(mode: str, engine: str) -> None:
    """A `trl vllm-serve` server only serves vLLM rollouts: with transformers' generate it would never be asked."""
    _check(
        mode != "server" or engine != "hf",
        "rollout.vllm.mode",
        "'colocate' with rollout.engine='hf' (a rollout server only serves rollout.engine=vllm)",
        mode,
    )


def check_correction_engine(correction: str, engine: str) -> None:
    """transformers' generate gives no log-probs of the sampled tokens: there is nothing to correct for."""
    _check(
        correction == "none" or engine != "hf",
        "rollout.correction",
        "'none' with rollout.engine='hf' (only vLLM rollouts give the sampled tokens' log-probs to correct with; "
        "set rollout.engine=vllm)",
        correction,
    )


# ------------------------------------------------------------------------------------------------- eval
@dataclass
class EvalConfig:
    enabled: bool = True
    # when evaluations run: `after` training, in a process of their own with a vLLM engine sized for the
    # longest prompt + max_tokens, from the adapter saved at each evaluated step (the paper's 32,768-token
    # budget on one GPU); or `during` training, on the live model (HF generate, or Unsloth's engine)
    when: str = "after"  # after | during
    keep_adapters: bool = False  # keep eval/adapters/step_<N> once step N is evaluated (final_adapter stays)
    # step 0 evaluated once per starting adapter and evaluation settings, and copied into every run that starts
    # from it (eval.when=during): the samples are the same ones, since every run evaluates step 0 alike
    share_start: bool = False
    every_steps: int = 50  # §6.1
    at_start: bool = True  # step 0: the model GRPO starts from (Table 2's base row for sft=none)
    benchmarks: list[str] = field(default_factory=lambda: ["amc23", "aime24", "aime25"])
    paths: dict[str, str] = field(default_factory=dict)  # benchmark -> local file instead of the hub
    strict: bool = True  # check each benchmark's row count
    n: int = 8  # samples per problem
    k: int = 8  # the K of Mean@K / Pass@K in tables (Table 2: 8)
    temperature: float = 0.3  # Table 4
    top_p: float = 0.95  # Table 4
    top_k: int = -1  # Table 4
    max_tokens: int = 32768  # Table 4
    seed: int = 0
    backend: str = "auto"  # auto: vllm on GPU when installed, else hf
    batch_size: int = 16  # prompts per HF generate call
    max_problems: int | None = None
    grader_workers: int | None = None  # None: one per CPU core
    grader_timeout: float = 5.0  # seconds per answer; a timeout counts as wrong
    # grade a box inside <think>...</think> too; default: only the answer after the thinking counts (as TRL's
    # reasoning reward and DAPO's). Applies to the training reward and to every evaluation alike
    credit_inside_think: bool = False
    # standalone vLLM engine (python -m atr_grpo.evaluate); inside training the colocated engine is used
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None  # None: the longest prompt + eval.max_tokens

    def __post_init__(self) -> None:
        registered = tuple(sorted(BENCHMARKS))  # read now: a benchmark registered after import counts too
        for name in self.benchmarks:
            _one_of("eval.benchmarks[]", name, registered)
        for name in self.paths:
            _one_of("eval.paths key", name, registered)
        _positive("eval.every_steps", self.every_steps)
        _check(self.n >= 1, "eval.n", ">= 1", self.n)
        _check(1 <= self.k <= self.n, "eval.k", f"in [1, eval.n={self.n}] (Pass@K needs n ≥ K samples)", self.k)
        _check(self.temperature >= 0, "eval.temperature", ">= 0", self.temperature)
        _check(self.temperature > 0 or self.n == 1, "eval.temperature", "> 0 when eval.n > 1", self.temperature)
        _check(0 < self.top_p <= 1, "eval.top_p", "in (0, 1]", self.top_p)
        _check(self.top_k == -1 or self.top_k > 0, "eval.top_k", "-1 (off) or > 0", self.top_k)
        _positive("eval.max_tokens", self.max_tokens)
        _one_of("eval.backend", self.backend, ("auto", "vllm", "hf"))
        _one_of("eval.when", self.when, ("after", "during"))
        _check(
            not self.share_start or self.when == "during",
            "eval.share_start",
            "false unless eval.when='during'",
            self.share_start,
        )
        if self.backend != "hf":  # auto is vLLM on a GPU: a config that passes on a CPU must not fail on a GPU
            check_vllm_temperature(
                self.temperature, "eval.temperature", f"eval.backend={self.backend}", "; eval.backend=hf does not"
            )
        for name, path in self.paths.items():
            _exists(f"eval.paths.{name}", path)
        _positive("eval.grader_timeout", self.grader_timeout)
        _check(
            isinstance(self.credit_inside_think, bool),
            "eval.credit_inside_think",
            "true or false",
            self.credit_inside_think,
        )
        _check(
            0 < self.gpu_memory_utilization < 1, "eval.gpu_memory_utilization", "in (0, 1)", self.gpu_memory_utilization
        )
        _check(
            self.max_model_len is None or self.max_model_len > 0,
            "eval.max_model_len",
            "null or > 0",
            self.max_model_len,
        )


# ----------------------------------------------------------------------------------------------- logger
@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | none
    project: str = "atr-grpo"
    entity: str | None = None
    mode: str = "auto"  # auto: WANDB_MODE if set, else online with an API key, else offline
    group: str | None = None  # default: the experiment, so one experiment's runs sit side by side
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _one_of("logger.name", self.name, ("wandb", "none"))
        _one_of("logger.mode", self.mode, ("auto", "online", "offline"))


# ------------------------------------------------------------------------------------------- clipping
@dataclass
class ClippingConfig:
    """Base of the per-rule schemas generated below from the registry (one per rule): the rule's parameters and,
    for a rule with a threshold δ, the keys of adaptive δ (`clipping/adaptive_delta.py`)."""

    name: str = MISSING

    def __post_init__(self) -> None:
        try:
            rule = build_rule(self.name, **self.params())
        except ValueError as err:
            raise ConfigError(f"invalid config: clipping: {err}") from None
        try:
            if takes_delta(self.name):
                check_delta_control(self.delta_control_settings(), rule.delta)
        except ValueError as err:  # the message starts with the key
            raise ConfigError(f"invalid config: clipping.{err}") from None

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
    module attribute so it pickles."""
    params = RULES[rule_name].params + (DELTA_CONTROL_PARAMS if takes_delta(rule_name) else ())
    fields = [
        (param.name, float | None if param.default is None else type(param.default), field(default=param.default))
        for param in params
    ]
    cls = dataclasses.make_dataclass(f"Clipping_{rule_name}", fields, bases=(ClippingConfig,))
    cls.__module__ = __name__
    globals()[cls.__name__] = cls
    return cls


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
        _check(0 <= self.seed < 2**32, "seed", "in [0, 2**32 - 1] (the seeds numpy and torch accept)", self.seed)
        tr, ro = self.trainer, self.rollout
        spg = ro.steps_per_generation or tr.gradient_accumulation_steps
        _check(
            spg % tr.gradient_accumulation_steps == 0,
            "rollout.steps_per_generation",
            f"a multiple of trainer.gradient_accumulation_steps={tr.gradient_accumulation_steps} "
            "(otherwise a rollout is generated in the middle of an optimizer step)",
            spg,
        )
        generation_batch = tr.per_device_train_batch_size * spg
        _check(
            generation_batch % tr.num_generations == 0,
            "trainer.per_device_train_batch_size",
            f"such that per_device_train_batch_size × steps_per_generation ({generation_batch}) is divisible "
            f"by trainer.num_generations={tr.num_generations}",
            tr.per_device_train_batch_size,
        )
        optimizer_batch = tr.per_device_train_batch_size * tr.gradient_accumulation_steps
        _check(
            optimizer_batch % tr.num_generations == 0,
            "trainer.gradient_accumulation_steps",
            f"such that per_device_train_batch_size × gradient_accumulation_steps ({optimizer_batch}) is "
            f"divisible by trainer.num_generations={tr.num_generations} (whole groups per optimizer step; "
            "Unsloth would otherwise silently change the batch size)",
            tr.gradient_accumulation_steps,
        )
        total = self.trainer.max_prompt_length + self.trainer.max_completion_length
        _check(
            total <= self.model.max_seq_length,
            "trainer.max_completion_length",
            f"≤ model.max_seq_length - trainer.max_prompt_length = "
            f"{self.model.max_seq_length - self.trainer.max_prompt_length}",
            tr.max_completion_length,
        )

        if self.rollout.engine == "vllm":
            check_vllm_temperature(self.trainer.temperature, "trainer.temperature", "rollout.engine=vllm")

        target = self.clipping.delta_control_settings().get("target_kl3")
        _check(
            target is None or self.optimizer_steps_per_rollout > 1,
            "clipping.target_kl3",
            "null when every update is on-policy (KL3 ≡ 0 gives the controller nothing to measure; use "
            "rollout=reuse2 or rollout.num_iterations > 1)",
            target,
        )

        per_rollout = self.optimizer_steps_per_rollout
        _check(
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


def check_vllm_temperature(value: float, key: str, why: str, hint: str = "") -> None:
    """vLLM refuses temperatures above 2 at the first request: refuse them before anything loads."""
    allowed = f"<= {VLLM_MAX_TEMPERATURE} with {why} (vLLM refuses more{hint})"
    _check(value <= VLLM_MAX_TEMPERATURE, key, allowed, value)


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
    method: str = "base"
    step: int = 0  # the step label of this evaluation in summary.jsonl
    force: bool = False  # re-evaluate (step, benchmark) pairs already in summary.jsonl

    def check_inputs(self) -> None:
        """What must exist when the evaluation runs (a plan may name an adapter a previous run will write)."""
        from pathlib import Path

        if self.adapter is not None:
            _exists("adapter", self.adapter)
        _check(not Path(self.out_dir).is_file(), "out_dir", "a directory to write eval/ into, not a file", self.out_dir)


# --------------------------------------------------------------------------------------- registration
# An experiment file (conf/experiment/<name>.yaml) may hold one key that is not a run's config: `plan`, the runs
# `python -m atr_grpo.launch <name>` starts. This is the one place that knows it: the root schemas accept the key
# so that the file composes, and `to_object` drops it, so it reaches neither a config object nor a run's files.
PLAN_KEY = "plan"


def _root_schema(schema: type) -> DictConfig:
    """The root schema as Hydra composes it: the dataclass's fields, plus the experiment's `plan` (null)."""
    node = OmegaConf.structured(schema)
    with open_dict(node):
        node[PLAN_KEY] = None
    return node


def register_configs() -> None:
    """Register schemas and resolvers (idempotent); entry points and tests call this before composing."""
    from hydra.core.config_store import ConfigStore

    OmegaConf.register_new_resolver("atr_method", rundir.method_label, replace=True)
    OmegaConf.register_new_resolver("atr_mul", lambda a, b: a * b, replace=True)
    OmegaConf.register_new_resolver("atr_run_name", rundir.run_name, replace=True)
    OmegaConf.register_new_resolver("atr_cache", lambda name: str(cache_dir(name)), replace=True)
    OmegaConf.register_new_resolver("atr_rank_suffix", log_suffix, replace=True)
    store = ConfigStore.instance()
    store.store(name="train_schema", node=_root_schema(TrainConfig))
    store.store(name="evaluate_schema", node=_root_schema(EvaluateConfig))
    # The groups are typed through the root schemas' fields; a clipping file picks its rule's schema with
    # `defaults: [/schema/clipping@_here_: <rule>]`, since the field itself cannot know the rule.
    for name, node in CLIPPING_SCHEMAS.items():
        store.store(group="schema/clipping", name=name, node=node)
        if not (CONF_DIR / "clipping" / f"{name}.yaml").exists():  # a rule with no file (a plugin's): its defaults
            store.store(group="clipping", name=name, node=node(name=name))


def config_to_yaml(cfg: TrainConfig) -> str:
    """The resolved YAML of a config object (the inverse of `config_from_yaml`)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_from_yaml(text: str) -> TrainConfig:
    """A run's resolved config.yaml back into its dataclasses (what a stage process of the run reads)."""
    raw = OmegaConf.create(text)
    schema = OmegaConf.structured(TrainConfig)
    name = raw.get("clipping", {}).get("name")
    if name not in CLIPPING_SCHEMAS:
        raise ConfigError(f"invalid config: clipping.name must be one of {', '.join(CLIPPING_SCHEMAS)}, got {name!r}")
    schema.clipping = OmegaConf.structured(CLIPPING_SCHEMAS[name])
    return to_object(OmegaConf.merge(schema, raw))


def _refuse_unknown_keys(node: DictConfig, prefix: str = "") -> None:
    """A `+trainer.lr=...` override adds a key the schema lacks, which OmegaConf would carry along as a stray
    attribute that nothing reads; refuse it like a misspelled key."""
    schema = OmegaConf.get_type(node)
    allowed = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    for key, value in node.items_ex(resolve=False):
        if allowed is not None and key not in allowed:
            raise ConfigError(unknown_key_message(f"{prefix}{key}", schema))
        if isinstance(value, DictConfig) and not OmegaConf.is_missing(node, key) and OmegaConf.get_type(value):
            _refuse_unknown_keys(value, f"{prefix}{key}.")  # (get_type is None for a null section)


def to_object(cfg: DictConfig) -> Any:
    """Resolve a composed DictConfig into its dataclasses, running every validation; drops the experiment's
    `plan` from `cfg` (see PLAN_KEY), so a run's config.yaml written from `cfg` afterwards holds none."""
    with flag_override(cfg, ["readonly", "struct"], False):
        cfg.pop(PLAN_KEY, None)
    _refuse_unknown_keys(cfg)
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:  # a missing mandatory value, an interpolation that fails
        raise ConfigError(f"invalid config: {err}") from err
