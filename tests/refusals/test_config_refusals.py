"""Bad input is refused before any model loads, with the key named: a rule's unknown parameter, a missing
local file, a temperature vLLM would refuse, vLLM asked for where it cannot run; a missing --config-dir, a
misspelled key in its files or a misspelled option is named as typed, and `--cfg job` refuses what a run refuses."""

import logging
import subprocess
import sys

import pytest
from conftest import REPO, compose, train_config

from atr_grpo.config_hydra import config_from_yaml, config_to_yaml, to_object
from atr_grpo.errors import ConfigError
from atr_grpo.hydra_app import check_sweep


def train_cli(*overrides):
    return subprocess.run(
        [sys.executable, "-m", "atr_grpo.train", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["clipping=atr", "+clipping.eps=0.2"], "'clipping.eps' is not a key of clipping; allowed keys: name, delta"),
        # each case starts Python: test-fast keeps the first
        *(
            pytest.param(*case, marks=pytest.mark.slow)
            for case in [
                (["data=dapo_math", "data.path=/nonexistent.parquet"], "data.path must be null when data.source='hub'"),
                (["data.source=file", "data.path=/nonexistent.parquet"], "data.path must be an existing file"),
                (["rollout.engine=vllm", "trainer.temperature=2.5"], "trainer.temperature must be <= 2.0"),
                (["experiment=smoke", "clipping=clip", "trainer.top_p=0.9"], "trainer.top_p must be 1.0 for training"),
            ]
        ),
    ],
)
def test_the_train_entry_point_refuses_with_status_2_and_no_traceback(overrides, message):
    result = train_cli(*overrides, "logger=none")
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+trainer.foo=1"], "'trainer.foo' is not a key of trainer"),
        (["+eval.paths.amc23=/no/such/file.jsonl"], "eval.paths.amc23 must be an existing file"),
        (["eval.backend=vllm", "eval.temperature=2.5"], "eval.temperature must be <= 2.0 with eval.backend=vllm"),
        # auto is vLLM on a GPU: refused on every machine, so that a config passing on a CPU never fails on a GPU
        (
            ["eval.backend=auto", "eval.temperature=2.5"],
            "eval.temperature must be <= 2.0 with eval.backend=auto (vLLM refuses more; eval.backend=hf does not)",
        ),
        (["sft.source=file", "sft.path=/no/such/sft.parquet"], "sft.path must be an existing file"),
        (["model.path=./no-such-model"], "model.path must be an existing file"),
    ],
)
def test_composed_configs_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        to_object(compose(["experiment=smoke", *overrides]))


# ------------------------------------------------------------------------ truncated training sampling
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.top_p=0.9"], "trainer.top_p must be 1.0 for training (truncated sampling draws from a renormalised"),
        (["trainer.top_k=20"], "trainer.top_k must be -1 for training (off; truncated sampling"),
        (["rollout.correction=tis", "rollout.engine=vllm", "trainer.top_p=0.8"], "trainer.top_p must be 1.0"),
        (
            ["trainer.top_p=0.9", "trainer.allow_truncated_sampling=true", "rollout.engine=hf"],
            "trainer.allow_truncated_sampling must be false with rollout.engine='hf'",
        ),
        (["trainer.allow_truncated_sampling=true"], "trainer.allow_truncated_sampling must be false with untruncated"),
    ],
)
def test_truncated_training_sampling_is_refused_naming_the_key_and_the_flag(overrides, message):
    """A truncated sampler puts its kept mass into every rule's ratio: refused unless explicitly allowed, and then
    only where the engine's log-probs measure it; the message names the key, why, and the flag."""
    with pytest.raises(ConfigError) as refused:
        to_object(compose(["experiment=smoke", "clipping=clip", *overrides]))
    assert message in str(refused.value)
    if not any("allow_truncated_sampling" in override for override in overrides):
        assert "trainer.allow_truncated_sampling=true" in str(refused.value)


def test_truncated_training_sampling_is_allowed_with_the_flag_and_warned(caplog):
    """The warning is logged at WARNING level, and its text does not repeat the word: the console's log format
    shows the level (`[...][WARNING] - trainer.top_p=0.9 truncates ...`)."""
    from atr_grpo.training.pipeline import warn_if_truncated_sampling

    cfg = train_config(["trainer.top_p=0.9", "trainer.allow_truncated_sampling=true", "rollout.engine=vllm"])
    with caplog.at_level(logging.WARNING, logger="atr_grpo.training.pipeline"):
        message = warn_if_truncated_sampling(cfg)
    assert message.startswith("trainer.top_p=0.9 truncates the training sampler")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", message)]
    assert "rollout/ratio_outside_box_frac" in message
    assert warn_if_truncated_sampling(train_config(["experiment=smoke"])) is None
    assert cfg.eval.top_p == 0.95, "evaluation sampling keeps the paper's top-p (§6.1)"


