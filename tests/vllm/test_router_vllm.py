"""The PD router in front of real vLLM servers (`kvstore route --backend vllm`): a text prompt
through a prefill and a decode vLLM OpenAI server sharing KV through kvstore, as the README
deploys it, generates what vLLM generates alone; and when `kvstore serve` is killed mid-workload
every request still does, and the records and counters say the path degraded (issue 18)."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kvstore.engines.launch import Fleet
from tests.cluster import Cluster, wait_until
from tests.vllm.conftest import needs_vllm
from tests.vllm.harness import ApiServer, kv_config
from tests.vllm.tiny_model import prompt_text

pytestmark = [pytest.mark.slow, needs_vllm, pytest.mark.timeout(600)]


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples whose labels include `labels`."""
    total = 0.0
    for found, value in re.findall(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if all(f'{k}="{v}"' in found for k, v in labels.items()):
            total += float(value)
    return total


def stream(httpx, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    return events


def test_the_router_fronts_a_vllm_prefill_and_decode_pair(tiny_model, tmp_path):
    httpx = pytest.importorskip("httpx")
    cluster = Cluster()
    serve, meta = cluster.serve("256MiB")
    prefill = ApiServer("prefill", tiny_model, kv_config("kv_producer", meta), tmp_path)
    decode = ApiServer("decode", tiny_model, kv_config("kv_consumer", meta), tmp_path)
    jsonl = tmp_path / "router.jsonl"
    try:
        with Fleet() as fleet:
            # Started with the servers still loading: the router waits for them to answer.
            _, router = fleet.router(
                [prefill.url],
                [decode.url],
                [],
                None,
                "--backend",
                "vllm",
                "--policy",
                "pd",
                "--wait-for-instances",
                "300",
                "--metrics-jsonl",
                str(jsonl),
                timeout=330,
            )
            body = {"prompt": prompt_text(250, seed=3), "max_tokens": 12, "temperature": 0, "ignore_eos": True}
            events = stream(httpx, router, body)
            text = "".join(e["choices"][0]["text"] for e in events)
            ids = [t for e in events for t in e["choices"][0]["token_ids"]]
            rec = events[-1]["kvstore"]
            assert len(ids) == 12 and events[-1]["usage"]["completion_tokens"] == 12
            assert rec["route"] == "pd" and rec["fallback"] is None and rec["error"] is None, rec
            assert rec["prompt_tokens"] > 200 and rec["ttft_s"] > 0 and rec["output_tokens"] == 12

            # vLLM alone, same prompt and sampling: the prefill instance generating the whole answer.
            alone = httpx.post(
                f"{prefill.url}/v1/completions",
                timeout=120,
                json={**body, "model": tiny_model, "return_token_ids": True},
            ).json()["choices"][0]
            assert ids == alone["token_ids"]
            assert text == alone["text"] and text.strip()

            loaded = metric(httpx.get(f"{decode.url}/metrics", timeout=10).text, "vllm:kvstore_load_blocks_total")
            assert 0 < loaded <= rec["prompt_tokens"] // 32
            routed = httpx.get(f"{router}/metrics", timeout=10).text
            assert metric(routed, "kvstore_router_requests_total", route="pd") == 1
            lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
            assert [line["route"] for line in lines] == ["pd"]
            assert rec["kv_save_failed"] is False and rec["kv_missing_tokens"] is None
            assert rec["cached_tokens"] is None and rec["recompute_tokens"] is None  # not in vLLM's stream

            _store_killed_mid_workload(httpx, serve, router, prefill, decode, body, tiny_model)
    finally:
        prefill.stop()
        decode.stop()
        cluster.close()


def _store_killed_mid_workload(httpx, serve, router, prefill, decode, body, model):
    """Three requests in flight when `kvstore serve` dies, three after it."""
    bodies = [{**body, "prompt": prompt_text(150 + 20 * i, seed=30 + i)} for i in range(6)]
    first_done = threading.Event()

    def send(i: int) -> list[dict[str, Any]]:
        events = stream(httpx, router, bodies[i])
        first_done.set()
        return events

    with ThreadPoolExecutor(3) as pool:
        in_flight = [pool.submit(send, i) for i in range(3)]
        assert first_done.wait(120)
        serve.kill()
        results = [f.result() for f in in_flight]
    results += [send(i) for i in range(3, 6)]
    for i, events in enumerate(results):
        alone = httpx.post(
            f"{prefill.url}/v1/completions", timeout=120, json={**bodies[i], "model": model, "return_token_ids": True}
        ).json()["choices"][0]
        assert [t for e in events for t in e["choices"][0]["token_ids"]] == alone["token_ids"], i
        assert events[-1]["kvstore"]["error"] is None
    for events in results[3:]:
        rec = events[-1]["kvstore"]
        assert rec["route"] == "pd" and rec["fallback"] == "save_failed" and rec["kv_save_failed"] is True, rec
        assert rec["kv_missing_tokens"] == rec["prompt_tokens"] // 32 * 32
        assert rec["cached_tokens"] is None and rec["recompute_tokens"] is None and rec["kv_load_bytes"] is None
    routed = httpx.get(f"{router}/metrics", timeout=10).text
    assert metric(routed, "kvstore_router_fallbacks_total", reason="save_failed") >= 3
    assert metric(routed, "kvstore_router_kv_failures_total", stage="save") >= 3
    # Each vLLM instance counts what failed there (its stats reach /metrics a step later: poll).
    wait_until(
        lambda: metric(httpx.get(f"{prefill.url}/metrics", timeout=10).text, "vllm:kvstore_unsaved_blocks_total") > 0,
        60,
        "prefill's unsaved blocks",
    )
    wait_until(
        lambda: (
            sum(
                metric(httpx.get(f"{decode.url}/metrics", timeout=10).text, f"vllm:kvstore_{name}_total")
                for name in ("lookup_failures", "lookups_skipped")
            )
            >= 3
        ),
        60,
        "decode's failed lookups",
    )
