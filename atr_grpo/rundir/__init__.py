"""The run directory: its name, and the files every number in this project is computed from.

`layout` names every file and folder of a run directory (the only module that spells one), `records` holds the
typed records written to and read from them, `files` the atomic and JSONL I/O, `lock` the one process a run
directory takes, and `naming` a run's name and its method's identity. The names below are re-exported so that
`from atr_grpo import rundir; rundir.X` reads as before. Importing this package does not import torch.
"""

from atr_grpo.rundir.files import (
    RunFileError,
    append_jsonl,
    file_lock,
    iter_jsonl,
    load_config,
    read_json,
    read_jsonl,
    read_text,
    set_torn_tail_aside,
    write_json,
    write_text,
)
from atr_grpo.rundir.layout import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    DONE_FILE,
    ENV_FILE,
    EVAL_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    eval_step_dir,
    find_run_dirs,
    summary_path,
)
from atr_grpo.rundir.lock import RunDirInUseError, lock_run_dir, unlock_run_dir
from atr_grpo.rundir.naming import (
    LABELLED_KEYS,
    NOT_METHOD_KEYS,
    config_differences,
    fit_name,
    in_section,
    method_label,
    method_settings,
    multirun_suffix,
    run_name,
    setting_text,
    study_of,
    sweep_run_name,
    sweep_suffix,
)

__all__ = [
    "CHECKPOINT_DIR",
    "CONFIG_FILE",
    "DONE_FILE",
    "ENV_FILE",
    "EVAL_DIR",
    "LABELLED_KEYS",
    "METRICS_FILE",
    "NOT_METHOD_KEYS",
    "SUMMARY_FILE",
    "RunDirInUseError",
    "RunFileError",
    "append_jsonl",
    "config_differences",
    "eval_step_dir",
    "file_lock",
    "find_run_dirs",
    "fit_name",
    "in_section",
    "iter_jsonl",
    "load_config",
    "lock_run_dir",
    "method_label",
    "method_settings",
    "multirun_suffix",
    "read_json",
    "read_jsonl",
    "read_text",
    "run_name",
    "set_torn_tail_aside",
    "setting_text",
    "study_of",
    "summary_path",
    "sweep_run_name",
    "sweep_suffix",
    "unlock_run_dir",
    "write_json",
    "write_text",
]
