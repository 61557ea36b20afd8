"""The demo's summary and printed table: Mean@8, Pass@8 and the two parts of Mean@8 at step 0 and at the end, read
from the run's eval/summary.jsonl."""

from atr_grpo import rundir
from atr_grpo.demo import before_after, format_table
from atr_grpo.rundir.records import SummaryRow


def row(step, mean, answered, accuracy):
    values = {"mean@8": mean, "pass@8": 0.9, "answered@8": answered, "acc_given_answer@8": accuracy}
    return SummaryRow(step, "arithmetic", values).to_dict()


def test_the_demo_shows_both_parts_before_and_after(tmp_path):
    """Step 0: half the samples answer, a third of those right; step 150: 90 % answer, the same third."""
    rundir.append_jsonl(rundir.summary_path(tmp_path), [row(0, 0.5 / 3, 0.5, 1 / 3), row(150, 0.3, 0.9, 1 / 3)])
    summary = {**before_after(tmp_path, 8), "seconds": 1.0, "run_dir": str(tmp_path)}
    assert summary["before"]["answered@8"] == 0.5 and summary["after"]["answered@8"] == 0.9
    assert summary["after"]["acc_given_answer@8"] == 1 / 3 and summary["steps"] == 150
    lines = format_table(summary, 8).splitlines()
    assert lines[0].split() == ["Mean@8", "Pass@8", "answered", "acc", "|", "answered"]
    assert lines[2].split() == ["before", "GRPO", "16.7%", "90.0%", "50.0%", "33.3%"]
    assert lines[3].split() == ["after", "GRPO", "30.0%", "90.0%", "90.0%", "33.3%"]


def test_a_part_the_summary_lacks_is_shown_as_a_dash(tmp_path):
    """A line written before the parts were recorded (or no answer at all: no accuracy given one)."""
    rundir.append_jsonl(rundir.summary_path(tmp_path), [row(0, 0.0, 0.0, None), row(4, 0.1, 0.2, 0.5)])
    summary = {**before_after(tmp_path, 8), "seconds": 1.0, "run_dir": str(tmp_path)}
    assert format_table(summary, 8).splitlines()[2].split()[-1] == "-"
