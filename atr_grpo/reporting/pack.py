"""`python -m atr_grpo.results pack --runs DIR`: compress the per-sample evaluation files of run directories.

`eval/step_<N:06d>/<benchmark>.jsonl` becomes `<benchmark>.jsonl.gz`, which every reader takes in its place (a
run tree to commit, such as results/mini/runs/, stays small). Lossless and checked: the compressed file is
written beside the original, decompressed and compared byte for byte, and only then is the original removed.
Deterministic: the gzip header carries no time and no name, so packing the same file twice gives the same bytes.
A `.jsonl.gz` already there is left alone if it holds the same content, and is an error otherwise.
"""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path

from atr_grpo import rundir
from atr_grpo.rundir import layout


class PackError(RuntimeError):
    pass


def compressed(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as handle:
        handle.write(data)
    return buffer.getvalue()


def pack_file(path: Path) -> tuple[int, int]:
    """Replace `path` by `path.gz` with the same content; returns (bytes before, bytes after)."""
    data = path.read_bytes()
    packed = compressed(data)
    if gzip.decompress(packed) != data:  # never remove what could not be restored
        raise PackError(f"{path}: compression did not round-trip")
    target = path.with_name(path.name + ".gz")
    if target.exists():
        if gzip.decompress(target.read_bytes()) != data:
            raise PackError(f"{target} exists with other content than {path}; neither was changed")
    else:
        staging = target.with_name(f".{target.name}.tmp{os.getpid()}")
        staging.write_bytes(packed)
        os.replace(staging, target)
    path.unlink()
    return len(data), target.stat().st_size


def pack_runs(root: str | Path) -> list[tuple[Path, int, int]]:
    """Pack every per-sample file of every run directory under `root`; returns (file, before, after) each."""
    done = []
    for run_dir in rundir.find_run_dirs(root):
        # the run's own evaluations, then those of a standalone evaluation inside it (a plan's final evaluation)
        inner = sorted(p for p in run_dir.iterdir() if p.is_dir() and layout.request_path(p).is_file())
        for folder in (run_dir, *inner):
            for path in layout.sample_files(folder):
                done.append((path, *pack_file(path)))
    return done