def test_a_hot_evaluation_temperature_is_allowed_with_the_hf_backend():
    cfg = to_object(compose(["experiment=smoke", "eval.backend=hf", "eval.temperature=2.5"]))
    assert (cfg.eval.backend, cfg.eval.temperature) == ("hf", 2.5)


def test_a_runs_config_survives_the_trip_through_its_yaml():
    """What a stage process reads back (config.yaml) is the config the run was launched with."""
    for overrides in (["experiment=smoke"], ["experiment=smoke", "clipping=clip_cov"], []):
        cfg = train_config(overrides)
        assert config_from_yaml(config_to_yaml(cfg)) == cfg


# ------------------------------------------------------------------------ what the user typed, named back
def refused_naming(result, *words):
    """Exit status 2, each of `words` on stderr, and none of Hydra's search path or a traceback."""
    assert result.returncode == 2, result.stderr[-2000:]
    for word in words:
        assert word in result.stderr, (word, result.stderr)
    for noise in ("Traceback", "structured://", "Config search path"):
        assert noise not in result.stderr, (noise, result.stderr)


def user_config_dir(tmp_path):
    """A --config-dir holding clipping/mine.yaml, an ATR file with the key `delta` misspelled."""
    clipping = tmp_path / "conf" / "clipping"
    clipping.mkdir(parents=True)
    (clipping / "mine.yaml").write_text("defaults:\n  - /schema/clipping@_here_: atr\n\nname: atr\ndeltaa: 0.05\n")
    return tmp_path / "conf"


