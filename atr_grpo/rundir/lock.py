"""One process per run directory: an exclusive lock on `<run_dir>/run.lock`, held for the run's life.

Two launches on one folder (the same command twice, a requeued cluster job racing its old node) would interleave
two trajectories in one metrics file. The launch that takes the lock runs; any other is refused before it writes a
thing, naming the holder. The lock is an `fcntl.flock`, so the OS gives it back when its process ends, however it
ends. Once held, the file names its holder (pid, host, start time) for a refused launch to quote. A run that returns
empties it; a killed one leaves its holder's name in a file no one locks, and the next launch takes it over with a
warning.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO

from atr_grpo.rundir import layout
from atr_grpo.rundir.errors import RunFileError

_HELD: dict[Path, IO[str]] = {}  # the run directories this process holds, by their resolved path
_HOLDER_WAIT_S = 2.0  # how long a refused launch waits for a holder that has just taken the lock to name itself


class RunDirInUseError(RunFileError):
    """Another live process holds the run directory's lock."""


def lock_run_dir(run_dir: str | Path) -> str | None:
    """Take `run_dir`'s lock (creating the folder) before anything else is written to it, and hold it until
    `unlock_run_dir` or the end of this process. Returns a warning when it was taken over from a process that died
    holding it; raises RunDirInUseError when another process holds it, RunFileError when the folder cannot be
    written. A process that holds the lock already takes it again at no cost."""
    run_dir = Path(run_dir)
    key = run_dir.resolve()
    if key in _HELD:
        return None
    path = layout.lock_path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(run_dir, os.W_OK):  # a read-only folder whose lock file exists would fail later
            raise PermissionError(13, os.strerror(13))
        handle = path.open("a+", encoding="utf-8")
    except OSError as err:
        raise RunFileError(f"{path}: cannot be written ({err.strerror}); choose a run_dir you can write to") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RunDirInUseError(
            f"{run_dir} is in use: {path} is locked by {_describe(_holder(path, wait=True))}. One run folder takes "
            "one process (two would interleave their steps in one metrics file); wait for that run to end, or stop "
            "it, then launch again. Nothing was written."
        ) from None
    previous = _holder(path)
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}) + "\n")
    handle.flush()
    os.fsync(handle.fileno())
    if not _HELD:
        atexit.register(_give_back_all)  # a process that exits holding a lock has not been killed: no warning
    _HELD[key] = handle
    if previous is None:
        return None
    return (
        f"{path} named {_describe(previous)}, which ended without giving the run up (killed?); "
        "this process takes the run over"
    )


def unlock_run_dir(run_dir: str | Path) -> None:
    """Give `run_dir`'s lock back (emptied: the next launch finds no holder); nothing when this process holds none."""
    handle = _HELD.pop(Path(run_dir).resolve(), None)
    if handle is None:
        return
    try:
        handle.seek(0)
        handle.truncate()
        handle.flush()
    except OSError:  # the folder was made read-only or removed under the run: the lock goes with the handle
        pass
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def _give_back_all() -> None:
    for run_dir in list(_HELD):
        unlock_run_dir(run_dir)


def _holder(path: Path, wait: bool = False) -> dict | None:
    """Who the lock file names (pid, host, started), or None when it names no one. With `wait`, a holder that has
    the lock but has not yet named itself is given a moment to."""
    deadline = time.monotonic() + (_HOLDER_WAIT_S if wait else 0.0)
    while True:
        try:
            text = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            text = ""
        if text:
            try:
                holder = json.loads(text)
            except json.JSONDecodeError:
                return {"pid": "?", "host": "?", "started": f"unreadable: {text[:60]!r}"}
            return holder if isinstance(holder, dict) else None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def _describe(holder: dict | None) -> str:
    if holder is None:
        return "a process that has not named itself yet"
    return f"pid {holder.get('pid')} on host {holder.get('host')} (since {holder.get('started')})"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
