"""A checkpoint is complete or it is not resumed from: the newest complete one wins, a cut-off one is named and
kept, and a checkpoint appears under its final name only once all of it is written."""

import json

import pytest
import torch
from safetensors.torch import save_file

from atr_grpo.training import checkpoints, interrupts


def write_checkpoint(folder, step):
    """The files transformers writes for a LoRA checkpoint (weights, optimizer, RNG, state), small."""
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    save_file({"lora_A": torch.randn(4, 8), "lora_B": torch.randn(8, 4)}, path / "adapter_model.safetensors")
    torch.save({"state": {0: {"exp_avg": torch.randn(64)}}}, path / "optimizer.pt")
    torch.save({"python": 1}, path / "rng_state.pth")
    (path / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (path / checkpoints.TRAINER_STATE).write_text(json.dumps({"global_step": step}))
    return path


def cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_the_newest_complete_checkpoint_is_resumed_from(tmp_path):
    for step in (2, 4, 10):
        write_checkpoint(tmp_path, step)
    (tmp_path / "checkpoint-x").mkdir()  # not a checkpoint name: ignored
    assert checkpoints.latest_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-10"  # 10 > 4 (not by name)
    assert checkpoints.latest_complete_checkpoint(tmp_path / "none") is None


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda c: cut(c / "optimizer.pt"), "optimizer.pt: not a complete torch archive"),
        (lambda c: cut(c / "adapter_model.safetensors", 0.9), "adapter_model.safetensors: "),
        (lambda c: cut(c / "adapter_model.safetensors", 0.001), "adapter_model.safetensors: "),
        (lambda c: (c / checkpoints.TRAINER_STATE).unlink(), "trainer_state.json is missing"),
        (lambda c: cut(c / checkpoints.TRAINER_STATE), "trainer_state.json: not valid JSON"),
    ],
)
def test_a_cut_off_newest_checkpoint_is_skipped_and_named(tmp_path, caplog, damage, problem):
    write_checkpoint(tmp_path, 2)
    newest = write_checkpoint(tmp_path, 4)
    assert checkpoints.checkpoint_problem(newest) is None
    damage(newest)
    assert problem in checkpoints.checkpoint_problem(newest)
    assert checkpoints.latest_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    (warning,) = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert f"checkpoint {newest} is incomplete ({problem}" in warning
    assert "resuming from the checkpoint before" in warning
    assert newest.exists()  # kept


def test_a_checkpoint_appears_under_its_name_only_when_committed(tmp_path):
    final = tmp_path / "checkpoint-4"
    staged = write_checkpoint(checkpoints.staging_dir(final), 4)
    assert staged == checkpoints.staging_dir(final) / "checkpoint-4"
    assert checkpoints.latest_complete_checkpoint(tmp_path) is None  # a save in progress is no checkpoint
    checkpoints.commit(final)
    assert checkpoints.checkpoint_problem(final) is None and not checkpoints.staging_dir(final).exists()
    assert checkpoints.latest_complete_checkpoint(tmp_path) == final


def test_a_cut_off_checkpoint_is_set_aside_when_its_step_is_saved_again(tmp_path):
    old = write_checkpoint(tmp_path, 4)
    cut(old / "optimizer.pt")
    write_checkpoint(checkpoints.staging_dir(old), 4)
    checkpoints.commit(old)
    assert checkpoints.checkpoint_problem(old) is None
    aside = tmp_path / "incomplete-checkpoint-4"
    assert "optimizer.pt" in checkpoints.checkpoint_problem(aside)  # kept, not deleted
    assert checkpoints.checkpoint_step(aside) is None  # and never taken for a checkpoint


def test_what_an_interrupted_save_left_is_discarded_before_the_step_is_saved_again(tmp_path):
    final = tmp_path / "checkpoint-6"
    write_checkpoint(checkpoints.staging_dir(final), 6)
    complete = write_checkpoint(tmp_path, 2)
    checkpoints.discard_partial(final)
    assert not checkpoints.staging_dir(final).exists() and checkpoints.checkpoint_problem(complete) is None


# ------------------------------------------------------------------------------------------------ Ctrl-C
def test_an_interrupted_run_says_in_one_line_its_stage_its_step_its_checkpoint_and_how_to_resume(tmp_path):
    write_checkpoint(tmp_path / "checkpoints", 2)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": step}) + "\n" for step in (1, 2, 3)))
    expected = (
        f"interrupted during GRPO training of {tmp_path} (at step 3); "
        f"checkpoint {tmp_path / 'checkpoints' / 'checkpoint-2'} kept; run the same command to resume"
    )
    assert interrupts.interrupted_message(tmp_path, "GRPO training") == expected


def test_a_run_interrupted_before_its_first_step_says_so_and_that_it_starts_again(tmp_path):
    """No checkpoint kept: there is nothing to resume, the same command starts the run again."""
    assert interrupts.interrupted_message(tmp_path) == (
        f"interrupted during start-up of {tmp_path} (before the first GRPO step); no checkpoint yet; "
        "run the same command to start it again"
    )


def test_an_evaluation_interrupted_before_its_first_result_says_it_starts_again(tmp_path):
    assert interrupts.evaluation_interrupted_message(tmp_path, "loading the model") == (
        f"interrupted during loading the model of the evaluation into {tmp_path}; no evaluation kept yet in "
        f"{tmp_path / 'eval' / 'summary.jsonl'}; run the same command to start it again"
    )


def test_an_interrupt_before_the_run_folder_names_no_folder_and_says_what_its_part_lost(tmp_path):
    with pytest.raises(KeyboardInterrupt) as interrupt:
        with interrupts.stage("building the tiny base model", loses="its pretraining so far is lost"):
            raise KeyboardInterrupt
    stage = interrupts.interrupted_stage(interrupt.value)
    assert interrupts.interrupted_message(tmp_path / "run", stage) == (
        "interrupted during building the tiny base model, before the run folder was made; its pretraining so far "
        "is lost; run the same command to start it"
    )


def test_an_interrupt_is_named_by_the_innermost_stage_it_struck_and_start_up_outside_every_stage():
    with pytest.raises(KeyboardInterrupt) as outer:
        with interrupts.stage("the SFT stage"), interrupts.stage("loading the model"):
            raise KeyboardInterrupt
    assert interrupts.interrupted_stage(outer.value) == "loading the model"
    with pytest.raises(KeyboardInterrupt) as unmarked:
        raise KeyboardInterrupt
    assert interrupts.interrupted_stage(unmarked.value) == "start-up"


def test_an_interrupted_stage_process_exits_130_without_a_traceback(tmp_path, monkeypatch, capsys):
    from atr_grpo.training import stages

    def interrupted(stage, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(stages, "run_here", interrupted)
    assert stages.main(["grpo", str(tmp_path)]) == 130
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("status", [130, -2])
def test_a_stage_process_ended_by_ctrl_c_interrupts_the_process_that_started_it(tmp_path, monkeypatch, status):
    from subprocess import CompletedProcess

    from atr_grpo.training import stage_process

    monkeypatch.setattr(stage_process.subprocess, "run", lambda command, env: CompletedProcess(command, status))
    with pytest.raises(KeyboardInterrupt):
        stage_process.run_stage("grpo", tmp_path)
