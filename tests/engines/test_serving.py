"""End to end over HTTP: store, prefill, decode and colocated engines, the router; then kill the
storage daemon mid-run and check every request still completes through the fallback."""

import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from kvstore.engines.launch import Fleet

pytestmark = pytest.mark.slow


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def complete(url: str, tokens: list[int], max_tokens: int = 10, stream: bool = False) -> dict[str, Any]:
    body = {"prompt": tokens, "max_tokens": max_tokens, "stream": stream}
    if not stream:
        resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        resp.raise_for_status()
        return resp.json()
    ids: list[int] = []
    last: dict[str, Any] | None = None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                import json

                last = json.loads(line[6:])
                ids += last["choices"][0]["token_ids"]
    assert last is not None, "no data in the stream"
    last["choices"][0]["token_ids"] = ids
    return last


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples whose labels include `labels`."""
    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(v)
        for found, v in re.findall(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M)
        if all(f'{k}="{val}"' in found for k, val in labels.items())
    )


@pytest.fixture
def fleet():
    with Fleet() as f:
        yield f


def test_pd_through_the_router_matches_colocated(fleet):
    _, meta = fleet.store("256MiB")
    _, prefill = fleet.engine("prefill", meta)
    _, decode = fleet.engine("decode", meta)
    _, colocated = fleet.engine("colocated")
    _, router = fleet.router([prefill], [decode], [colocated], meta, "--policy", "pd")
    base = prompt(900, seed=1)
    for tokens, route in ((base[:421], "pd"), (base, "pd"), (base[:421], "decode")):
        want = complete(colocated, tokens)["choices"][0]["token_ids"]
        got = complete(router, tokens, stream=True)
        assert got["choices"][0]["token_ids"] == want
        rec = got["kvstore"]
        assert rec["route"] == route and rec["fallback"] is None and rec["ttft_s"] > 0, rec
    # shares 26 blocks with the first: the prefill instance computes only the rest
    shared = complete(router, base[:421] + prompt(150, 9))["kvstore"]
    assert shared["route"] == "pd" and shared["prefill_tokens"] == 571 - 416
    assert metric(router, "kvstore_router_requests_total") == 4
    assert metric(decode, "kvstore_engine_fallbacks_total") == 0
    state = httpx.get(f"{router}/router/state").json()
    assert state["bandwidth_bytes_per_s"] > 0 and state["fallbacks"] == 0


def test_killing_the_storage_daemon_mid_run_still_completes_every_request(fleet, cluster):
    _, meta = cluster.meta({"KVSTORE_META_HEARTBEAT_TTL_S": "1", "KVSTORE_META_TICK_INTERVAL_S": "0.2"})
    daemon = cluster.daemon(meta, "256MiB", {"KVSTORE_DAEMON_HEARTBEAT_INTERVAL_S": "0.2"})
    kv = ("--kv-transports", "tcp", "--load-deadline", "3", "--kv-timeout", "3")
    _, prefill = fleet.engine("prefill", meta, *kv)
    _, decode = fleet.engine("decode", meta, *kv)
    _, colocated = fleet.engine("colocated")
    _, router = fleet.router([prefill], [decode], [colocated], meta, "--policy", "pd")
    prompts = [prompt(300 + 40 * i, seed=10 + i) for i in range(8)]
    want = {i: complete(colocated, p)["choices"][0]["token_ids"] for i, p in enumerate(prompts)}
    assert complete(router, prompts[0])["kvstore"]["fallback"] is None  # healthy first

    first_done = threading.Event()

    def send(i: int) -> dict[str, Any]:
        out = complete(router, prompts[i], stream=True)
        first_done.set()
        return out

    with ThreadPoolExecutor(4) as pool:
        in_flight = [pool.submit(send, i) for i in range(1, 5)]
        first_done.wait(120)
        daemon.kill()  # mid-run
        results = {i: f.result() for i, f in zip(range(1, 5), in_flight)}
    for i in range(5, 8):  # after the kill
        results[i] = complete(router, prompts[i], stream=True)
    for i, r in results.items():
        assert r["choices"][0]["token_ids"] == want[i], i
        assert r["kvstore"]["error"] is None
    later = [results[i]["kvstore"]["fallback"] for i in range(5, 8)]
    assert all(later), later
    assert metric(router, "kvstore_router_fallbacks_total") >= 3
    # The prefill instance's saves fail, so the decode instance is promised nothing: it recomputes
    # (measured), and the failure is counted where it happened.
    assert metric(prefill, "kvstore_engine_kv_failures_total", stage="save") >= 3
    for i in range(5, 8):
        rec = results[i]["kvstore"]
        assert rec["kv_save_failed"] and rec["recompute_tokens"] == rec["prompt_tokens"], rec


def test_a_dead_store_shows_in_every_record_and_counter(fleet):
    """Issue 18: kill `kvstore serve` mid-run. Every request still completes with colocated's
    tokens, and no record reads as a healthy PD request: each after the kill names its fallback,
    what failed (the lookups, the save), and the decode instance's measured recompute."""
    store, meta = fleet.store("256MiB")
    kv = ("--kv-transports", "tcp", "--kv-timeout", "2")
    _, prefill = fleet.engine("prefill", meta, *kv)
    _, decode = fleet.engine("decode", meta, *kv)
    _, colocated = fleet.engine("colocated")
    _, router = fleet.router([prefill], [decode], [colocated], meta, "--policy", "pd")
    prompts = [prompt(200 + 30 * i, seed=40 + i) for i in range(8)]
    want = {i: complete(colocated, p)["choices"][0]["token_ids"] for i, p in enumerate(prompts)}
    healthy = complete(router, prompts[0], stream=True)["kvstore"]
    assert healthy["fallback"] is None and healthy["kv_missing_tokens"] == 0, healthy
    assert (healthy["kv_lookup_failed"], healthy["kv_save_failed"], healthy["kv_load_failed"]) == (False, False, False)
    assert (
        healthy["cached_tokens"] == (200 - 1) // 16 * 16
        and healthy["recompute_tokens"] == 200 - healthy["cached_tokens"]
    )

    first_done = threading.Event()

    def send(i: int) -> dict[str, Any]:
        out = complete(router, prompts[i], stream=True)
        first_done.set()
        return out

    with ThreadPoolExecutor(4) as pool:
        in_flight = [pool.submit(send, i) for i in range(1, 5)]
        first_done.wait(120)
        store.kill()  # mid-run
        results = {i: f.result() for i, f in zip(range(1, 5), in_flight)}
    for i in range(5, 8):  # after the kill
        results[i] = complete(router, prompts[i], stream=True)
    for i, r in results.items():
        rec = r["kvstore"]
        assert r["choices"][0]["token_ids"] == want[i], i
        assert rec["error"] is None and rec["route"] == "pd"
        assert rec["cached_tokens"] + rec["recompute_tokens"] == rec["prompt_tokens"], rec  # all measured
        assert (rec["fallback"] is None) == (rec["kv_missing_tokens"] == 0), rec
    for i in range(5, 8):
        rec = results[i]["kvstore"]
        assert rec["fallback"] == "save_failed" and rec["kv_save_failed"] and rec["kv_lookup_failed"], rec
        assert rec["recompute_tokens"] == rec["prompt_tokens"] and rec["kv_load_bytes"] == 0
        assert rec["kv_missing_tokens"] == (rec["prompt_tokens"] - 1) // 16 * 16
    assert metric(router, "kvstore_router_fallbacks_total") >= 3
    for stage, url in (("lookup", router), ("save", router), ("save", prefill), ("lookup", decode)):
        assert (
            metric(
                url,
                "kvstore_router_kv_failures_total" if url == router else "kvstore_engine_kv_failures_total",
                stage=stage,
            )
            >= 3
        ), (stage, url)
    assert metric(router, "kvstore_router_tokens_total", kind="kv_missing") >= sum(
        results[i]["kvstore"]["kv_missing_tokens"] for i in range(5, 8)
    )
