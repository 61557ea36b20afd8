"""Where built artefacts are cached: the tiny base model and the SFT adapters, each reused by later runs.

One root decides it: `$ATR_GRPO_CACHE` when set, else `results/cache` (relative to the working directory, like
`results/runs`). Entries are keyed by a hash of what built them, so one root can serve many checkouts.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "ATR_GRPO_CACHE"
DEFAULT_CACHE_ROOT = "results/cache"


def cache_dir(name: str) -> Path:
    """`<cache root>/<name>`, e.g. cache_dir("tiny") for the tiny base models."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_ROOT) / name
