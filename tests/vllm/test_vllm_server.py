"""1P1D with vLLM's own OpenAI server (default multiprocess mode: the connector's scheduler half in
the engine-core process, its worker half in the worker process), as the README deploys it."""

from __future__ import annotations

import json

import pytest

from tests.vllm.conftest import needs_vllm
from tests.vllm.harness import ApiServer, kv_config
from tests.vllm.tiny_model import prompt_ids

pytestmark = [pytest.mark.slow, needs_vllm, pytest.mark.timeout(600)]


def test_prefill_and_decode_servers_hand_off_through_kvstore(store, tiny_model, tmp_path):
    httpx = pytest.importorskip("httpx")
    servers = [
        ApiServer("prefill", tiny_model, kv_config("kv_producer", store[0]), tmp_path),
        ApiServer("decode", tiny_model, kv_config("kv_consumer", store[0]), tmp_path),
    ]
    try:
        for s in servers:
            s.wait_ready()
        prefill, decode = servers
        prompt = prompt_ids(300, 11)
        common = {"model": tiny_model, "prompt": prompt, "temperature": 0, "ignore_eos": True}
        first = httpx.post(
            f"{prefill.url}/v1/completions",
            timeout=60,
            json={
                **common,
                "max_tokens": 1,
                "return_token_ids": True,
                "kv_transfer_params": {"do_remote_decode": True},
            },
        ).json()
        params = first["kv_transfer_params"]
        assert params["kvstore_blocks"] == 9
        tokens: list[int] = []
        with httpx.stream(
            "POST",
            f"{decode.url}/v1/completions",
            timeout=60,
            json={**common, "max_tokens": 12, "stream": True, "return_token_ids": True, "kv_transfer_params": params},
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data:") and "[DONE]" not in line:
                    tokens += json.loads(line[5:])["choices"][0].get("token_ids") or []
        local = httpx.post(
            f"{prefill.url}/v1/completions", timeout=60, json={**common, "max_tokens": 12, "return_token_ids": True}
        ).json()
        assert tokens == local["choices"][0]["token_ids"]
        assert tokens[0] == first["choices"][0]["token_ids"][0]
        metrics = httpx.get(f"{decode.url}/metrics", timeout=10).text
        assert 'vllm:kvstore_load_blocks_total{engine="0"' in metrics
        loaded = [line for line in metrics.splitlines() if line.startswith("vllm:kvstore_load_blocks_total")]
        assert float(loaded[0].split()[-1]) == 9
        # the decode worker's store client, across vLLM's processes: what it read, per transport and daemon
        read = [
            line
            for line in metrics.splitlines()
            if line.startswith("vllm:kvstore_client_transfer_bytes_total{") and 'direction="get"' in line
        ]
        assert read and sum(float(line.split()[-1]) for line in read) > 0, metrics
        assert "kvstore: blocks named" in decode.log()  # the handshake crossed processes
    finally:
        for s in servers:
            s.stop()