@pytest.mark.parametrize("missing", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_a_config_dir_is_refused_naming_the_missing_folder_or_the_misspelled_key(tmp_path, missing):
    folder = tmp_path / "no-such-folder" if missing else user_config_dir(tmp_path)
    result = train_cli("--config-dir", str(folder), "experiment=smoke", "clipping=mine", "logger=none")
    if missing:
        refused_naming(result, f"--config-dir {folder}: no such folder")
    else:
        refused_naming(
            result,
            f"{folder / 'clipping' / 'mine.yaml'}: 'clipping.deltaa' is not a key of clipping; did you mean 'delta'? "
            "allowed keys: name, delta, semantics",
        )


def test_a_config_dir_file_is_read_as_hydra_reads_it(tmp_path):
    """The check before a run composes with --config-dir's files, so a good one passes it."""
    folder = user_config_dir(tmp_path)
    (folder / "clipping" / "mine.yaml").write_text("defaults:\n  - /schema/clipping@_here_: atr\n\nname: atr\n")
    assert check_sweep("train", ["experiment=smoke", "clipping=mine"], config_dir=folder) == 1
    with pytest.raises(ConfigError, match=f"--config-dir {tmp_path / 'none'}: no such folder"):
        compose(["experiment=smoke"], config_dir=tmp_path / "none")


@pytest.mark.parametrize(
    "overrides",
    [
        ["clipping.semantics=minn"],
        pytest.param(["clipping=clip", "clipping.eps=-1"], marks=pytest.mark.slow),
    ],
)
def test_cfg_job_validates_what_a_run_validates(overrides):
    """`--cfg job --resolve` prints only a config a run accepts: a bad value stops it with exit status 2 and the
    message a run gives."""
    with pytest.raises(ConfigError) as err:
        check_sweep("train", ["experiment=smoke", *overrides], multirun=False)
    result = train_cli("experiment=smoke", *overrides, "--cfg", "job", "--resolve")
    refused_naming(result, str(err.value))
    assert result.stdout == ""


@pytest.mark.slow
def test_resolve_without_cfg_is_refused_naming_the_flag():
    refused_naming(train_cli("experiment=smoke", "--resolve"), "--resolve is read with --cfg or --help only")


@pytest.mark.slow
def test_a_single_run_is_refused_without_talk_of_a_sweep():
    result = train_cli("experiment=smoke", "logger=none", "trainer.max_steps=0")
    refused_naming(result, "trainer.max_steps must be > 0, got 0")
    assert "sweep" not in result.stderr


@pytest.mark.slow
def test_a_misspelled_option_is_named_with_a_guess_and_the_allowed_names():
    result = train_cli("experiment=smoke", "logger=none", "clipping=atrr")
    allowed = ", ".join(sorted(path.stem for path in (REPO / "conf" / "clipping").glob("*.yaml")))
    refused_naming(result, f"clipping=atrr: no such clipping config; did you mean 'atr'? allowed: {allowed}")
    assert len(result.stderr.strip().splitlines()) == 1 and "sweep" not in result.stderr


def test_a_misspelled_option_without_a_close_name_lists_the_allowed_ones():
    with pytest.raises(ConfigError) as err:
        compose(["experiment=zzzz"])
    assert str(err.value).startswith("invalid config: experiment=zzzz: no such experiment config; allowed: ")
    assert "did you mean" not in str(err.value) and "smoke" in str(err.value)


@pytest.mark.parametrize(
    ("override", "guess"),
    [
        ("trainer.learning_rat=1e-5", "'trainer.learning_rat' is not a key of trainer; did you mean 'learning_rate'?"),
        ("+clipping.delt=0.1", "'clipping.delt' is not a key of clipping; did you mean 'delta'?"),
    ],
)
def test_a_misspelled_key_is_named_with_a_guess_as_a_misspelled_option_is(override, guess):
    with pytest.raises(ConfigError) as err:
        train_config([override])
    assert guess in str(err.value) and "allowed keys: " in str(err.value)


def test_a_misspelled_key_without_a_close_name_lists_the_allowed_keys_and_guesses_none():
    with pytest.raises(ConfigError) as err:
        train_config(["+trainer.zzzz=1"])
    assert "did you mean" not in str(err.value) and "; allowed keys: backend, learning_rate" in str(err.value)


# ------------------------------------------------------------- a rule's config file without its schema line
def rule_file_without_schema_line(tmp_path):
    """A --config-dir holding clipping/mine.yaml as the README once asked for it: ATR's values, no `defaults:`."""
    clipping = tmp_path / "conf" / "clipping"
    clipping.mkdir(parents=True)
    (clipping / "mine.yaml").write_text("# ATR with a smaller δ\nname: atr\ndelta: 0.05\n")
    return tmp_path / "conf"


SCHEMA_LINE = "needs the defaults line 'defaults: [/schema/clipping@_here_: atr, _self_]'"


def test_a_rule_file_without_its_schema_line_is_refused_naming_the_file_and_the_line(tmp_path):
    """Without the line the file composes into a plain mapping that no rule reads (every run used to die on it
    with an AttributeError); composing refuses it, naming the file and the line to add."""
    folder = rule_file_without_schema_line(tmp_path)
    with pytest.raises(ConfigError) as err:
        compose(["experiment=smoke", "clipping=mine"], config_dir=folder)
    assert str(err.value).startswith(f"invalid config: {folder / 'clipping' / 'mine.yaml'}: a rule's config file")
    assert SCHEMA_LINE in str(err.value)
    (folder / "clipping" / "mine.yaml").write_text(
        "defaults:\n  - /schema/clipping@_here_: atr\n  - _self_\nname: atr\ndelta: 0.05\n"
    )
    assert to_object(compose(["experiment=smoke", "clipping=mine"], config_dir=folder)).clipping.delta == 0.05


def test_a_rule_file_with_another_rules_schema_is_refused_naming_both():
    with pytest.raises(ConfigError) as err:
        to_object(compose(["experiment=smoke", "clipping=atr", "clipping.name=clip"]))
    assert str(err.value) == (
        "invalid config: clipping.name='clip' in a file with the schema of 'atr': a rule's config file picks its own "
        "schema ('defaults: [/schema/clipping@_here_: clip, _self_]')"
    )


@pytest.mark.slow
@pytest.mark.parametrize("cfg_flags", [["--cfg", "job", "--resolve"], []], ids=["cfg-job", "run"])
def test_the_train_entry_point_refuses_a_rule_file_without_its_schema_line(tmp_path, cfg_flags):
    """`--cfg job --resolve` prints nothing, and a run stops before any model loads: exit status 2, the message,
    no run directory."""
    folder = rule_file_without_schema_line(tmp_path)
    run_dir = tmp_path / "run"
    result = train_cli(
        "--config-dir",
        str(folder),
        "experiment=smoke",
        "clipping=mine",
        "logger=none",
        f"run_dir={run_dir}",
        *cfg_flags,
    )
    refused_naming(result, f"{folder / 'clipping' / 'mine.yaml'}: a rule's config file", SCHEMA_LINE)
    assert result.stdout == "" and not run_dir.exists()
