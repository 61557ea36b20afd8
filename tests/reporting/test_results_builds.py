"""A build of tables is whole or marked: `results all` killed half-way (SIGKILL, no clean-up) leaves --out as the last
whole build left it, and one killed while its files move in leaves BUILD_INCOMPLETE.txt; the next build repairs both.
An --out that cannot be written is one line naming it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

from helpers.run_trees import make_run

from atr_grpo import results
from atr_grpo.reporting.render import writers

REPO = Path(__file__).resolve().parents[2]
EVALS = {s: {"arithmetic": (0.2 + 0.01 * s, 0.5)} for s in (0, 2, 4)}

# runs `results` with `writers.write_table`, or the move of the staged files, ending the process by SIGKILL after
# its first call: the process dies as a killed one does, with no clean-up
KILLED_AFTER_FIRST = """
import os, signal, sys
from atr_grpo import results
from atr_grpo.reporting.render import writers
where = sys.argv[1]
if where == "write":
    write = writers.write_table
    def write_then_die(*args):
        write(*args)
        os.kill(os.getpid(), signal.SIGKILL)
    writers.write_table = write_then_die
else:
    replace = os.replace
    def replace_then_die(source, target):
        replace(source, target)
        if writers.STAGING in str(source) and writers.STAGING not in str(target):  # a staged file moved in
            os.kill(os.getpid(), signal.SIGKILL)
    writers.os.replace = replace_then_die
results.main(sys.argv[2:])
"""


def _runs(root, seeds):
    for seed in seeds:
        make_run(root, "power2", "tiny", "clip", {"name": "clip"}, seed, EVALS, max_steps=4, benchmarks=["arithmetic"])


def _files(folder):
    """{name: bytes} of the files a reader of --out sees (the staging folder of a killed build is hidden)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _killed(where, runs, out):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", KILLED_AFTER_FIRST, where, "all", "--runs", str(runs), "--out", str(out)]
    return subprocess.run(argv, env=env, capture_output=True, timeout=300).returncode


def test_a_build_killed_after_its_first_table_leaves_the_last_whole_build(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "tables"
    _runs(runs, [0])
    assert results.main(["all", "--runs", str(runs), "--out", str(out)]) == 0
    before = _files(out)
    assert {"timing.csv", "endpoints.csv", writers.MANIFEST} <= set(before)
    _runs(runs, [1])  # a second seed: every table changes
    assert _killed("write", runs, out) == -9
    assert _files(out) == before  # no table of the two-seed runs beside those of the one-seed run
    assert results.main(["all", "--runs", str(runs), "--out", str(out)]) == 0
    assert results.main(["all", "--runs", str(runs), "--out", str(tmp_path / "fresh")]) == 0
    assert _files(out) == _files(tmp_path / "fresh") and not (out / writers.STAGING).exists()


def test_a_build_killed_while_its_files_move_in_is_marked_incomplete(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "tables"
    _runs(runs, [0])
    assert results.main(["all", "--runs", str(runs), "--out", str(out)]) == 0
    _runs(runs, [1])
    assert _killed("move", runs, out) == -9
    assert "did not finish" in (out / writers.INCOMPLETE).read_text()
    assert results.main(["all", "--runs", str(runs), "--out", str(out)]) == 0
    assert not (out / writers.INCOMPLETE).exists() and writers.INCOMPLETE not in _files(out)[writers.MANIFEST].decode()


def test_a_read_only_out_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    runs, out = tmp_path / "runs", tmp_path / "tables"
    _runs(runs, [0])
    mkdir = Path.mkdir

    def read_only(path, *args, **kwargs):
        if out in (path, *path.parents):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert results.main(["timing", "--runs", str(runs), "--out", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert err == [f"error: --out {out}: cannot write there (Permission denied); choose a writable folder"]
