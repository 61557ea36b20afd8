"""The run directory's records and names: a record reads back as the one written, and every reader of DONE sees the
step its one writer wrote."""

import gzip
import subprocess
import sys

import pytest

from atr_grpo.rundir import files, layout, records
from atr_grpo.rundir.records import Done, MetricsLine, SampleRecord, SummaryRow
from atr_grpo.training.checkpoints import adapter_step

RECORDS = [
    Done(step=40, seconds=12.5, backend="trl", rollout_engine="hf", world_size=1),
    SummaryRow(50, "aime24", {"num_problems": 30, "n": 8, "mean@8": 0.25, "pass@8": 0.5}),
    SampleRecord("p7", 3, True, {"completion": "\\boxed{7}", "status": "correct"}),
    MetricsLine(5, {"reward": 0.5, "clip/frac": 0.01}),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_written_to_a_file_reads_back_as_itself(tmp_path, record):
    path = tmp_path / "records.jsonl"
    files.append_jsonl(path, record.to_dict())
    (line,) = files.read_jsonl(path)
    assert type(record).from_dict(line) == record


def test_a_summary_row_keeps_its_metrics_after_its_key():
    row = SummaryRow.from_dict({"step": "50", "benchmark": "amc23", "mean@8": 0.5})
    assert row.key == (50, "amc23") and list(row.to_dict()) == ["step", "benchmark", "mean@8"]


def test_every_reader_of_done_sees_the_step_it_was_written_with(tmp_path):
    assert records.read_done(tmp_path) is None and not records.is_done(tmp_path)
    records.write_done(tmp_path, Done(step=7, seconds=3.0))
    assert records.is_done(tmp_path) and records.read_done(tmp_path) == Done(step=7, seconds=3.0)
    assert adapter_step(tmp_path / layout.FINAL_ADAPTER) == (7, f"the run's {layout.DONE_FILE} file")


def test_a_step_folder_name_reads_back_as_its_step():
    assert layout.step_name(50) == "step_000050" and layout.step_of(layout.step_name(50)) == 50
    assert [layout.step_of(name) for name in ("step_x", "stop_000050", "step_12.partial")] == [None, None, None]
    assert layout.adapter_dir("run", 50).parent == layout.adapters_dir("run")


def test_importing_the_run_directory_package_does_not_import_torch():
    code = "import sys, atr_grpo.rundir; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------ readers that refuse what they cannot trust
def lines(path, keys):
    files.write_jsonl(path, [dict(key) for key in keys])
    return path


def test_metrics_steps_rise_once_each_or_the_file_is_refused_naming_the_steps(tmp_path):
    path = layout.metrics_path(tmp_path)
    assert [r["step"] for r in records.metrics_lines(lines(path, [{"step": s} for s in (1, 2, 3)]))] == [1, 2, 3]
    lines(path, [{"step": s} for s in (1, 2, 1, 2, 3)])  # two processes' lines, interleaved
    with pytest.raises(files.RunFileError, match=r"metrics\.jsonl: steps logged more than once: 1, 2; two processes"):
        records.metrics_lines(path)
    lines(path, [{"step": s} for s in (1, 3, 2)])
    with pytest.raises(files.RunFileError, match=r"metrics\.jsonl: steps out of order: 2 after 3; .*fresh run_dir"):
        records.metrics_lines(path)
    assert records.metrics_lines(tmp_path / "none.jsonl") == []


def test_a_resume_refuses_metrics_with_a_step_logged_twice(tmp_path):
    """The resume's truncation would keep both copies of a step below the checkpoint: it refuses, changing nothing."""
    from atr_grpo.training.run_logger import truncate_metrics

    path = lines(layout.metrics_path(tmp_path), [{"step": s} for s in (1, 2, 1, 2, 3, 4)])
    before = path.read_bytes()
    with pytest.raises(files.RunFileError, match="steps logged more than once: 1, 2"):
        truncate_metrics(tmp_path, 2)
    assert path.read_bytes() == before


def test_an_evaluation_recorded_twice_is_refused_by_the_summary_readers(tmp_path):
    """A (step, benchmark) is committed once, or again by a forced re-evaluation that says so; a retried step comes
    later (0, 4, 2 is one run's order)."""
    from atr_grpo.evaluation.outputs import read_summary

    path = layout.summary_path(tmp_path)
    path.parent.mkdir()
    lines(path, [{"step": s, "benchmark": "arithmetic"} for s in (0, 4, 2)])
    assert sorted(read_summary(tmp_path)) == [(0, "arithmetic"), (2, "arithmetic"), (4, "arithmetic")]
    lines(path, [{"step": s, "benchmark": b} for s in (0, 4) for b in ("amc23", "aime24")] * 2)
    message = r"summary\.jsonl: evaluations recorded more than once: step 0 \(aime24\), 0 \(amc23\), 4 \(aime24\)"
    with pytest.raises(files.RunFileError, match=message):
        read_summary(tmp_path)
    with pytest.raises(files.RunFileError, match=message):
        records.summary_lines(path)
    forced = {"step": 0, "benchmark": "amc23", "mean@8": 1.0, records.REPLACES: "amc23.jsonl.replaced-1"}
    lines(path, [{"step": 0, "benchmark": "amc23", "mean@8": 0.5}, forced])  # a forced re-evaluation says so
    assert read_summary(tmp_path)[(0, "amc23")]["mean@8"] == 1.0


@pytest.mark.parametrize("packed", [False, True])
def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path, packed):
    data = b'{"step": 1}\n{"step": 2, "note": "\xff"}\n'
    path = tmp_path / ("metrics.jsonl.gz" if packed else "metrics.jsonl")
    path.write_bytes(gzip.compress(data) if packed else data)
    with pytest.raises(files.RunFileError, match=rf"{path.name}:2: not UTF-8 text \(byte 0xff\)"):
        files.read_jsonl(path)
    with pytest.raises(files.RunFileError, match=r"plan\.yaml:3: not UTF-8"):
        (tmp_path / "plan.yaml").write_bytes(b"a: 1\nb: 2\nc: caf\xe9\n")
        files.read_text(tmp_path / "plan.yaml")
