"""The vLLM and Unsloth backends' glue, against fakes with vLLM 0.31's API; the real vLLM engine on CPU in
test_vllm_cpu.py, Unsloth's under `gpu`."""

import importlib.util
import json
import sys
import types
from types import SimpleNamespace

import pytest
from conftest import random_tiny_model

from atr_grpo.evaluation import SamplingConfig, UnslothVLLMGenerator, VLLMGenerator
from atr_grpo.evaluation.backends import adapter_rank, vllm_max_lora_rank
from atr_grpo.evaluation.sampling import prompt_seed

EOS = 99  # the fake engine's end-of-sequence token


class FakeTokenizer:
    """Words as tokens: enough to check what the backends hand to the engine."""

    eos_token_id = EOS

    def __call__(self, text, add_special_tokens=True):
        assert add_special_tokens is False, "the chat template already wrote the special tokens"
        return {"input_ids": text.split()}


class FakeLLM:
    """`vllm.LLM` as far as the backends use it: generate(...) -> [RequestOutput], sleep mode, tokenizer."""

    def __init__(self, max_model_len=64, sleeping=False, short=False, finish_reasons=None, **kwargs):
        self.kwargs, self.calls, self.events, self.sleeping, self.short = kwargs, [], [], sleeping, short
        self.finish_reasons = finish_reasons  # what vLLM says of each sample j (default: what its tokens say)
        model_config = SimpleNamespace(max_model_len=max_model_len, try_get_generation_config=lambda: {})
        engine = SimpleNamespace(model_config=model_config)
        engine.is_sleeping = lambda: self.sleeping
        self.llm_engine = engine

    def get_tokenizer(self):
        return FakeTokenizer()

    def wake_up(self, tags=None):
        self.events.append("wake_up")
        self.sleeping = False

    def sleep(self, level=1):
        self.events.append(f"sleep({level})")
        self.sleeping = True

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None):
        self.events.append("generate")
        self.calls.append((prompts, sampling_params, lora_request))
        assert len(sampling_params) == len(prompts), "the backends send one SamplingParams per prompt"
        outputs, finish_reasons = [], self.finish_reasons
        for request, params in zip(prompts, sampling_params):
            n = params.n - (1 if self.short else 0)
            prompt = " ".join(request["prompt_token_ids"])  # token ids in, as the backends send them
            completions = [
                SimpleNamespace(
                    index=j,
                    text=f"{prompt} -> \\boxed{{{j}}}",
                    # the first sample runs out of tokens, the others end on EOS after j tokens
                    token_ids=[7] * params.max_tokens if j == 0 else [*range(j), EOS],
                    finish_reason=finish_reasons[j] if finish_reasons else "length" if j == 0 else "stop",
                )
                for j in reversed(range(n))  # out of order on purpose: the backend sorts by index
            ]
            outputs.append(SimpleNamespace(prompt=prompt, outputs=completions))
        return outputs


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeLoRARequest:
    def __init__(self, lora_name, lora_int_id, lora_path=""):
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


@pytest.fixture
def fake_vllm(monkeypatch):
    created = []

    def make_llm(**kwargs):
        llm = FakeLLM(**kwargs)
        llm.kwargs = kwargs  # everything the backend passed, max_model_len included
        created.append(llm)
        return llm

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = make_llm, FakeSamplingParams
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest
    for name, module in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, module)
    return created


@pytest.fixture
def adapter_dir(tmp_path):
    path = tmp_path / "adapter"
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": 32, "lora_alpha": 64}))
    return path


PARAMS = SamplingConfig(n=3, temperature=0.3, top_p=0.95, top_k=-1, max_tokens=16, seed=7)


def test_vllm_engine_and_lora_request(fake_vllm, adapter_dir):
    first = VLLMGenerator.from_pretrained("base-model", adapter_dir, seed=5, max_model_len=4096)
    second = VLLMGenerator.from_pretrained("base-model", adapter_dir)
    kwargs = fake_vllm[0].kwargs
    assert kwargs["model"] == "base-model" and kwargs["seed"] == 5 and kwargs["max_model_len"] == 4096
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 32 and kwargs["enable_prefix_caching"] is True
    assert first.lora_request.lora_path == str(adapter_dir.resolve())
    assert second.lora_request.lora_int_id > first.lora_request.lora_int_id >= 1, "a fresh id for every adapter"


