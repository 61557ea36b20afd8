"""The config schemas of how a run trains: the trainer (optimizer, batch, group, sampling, loss aggregation), the
rollouts (their engine, staleness and importance correction), the evaluations and the logger. Each
`__post_init__` checks its values (`config_checks`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from omegaconf import MISSING

from atr_grpo.benchmarks import BENCHMARKS
from atr_grpo.config_checks import check, check_vllm_temperature, require_exists, require_one_of, require_positive
from atr_grpo.errors import ConfigError
from atr_grpo.losses import AGGREGATION_CHOICES, KL_ESTIMATORS
from atr_grpo.rollout_correction import RolloutCorrection, correction_problem, rejection_problem
from atr_grpo.truncation import DAPO_PENALTY, TRUNCATION_SETTINGS


# ---------------------------------------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    """The defaults are the paper's values (Table 4, §6.1), each with its source: `conf/trainer/paper.yaml` selects
    them and restates none. Anything that changes the loss is set here, never left to a library default."""

    backend: str = "auto"  # auto: unsloth on a CUDA machine with unsloth installed, else trl
    learning_rate: float = 5e-6  # Table 4
    weight_decay: float = 1e-3  # Table 4
    optim: str = "adamw_torch"  # AdamW (Table 4); set explicitly because Unsloth defaults to adamw_8bit
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99  # Unsloth's GRPO notebook, whose other values Table 4 matches
    lr_scheduler_type: str = "linear"  # the notebook's
    warmup_ratio: float = 0.1  # the notebook's; a fraction of max_steps (transformers 5 `warmup_steps` < 1)
    max_grad_norm: float = 1.0
    per_device_train_batch_size: int = 8  # Table 4
    # Table 4. Micro-batches per optimizer step over all processes: N launched processes accumulate GA/N each, so
    # per_device_train_batch_size × gradient_accumulation_steps is the global batch on any number of processes
    gradient_accumulation_steps: int = 4
    num_generations: int = 8  # group size G, Table 4
    temperature: float = 1.0  # Table 4
    top_p: float = 1.0  # Table 4
    top_k: int = -1  # Table 4; -1 = off
    # top_p < 1 or top_k > 0 samples from a truncated π_old: every rule's ratio and the rollout correction then
    # measure against another distribution than the one sampled (trl#6789). Refused unless this is true, which warns
    # and logs the share of the engine's ratios outside the rule's box (rollout/ratio_outside_box_frac)
    allow_truncated_sampling: bool = False
    max_steps: int = 1000  # §6.1
    beta: float = 0.0  # KL to the reference policy: none (App. B)
    kl_estimator: str = "k3"  # only used when beta > 0 (RPG paper's estimators)
    kl_importance_weight: bool = True  # the w-correction that makes k3's off-policy gradient unbiased
    max_prompt_length: int = 512
    max_completion_length: int = 1536  # = model.max_seq_length (2048) - max_prompt_length; also Dr.GRPO's constant
    loss_agg: str = "dr_grpo"  # Dr.GRPO backbone (§6.1); token_mean and seq_mean as ablations
    scale_rewards: str = "none"  # Dr.GRPO: advantages are R - mean(R), no std division
    # a completion that reaches max_completion_length without ending: zero | mask | soft_overlong | credit_box
    # (atr_grpo/truncation.py); the evaluation never credits one
    truncation: str = "zero"
    overlong_buffer: int | None = None  # soft_overlong: tokens before the budget where the penalty ramps (null: 1/5)
    overlong_penalty: float = DAPO_PENALTY  # soft_overlong: the penalty at the budget (DAPO's factor)
    logging_steps: int = 1
    save_steps: int = 50  # aligned with eval.every_steps
    save_total_limit: int | None = 3
    bf16: bool | None = None  # null: true on a CUDA GPU, false on CPU
    gradient_checkpointing: bool | None = None  # null: on for GPU backends, off on CPU
    log_completions: bool = False
    num_threads: int | None = None  # torch CPU threads (None: leave torch's choice)
    # launched runs (torchrun / accelerate launch): seconds any collective may wait, the barrier where the other
    # processes wait for the main one's evaluation (eval.when=during) included (transformers' default)
    ddp_timeout: int = 1800

    def __post_init__(self) -> None:
        require_one_of("trainer.backend", self.backend, ("auto", "unsloth", "trl"))
        require_positive("trainer.learning_rate", self.learning_rate)
        check(self.weight_decay >= 0, "trainer.weight_decay", ">= 0", self.weight_decay)
        check(0 <= self.warmup_ratio < 1, "trainer.warmup_ratio", "in [0, 1)", self.warmup_ratio)
        require_positive("trainer.per_device_train_batch_size", self.per_device_train_batch_size)
        require_positive("trainer.gradient_accumulation_steps", self.gradient_accumulation_steps)
        group = self.num_generations
        check(group >= 2, "trainer.num_generations", ">= 2 (a group needs a baseline)", group)
        check(0 < self.temperature <= 10, "trainer.temperature", "in (0, 10]", self.temperature)
        check(0 < self.top_p <= 1, "trainer.top_p", "in (0, 1]", self.top_p)
        check(self.top_k == -1 or self.top_k > 0, "trainer.top_k", "-1 (off) or > 0", self.top_k)
        check_truncated_sampling(self)
        require_positive("trainer.max_steps", self.max_steps)
        check(self.beta >= 0, "trainer.beta", ">= 0", self.beta)
        require_one_of("trainer.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        require_one_of("trainer.loss_agg", self.loss_agg, AGGREGATION_CHOICES)
        require_one_of("trainer.scale_rewards", self.scale_rewards, ("none", "group", "batch"))
        require_positive("trainer.max_prompt_length", self.max_prompt_length)
        require_positive("trainer.max_completion_length", self.max_completion_length)
        self._check_truncation()
        require_positive("trainer.save_steps", self.save_steps)
        require_positive("trainer.ddp_timeout", self.ddp_timeout)

    def _check_truncation(self) -> None:
        require_one_of("trainer.truncation", self.truncation, TRUNCATION_SETTINGS)
        if self.truncation != "soft_overlong":  # the penalty's settings would be accepted and never read
            check(
                self.overlong_buffer is None,
                "trainer.overlong_buffer",
                "null unless truncation=soft_overlong",
                self.overlong_buffer,
            )
            check(
                self.overlong_penalty == DAPO_PENALTY,
                "trainer.overlong_penalty",
                f"{DAPO_PENALTY} unless truncation=soft_overlong",
                self.overlong_penalty,
            )
            return
        budget = self.max_completion_length
        if self.overlong_buffer is not None:
            check(
                1 <= self.overlong_buffer <= budget,
                "trainer.overlong_buffer",
                f"null or in [1, trainer.max_completion_length = {budget}]",
                self.overlong_buffer,
            )
        require_positive("trainer.overlong_penalty", self.overlong_penalty)


def truncated_sampling(trainer: TrainerConfig) -> str | None:
    """The setting that truncates the training sampler (`trainer.top_p=0.9`), None when sampling is untruncated."""
    if trainer.top_p < 1:
        return f"trainer.top_p={trainer.top_p!r}"
    if trainer.top_k > 0:
        return f"trainer.top_k={trainer.top_k!r}"
    return None


def check_truncated_sampling(trainer: TrainerConfig) -> None:
    """Truncated sampling (top-p < 1, top-k > 0) draws each token from the kept part of π_old, renormalised, while
    the trainer computes π_old over the whole vocabulary: the ratio every rule clips and the rollout correction's
    r = π_old/π_rollout carry the kept mass, which is no policy change (with top_p 0.8, 51.8 % of the tokens' r fell
    outside [0.9, 1.1], against 4.3 % once renormalised: TRL PR #7269). Every rule of the registry takes that ratio,
    so the check needs no rule. Refused unless `trainer.allow_truncated_sampling=true`; evaluation sampling
    (eval.top_p) is not concerned."""
    setting = truncated_sampling(trainer)
    if trainer.allow_truncated_sampling:  # the flag would be accepted and never read
        check(setting is not None, "trainer.allow_truncated_sampling", "false with untruncated sampling", True)
        return
    why = (
        "truncated sampling draws from a renormalised part of π_old, so the rule's ratio π_θ/π_old and the rollout "
        "correction measure against a distribution that was not sampled; trainer.allow_truncated_sampling=true "
        "trains so anyway, with a warning and the share of ratios outside the rule's box logged"
    )
    check(trainer.top_p == 1, "trainer.top_p", f"1.0 for training ({why})", trainer.top_p)
    check(trainer.top_k == -1, "trainer.top_k", f"-1 for training (off; {why})", trainer.top_k)


def check_truncated_sampling_engine(trainer: TrainerConfig, engine: str) -> None:
    """Truncated sampling, when allowed, logs the engine's ratios against the rule's box: transformers' generate
    returns no log-probs of the sampled tokens to measure them with."""
    setting = truncated_sampling(trainer)
    check(
        setting is None or engine != "hf",
        "trainer.allow_truncated_sampling",
        f"false with rollout.engine='hf' (the share of ratios outside the rule's box that {setting} needs logged "
        "comes from the rollout engine's log-probs, which transformers' generate does not return; set "
        "rollout.engine=vllm)",
        trainer.allow_truncated_sampling,
    )


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
        require_one_of("rollout.vllm.mode", self.mode, ("colocate", "server"))
        check(
            0 < self.gpu_memory_utilization < 1,
            "rollout.vllm.gpu_memory_utilization",
            "in (0, 1)",
            self.gpu_memory_utilization,
        )
        check(0 < self.server_port < 65536, "rollout.vllm.server_port", "a port number", self.server_port)
        check(0 < self.group_port < 65536, "rollout.vllm.group_port", "a port number (1-65535)", self.group_port)
        check(self.server_timeout > 0, "rollout.vllm.server_timeout", "> 0", self.server_timeout)


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
    # verl's sequence rejection (rollout_rs): a sequence whose divergence from the rollout policy exceeds
    # rejection_threshold leaves the loss: none | seq_max_k2 | seq_max_k3 | seq_mean_k3; combines with correction
    rejection: str = "none"
    rejection_threshold: float | None = None  # verl's rollout_rs_threshold (no default there either)

    def __post_init__(self) -> None:
        check(self.num_iterations >= 1, "rollout.num_iterations", ">= 1", self.num_iterations)
        if self.steps_per_generation is not None:
            require_positive("rollout.steps_per_generation", self.steps_per_generation)
        require_one_of("rollout.engine", self.engine, ("auto", "hf", "vllm"))
        problem = correction_problem(self.correction, self.correction_level, self.correction_min, self.correction_max)
        if problem is None:
            problem = rejection_problem(self.rejection, self.rejection_threshold)
        if problem is not None:
            raise ConfigError(f"invalid config: {problem}")
        if self.correction == "none":  # the correction's settings would be accepted and never read
            for key in ("correction_level", "correction_min", "correction_max"):
                default = ROLLOUT_DEFAULTS[key]
                check(
                    getattr(self, key) == default,
                    f"rollout.{key}",
                    f"left at its default {default!r} with rollout.correction='none' (set rollout.correction=tis "
                    "or mis for it to act)",
                    getattr(self, key),
                )
        check_correction_engine(self.correction, self.engine)
        check_rejection_engine(self.rejection, self.engine)
        check_server_engine(self.vllm.mode, self.engine)

    def rollout_correction(self) -> RolloutCorrection:
        return RolloutCorrection(
            self.correction,
            self.correction_level,
            self.correction_min,
            self.correction_max,
            self.rejection,
            self.rejection_threshold,
        )


ROLLOUT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RolloutConfig)}


def check_server_engine(mode: str, engine: str) -> None:
    """A `trl vllm-serve` server only serves vLLM rollouts: with transformers' generate it would never be asked."""
    check(
        mode != "server" or engine != "hf",
        "rollout.vllm.mode",
        "'colocate' with rollout.engine='hf' (a rollout server only serves rollout.engine=vllm)",
        mode,
    )


def check_correction_engine(correction: str, engine: str) -> None:
    """transformers' generate gives no log-probs of the sampled tokens: there is nothing to correct for."""
    check(
        correction == "none" or engine != "hf",
        "rollout.correction",
        "'none' with rollout.engine='hf' (only vLLM rollouts give the sampled tokens' log-probs to correct with; "
        "set rollout.engine=vllm)",
        correction,
    )


def check_rejection_engine(rejection: str, engine: str) -> None:
    """A rollout rejection measures π_old against the engine's log-probs, which transformers' generate does not give."""
    check(
        rejection == "none" or engine != "hf",
        "rollout.rejection",
        "'none' with rollout.engine='hf' (only vLLM rollouts give the sampled tokens' log-probs to reject with; "
        "set rollout.engine=vllm)",
        rejection,
    )


# ------------------------------------------------------------------------------------------------- eval
@dataclass
class EvalConfig:
    """The defaults are the paper's protocol (§6.1, Table 4): Mean@8 and Pass@8 on AMC2023 (83 problems), AIME2024
    and AIME2025 every 50 steps. `conf/eval/paper.yaml` selects them and restates none."""

    enabled: bool = True
    # when evaluations run: `after` training, in a process of their own with a vLLM engine sized for the
    # longest prompt + max_tokens, from the adapter saved at each evaluated step (the paper's 32,768-token
    # budget on one GPU); or `during` training, on the live model (HF generate, or Unsloth's engine)
    when: str = "after"  # after | during
    keep_adapters: bool = False  # keep eval/adapters/step_<N:06d> once step N is evaluated (final_adapter stays)
    # step 0 evaluated once per starting adapter and evaluation settings, and copied into every run that starts
    # from it (eval.when=during): the samples are the same ones, since every run evaluates step 0 alike
    share_start: bool = False
    every_steps: int = 50  # §6.1
    at_start: bool = True  # step 0: the model GRPO starts from (Table 2's base row for sft=none)
    benchmarks: list[str] = field(default_factory=lambda: ["amc23", "aime24", "aime25"])  # §6.1
    paths: dict[str, str] = field(default_factory=dict)  # benchmark -> local file instead of the hub
    strict: bool = True  # check each benchmark's row count
    n: int = 8  # samples per problem
    k: int = 8  # the K of Mean@K / Pass@K in tables (Table 2: 8)
    temperature: float = 0.3  # Table 4
    top_p: float = 0.95  # Table 4
    top_k: int = -1  # Table 4
    max_tokens: int = 32768  # Table 4
    seed: int = 0
    # draw each evaluation step's samples from a seed of its own, derived from (eval.seed, step): with
    # `eval.seed: ${seed}` the methods of one run seed share their draws, and no two steps or seeds do
    seed_by_step: bool = False
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
            require_one_of("eval.benchmarks[]", name, registered)
        for name in self.paths:
            require_one_of("eval.paths key", name, registered)
        require_positive("eval.every_steps", self.every_steps)
        check(self.n >= 1, "eval.n", ">= 1", self.n)
        check(1 <= self.k <= self.n, "eval.k", f"in [1, eval.n={self.n}] (Pass@K needs n ≥ K samples)", self.k)
        check(self.temperature >= 0, "eval.temperature", ">= 0", self.temperature)
        check(self.temperature > 0 or self.n == 1, "eval.temperature", "> 0 when eval.n > 1", self.temperature)
        check(0 < self.top_p <= 1, "eval.top_p", "in (0, 1]", self.top_p)
        check(self.top_k == -1 or self.top_k > 0, "eval.top_k", "-1 (off) or > 0", self.top_k)
        require_positive("eval.max_tokens", self.max_tokens)
        require_one_of("eval.backend", self.backend, ("auto", "vllm", "hf"))
        require_one_of("eval.when", self.when, ("after", "during"))
        check(
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
            require_exists(f"eval.paths.{name}", path)
        require_positive("eval.grader_timeout", self.grader_timeout)
        check(
            isinstance(self.credit_inside_think, bool),
            "eval.credit_inside_think",
            "true or false",
            self.credit_inside_think,
        )
        check(
            0 < self.gpu_memory_utilization < 1, "eval.gpu_memory_utilization", "in (0, 1)", self.gpu_memory_utilization
        )
        check(
            self.max_model_len is None or self.max_model_len > 0,
            "eval.max_model_len",
            "null or > 0",
            self.max_model_len,
        )


# ----------------------------------------------------------------------------------------------- logger
MAX_EVAL_COMPLETIONS = 1000  # a W&B table row holds a whole completion (up to eval.max_tokens): keep tables small


@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | none
    project: str = "atr-grpo"
    entity: str | None = None
    mode: str = "auto"  # auto: WANDB_MODE if set, else online with an API key, else offline
    group: str | None = None  # default: the experiment, so one experiment's runs sit side by side
    tags: list[str] = field(default_factory=list)
    # rows per benchmark of the table of sample completions logged at each evaluation (prompt, completion, gold,
    # status); an integer in 0..MAX_EVAL_COMPLETIONS, 0 for no table
    eval_completions: int = 16

    def __post_init__(self) -> None:
        require_one_of("logger.name", self.name, ("wandb", "none"))
        require_one_of("logger.mode", self.mode, ("auto", "online", "offline"))
        check(
            isinstance(self.eval_completions, int) and 0 <= self.eval_completions <= MAX_EVAL_COMPLETIONS,
            "logger.eval_completions",
            f"an integer in 0..{MAX_EVAL_COMPLETIONS} (rows per benchmark of W&B's completions table; 0: no table)",
            self.eval_completions,
        )
