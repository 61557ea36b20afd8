"""GPU only: the smoke run through Unsloth's generated trainer with our rule installed in its compiled loss.

vLLM is not needed (model.fast_inference=false: rollouts with HF generate); the tiny local model stands in
for Qwen3. Skipped without CUDA and unsloth.
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


@pytest.mark.parametrize("rule", ["atr", "clip_cov", "full_kl"])
def test_unsloth_backend_trains_with_the_rule(tmp_path, tiny_model_dir, rule):
    run_dir = tmp_path / rule
    cmd = [
        sys.executable, "-m", "atr_grpo.train", "experiment=smoke", f"clipping={rule}", "trainer.backend=unsloth",
        "model.fast_inference=false", "eval=none", f"run_dir={run_dir}", "trainer.learning_rate=5e-3",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        for key in ("reward", "entropy", "completion_length", "clip/frac", "ratio/mean", "ratio/max"):
            assert key in row and row[key] == row[key], (key, row)  # present and not NaN
    # steps 2 and 4 reuse their rollout (rollout=reuse2): the ratio moved and the rule acted
    assert rows[1]["ratio/max"] > 1.0 or rows[3]["ratio/max"] > 1.0
    assert rows[0]["ratio/max"] == pytest.approx(1.0, abs=1e-3)
    assert (run_dir / "DONE").exists()
