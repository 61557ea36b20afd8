"""The stages of a training run that get a process of their own:

    python -m atr_grpo.training.stages sft STAGING_DIR    the SFT format stage (STAGING_DIR/run_config.yaml)
    python -m atr_grpo.training.stages grpo RUN_DIR       GRPO training of a prepared run directory
    python -m atr_grpo.training.stages evaluate RUN_DIR   the evaluation of the run's saved adapters

Why processes. SFT must run through the same, pristine TRL `SFTTrainer` on every machine, and on a GPU the
training process has imported Unsloth, which rewrites TRL's trainers. The evaluation after training needs the
GPU memory that training holds (Unsloth's colocated vLLM engine included), which only exiting gives back.
Each stage reads the run's own resolved config, so what it does is what the run directory records. A stage
process is one process on its own: it does not inherit a launcher's process-group variables (RANK, WORLD_SIZE,
MASTER_PORT, ...), so under `torchrun` it never joins, or waits for, the launched processes' group.

This module is the child's entry point; the parent starts it with `stage_process.run_stage`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from atr_grpo.training.stage_process import (
    EXIT_INTERRUPTED,
    RUN_CONFIG,
    STAGE_MODULE,
    STAGES,
    die_with_parent,
    handed_decision,
)


def main(argv: list[str] | None = None) -> int:
    if not die_with_parent():
        print("the process that started this stage has ended; the stage does not run", file=sys.stderr)
        return 1
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in STAGES:
        print(f"usage: python -m {STAGE_MODULE} {{{','.join(STAGES)}}} PATH", file=sys.stderr)
        return 2
    from atr_grpo import rundir
    from atr_grpo.console import configure_logging
    from atr_grpo.errors import ConfigError

    configure_logging()
    try:
        return run_here(args[0], Path(args[1]))
    except (ConfigError, rundir.RunFileError) as err:  # a run file changed from outside: one line, no traceback
        print(err, file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the process that started the stage says where the run stands
        return EXIT_INTERRUPTED


def run_here(stage: str, path: Path) -> int:
    """One stage in this process."""
    from atr_grpo import rundir
    from atr_grpo.config_hydra import config_from_yaml

    if stage == "sft":
        from atr_grpo.training.sft import train_sft

        train_sft(config_from_yaml((path / RUN_CONFIG).read_text()), path)
        return 0
    cfg = config_from_yaml((path / rundir.CONFIG_FILE).read_text())
    if stage == "grpo":
        from atr_grpo.machine import inherited_or_decided
        from atr_grpo.training.pipeline import import_only_what_runs, run_state, train_grpo

        decision = inherited_or_decided(cfg, handed_decision(path))
        import_only_what_runs(decision)
        train_grpo(cfg, run_state(path), decision)
        return 0
    from atr_grpo.evaluation.engines import engine_in_this_process
    from atr_grpo.training.evaluations import evaluate_saved_adapters

    engine_in_this_process()
    evaluate_saved_adapters(cfg, path)  # a failed step is recorded in eval/failures.jsonl, not an exit status
    return 0


if __name__ == "__main__":
    sys.exit(main())
