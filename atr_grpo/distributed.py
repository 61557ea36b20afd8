"""One run on N processes (`torchrun`, `accelerate launch`): who they are, what each does, how they agree.

A launcher starts `python -m atr_grpo.train` once per process and says which one each is through the
environment (RANK, LOCAL_RANK, WORLD_SIZE), so everything here that only reads it works before any process
group exists, and is the single-process answer outside a launcher (rank 0 of 1).

- `process_group`: the group of a launched run, started through accelerate's `PartialState` with `cpu=True`
  on a machine without CUDA. Without that flag accelerate only looks for an accelerator: on CPU every
  process then reports itself alone (`DistributedType.NO`, one process) even under torchrun, and N processes
  would each train their own copy into the same run directory. The number of processes the group finds is
  checked against the launcher's WORLD_SIZE, and a CPU process's device is named `cpu` (accelerate's `cpu:0`
  is a location `torch.load` cannot map a checkpoint to, so a resumed run failed).
- `on_main` / `main_first`: run-directory writes happen on the main process, which shares the outcome (or
  its error) with the others; a cache (the SFT adapter) is built by each node's first process, then reused.
- `process_batch`: the global batch stays the config's on any number of processes (see its docstring).
- `stage_environment`: a stage process (`training.stages`: SFT, evaluation) is one process on its own, never
  a member of the launcher's group, whatever launched its parent, and it sees one GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from atr_grpo.errors import ConfigError

T = TypeVar("T")

# How long `main_first`'s other processes wait for the first one's cache (an SFT stage of any realistic length)
CACHE_WAIT = timedelta(days=7)

# What a launcher sets to make a process one member of a group (torchrun, its elastic agent, accelerate)
LAUNCHER_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "ACCELERATE_", "FSDP_")
# wandb keeps the address of its service process (wandb-core) here once a process has started one: a stage process
# that inherited it would open its W&B run in the parent's service, where the stream of a run with the same id can
# outlive a crashed client ("run ID ... is in use"). A stage starts a service of its own.
WANDB_SERVICE_VARIABLE = "WANDB_SERVICE"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def world_size() -> int:
    """How many processes the launcher started (1 without one)."""
    return _env_int("WORLD_SIZE", 1)


def rank() -> int:
    return _env_int("RANK", 0)


def local_rank() -> int:
    """The process's index on its machine: the GPU it uses."""
    return _env_int("LOCAL_RANK", 0)


def launched() -> bool:
    return world_size() > 1


def is_main() -> bool:
    """The process that writes the run's files (rank 0; the only one without a launcher)."""
    return rank() == 0


def local_device() -> str:
    """This process's device: its own GPU (cuda:LOCAL_RANK), or the CPU."""
    import torch

    return f"cuda:{local_rank()}" if torch.cuda.is_available() else "cpu"


def log_suffix() -> str:
    """`""` for the main process, `.rank<k>` for the others: Hydra's log file of each process (train.rank1.log)."""
    return "" if is_main() else f".rank{rank()}"


def parent_only(name: str) -> bool:
    """Whether a process it starts must not inherit this environment variable: it makes this process a member of a
    process group (a launcher's), or a client of this process's W&B service."""
    return name in LAUNCHER_VARIABLES or name.startswith(LAUNCHER_PREFIXES) or name == WANDB_SERVICE_VARIABLE


def stage_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a stage process: this one's, without the variables that made it a member of a group or
    a client of this process's W&B service, and with CUDA_VISIBLE_DEVICES narrowed to the one GPU the stage uses
    (`stage_device`)."""
    source = os.environ if environ is None else environ
    env = {key: value for key, value in source.items() if not parent_only(key)}
    device = stage_device(source)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    return env


def stage_device(environ: Mapping[str, str]) -> str | None:
    """The one GPU of a stage process: the caller's own (LOCAL_RANK among the visible ones), or the first visible.

    A stage process is one process: transformers' Trainer outside a process group takes every GPU it sees
    (`n_gpu = device_count()`), which TRL's SFTTrainer and GRPOTrainer refuse. None: no GPU is visible (an
    empty CUDA_VISIBLE_DEVICES, or "-1"), which stays as it is.
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    index = int(environ.get("LOCAL_RANK", "").strip() or 0)
    if visible is None:  # every GPU of the machine, numbered from 0
        return str(index)
    devices = [device.strip() for device in visible.split(",") if device.strip()]
    if not devices or devices[0] == "-1":
        return None
    if index >= len(devices):
        raise RuntimeError(
            f"LOCAL_RANK={index} but CUDA_VISIBLE_DEVICES={visible!r} shows {len(devices)} GPU(s): "
            "a stage process would have no GPU of its own"
        )
    return devices[index]


# ------------------------------------------------------------------------------------------ the global batch
@dataclass(frozen=True)
class ProcessBatch:
    """What each of the `world_size` processes does per optimizer step and per generation."""

    world_size: int
    gradient_accumulation_steps: int  # micro-batches each process accumulates per optimizer step
    steps_per_generation: int  # micro-batches each process takes from one generation batch


