"""Which float ops give other bits on another numeric path? A fingerprint of each op the tiny pipeline runs.

    python scripts/kernel_probe.py                    # runs itself once per numeric path and compares
    python scripts/kernel_probe.py --threads 1

Each op runs on fixed random float32 inputs shaped like the tiny model's (hidden 64, vocabulary 32, batch 64 × 96
tokens); its output's sha256 is printed per numeric path (`atr_grpo.numeric_paths`). An op whose fingerprint differs
between two paths gives other results on CPUs that dispatch those kernels natively.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def fingerprints(threads: int) -> dict[str, str]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, 64, generator=g)
    w = torch.randn(64, 64, generator=g) / 8
    logits = torch.randn(64, 96, 32, generator=g) * 3
    ops = {
        "matmul (linear)": lambda: x @ w,
        "matmul backward": lambda: torch.autograd.grad((x.requires_grad_() @ w).square().sum(), x)[0],
        "softmax": lambda: torch.softmax(logits, -1),
        "log_softmax": lambda: torch.log_softmax(logits, -1),
        "exp": lambda: torch.exp(logits),
        "rms norm": lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
        "silu": lambda: F.silu(x),
        "sum over tokens": lambda: x.sum(1),
        "attention (sdpa)": lambda: F.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None], is_causal=True),
        "adamw step": lambda: adamw_step(w.clone()),
    }
    return {
        name: hashlib.sha256(op().detach().contiguous().numpy().tobytes()).hexdigest()[:12] for name, op in ops.items()
    }


def adamw_step(weight: torch.Tensor) -> torch.Tensor:
    import torch

    weight.requires_grad_()
    opt = torch.optim.AdamW([weight], lr=1e-3)
    (weight.sin().sum()).backward()
    opt.step()
    return weight


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child: print this path's prints
    args = parser.parse_args()
    if args.one:
        print(json.dumps(fingerprints(args.threads)))
        return 0
    from atr_grpo.numeric_paths import NUMERIC_PATHS, path_environment
    from atr_grpo.run_environment import cpu_model

    table = {}
    for path in NUMERIC_PATHS:
        command = [sys.executable, __file__, "--one", "--threads", str(args.threads)]
        out = subprocess.run(command, env=path_environment(path), capture_output=True, text=True, check=True)
        table[path] = json.loads(out.stdout)
    paths = list(table)
    print(f"Host: {cpu_model()}; {args.threads} threads")
    print("| op | " + " | ".join(paths) + " | differs |")
    print("|---|" + "---|" * (len(paths) + 1))
    for op in table[paths[0]]:
        prints = [table[p][op] for p in paths]
        print(f"| {op} | " + " | ".join(prints) + f" | {'yes' if len(set(prints)) > 1 else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
