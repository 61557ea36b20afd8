"""The transformers backend on a tiny random Qwen3 (built by the package, no downloads); the CPU end-to-end run."""

import pytest
import torch
from conftest import REPO, random_tiny_model

from atr_grpo import rundir
from atr_grpo.data.prompts import render_prompt
from atr_grpo.evaluation import (
    HFGenerator,
    SamplingConfig,
    load_benchmark,
    read_summary,
    run_evaluation,
    summarize,
)

FIXTURES = REPO / "tests" / "fixtures" / "eval"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's matmuls are fastest on one thread (and two threads thrash on a busy 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny():
    """The tiny Qwen3 with random weights and the package's tokenizer, loaded as evaluation loads a model."""
    from atr_grpo.models import load_model_and_tokenizer

    _, cfg = random_tiny_model()
    return load_model_and_tokenizer(cfg)


PARAMS = SamplingConfig(n=3, temperature=1.0, top_p=0.95, max_tokens=10, seed=1)


def prompts_for(tokenizer, count):
    return [render_prompt(tokenizer, f"What is {i} + {2 * i}?") for i in range(count)]


def test_n_samples_per_prompt_with_finish_reasons(tiny):
    model, tokenizer = tiny
    samples = HFGenerator(model, tokenizer, batch_size=2, show_progress=False).generate(
        prompts_for(tokenizer, 5), PARAMS
    )
    assert [len(row) for row in samples] == [3] * 5
    flat = [s for row in samples for s in row]
    assert {s.finish_reason for s in flat} <= {"stop", "length"}
    assert all(s.num_tokens == 10 for s in flat if s.finish_reason == "length")
    assert all(1 <= s.num_tokens <= 10 for s in flat)
    assert not any("<|im_end|>" in s.text or "<|endoftext|>" in s.text for s in flat)
    assert len({s.text for s in flat}) > 5, "samples differ"


def test_seeded_reproducible_and_leaves_the_caller_state_alone(tiny):
    model, tokenizer = tiny
    generator = HFGenerator(model, tokenizer, batch_size=2, show_progress=False)
    prompts = prompts_for(tokenizer, 3)
    model.train()
    tokenizer.padding_side = "right"
    rng_before = torch.random.get_rng_state()
    first = generator.generate(prompts, PARAMS)
    assert torch.equal(torch.random.get_rng_state(), rng_before), "the training run's random stream is untouched"
    assert model.training and tokenizer.padding_side == "right", "mode and padding side are given back"
    assert generator.generate(prompts, PARAMS) == first
    other = generator.generate(prompts, SamplingConfig(n=3, temperature=1.0, top_p=0.95, max_tokens=10, seed=2))
    assert other != first
    model.eval()
    generator.generate(prompts[:1], PARAMS)
    assert not model.training


def test_completions_are_cut_at_the_first_eos(tiny):
    model, tokenizer = tiny
    generator = HFGenerator(model, tokenizer, show_progress=False)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    word = tokenizer.encode("answer", add_special_tokens=False)
    stopped = generator._to_sample([*word, eos, pad, pad], {eos}, max_tokens=len(word) + 3)
    assert (stopped.text, stopped.finish_reason, stopped.num_tokens) == ("answer", "stop", len(word) + 1)
    ran_out = generator._to_sample([*word, *word], {eos}, max_tokens=2 * len(word))
    assert (ran_out.finish_reason, ran_out.num_tokens) == ("length", 2 * len(word))
    with pytest.raises(RuntimeError, match="without EOS"):
        generator._to_sample(word, {eos}, max_tokens=len(word) + 5)


def test_end_to_end_cpu_evaluation_writes_consistent_files(tiny, tmp_path):
    model, tokenizer = tiny
    benchmarks = [
        load_benchmark("aime24", FIXTURES / "aime24.jsonl", strict=False),
        load_benchmark("amc23", FIXTURES / "amc23.jsonl", strict=False),
    ]
    sampling = SamplingConfig(n=4, temperature=0.3, top_p=0.95, max_tokens=12, seed=0)
    generator = HFGenerator(model, tokenizer, batch_size=4, show_progress=False)
    metrics = run_evaluation(
        generator,
        tokenizer,
        benchmarks,
        sampling,
        tmp_path,
        step=0,
        k=4,
        grader_workers=2,
        show_progress=False,
    )

    summary = read_summary(tmp_path)
    assert set(summary) == {(0, "aime24"), (0, "amc23")}
    for bench in benchmarks:
        lines = rundir.read_jsonl(tmp_path / "eval" / "step_000000" / f"{bench.name}.jsonl")
        assert len(lines) == len(bench) * 4
        row = summary[(0, bench.name)]
        assert (row["num_problems"], row["n"], row["backend"], row["max_tokens"]) == (len(bench), 4, "hf", 12)
        assert sum(row["status_counts"].values()) == len(lines)
        assert row["status_counts"]["truncated"] == sum(line["finish_reason"] == "length" for line in lines)
        matrix = [[line["correct"] for line in lines[i * 4 : (i + 1) * 4]] for i in range(len(bench))]
        assert [lines[i * 4]["problem_id"] for i in range(len(bench))] == [p.id for p in bench.problems]
        for key, value in summarize(matrix).items():
            assert row[key] == pytest.approx(value)
        assert metrics[f"eval/{bench.name}/mean@4"] == row["mean@4"]
    expected_average = (summary[(0, "aime24")]["pass@4"] + summary[(0, "amc23")]["pass@4"]) / 2
    assert metrics["eval/average/pass@4"] == pytest.approx(expected_average)
