"""Run-directory files: appended, atomically written, never silently overwritten; compressed copies read alike."""

import gzip
import json
from pathlib import Path

import pytest
import torch
import trl

from atr_grpo import run_environment, rundir
from atr_grpo.evaluation.outputs import find_sample_file, sample_file


def test_jsonl_appends_and_skips_only_a_torn_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    rundir.append_jsonl(path, {"step": 1})
    rundir.append_jsonl(path, [{"step": 2}, {"step": 3}])
    with path.open("a") as handle:
        handle.write('{"step": 4, "rew')  # a run killed mid-write
    assert [r["step"] for r in rundir.read_jsonl(path)] == [1, 2, 3]
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=":2: not valid JSON"):
        rundir.read_jsonl(path)


def test_write_json_refuses_to_overwrite_when_asked(tmp_path):
    path = tmp_path / "env.json"
    rundir.write_json(path, {"a": 1}, overwrite=False)
    with pytest.raises(FileExistsError):
        rundir.write_json(path, {"a": 2}, overwrite=False)
    assert json.loads(path.read_text()) == {"a": 1}
    assert not list(tmp_path.glob(".*tmp*")), "no temporary file is left behind"


def test_find_run_dirs_and_eval_paths(tmp_path):
    for name in ("b", "a/x"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "config.yaml").write_text("seed: 0\n")
    (tmp_path / "a/x/checkpoints/checkpoint-1").mkdir(parents=True)
    (tmp_path / "a/x/checkpoints/checkpoint-1/config.yaml").write_text("")
    assert rundir.find_run_dirs(tmp_path) == [tmp_path / "a/x", tmp_path / "b"]
    assert rundir.eval_step_dir(tmp_path, 50) == tmp_path / "eval" / "step_000050"
    assert rundir.summary_path(tmp_path) == tmp_path / "eval" / "summary.jsonl"


def test_environment_records_versions_and_device():
    env = run_environment.environment()
    # what is installed where the run runs (a GPU image may hold another torch than the pin), read independently
    assert env["packages"]["torch"] in {torch.__version__, torch.__version__.split("+")[0]}
    assert env["packages"]["trl"] == trl.__version__
    assert {"git_commit", "python", "device", "start_time"} <= set(env)
    # the CPU type decides float results: its name and the instruction set torch's kernels use
    cpuinfo = Path("/proc/cpuinfo").read_text()
    assert env["device"]["cpu"] and f": {env['device']['cpu']}\n" in cpuinfo
    capability = env["device"]["cpu_capability"]
    if env["device"]["kernel_choice"]:
        pytest.skip("the suite runs on a chosen numeric path (ATEN_CPU_CAPABILITY ...): the flags do not decide it")
    assert capability in {"AVX512", "AVX2", "DEFAULT", "ZVECTOR", "SVE256", "VSX"}
    assert (capability == "AVX512") == (" avx512f " in cpuinfo.split("flags", 1)[1].split("\n", 1)[0] + " ")


def test_environment_records_the_kernel_choice():
    """A process on another host's numeric path (numeric_paths.NUMERIC_PATHS) says so in env.json."""
    import subprocess
    import sys

    from atr_grpo.numeric_paths import path_environment

    script = "import json; from atr_grpo import run_environment; print(json.dumps(run_environment.device_info()))"
    out = subprocess.run(
        [sys.executable, "-c", script], env=path_environment("avx2"), capture_output=True, text=True, check=True
    )
    device = json.loads(out.stdout)
    want = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert (device["kernel_choice"], device["cpu_capability"]) == (want, "AVX2")
    with pytest.raises(ValueError, match="numeric path must be one of native, avx2, baseline, got 'sse'"):
        path_environment("sse")


def test_an_append_after_a_torn_last_line_starts_a_new_line_and_keeps_the_fragment(tmp_path):
    """A killed write leaves a line without its newline; the next record must not glue onto it."""
    path = tmp_path / "summary.jsonl"
    path.write_text('{"step": 0}\n{"step": 5')
    rundir.append_jsonl(path, {"step": 50})
    assert rundir.read_jsonl(path) == [{"step": 0}, {"step": 50}]
    assert (tmp_path / "summary.jsonl.torn").read_text() == '{"step": 5\n'
    path.write_text('{"ste')  # the whole file one torn line
    rundir.append_jsonl(path, {"step": 1})
    assert rundir.read_jsonl(path) == [{"step": 1}]
    assert (tmp_path / "summary.jsonl.torn").read_text() == '{"step": 5\n{"ste\n', "earlier fragments are kept"


def test_compressed_jsonl_reads_like_the_plain_file(tmp_path):
    """A `.jsonl.gz` file gives the records of its plain twin; a cut-off gzip stream is an error naming the file."""
    records = [{"problem_id": 1, "sample": i, "correct": i % 2 == 0} for i in range(4)]
    text = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    assert rundir.read_jsonl(tmp_path / "a.jsonl.gz") == records
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(text.encode())[:-12])
    with pytest.raises(ValueError, match="cut.jsonl.gz: not a complete gzip file"):
        rundir.read_jsonl(tmp_path / "cut.jsonl.gz")


def test_the_per_sample_file_is_found_plain_or_compressed_never_both(tmp_path):
    """find_sample_file returns the plain file, else the `.gz` one, else None; both at once is refused."""
    plain = sample_file(tmp_path, 50, "aime24")
    assert find_sample_file(tmp_path, 50, "aime24") is None
    plain.parent.mkdir(parents=True)
    packed = plain.with_name("aime24.jsonl.gz")
    packed.write_bytes(gzip.compress(b'{"sample": 0}\n'))
    assert find_sample_file(tmp_path, 50, "aime24") == packed
    plain.write_text('{"sample": 0}\n')
    with pytest.raises(ValueError, match="both .*aime24.jsonl and aime24.jsonl.gz exist"):
        find_sample_file(tmp_path, 50, "aime24")
    packed.unlink()
    assert find_sample_file(tmp_path, 50, "aime24") == plain


# ------------------------------------------------------------------------------------- finding run folders
def a_run(folder):
    folder.mkdir(parents=True)
    rundir.write_text(rundir.layout.config_path(folder), "seed: 0\n")
    return folder


def test_run_folders_behind_links_are_found_by_the_link(tmp_path):
    a_run(tmp_path / "elsewhere" / "b")
    root = tmp_path / "runs"
    a_run(root / "a")
    (root / "b").symlink_to(tmp_path / "elsewhere" / "b")  # a linked run folder
    (root / "group").symlink_to(tmp_path / "elsewhere", target_is_directory=True)  # reaches b a second time
    with pytest.raises(rundir.RunFileError, match=r"runs/group/b: the run .*runs/b again .* would count twice"):
        rundir.find_run_dirs(root)
    (root / "group").unlink()
    assert rundir.find_run_dirs(root) == [root / "a", root / "b"]


def test_a_link_loop_is_refused_naming_the_link(tmp_path):
    root = tmp_path / "runs"
    a_run(root / "a")
    (root / "a" / "eval").mkdir()
    (root / "a" / "eval" / "back").symlink_to(root)
    with pytest.raises(rundir.RunFileError, match=r"runs/a/eval/back: a link to .*runs, a folder it lies in"):
        rundir.find_run_dirs(root)
