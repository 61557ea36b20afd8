"""The console: one progress line per stage with its chosen values, never a Trainer's raw log dicts; plain lines
off a terminal (first, each tenth, last), a redrawn bar on one, with warnings and log records kept above it."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
from transformers import DefaultFlowCallback, PrinterCallback, ProgressCallback, TrainingArguments
from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

from atr_grpo import console
from atr_grpo.console import GRPO_SHOWN, LOSS_SHOWN, StageProgress, evaluation_shown
from atr_grpo.training.progress import TrainerProgress, attach_progress


@pytest.fixture(autouse=True)
def lines_at_tenths_only(monkeypatch):
    """No heartbeat line: how many lines a test sees must not depend on how fast the machine runs it."""
    monkeypatch.setattr(console, "HEARTBEAT_S", float("inf"))


def grpo_logs(step: int) -> dict[str, float]:
    """What a GRPO step logs with rollout=reuse2: odd steps generate (the reward is logged) and are on-policy
    (nothing is clipped, KL3 is 0); even steps reuse the rollout."""
    stale = step % 2 == 0
    logs = {"loss": 0.01 * step, "grad_norm": 1.5, "learning_rate": 3e-4, "entropy": 2.0 - 0.01 * step}
    logs.update({"clip/frac": 0.001 * step * stale, "kl/kl3_mean": 1e-5 * step * stale, "ratio/max": 1.2})
    if not stale:
        logs["reward"] = 0.01 * step
    return logs


def span_values(steps) -> str:
    """A line's values over `steps`: each shown metric's mean over the steps that logged it."""
    logs = [grpo_logs(step) for step in steps]
    mean = lambda key: sum(row[key] for row in logs if key in row) / sum(key in row for row in logs)
    return ", ".join(f"{label} {mean(key):.3g}" for key, label in GRPO_SHOWN.items())


def fake_training(tmp_path, max_steps, logging_steps=1, start_step=0, world_zero=True, logs=grpo_logs):
    """What transformers' Trainer does with its callbacks around the optimizer steps, minus the training: the
    flow callback decides which steps log, the printer stands where a Trainer puts it, ours is attached."""
    args = TrainingArguments(
        output_dir=str(tmp_path), logging_steps=logging_steps, report_to="none", use_cpu=True, save_strategy="no"
    )
    handler = CallbackHandler([DefaultFlowCallback, PrinterCallback], None, None, None, None)
    attach_progress(handler, "GRPO", GRPO_SHOWN)
    state = TrainerState(max_steps=max_steps, logging_steps=logging_steps, global_step=start_step)
    state.is_world_process_zero = state.is_local_process_zero = world_zero
    control = handler.on_train_begin(args, state, TrainerControl())
    while state.global_step < max_steps:
        control = handler.on_step_begin(args, state, control)
        state.global_step += 1
        control = handler.on_step_end(args, state, control)
        if control.should_log:
            control = handler.on_log(args, state, control, logs=logs(state.global_step))
    handler.on_log(args, state, control, logs={"train_runtime": 12.5, "train_loss": 0.3})  # the closing summary
    handler.on_train_end(args, state, control)
    return handler


def test_attach_progress_replaces_the_trainers_log_printing(tmp_path):
    """The Trainer's printing callbacks (a dict per log) are gone, and one TrainerProgress is in their place."""
    handler = CallbackHandler([DefaultFlowCallback, PrinterCallback, ProgressCallback], None, None, None, None)
    attach_progress(handler, "GRPO", GRPO_SHOWN)
    kinds = [type(cb) for cb in handler.callbacks]
    assert kinds == [DefaultFlowCallback, TrainerProgress]


def test_a_grpo_run_prints_one_line_per_tenth_with_reward_entropy_clip_and_kl3(tmp_path, capsys):
    """Off a terminal, 20 logged steps print the first line and one per tenth (11 lines, on stderr), each with the
    mean reward, entropy, clip/frac and KL3 of the steps since the previous line; no raw log dict is printed."""
    fake_training(tmp_path, max_steps=20)
    out, err = capsys.readouterr()
    assert out == "" and "{" not in err
    lines = err.splitlines()
    assert len(lines) == 11 and all(line.startswith("GRPO: ") for line in lines)
    assert "  0% 0/20" in lines[0] and lines[0].endswith("?step/s]")  # nothing logged yet: no values
    for tenth, line in enumerate(lines[1:], start=1):
        assert f"{10 * tenth:3d}% {2 * tenth}/20 " in line
        assert line.endswith(span_values([2 * tenth - 1, 2 * tenth])), line
    assert span_values([19, 20]) == "reward 0.19, entropy 1.81, clip/frac 0.01, KL3 0.0001"  # not 0 on-policy


