"""`python -m atr_grpo.evaluate`: the step an adapter is filed under is given, read from its run, or refused."""

import json

import pytest
from conftest import REPO, compose
from helpers.scripted_generation import FakeTokenizer, ScriptedGenerator

from atr_grpo import evaluate as evaluate_module
from atr_grpo import rundir
from atr_grpo.config_hydra import to_object
from atr_grpo.errors import ConfigError
from atr_grpo.evaluation.sampling import step_seed
from atr_grpo.training.checkpoints import adapter_step

FIXTURES = REPO / "tests" / "fixtures" / "eval"


def adapter_at(path):
    """A folder that stands for a saved adapter (what the step is read from does not need its weights)."""
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}\n")
    return path


def config(out_dir, *extra):
    overrides = [
        "model=tiny",
        f"out_dir={out_dir}",
        "eval.benchmarks=[amc23]",
        f"+eval.paths.amc23={FIXTURES / 'amc23.jsonl'}",
        "eval.strict=false",
        "eval.n=2",
        "eval.k=2",
        "eval.backend=hf",
        "eval.grader_workers=0",
        *extra,
    ]
    return to_object(compose(overrides, config_name="evaluate"))


def test_the_step_of_a_trainer_checkpoint_is_its_folder_number(tmp_path):
    checkpoint = adapter_at(tmp_path / "run" / "checkpoints" / "checkpoint-250")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 250}))
    assert adapter_step(checkpoint)[0] == 250


def test_a_checkpoint_whose_trainer_state_disagrees_is_refused(tmp_path):
    checkpoint = adapter_at(tmp_path / "run" / "checkpoints" / "checkpoint-250")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 200}))
    with pytest.raises(ValueError, match=r"^step: .*checkpoint-250 is named step 250 but its trainer_state.json"):
        adapter_step(checkpoint)


def test_an_evaluation_adapter_and_a_final_adapter_and_an_sft_adapter_have_their_steps(tmp_path):
    assert adapter_step(adapter_at(tmp_path / "run" / "eval" / "adapters" / "step_000040"))[0] == 40
    final = adapter_at(tmp_path / "run" / "final_adapter")
    (tmp_path / "run" / rundir.DONE_FILE).write_text(json.dumps({"step": 1000}))
    assert adapter_step(final) == (1000, "the run's DONE file")
    sft = adapter_at(tmp_path / "sft")
    (sft / "sft_info.json").write_text("{}")
    assert adapter_step(sft)[0] == 0


def test_a_final_adapter_without_its_runs_done_file_is_not_guessed(tmp_path):
    with pytest.raises(ValueError, match="step: the training step of adapter .*final_adapter is unknown"):
        adapter_step(adapter_at(tmp_path / "run" / "final_adapter"))


def test_an_adapter_of_unknown_step_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    """No `step=` and an adapter outside a run: ConfigError naming `step`, and nothing loaded or written."""
    adapter = adapter_at(tmp_path / "somewhere" / "my-adapter")
    monkeypatch.setattr(evaluate_module, "check_adapter_base", lambda model, path: None)  # tested elsewhere

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(evaluate_module, "build_generator", no_loading)
    monkeypatch.setattr(evaluate_module.engines, "load_benchmarks", no_loading)
    out_dir = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"invalid config: step: the training step of adapter .*my-adapter"):
        evaluate_module.evaluate(config(out_dir, f"adapter={adapter}"), "config: text\n")
    assert not out_dir.exists()


@pytest.mark.parametrize(
    ("adapter_path", "extra", "expected"),
    [
        (None, [], 0),  # the base model is step 0
        ("run/checkpoints/checkpoint-30", [], 30),  # read from the run
        ("elsewhere/adapter", ["step=12"], 12),  # given
    ],
)
def test_the_summary_files_the_evaluation_under_its_step(tmp_path, monkeypatch, adapter_path, extra, expected):
    extra = list(extra)
    if adapter_path is not None:
        extra.append(f"adapter={adapter_at(tmp_path / adapter_path)}")
    monkeypatch.setattr(evaluate_module, "check_adapter_base", lambda model, path: None)
    script = {"": [("\\boxed{84}", "stop")] * 2}
    monkeypatch.setattr(
        evaluate_module,
        "build_generator",
        lambda cfg, backend, benchmarks: (ScriptedGenerator(script), FakeTokenizer()),
    )
    out_dir = tmp_path / "out"
    evaluate_module.evaluate(config(out_dir, *extra, "eval.seed_by_step=true"))
    (row,) = rundir.read_jsonl(out_dir / "eval" / "summary.jsonl")
    assert row["step"] == expected
    assert row["seed"] == step_seed(0, expected)  # the step read from the run draws what training's step drew
    assert (out_dir / "eval" / f"step_{expected:06d}" / "amc23.jsonl").exists()
