"""GPU only: the smoke run through Unsloth's generated trainer with our rule installed in its compiled loss.

The tiny local model stands in for Qwen3: rollouts with HF generate (rollout.engine=hf), then with Unsloth's
colocated vLLM engine and the paper's evaluation design (eval.when=after: a vLLM engine of its own after
training). Unsloth turns bf16 on for a bf16-capable GPU, so the runs ask for it (the check refuses otherwise).
Skipped without CUDA and unsloth.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("unsloth") is None,
        reason="needs a CUDA GPU and unsloth (pip install -e .[gpu])",
    ),
]


HF_ROLLOUTS = ["rollout.engine=hf", "eval=none"]
VLLM_ROLLOUTS_AND_EVAL = ["rollout.engine=vllm", "eval.when=after", "eval.backend=vllm"]


@pytest.mark.parametrize(
    ("rule", "engine"),
    [("atr", HF_ROLLOUTS), ("clip_cov", HF_ROLLOUTS), ("full_kl", HF_ROLLOUTS), ("atr", VLLM_ROLLOUTS_AND_EVAL)],
)
def test_unsloth_backend_trains_with_the_rule(tmp_path, tiny_model_dir, rule, engine):
    run_dir = tmp_path / rule
    cmd = [
        sys.executable,
        "-m",
        "atr_grpo.train",
        "experiment=smoke",
        f"clipping={rule}",
        "trainer.backend=unsloth",
        "trainer.bf16=true",
        *engine,
        f"run_dir={run_dir}",
        "trainer.learning_rate=5e-3",
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        for key in ("entropy", "completion_length", "clip/frac", "ratio/mean", "ratio/max"):
            assert key in row and row[key] == row[key], (key, row)  # present and not NaN
    # the reward is logged where a rollout is sampled (steps 1 and 3), as on the TRL path
    assert [r["step"] for r in rows if "reward" in r] == [1, 3]
    assert all(0.0 <= r["reward"] <= 1.0 for r in rows if "reward" in r)
    # steps 2 and 4 reuse their rollout (rollout=reuse2): the ratio moved and the rule acted
    assert rows[1]["ratio/max"] > 1.0 or rows[3]["ratio/max"] > 1.0
    # step 1 is the rollout's first update: π_old is the same weights, recomputed by a separate no-grad pass under
    # bf16 autocast, so the ratio is 1 on average and close to it on every token, not exactly 1
    assert rows[0]["ratio/mean"] == pytest.approx(1.0, abs=1e-3)
    assert rows[0]["ratio/max"] <= 1.05
    assert (run_dir / "DONE").exists()
    if "eval.when=after" in engine:  # every scheduled step evaluated by the engine sized for the evaluation
        summary = [json.loads(line) for line in (run_dir / "eval" / "summary.jsonl").read_text().splitlines()]
        assert [(r["step"], r["backend"]) for r in summary] == [(0, "vllm"), (2, "vllm"), (4, "vllm")]
        assert all("rollout/logp_abs_diff_mean" in row for row in rows)