def test_vllm_base_model_has_no_lora(fake_vllm):
    generator = VLLMGenerator.from_pretrained("base-model")
    assert generator.lora_request is None and "enable_lora" not in fake_vllm[0].kwargs


def test_one_engine_serves_several_adapters(fake_vllm, adapter_dir, tmp_path):
    """An engine built with max_lora_rank serves adapters given later, each with a fresh LoRA id."""
    engine = VLLMGenerator.from_pretrained("base-model", max_lora_rank=20)
    assert fake_vllm[0].kwargs["enable_lora"] is True and fake_vllm[0].kwargs["max_lora_rank"] == 32
    first, second = engine.with_adapter(adapter_dir), engine.with_adapter(adapter_dir)
    assert first.llm is second.llm is engine.llm and len(fake_vllm) == 1, "no second engine"
    assert second.lora_request.lora_int_id > first.lora_request.lora_int_id
    assert engine.with_adapter(None).lora_request is None


def test_vllm_generate_passes_table4_sampling_and_converts_outputs(fake_vllm, adapter_dir):
    generator = VLLMGenerator.from_pretrained("base-model", adapter_dir, max_model_len=64)
    samples = generator.generate(["p one", "p two"], PARAMS)
    prompts, params, lora_request = fake_vllm[0].calls[0]
    assert prompts == [{"prompt_token_ids": ["p", "one"]}, {"prompt_token_ids": ["p", "two"]}]
    assert lora_request is generator.lora_request
    assert [(sp.n, sp.temperature, sp.top_p, sp.top_k, sp.max_tokens) for sp in params] == [(3, 0.3, 0.95, -1, 16)] * 2
    assert [sp.seed for sp in params] == [prompt_seed(7, ["p", "one"]), prompt_seed(7, ["p", "two"])]
    assert [len(row) for row in samples] == [3, 3]
    assert [s.text for s in samples[1]] == [f"p two -> \\boxed{{{j}}}" for j in range(3)]
    assert [(s.finish_reason, s.num_tokens) for s in samples[0]] == [("length", 16), ("stop", 2), ("stop", 3)]


def test_each_prompt_is_sampled_from_random_streams_of_its_own(fake_vllm):
    """vLLM seeds a request's n samples seed, seed+1, ...: each prompt's request gets a seed of its own (from the
    evaluation's seed and the prompt's token ids), so no two problems share a stream, and a problem is sampled
    alike whatever else is in the batch."""
    generator = VLLMGenerator(FakeLLM())
    generator.generate(["p one", "p two", "p three"], PARAMS)
    generator.generate(["p three", "p one"], PARAMS)
    generator.generate(["p one"], SamplingConfig(**{**PARAMS.__dict__, "seed": 8}))
    first, reordered, reseeded = ([sp.seed for sp in call[1]] for call in generator.llm.calls)
    streams = [set(range(seed, seed + PARAMS.n)) for seed in first]  # the seeds of each prompt's n samples
    assert all(a.isdisjoint(b) for i, a in enumerate(streams) for b in streams[i + 1 :])
    assert reordered == [first[2], first[0]]
    assert reseeded[0] != first[0], "another evaluation seed, other streams"


def test_vllm_refuses_fewer_samples_and_too_long_contexts(fake_vllm):
    short = VLLMGenerator(FakeLLM(short=True))
    with pytest.raises(RuntimeError, match="instead of n=3"):
        short.generate(["p"], PARAMS)
    tight = VLLMGenerator(FakeLLM(max_model_len=20))
    with pytest.raises(ValueError, match="max_model_len"):
        tight.generate(["five tokens in this prompt"], PARAMS)  # 5 + 16 > 20


