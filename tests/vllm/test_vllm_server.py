"""1P1D with vLLM's own OpenAI server (default multiprocess mode: the connector's scheduler half in
the engine-core process, its worker half in the worker process), as the README deploys it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.vllm.conftest import needs_vllm
from tests.vllm.harness import kv_config
from tests.vllm.tiny_model import prompt_ids

pytestmark = [pytest.mark.slow, needs_vllm, pytest.mark.timeout(600)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name, model, kv, tmp_path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"{name}.log"
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
             "--port", str(self.port), "--dtype", "float32", "--block-size", "32", "--max-model-len", "4096",
             "--kv-cache-memory-bytes", str(64 << 20), "--enforce-eager", "--kv-transfer-config", json.dumps(kv)],
            stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})

    def wait_ready(self, httpx, timeout=300.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.popen.poll() is None, f"vLLM server exited:\n{self.log()[-4000:]}"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)           # polling readiness, not sleeping for luck
        raise TimeoutError(f"vLLM server not ready in {timeout}s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self):
        self.popen.terminate()
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)


def test_prefill_and_decode_servers_hand_off_through_kvstore(store, tiny_model, tmp_path):
    httpx = pytest.importorskip("httpx")
    servers = [Server("prefill", tiny_model, kv_config("kv_producer", store[0]), tmp_path),
               Server("decode", tiny_model, kv_config("kv_consumer", store[0]), tmp_path)]
    try:
        for s in servers:
            s.wait_ready(httpx)
        prefill, decode = servers
        prompt = prompt_ids(300, 11)
        common = {"model": tiny_model, "prompt": prompt, "temperature": 0, "ignore_eos": True}
        first = httpx.post(f"{prefill.url}/v1/completions", timeout=60, json={
            **common, "max_tokens": 1, "return_token_ids": True,
            "kv_transfer_params": {"do_remote_decode": True}}).json()
        params = first["kv_transfer_params"]
        assert params["kvstore_blocks"] == 9
        tokens = []
        with httpx.stream("POST", f"{decode.url}/v1/completions", timeout=60, json={
                **common, "max_tokens": 12, "stream": True, "return_token_ids": True,
                "kv_transfer_params": params}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data:") and "[DONE]" not in line:
                    tokens += json.loads(line[5:])["choices"][0].get("token_ids") or []
        local = httpx.post(f"{prefill.url}/v1/completions", timeout=60,
                           json={**common, "max_tokens": 12, "return_token_ids": True}).json()
        assert tokens == local["choices"][0]["token_ids"]
        assert tokens[0] == first["choices"][0]["token_ids"][0]
        metrics = httpx.get(f"{decode.url}/metrics", timeout=10).text
        assert 'vllm:kvstore_load_blocks_total{engine="0"' in metrics
        loaded = [line for line in metrics.splitlines() if line.startswith("vllm:kvstore_load_blocks_total")]
        assert float(loaded[0].split()[-1]) == 9
        assert "kvstore: blocks named" in decode.log()       # the handshake crossed processes
    finally:
        for s in servers:
            s.stop()