def test_a_value_is_averaged_over_its_span_and_kept_where_none_was_logged():
    """Reward 0.2 then 0.4 within a tenth shows 0.3; a tenth that logs no reward shows that 0.3 again."""
    stream = io.StringIO()
    with StageProgress("GRPO", 20, shown=GRPO_SHOWN, stream=stream, terminal=False) as progress:
        progress.update(1, {"reward": 0.2})
        progress.update(2, {"reward": 0.4})
        progress.update(3, {"entropy": 1.0})
        progress.update(4, {"entropy": 2.0})
    lines = stream.getvalue().splitlines()
    assert lines[1].endswith("reward 0.3") and lines[2].endswith("reward 0.3, entropy 1.5")


def test_an_evaluation_line_shows_the_latest_result_not_a_mean():
    """latest=True (one result per adapter): a line spanning two adapters shows the second one's Mean@k."""
    stream = io.StringIO()
    shown = evaluation_shown(8)
    with StageProgress("evaluation", 20, shown=shown, latest=True, stream=stream, terminal=False) as progress:
        progress.update(metrics={"eval/average/mean@8": 0.1, "eval/average/pass@8": 0.5})
        progress.update(metrics={"eval/average/mean@8": 0.3, "eval/average/pass@8": 0.7})
    assert stream.getvalue().splitlines()[1].endswith("mean@8 0.3, pass@8 0.7")


def test_steps_between_logs_still_move_the_line(tmp_path, capsys):
    """SFT logs every 10th step: the unlogged steps move the line too, and it ends at the last step with the last
    logged loss."""
    handler = CallbackHandler([DefaultFlowCallback, PrinterCallback], None, None, None, None)
    args = TrainingArguments(output_dir=str(tmp_path), logging_steps=10, report_to="none", use_cpu=True)
    callback = attach_progress(handler, "SFT", LOSS_SHOWN)
    state = TrainerState(max_steps=25, logging_steps=10)
    control = handler.on_train_begin(args, state, TrainerControl())
    for step in range(1, 26):
        control = handler.on_step_begin(args, state, control)
        state.global_step = step
        control = handler.on_step_end(args, state, control)
        assert callback.progress.n == (step if step % 10 else step - 1)  # a logged step moves in on_log
        if control.should_log:
            control = handler.on_log(args, state, control, logs={"loss": 1.0 / step, "grad_norm": 0.5})
        assert callback.progress.n == step
    handler.on_train_end(args, state, control)
    lines = capsys.readouterr().err.splitlines()
    assert "100% 25/25" in lines[-1] and lines[-1].endswith("loss 0.05")
    assert not any("grad_norm" in line for line in lines)


def test_a_resumed_run_starts_its_line_at_the_checkpoint(tmp_path, capsys):
    """Resumed at step 10 of 20: the first line says 10/20, then one line per tenth still to do (6 lines)."""
    fake_training(tmp_path, max_steps=20, start_step=10)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 6 and " 50% 10/20" in lines[0] and "100% 20/20" in lines[-1]


def test_only_the_main_process_prints(tmp_path, capsys):
    fake_training(tmp_path, max_steps=4, world_zero=False)
    assert capsys.readouterr() == ("", "")


def test_a_slow_stage_prints_at_least_every_heartbeat(monkeypatch):
    """With the heartbeat elapsed at every update, every step gets its line (a tenth may take hours)."""
    monkeypatch.setattr(console, "HEARTBEAT_S", 0.0)
    stream = io.StringIO()
    with StageProgress("GRPO", 1000, shown=GRPO_SHOWN, stream=stream, terminal=False) as progress:
        for step in range(1, 4):
            progress.update(step, {"reward": step / 10})
    lines = stream.getvalue().splitlines()
    assert [re.search(r" (\d+)/1000 ", line).group(1) for line in lines] == ["0", "1", "2", "3"]
    assert lines[-1].endswith("reward 0.3")