def test_vllm_samples_stop_as_their_token_ids_say(fake_vllm):
    """Why a sample stopped comes from its token ids (the reward's rule); a vLLM finish_reason that disagrees
    (a stop string ending a sample without EOS, an aborted request) is refused, not copied."""
    with pytest.raises(RuntimeError, match=r"finish_reason 'stop' after 16 tokens, but its token ids say 'length'"):
        VLLMGenerator(FakeLLM(finish_reasons=["stop", "stop", "stop"])).generate(["p"], PARAMS)
    with pytest.raises(RuntimeError, match=r"finish_reason 'abort' after 2 tokens"):
        VLLMGenerator(FakeLLM(finish_reasons=["length", "abort", "stop"])).generate(["p"], PARAMS)


def test_lora_ranks():
    assert [vllm_max_lora_rank(r) for r in (1, 8, 20, 32, 64, 300)] == [1, 8, 32, 32, 64, 320]
    with pytest.raises(ValueError):
        vllm_max_lora_rank(1024)


def test_adapter_rank_reads_rank_pattern(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 16, "rank_pattern": {"q_proj": 48}}))
    assert adapter_rank(tmp_path) == 48


class FakeUnslothModel:
    def __init__(self, engine):
        self.vllm_engine, self.loaded = engine, []

    def load_lora(self, path, load_tensors=False):
        self.loaded.append((path, load_tensors))
        return f"live-lora-{len(self.loaded)}"

    def fast_generate(self, prompts, sampling_params=None, lora_request=None, use_tqdm=True):
        return self.vllm_engine.generate(prompts, sampling_params, lora_request=lora_request, use_tqdm=use_tqdm)


def test_unsloth_uses_the_live_adapter_and_wakes_a_sleeping_engine(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SLEEP_MODE", "2")
    engine = FakeLLM(sleeping=True)
    model = FakeUnslothModel(engine)
    generator = UnslothVLLMGenerator(model, tmp_path / "live_lora")
    samples = generator.generate(["a prompt"], PARAMS)
    assert model.loaded == [(str(tmp_path / "live_lora"), True)] and (tmp_path / "live_lora").is_dir()
    assert engine.calls[0][2] == "live-lora-1"
    assert engine.events == ["wake_up", "generate", "sleep(2)"], "woken for generation, asleep again after"
    assert [s.num_tokens for s in samples[0]] == [16, 2, 3]
    generator.generate(["again"], PARAMS)
    assert engine.calls[1][2] == "live-lora-2", "every evaluation serves the adapter as it is now"


def test_unsloth_engine_awake_or_without_sleep_mode(fake_vllm, tmp_path):
    engine = FakeLLM(sleeping=False)
    UnslothVLLMGenerator(FakeUnslothModel(engine), tmp_path / "l").generate(["p"], PARAMS)
    assert engine.events == ["generate"]
    del engine.llm_engine.is_sleeping  # an engine built without sleep mode support
    UnslothVLLMGenerator(FakeUnslothModel(engine), tmp_path / "l").generate(["p"], PARAMS)


# ------------------------------------------------------------------------------------ real engines (GPU)
def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(
    not (_cuda() and importlib.util.find_spec("unsloth") is not None and importlib.util.find_spec("vllm") is not None),
    reason="needs a CUDA GPU, Unsloth and vLLM",
)
def test_unsloth_generator_on_a_tiny_model(tmp_path):
    import unsloth  # noqa: F401  (must come before transformers/peft patches)
    from unsloth import FastLanguageModel

    base, _ = random_tiny_model()
    model, _ = FastLanguageModel.from_pretrained(
        str(base),
        max_seq_length=256,
        fast_inference=True,
        max_lora_rank=8,
        gpu_memory_utilization=0.2,
        load_in_4bit=False,
    )
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    params = SamplingConfig(n=2, temperature=0.3, top_p=0.95, max_tokens=16, seed=1)
    samples = UnslothVLLMGenerator(model, tmp_path / "live_lora").generate(["What is 12 + 7?"], params)
    assert len(samples) == 1 and len(samples[0]) == 2
