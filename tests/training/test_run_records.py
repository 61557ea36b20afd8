"""The run directory's records and names: a record reads back as the one written, and every reader of DONE sees the
step its one writer wrote."""

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
