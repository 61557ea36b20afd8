"""Shared fixtures: the tiny model (built once per session, cached under results/cache/tiny) and configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"


def compose(overrides: list[str] | None = None, config_name: str = "train", **kwargs):
    """The composed DictConfig for `overrides`, as `python -m atr_grpo.train ...` would see it."""
    from atr_grpo import hydra_app

    return hydra_app.compose(config_name, overrides or [], **kwargs)


def train_config(overrides: list[str] | None = None):
    from atr_grpo.config import to_object

    return to_object(compose(overrides))


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The pretrained tiny base model (built on first use, then reused from the cache)."""
    from atr_grpo.models import materialize_tiny

    cfg = train_config(["experiment=smoke"])
    old = os.getcwd()
    os.chdir(REPO)  # the cache lives under the repo's results/cache
    try:
        return materialize_tiny(cfg.model.tiny).resolve()
    finally:
        os.chdir(old)
