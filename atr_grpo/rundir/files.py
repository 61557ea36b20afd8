"""Reading and writing a run's files so that a killed process loses nothing: atomic JSON and text, JSONL appends.

Writers here never truncate an existing file: JSONL files are appended to, JSON files are written through a
temporary file and renamed, and a file that must not change is refused if present. The one exception is a JSONL
file's torn last line (a killed write): it is moved to `<name>.torn` before the next append. Readers take a
`.gz` copy as the file itself, and name the file in every error (`RunFileError`).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from atr_grpo.rundir import layout
from atr_grpo.rundir.errors import RunFileError

log = logging.getLogger(__name__)


@contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if needed): serialises cache builds across processes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def append_jsonl(path: str | Path, records: dict[str, Any] | Iterable[dict[str, Any]]) -> None:
    """Append one record (a dict) or several to a JSONL file, creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(records, dict):
        records = [records]
    set_torn_tail_aside(path)
    with path.open("a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False, allow_nan=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def set_torn_tail_aside(path: Path) -> None:
    """A JSONL file that does not end in a newline ends in a write that was cut off (a killed process). Before the
    next record is appended, that fragment is moved to `<name>.torn` (kept, never deleted), so the new record does
    not glue onto it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        data = path.read_bytes()
        keep = data.rfind(b"\n") + 1  # 0 when the whole file is one torn line
        aside = layout.torn_path(path)
        with aside.open("ab") as torn:
            torn.write(data[keep:] + b"\n")
            torn.flush()
            os.fsync(torn.fileno())
        handle.truncate(keep)
    log.warning("%s: its last line was cut off; the fragment is kept in %s", path, aside)


def _reason(err: BaseException) -> str:
    """An exception's first line (YAML and JSON errors span several), for a one-line message."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def read_text(path: str | Path) -> str:
    """The text of a file, decompressed when its name ends in `.gz` (committed per-sample files are). Bytes that
    are not UTF-8 are a RunFileError naming the file and the line (any text file: a plan.yaml too)."""
    path = Path(path)
    data = path.read_bytes()
    if path.suffix == layout.PACKED_SUFFIX:
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError) as err:  # gzip.BadGzipFile is an OSError
            raise RunFileError(f"{path}: not a complete gzip file ({err})") from None
    return decode_utf8(path, data)


def decode_utf8(path: str | Path, data: bytes) -> str:
    """`data`, the bytes of the file `path`, as text; a RunFileError naming the file and line if not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise RunFileError(
            f"{path}:{line}: not UTF-8 text (byte {data[err.start]:#04x}); the file was damaged or written by "
            "something else: restore it from a copy, or re-run into a fresh folder"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # the newlines Path.read_text gives


def iter_jsonl(path: str | Path, whole: bool = False) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file (or `.jsonl.gz`). A torn last line (a run killed mid-write) is skipped and any
    other bad line refused; with `whole` (readers that need every record: the results commands) it is refused too."""
    lines = read_text(path).splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and not whole:
                return
            torn = " (the last line: a write that was cut off?)" if number == len(lines) else ""
            raise RunFileError(f"{path}:{number}: not valid JSON{torn}") from None


def read_jsonl(path: str | Path, whole: bool = False) -> list[dict[str, Any]]:
    return list(iter_jsonl(path, whole))


def read_json(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise RunFileError(f"{path}: not valid JSON ({_reason(err)})") from None


def load_config(path: str | Path, resolve: bool = True) -> dict[str, Any]:
    """A run's config.yaml as a plain dict; a file that is empty or not a YAML mapping is a RunFileError naming it."""
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    try:
        config = OmegaConf.load(path)
        if not isinstance(config, DictConfig):
            raise RunFileError(f"{path}: not a config (a YAML mapping of keys)")
        if not config:  # a run's config.yaml holds its whole config: an empty one was cut off or emptied
            raise RunFileError(f"{path}: damaged: empty (a run's config.yaml holds every key of its config)")
        container = OmegaConf.to_container(config, resolve=resolve)
        assert isinstance(container, dict)  # what to_container gives for a DictConfig
        return {str(key): value for key, value in container.items()}
    except (YAMLError, OmegaConfBaseException, UnicodeDecodeError) as err:
        raise RunFileError(f"{path}: not a readable config ({_reason(err)})") from None


def write_json(path: str | Path, obj: Any, overwrite: bool = True) -> None:
    """Write JSON atomically (temporary file + rename). With overwrite=False an existing file is an error."""
    path = Path(path)
    if not overwrite and path.exists():
        raise FileExistsError(f"{path} exists and is not overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Write a whole JSONL file through a temporary file, so that a partial file never has the real name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_text(path: str | Path, text: str, overwrite: bool = True) -> None:
    path = Path(path)
    if not overwrite and path.exists():
        raise FileExistsError(f"{path} exists and is not overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