def process_batch(
    per_device_batch: int, gradient_accumulation_steps: int, steps_per_generation: int, processes: int
) -> ProcessBatch:
    """Split the config's micro-batch counts over `processes` so that the global batch stays the config's.

    `trainer.gradient_accumulation_steps` counts the micro-batches of one optimizer step over all processes:
    one process accumulates all of them (Table 4: 8 × 4 = 32 completions per step on one GPU); N processes
    accumulate GA/N each and DDP averages their gradients, which is the same optimizer step. The generation
    batch (per_device_batch × steps_per_generation) is split the same way (steps_per_generation is a multiple
    of GA, so N divides it too). A GA that N does not divide is refused, naming the keys, rather than silently
    changing the batch.
    """
    if gradient_accumulation_steps % processes:
        global_batch = per_device_batch * gradient_accumulation_steps
        raise ConfigError(
            f"invalid config: trainer.gradient_accumulation_steps must be a multiple of the number of processes "
            f"({processes}), got {gradient_accumulation_steps}. It counts the micro-batches of one optimizer step "
            f"over all processes, so that trainer.per_device_train_batch_size × trainer.gradient_accumulation_steps "
            f"= {global_batch} is the global batch on any number of processes; "
            + _same_global_batch(global_batch, per_device_batch, processes)
        )
    return ProcessBatch(processes, gradient_accumulation_steps // processes, steps_per_generation // processes)


def _same_global_batch(global_batch: int, per_device_batch: int, processes: int) -> str:
    """A split of `global_batch` whose accumulation `processes` divides (the largest micro-batch), if any."""
    for batch in range(per_device_batch, 0, -1):
        accumulation, rest = divmod(global_batch, batch)
        if rest == 0 and accumulation % processes == 0:
            return (
                f"for the same global batch use trainer.per_device_train_batch_size={batch} "
                f"trainer.gradient_accumulation_steps={accumulation}"
            )
    return f"no micro-batch size splits {global_batch} over {processes} processes: use another number of processes"


# ------------------------------------------------------------------------------------------ the process group
def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


@contextmanager
def process_group(timeout_seconds: float) -> Iterator[None]:
    """The launched run's process group, for the time of the `with` (nothing without a launcher).

    `timeout_seconds` bounds every collective, the barriers included (`trainer.ddp_timeout`). A group that
    exists already (a caller's own) is used and left in place.
    """
    if not launched() or _initialized():
        yield
        return
    import torch
    from accelerate import PartialState

    cpu = not torch.cuda.is_available()
    if cpu:  # else accelerate names every CPU process's device "cpu:0", which torch.load cannot map a checkpoint to
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")
    state = PartialState(cpu=cpu, timeout=timedelta(seconds=timeout_seconds))
    if state.num_processes != world_size():
        raise RuntimeError(
            f"the launcher started {world_size()} processes (WORLD_SIZE) but accelerate set up "
            f"{state.num_processes} ({state.distributed_type}); refusing to train {world_size()} separate copies"
        )
    try:
        yield
    finally:
        _shutdown()


def _shutdown() -> None:
    import torch.distributed as dist
    from accelerate.state import AcceleratorState

    if _initialized():
        dist.destroy_process_group()
    AcceleratorState._reset_state(reset_partial_state=True)  # nothing later in this process sees a stale group


def barrier() -> None:
    """Wait until every process of the group gets here (nothing on one process)."""
    if _initialized():
        import torch.distributed as dist

        dist.barrier()


class ProcessFailed(RuntimeError):
    """Another process of the run failed at a point where all of them must agree."""


def on_main(work: Callable[[], T]) -> T:
    """`work()` on the main process; every process returns its result, or raises its exception."""
    if not _initialized():
        return work()
    import torch.distributed as dist

    outcome: list[Any] = [None]
    if is_main():
        try:
            outcome = [(True, work())]
        except Exception as err:
            outcome = [(False, _portable(err))]
    dist.broadcast_object_list(outcome, src=0)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _portable(error: Exception) -> Exception:
    """`error` itself when it can be sent to the other processes, else a RuntimeError with its message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def main_first(work: Callable[[], T]) -> T:
    """`work()` on each machine's first process, then, once it succeeded on all of them, on the others: a
    cache that one process of a machine builds and the others reuse. A failure anywhere stops every process.

    The others wait in a group of their own whose timeout is `CACHE_WAIT`, not the run's `trainer.ddp_timeout`
    (which bounds the collectives of training): building the cache (the SFT stage, a model download included)
    may take longer than that. A process that dies still ends the run: the launcher stops the others.
    """
    if not _initialized():
        return work()
    import torch.distributed as dist

    waiting = dist.new_group(backend="gloo", timeout=CACHE_WAIT)  # every process, before any of them works
    first = local_rank() == 0
    result: Any = None
    error: Exception | None = None
    if first:
        try:
            result = work()
        except Exception as err:
            error = err
    errors: list[Any] = [None] * world_size()
    try:
        dist.all_gather_object(errors, None if error is None else f"{type(error).__name__}: {error}", group=waiting)
    finally:
        dist.destroy_process_group(waiting)
    if error is not None:
        raise error
    failed = [(index, message) for index, message in enumerate(errors) if message is not None]
    if failed:
        raise ProcessFailed("; ".join(f"process {index} failed: {message}" for index, message in failed))
    return result if first else work()
