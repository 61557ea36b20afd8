"""`python -m atr_grpo.train [group=option ...] [key=value ...]`: one GRPO run (or a Hydra multirun sweep).

Compose the config, validate it (bad input stops here with its message and exit status 2, before any model
is loaded), then hand the plain dataclasses to `atr_grpo.training.pipeline.run_pipeline`. `--cfg job --resolve`
prints the resolved config, validated as a run's is, and loads nothing. Exit status: 0 when the run trained to its
last step and every scheduled evaluation is recorded, 2 for bad input, 3 when training finished but evaluations are
missing (re-launch the same command to retry them). Under `torchrun` / `accelerate launch` the main process reports
the outcome and the launcher fails when any process does.
"""

from __future__ import annotations

import sys

from atr_grpo.training.interrupts import before_the_run

with before_the_run():  # Ctrl-C while the libraries load: one line, no traceback
    import hydra
    from omegaconf import DictConfig, OmegaConf

    from atr_grpo.plugins import broken_plugins_stop_the_command

    with broken_plugins_stop_the_command():  # importing the config reads the installed rules
        from atr_grpo.config_hydra import register_configs
        from atr_grpo.console import quiet_libraries
        from atr_grpo.errors import ConfigError
        from atr_grpo.hydra_app import checked_config, run_app
        from atr_grpo.machine import check_launch_here

    register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    try:
        train_cfg = checked_config("train", cfg)  # validated once, by run_app's check
    except ConfigError as err:
        print(err, file=sys.stderr)
        sys.exit(2)
    from atr_grpo import multirun
    from atr_grpo.rundir import RunFileError
    from atr_grpo.training.interrupts import interrupted_message, interrupted_stage
    from atr_grpo.training.pipeline import EXIT_EVALUATIONS_INCOMPLETE, RunDirError, run_pipeline
    from atr_grpo.training.stage_process import EXIT_INTERRUPTED, StageError

    quiet_libraries()

    try:
        outcome = run_pipeline(train_cfg, OmegaConf.to_yaml(cfg, resolve=True))
    except (ConfigError, RunDirError, RunFileError) as err:  # bad input, or a run file changed from outside
        print(err, file=sys.stderr)
        sys.exit(2)
    except StageError as err:  # the stage process printed why
        print(err, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as interrupt:  # Ctrl-C: one line, no traceback; the run continues from its checkpoint
        print(interrupted_message(train_cfg.run_dir, interrupted_stage(interrupt)), file=sys.stderr)
        multirun.interrupted()  # in a sweep: the table of its jobs
        sys.exit(EXIT_INTERRUPTED)
    if outcome is None:  # a launched run's other processes: their part ended with training
        return
    print(outcome.summary(), file=sys.stdout if outcome.ok else sys.stderr)
    if not outcome.ok:
        sys.exit(EXIT_EVALUATIONS_INCOMPLETE)


if __name__ == "__main__":
    with before_the_run():  # composing and checking the config, before `main` knows the run
        status = run_app(main, config_name="train", launch_check=check_launch_here)
    sys.exit(status)
