"""Trainer checkpoints that a kill cannot leave half-written, and the newest complete one to resume from.

A checkpoint is written under a temporary name (`checkpoints/.partial-checkpoint-<N>/checkpoint-<N>`), its files
are flushed to disk, and only then is it renamed to `checkpoints/checkpoint-<N>`: a run killed during a save (a
SLURM preemption, an out-of-memory kill) has no `checkpoint-<N>` and resumes from the one before, losing at most
the steps since. A checkpoint cut off some other way (copied in part, a full disk, written by another tool) is
recognised by its files (`checkpoint_problem`), skipped with a warning that names it, and kept, moved aside as
`incomplete-checkpoint-<N>` when the resumed run saves step N again. Nothing here deletes a checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "checkpoint"  # transformers' PREFIX_CHECKPOINT_DIR
PARTIAL_PREFIX = ".partial-"  # a checkpoint being written (its name does not match transformers' `checkpoint-*`)
INCOMPLETE_PREFIX = "incomplete-"  # a cut-off checkpoint set aside when its step is saved again
TRAINER_STATE = "trainer_state.json"  # written last by transformers' save
SFT_INFO = "sft_info.json"  # written beside an SFT adapter, the adapter GRPO starts from (step 0)


def checkpoint_step(path: Path) -> int | None:
    """N of a `checkpoint-<N>` folder, None for any other name."""
    prefix, _, number = path.name.rpartition("-")
    return int(number) if prefix == PREFIX and number.isdigit() else None


def staging_dir(checkpoint: Path) -> Path:
    """The temporary folder a checkpoint is written under before it is renamed into place."""
    return checkpoint.parent / f"{PARTIAL_PREFIX}{checkpoint.name}"


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return "no header"
        (header_size,) = struct.unpack("<Q", head)
        if 8 + header_size > size:
            return "cut off inside its header"
        try:
            header = json.loads(handle.read(header_size))
        except ValueError:
            return "an unreadable header"
    end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    return None if 8 + header_size + end <= size else f"{size} bytes where its header promises {8 + header_size + end}"


def _file_problem(path: Path) -> str | None:
    """Why a checkpoint file cannot be read (cheaply: headers and archive directories, not the tensors), or None."""
    if path.suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            return "not valid JSON"
        return None
    if path.suffix == ".safetensors":
        return _safetensors_problem(path)
    if path.suffix in (".pt", ".pth", ".bin"):  # torch.save writes a zip archive; cut off, it has no directory
        try:
            with zipfile.ZipFile(path):
                return None
        except (zipfile.BadZipFile, OSError):
            return "not a complete torch archive"
    return None


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why `checkpoint` cannot be resumed from (`<file>: <what is wrong>`), or None when it is complete."""
    if not (checkpoint / TRAINER_STATE).is_file():
        return f"{TRAINER_STATE} is missing"
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        problem = _file_problem(path)
        if problem is not None:
            return f"{path.relative_to(checkpoint)}: {problem}"
    return None


def latest_complete_checkpoint(folder: Path, warn: bool = True) -> Path | None:
    """The newest `checkpoint-<N>` in `folder` that is complete; each newer, incomplete one is named in a warning."""
    found = [p for p in folder.glob(f"{PREFIX}-*") if p.is_dir() and checkpoint_step(p) is not None]
    for checkpoint in sorted(found, key=checkpoint_step, reverse=True):
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return checkpoint
        if warn:
            message = (
                f"checkpoint {checkpoint} is incomplete ({problem}), probably cut off during its save; "
                "resuming from the checkpoint before it (it is kept, and set aside as "
                f"{INCOMPLETE_PREFIX}{checkpoint.name} when this step is saved again)"
            )
            log.warning(message)  # once: the console's log handler shows it
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """Flush every file and folder under `folder` to disk, so a renamed checkpoint survives a node crash too."""
    for path in sorted(folder.rglob("*")):
        _fsync(path)
    _fsync(folder)


def _set_aside(path: Path) -> Path:
    """Rename a cut-off checkpoint out of the way of its step's new save: `incomplete-checkpoint-<N>[.k]`."""
    target, k = path.with_name(INCOMPLETE_PREFIX + path.name), 1
    while target.exists():
        target, k = path.with_name(f"{INCOMPLETE_PREFIX}{path.name}.{k}"), k + 1
    os.replace(path, target)
    return target


def discard_partial(checkpoint: Path) -> None:
    """Remove what an interrupted save of `checkpoint` left under its temporary name (never a committed one)."""
    staging = staging_dir(checkpoint)
    if staging.exists():
        shutil.rmtree(staging)


def commit(checkpoint: Path) -> None:
    """Move a checkpoint written under `staging_dir(checkpoint)` to `checkpoint` in one rename."""
    staging = staging_dir(checkpoint)
    written = staging / checkpoint.name
    _fsync_tree(written)
    if checkpoint.exists():  # only a cut-off save of this step can be there: keep it, out of the way
        aside = _set_aside(checkpoint)
        log.warning("set aside the incomplete %s as %s", checkpoint, aside)
    os.replace(written, checkpoint)
    staging.rmdir()
    _fsync(checkpoint.parent)  # the rename itself


def adapter_step(adapter: str | Path) -> tuple[int, str]:
    """(the training step of a run's adapter, how it was read), from where the run saved it:
    `checkpoints/checkpoint-<N>` (N, checked against its trainer_state.json when there is one),
    `eval/adapters/step_<N:06d>` (N), `final_adapter` (the step in the run's DONE file), or an SFT adapter (0: GRPO
    starts from it). Raises ValueError, naming the key `step`, for an adapter saved anywhere else."""
    from atr_grpo.rundir import layout, records

    path = Path(adapter).resolve()
    if checkpoint_step(path) is not None:
        step = checkpoint_step(path)
        state = path / TRAINER_STATE
        if state.is_file():
            recorded = json.loads(state.read_text(encoding="utf-8")).get("global_step")
            if recorded is not None and int(recorded) != step:
                raise ValueError(f"step: {path} is named step {step} but its {TRAINER_STATE} says {recorded}")
        return step, f"its folder name {path.name}"
    step = layout.step_of(path.name)
    if step is not None and path.parent.name == layout.ADAPTERS_DIR:
        return step, f"its folder name {path.name}"
    done = records.read_done(path.parent) if path.name == layout.FINAL_ADAPTER else None
    if done is not None:
        return done.step, f"the run's {layout.DONE_FILE} file"
    if (path / SFT_INFO).is_file():
        return 0, f"its {SFT_INFO} (an SFT adapter is where GRPO starts)"
    raise ValueError(
        f"step: the training step of adapter {adapter} is unknown (it is not a run's "
        f"{layout.CHECKPOINT_DIR}/{PREFIX}-<N>, {layout.EVAL_DIR}/{layout.ADAPTERS_DIR}/{layout.STEP_PREFIX}<N>, "
        f"{layout.FINAL_ADAPTER} beside a {layout.DONE_FILE} file, or an SFT adapter with its {SFT_INFO}); pass step=N"
    )
