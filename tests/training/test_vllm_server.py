"""rollout.engine=vllm with rollout.vllm.mode=server: the config reaches TRL's client, and a server that does not
answer is refused before anything is loaded (against a local HTTP server and a closed port). The weight sync to a
real `trl vllm-serve` (NCCL) needs two GPUs: the last test, marked gpu."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import REPO, train_config

from atr_grpo.errors import ConfigError
from atr_grpo.training import pipeline
from atr_grpo.training.rule_trainer import grpo_arg_values
from atr_grpo.training.vllm_server import check_rollout_server

SERVER = ["rollout.engine=vllm", "rollout.vllm.mode=server"]


class Health(http.server.BaseHTTPRequestHandler):
    status = 200  # what /health answers
    requests: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).requests.append(self.path)
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    """A local HTTP server on 127.0.0.1 standing in for `trl vllm-serve`; yields (port, handler class)."""
    handler = type("Handler", (Health,), {"requests": [], "status": 200})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_server_mode_reaches_trls_client_settings():
    """Every rollout.vllm.server_* key becomes TRL's vllm_server_* argument, and GRPOConfig accepts them."""
    from trl import GRPOConfig

    cfg = train_config(
        [
            "experiment=smoke",
            *SERVER,
            "rollout.vllm.server_host=10.1.2.3",
            "rollout.vllm.server_port=8123",
            "rollout.vllm.server_timeout=30",
            "rollout.vllm.group_port=51300",
        ]
    )
    values = grpo_arg_values(cfg, "unused", "vllm")
    assert values["use_vllm"] is True and values["vllm_mode"] == "server"
    assert (values["vllm_server_host"], values["vllm_server_port"]) == ("10.1.2.3", 8123)
    assert (values["vllm_server_timeout"], values["vllm_group_port"], values["vllm_server_base_url"]) == (
        30,
        51300,
        None,
    )
    args = GRPOConfig(**values)
    assert (args.vllm_mode, args.vllm_server_host, args.vllm_server_port, args.vllm_group_port) == (
        "server",
        "10.1.2.3",
        8123,
        51300,
    )


def test_an_unknown_vllm_mode_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="rollout.vllm.mode must be one of 'colocate', 'server'"):
        train_config(["experiment=smoke", *SERVER[:1], "rollout.vllm.mode=remote"])


def test_a_server_that_answers_health_is_accepted(health_server):
    port, handler = health_server
    cfg = train_config(
        [
            "experiment=smoke",
            *SERVER,
            "rollout.vllm.server_host=127.0.0.1",
            f"rollout.vllm.server_port={port}",
            "rollout.vllm.server_timeout=5",
        ]
    )
    check_rollout_server(cfg.rollout, "vllm")
    assert handler.requests and set(handler.requests) == {"/health"}  # (a slow first answer is asked again)


def test_server_base_url_takes_precedence_over_host_and_port(health_server):
    port, handler = health_server
    cfg = train_config(
        [
            "experiment=smoke",
            *SERVER,
            f"rollout.vllm.server_base_url=http://127.0.0.1:{port}/",
            f"rollout.vllm.server_port={closed_port()}",
            "rollout.vllm.server_timeout=5",
        ]
    )
    check_rollout_server(cfg.rollout, "vllm")
    assert handler.requests and set(handler.requests) == {"/health"}


def test_a_closed_port_is_refused_before_anything_loads_naming_the_keys():
    """Nothing listens: preflight fails after rollout.vllm.server_timeout with the URL and the keys to check."""
    port = closed_port()
    cfg = train_config(
        [
            "experiment=smoke",
            "eval=none",
            *SERVER,
            "rollout.vllm.server_host=127.0.0.1",
            f"rollout.vllm.server_port={port}",
            "rollout.vllm.server_timeout=1",
        ]
    )
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        pipeline.preflight(cfg)
    message = str(err.value)
    assert f"GET http://127.0.0.1:{port}/health" in message and "rollout.vllm.server_timeout=1 s" in message
    assert f"rollout.vllm.server_host='127.0.0.1', rollout.vllm.server_port={port}" in message
    assert "trl vllm-serve" in message
    assert 1 <= time.monotonic() - started < 10


def test_a_server_that_is_not_healthy_is_refused(health_server):
    port, handler = health_server
    handler.status = 503  # (each request may take up to the 2 s timeout, so a loaded machine still sees the 503)
    cfg = train_config(
        [
            "experiment=smoke",
            *SERVER,
            f"rollout.vllm.server_base_url=http://127.0.0.1:{port}",
            "rollout.vllm.server_timeout=2",
        ]
    )
    with pytest.raises(ConfigError, match=r"last: HTTP 503.*rollout.vllm.server_base_url="):
        check_rollout_server(cfg.rollout, "vllm")
    assert handler.requests and set(handler.requests) == {"/health"}


def test_colocate_mode_asks_no_server(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("no request expected")

    monkeypatch.setattr("urllib.request.urlopen", refuse)
    check_rollout_server(train_config(["experiment=smoke", "rollout.engine=vllm"]).rollout, "vllm")


def test_a_server_with_hf_rollouts_is_refused_since_nothing_would_ask_it():
    with pytest.raises(ConfigError, match="rollout.vllm.mode must be 'colocate' with rollout.engine='hf'"):
        train_config(["experiment=smoke", "rollout.engine=hf", "rollout.vllm.mode=server"])


def test_auto_rollouts_resolving_to_hf_refuse_a_server_before_anything_loads():
    from atr_grpo.machine import Machine, decide

    cfg = train_config(["experiment=smoke", "rollout.vllm.mode=server"])  # auto: hf on a CPU machine
    with pytest.raises(ConfigError, match="rollout.vllm.mode must be 'colocate' with rollout.engine='hf'"):
        decide(cfg, Machine(cuda=False, unsloth=False, vllm=True))


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 2 or importlib.util.find_spec("vllm") is None,
    reason="needs 2 CUDA GPUs (server and trainer on GPUs of their own) and vLLM",
)
def test_rollouts_from_a_trl_vllm_serve_server_follow_the_trained_weights(tmp_path, tiny_model_dir, smoke_sft_adapter):
    """GPU 1 serves the tiny base model; the smoke run on GPU 0 pushes its weights (NCCL) before each generation, so
    the server's log-probs match the trainer's: a server left on the base weights would not."""
    port = closed_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trl.cli.main",
            "vllm-serve",
            "--model",
            str(tiny_model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max_model_len",
            "128",
            "--gpu_memory_utilization",
            "0.3",
        ],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"},
    )
    try:
        run_dir = tmp_path / "run"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "atr_grpo.train",
                "experiment=smoke",
                "eval=none",
                "trainer.backend=trl",
                *SERVER,
                "rollout.vllm.server_host=127.0.0.1",
                f"rollout.vllm.server_port={port}",
                f"run_dir={run_dir}",
            ],
            cwd=REPO,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [row["step"] for row in rows] == [1, 2, 3, 4]
        for row in rows:  # the server sampled with the weights the trainer computed π_old with
            assert row["rollout/logp_abs_diff_mean"] < 0.05, row
    finally:
        server.terminate()
        server.wait(timeout=60)
