"""The vLLM server of rollout.vllm.mode=server, checked before anything is loaded.

In server mode the rollouts come from a vLLM server on GPUs of its own (started with `trl vllm-serve`,
docs/scaling.md); TRL's client connects to it only once the trainer is built, after the model, the data and the
SFT stage. `check_rollout_server` asks the server's `/health` endpoint first, for up to
rollout.vllm.server_timeout seconds (a server still loading its model does not answer yet), and refuses the
run with the keys to check when nothing answers. The weight sync that follows (NCCL, on rollout.vllm.group_port)
needs GPUs and is not checked here.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request

from atr_grpo.config_training import RolloutConfig, VLLMRolloutConfig
from atr_grpo.errors import ConfigError

log = logging.getLogger(__name__)

RETRY_SECONDS = 2.0  # between two health requests while the server starts


def server_url(vllm: VLLMRolloutConfig) -> str:
    """The server's base URL as TRL's client builds it: server_base_url, else http://server_host:server_port."""
    if vllm.server_base_url:
        return vllm.server_base_url.rstrip("/")
    return f"http://{vllm.server_host}:{vllm.server_port}"


def _answers(url: str, timeout: float) -> str | None:
    """None when GET `url` returns 200, else what went wrong."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        return str(getattr(err, "reason", err))


def check_rollout_server(rollout: RolloutConfig, engine: str | None) -> None:
    """Refuse a server-mode run whose vLLM server does not answer (nothing to do in other modes); `engine`: the
    run's rollout engine (`machine.decide`)."""
    if engine != "vllm" or rollout.vllm.mode != "server":
        return
    vllm = rollout.vllm
    url = f"{server_url(vllm)}/health"
    deadline = time.monotonic() + vllm.server_timeout
    log.info("waiting up to %.0f s for the vLLM server at %s", vllm.server_timeout, url)
    while True:
        problem = _answers(url, timeout=min(RETRY_SECONDS, vllm.server_timeout))
        if problem is None:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(min(RETRY_SECONDS, max(deadline - time.monotonic(), 0.0)))
    where = (
        f"rollout.vllm.server_base_url={vllm.server_base_url!r}"
        if vllm.server_base_url
        else f"rollout.vllm.server_host={vllm.server_host!r}, rollout.vllm.server_port={vllm.server_port}"
    )
    raise ConfigError(
        f"invalid config: rollout.vllm.mode='server' but no vLLM server answered GET {url} within "
        f"rollout.vllm.server_timeout={vllm.server_timeout:g} s (last: {problem}). Start it first, on GPUs of its "
        "own (`CUDA_VISIBLE_DEVICES=<gpu> trl vllm-serve --model <model.path> --port <port>`, docs/scaling.md), or "
        f"point {where} at it"
    )