def test_a_stage_without_steps_ends_with_its_last_count(monkeypatch):
    """A stage that stops early (an error, a short epoch) still prints where it stopped when it is closed."""
    stream = io.StringIO()
    progress = StageProgress("evaluation", 30, stream=stream, terminal=False, unit="adapter")
    progress.update()
    progress.close()
    progress.close()  # closing twice prints nothing more
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "1/30" in lines[-1] and "adapter" in lines[-1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_shows_the_values_and_keeps_warnings_and_logs_above_it(monkeypatch):
    """A terminal gets a bar redrawn in place whose postfix holds the values; a warning and a log record raised
    meanwhile are written whole, each on lines of its own, and the bar is drawn again below them."""
    stream = Terminal()
    handler = logging.StreamHandler(stream)
    monkeypatch.setattr(console.sys, "stderr", stream)  # the console handler's stream is recognised as the console's
    logging.root.addHandler(handler)
    handlers, show_warning = list(logging.root.handlers), warnings.showwarning
    log = logging.getLogger("atr_grpo.test_console")
    log.setLevel(logging.INFO)
    try:
        with StageProgress("GRPO", 4, shown=GRPO_SHOWN) as progress:
            assert progress.terminal
            progress.update(1, grpo_logs(1))
            warnings.warn("a library's warning", UserWarning, stacklevel=1)
            log.info("step 1, arithmetic: mean@8 0.25")
            for step in (2, 3, 4):
                progress.update(step, grpo_logs(step))
        assert logging.root.handlers == handlers and warnings.showwarning is show_warning  # restored on close
    finally:
        logging.root.removeHandler(handler)
    screen = stream.getvalue()
    rows = [row for line in screen.split("\n") for row in line.split("\r")]  # what each redraw leaves
    assert "UserWarning: a library's warning" in screen
    assert "step 1, arithmetic: mean@8 0.25" in rows
    assert "\r" in screen and "GRPO: 100%" in rows[-2]  # redrawn in place; closing ends the line
    assert rows[-2].endswith("reward 0.03, entropy 1.96, clip/frac 0.004, KL3 4e-05]")


@pytest.mark.parametrize("value, text", [(0.41234, "0.412"), (1.0, "1"), (3.4e-05, "3.4e-05"), (123.456, "123")])
def test_values_have_three_significant_digits(value, text):
    assert console.format_values({"reward": value}) == f"reward {text}"


def test_tiny_model_pretraining_prints_one_line_with_its_loss(capsys):
    """The tiny model's pretraining is a stage line whose last state is its last step and loss."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from atr_grpo.config_inputs import TinyModelConfig
    from atr_grpo.tiny_model import build_tiny_tokenizer, pretrain_tiny

    cfg = TinyModelConfig(pretrain_steps=3, pretrain_batch_size=2)
    tokenizer = build_tiny_tokenizer(cfg.vocab_size)
    torch.manual_seed(0)
    model_cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        pad_token_id=tokenizer.pad_token_id,
    )
    losses = pretrain_tiny(Qwen3ForCausalLM(model_cfg), tokenizer, cfg)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4 and all(line.startswith("tiny model pretraining: ") for line in lines)
    assert "100% 3/3" in lines[-1] and lines[-1].endswith(f"loss {losses[-1]:.3g}")


@pytest.mark.parametrize("asked, level", [(None, logging.WARNING), ("info", logging.INFO)])
def test_quiet_libraries_keeps_vllm_to_warnings_unless_asked_and_turns_library_bars_off(
    monkeypatch, caplog, asked, level
):
    """Without VLLM_LOGGING_LEVEL, vLLM's records below WARNING are dropped even where ours are shown at DEBUG (a
    level the user set is kept), and datasets' and transformers' progress bars are off: datasets' here, where it
    is imported, and in the processes this one starts (which read HF_DATASETS_DISABLE_PROGRESS_BARS)."""
    import datasets
    import transformers

    caplog.set_level(logging.DEBUG)  # the root logger lets everything through

    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", asked or "")
    if asked is None:
        monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    vllm_logger = logging.getLogger("vllm")
    previous = vllm_logger.level
    try:
        console.quiet_libraries()
        assert os.environ["VLLM_LOGGING_LEVEL"].upper() == logging.getLevelName(level)
        assert logging.getLogger("vllm.engine").getEffectiveLevel() == level
        assert not datasets.utils.logging.is_progress_bar_enabled()
        assert os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"
        assert not transformers.utils.logging.is_progress_bar_enabled()
    finally:
        vllm_logger.setLevel(previous)
        datasets.enable_progress_bars()
        transformers.utils.logging.enable_progress_bar()


def test_a_stage_process_shows_a_warnings_level_once(tmp_path):
    """`configure_logging` (a stage process, the demo) shows the level as Hydra's console does, and our warnings
    do not carry the word themselves: `[12:00:00 atr_grpo.training.checkpoints][WARNING] checkpoint ...`."""
    script = (
        "import pathlib, sys\n"
        "from atr_grpo.console import configure_logging\n"
        "from atr_grpo.training import checkpoints\n"
        "configure_logging()\n"
        "folder = pathlib.Path(sys.argv[1])\n"
        "(folder / 'checkpoint-4').mkdir()\n"
        "checkpoints.latest_complete_checkpoint(folder)\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "is incomplete" in line]
    assert re.match(r"^\[\d\d:\d\d:\d\d atr_grpo\.training\.checkpoints\]\[WARNING\] checkpoint ", line), line
    assert line.count("WARNING") == 1
