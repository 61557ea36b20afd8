"""The weights the vLLM weight sync sends (`training/weight_sync.py`), without an engine: a bf16 LoRA model whose
frozen base stays bit-identical over many syncs while the adapter moves, and whose sent weights equal a float32
merge; the names are the base model's checkpoint names; what the sync cannot merge is refused."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel, Qwen3Config, Qwen3ForCausalLM
from trl.generation.vllm_generation import VLLMGeneration

from atr_grpo.training.weight_sync import ExactWeightSync, adopt_exact_weight_sync

SYNCS = 100
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_base(dtype=torch.bfloat16):
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config).to(dtype)


def lora_model(base, **lora):
    """`base` with a LoRA adapter whose B is not zero (a trained adapter), r=8, α=16 unless given. The adapter
    keeps the base's dtype (PEFT would otherwise hold it in float32), so a merge done in bf16 rounds twice."""
    settings = {"r": 8, "lora_alpha": 16, "target_modules": TARGETS, **lora}
    model = get_peft_model(base, LoraConfig(**settings), autocast_adapter_dtype=False)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 1e-2)
    return model


def generation(model, cls=ExactWeightSync):
    """A `VLLMGeneration` of class `cls` with no engine: what the weight iterator reads (one process, no FSDP)."""
    instance = VLLMGeneration.__new__(cls)
    instance.model = model
    instance._dist = SimpleNamespace(gather_params=lambda params: nullcontext(), is_fsdp=False)
    return instance


def frozen_base(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" not in name}


def nudge_lora_b(model, generator):
    """An optimizer step's worth of change to the adapter (1e-5), as between two syncs."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn(param.shape, generator=generator).to(param.dtype) * 1e-5)


def float32_merge(model):
    """The reference: the model's merge done by PEFT in float32 on a copy, cast to the base's dtype."""
    reference = copy.deepcopy(model).float().merge_and_unload()
    return {name: p.detach().to(torch.bfloat16) for name, p in reference.named_parameters()}


def changed(before, model):
    now = frozen_base(model)
    return sum(int((now[name] != before[name]).sum()) for name in before)


def test_the_base_stays_bit_identical_over_100_syncs_and_the_sent_weights_are_the_float32_merge():
    """Draining the sync 100 times while the adapter moves never writes into the bf16 base; each time the weights
    sent equal W + s·B·A merged in float32 and cast (up to the cast: bit-equal)."""
    model = lora_model(tiny_base())
    start = frozen_base(model)
    sync = generation(model)
    generator = torch.Generator().manual_seed(2)
    for index in range(SYNCS):
        nudge_lora_b(model, generator)
        sent = dict(sync._iter_named_params())
        if index in (0, SYNCS - 1):
            reference = float32_merge(model)
            assert sent.keys() == reference.keys()
            for name, tensor in sent.items():
                assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, reference[name]), name
    assert changed(start, model) == 0
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(sent[q_proj], start[f"base_model.model.{q_proj.replace('.weight', '.base_layer.weight')}"])


def test_trls_in_place_merge_drifts_the_bf16_base():
    """Why the sync is replaced: TRL 1.15's own iterator (merge_adapter, read, unmerge_adapter) changes the frozen
    base in the same setting. If this ever fails, TRL merges out of place and `weight_sync` may be retired."""
    model = lora_model(tiny_base())
    start = frozen_base(model)
    sync = generation(model, cls=VLLMGeneration)
    generator = torch.Generator().manual_seed(2)
    for _ in range(SYNCS):
        nudge_lora_b(model, generator)
        for _ in sync._iter_named_params():
            pass
    assert changed(start, model) > 0.01 * sum(t.numel() for t in start.values())


def test_the_names_sent_are_the_base_models_checkpoint_names():
    """One tensor per parameter of the plain model, under its name (the tied embedding once), as vLLM loads them."""
    base = tiny_base()
    plain_names = [name for name, _ in base.named_parameters()]
    sent = [name for name, _ in generation(lora_model(base))._iter_named_params()]
    assert sent == plain_names and "lm_head.weight" not in sent


def test_fan_in_fan_out_and_lora_bias_merge_as_peft_does():
    """GPT-2's Conv1D stores its weight [in, out] (PEFT's fan_in_fan_out) and has a bias, which a LoRA bias moves."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=96, n_positions=32, n_embd=64, n_layer=1, n_head=2)
    gpt2 = GPT2LMHeadModel(config).to(torch.bfloat16)
    model = lora_model(gpt2, target_modules=["c_attn"], lora_bias=True, fan_in_fan_out=True)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name and name.endswith("bias"):
                param.normal_(0, 1e-2)
    assert model.base_model.model.transformer.h[0].attn.c_attn.fan_in_fan_out
    sent = dict(generation(model)._iter_named_params())
    reference = float32_merge(model)
    base_bias = model.base_model.model.transformer.h[0].attn.c_attn.base_layer.bias
    for name in ("transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias"):
        assert torch.equal(sent[name], reference[name]), name
    assert not torch.equal(sent["transformer.h.0.attn.c_attn.bias"], base_bias), "the LoRA bias is merged"


def test_modules_to_save_sends_the_trained_copy_under_the_original_name():
    base = tiny_base()
    model = lora_model(base, modules_to_save=["norm"])
    with torch.no_grad():
        model.base_model.model.model.norm.modules_to_save["default"].weight.fill_(3.0)
    sent = dict(generation(model)._iter_named_params())
    assert torch.equal(sent["model.norm.weight"], torch.full((64,), 3.0, dtype=torch.bfloat16))
    assert not any("modules_to_save" in name or "original_module" in name for name in sent)
    with model.disable_adapter():  # the forward's choice: the original module
        assert torch.equal(dict(generation(model)._iter_named_params())["model.norm.weight"], torch.ones(64).bfloat16())


@pytest.mark.parametrize(
    "lora, part",
    [({"use_dora": True}, "LoRA variant"), ({"target_modules": ["embed_tokens", "q_proj"]}, "LoRA on Embedding")],
)
def test_an_adapter_the_sync_cannot_merge_is_refused(lora, part):
    model = lora_model(tiny_base(torch.float32), **lora)
    with pytest.raises(ValueError) as refusal:
        adopt_exact_weight_sync(generation(model, cls=VLLMGeneration))
    message = str(refusal.value)
    assert part in message and "model.lora.target_modules" in message and "rollout.engine=hf" in message


def test_adoption_refuses_fsdp_and_keeps_trls_instance():
    model = lora_model(tiny_base())
    fsdp = generation(model, cls=VLLMGeneration)
    fsdp._dist = SimpleNamespace(is_fsdp=True)
    with pytest.raises(ValueError, match="FSDP"):
        adopt_exact_weight_sync(fsdp)
    plain = generation(model, cls=VLLMGeneration)
    adopted = adopt_exact_weight_sync(plain)
    assert adopted is plain and isinstance(plain, ExactWeightSync) and plain.model is model
