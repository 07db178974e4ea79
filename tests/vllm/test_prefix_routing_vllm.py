"""Prefix-aware routing in front of real vLLM servers (issue 16): the router follows each
server's own KV events (--kv-events-config) and kvstore's, sends a prompt to the server whose
cache already holds its prefix, and knows what kvstore holds."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.engines.launch import Fleet
from tests.cluster import Cluster, found, wait_until
from tests.vllm.conftest import needs_vllm
from tests.vllm.harness import ApiServer, kv_config
from tests.vllm.test_router_vllm import metric
from tests.vllm.tiny_model import prompt_ids

pytestmark = [pytest.mark.slow, needs_vllm, pytest.mark.timeout(900)]
BLOCK = 32


def test_the_router_routes_to_the_server_holding_the_prefix_and_sees_the_store(tiny_model, tmp_path):
    httpx = pytest.importorskip("httpx")
    cluster = Cluster()
    proc, meta = cluster.meta({"KVSTORE_META_EVENTS_PORT": "0", "KVSTORE_LOG_LEVEL": "INFO"})
    endpoint, replay = found(r"KV events: epoch \d+ on (\S+) \(replay (\S+)\)", "".join(proc.lines)).groups()
    cluster.daemon(meta, "256MiB")
    servers = [ApiServer(name, tiny_model, kv_config("kv_both", meta), tmp_path, kv_events=True) for name in "ab"]
    try:
        for s in servers:
            s.wait_ready()
        # Idle instances tie, and least-loaded breaks ties by URL: a is the one it would pick.
        a, b = sorted(servers, key=lambda s: s.url)
        with Fleet() as fleet:
            args = [
                "--backend",
                "vllm",
                "--policy",
                "colocated",
                "--kv-block-size",
                str(BLOCK),
                "--store-events",
                f"{endpoint},{replay}",
            ]
            for s in servers:
                assert s.events is not None  # started with kv_events=True
                args += ["--kv-events", f"{s.url}={s.events[0]},{s.events[1]}"]
            router_proc, router = fleet.router([], [], [a.url, b.url], None, *args)

            def state() -> dict[str, Any]:
                return httpx.get(f"{router}/router/state", timeout=10).json()["prefix_index"]

            prefix = prompt_ids(10 * BLOCK, seed=41)
            # Straight to b, not through the router: only b's own cache holds the prefix now, and
            # kvstore (b's connector saved it).
            httpx.post(
                f"{b.url}/v1/completions",
                timeout=120,
                json={"model": tiny_model, "prompt": prefix + [7] * 8, "max_tokens": 1},
            ).raise_for_status()
            wait_until(lambda: state()["instances"][b.url]["blocks"] >= 10, what="b's KV events at the router")
            wait_until(lambda: state()["store"]["blocks"] >= 10, what="kvstore's KV events at the router")
            assert state()["instances"][a.url]["blocks"] == 0

            # In (a, b) order, the order the assertions below use, not the order servers were named in.
            hits_before = [
                metric(httpx.get(f"{s.url}/metrics", timeout=10).text, "vllm:prefix_cache_hits_total") for s in (a, b)
            ]
            body = {"prompt": prefix + [9] * 8, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
            answer = httpx.post(f"{router}/v1/completions", json=body, timeout=120).json()
            assert len(answer["choices"][0]["token_ids"]) == 4
            hits = [
                metric(httpx.get(f"{s.url}/metrics", timeout=10).text, "vllm:prefix_cache_hits_total") - h
                for s, h in zip((a, b), hits_before)
            ]
            # Both idle: without events the router would pick a. It picked b.
            assert hits[1] >= 10 * BLOCK and hits[0] == 0, hits
            decision = (
                f"{10 * BLOCK + 8} tokens, {10 * BLOCK} cached -> colocated (fixed: colocated; "  # kvstore's
                f"prefix affinity: {b.url} holds {10 * BLOCK} of {10 * BLOCK + 8} tokens)"
            )
            try:
                wait_until(lambda: decision in "".join(router_proc.lines), what="the router's decision in its log")
            except TimeoutError:
                print("".join(router_proc.lines))  # the decision it did log, for the failure report
                raise
            # Router state reports the event streams' health.
            assert state()["instances"][b.url]["lost"] == 0
    finally:
        for s in servers:
            s.stop()
        cluster.close()
