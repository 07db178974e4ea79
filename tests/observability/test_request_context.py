"""One engine thread serves a whole batch, and KV moves on pool threads: every store call made for a
request still runs with that request's id set, so the client's log lines carry it. And the TTFT
split's parts the batching engine measures add up to its TTFT."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from kvstore.client import KVClient
from kvstore.engines.keys import Granularity
from kvstore.engines.reference.engine import EngineConfig, GenerationRequest, ReferenceEngine, Role
from kvstore.engines.reference.model import ModelConfig, ReferenceModel
from kvstore.jsonlog import request_id
from tests.cluster import Cluster

BS = 16
PER_REQUEST = ("match_prefix", "put_many", "get_many_into")


class Recording:
    """The real client; each call notes (method, thread, the request id it runs under)."""

    def __init__(self, client: KVClient) -> None:
        self._client = client
        self.calls: list[tuple[str, str, str, list[str]]] = []

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if name not in PER_REQUEST:
            return attr

        def call(keys, *args, **kwargs):
            self.calls.append((name, threading.current_thread().name, request_id.get(), list(keys)))
            return attr(keys, *args, **kwargs)

        return call


class Sink:
    def __init__(self):
        self.generation, self.error = None, None

    def token(self, t):
        pass

    def done(self, g):
        self.generation = g

    def failed(self, e):
        self.error = e


@pytest.fixture(scope="module")
def store_address():
    cluster = Cluster()
    _, address = cluster.serve("256MiB")
    yield address
    cluster.close()


def serve_batch(e: ReferenceEngine, requests: list[GenerationRequest]) -> list[Any]:
    sinks = [Sink() for _ in requests]
    for req, sink in zip(requests, sinks):
        e.submit(req, sink)
    while e.has_work():
        e.step(wait_s=0.05)
    assert all(s.error is None and s.generation is not None for s in sinks)
    return [s.generation.metrics for s in sinks if s.generation is not None]


@pytest.mark.parametrize("granularity", list(Granularity))
def test_each_store_call_runs_under_its_requests_id(store_address, granularity):
    model = ReferenceModel(ModelConfig())
    prompts = {
        f"rid-{i}": torch.randint(0, 256, (70 + 20 * i,), generator=torch.Generator().manual_seed(i)).tolist()
        for i in range(3)
    }
    with KVClient(store_address) as kv:
        store = Recording(kv)
        tenant = f"ctx-{granularity.value}"
        for role, suffix in ((Role.PREFILL, "p"), (Role.DECODE, "d")):
            e = ReferenceEngine(
                model,
                EngineConfig(role, block_size=BS, cache_blocks=256, tenant=tenant, granularity=granularity),
                store,
            )
            done = serve_batch(
                e, [GenerationRequest(f"{rid}-{suffix}", p, 4, len(p) // BS * BS) for rid, p in prompts.items()]
            )
            e.close()
            # The TTFT split's parts measured on the instance: they make up its TTFT, and sharing
            # steps shows as time in the batch.
            for m in done:
                parts = m.queue_s + m.kv_load_s + m.prefill_compute_s + m.batch_wait_s
                assert m.batch_wait_s >= 0 and parts == pytest.approx(m.ttft_s)
            assert any(m.batch_wait_s > 0 for m in done)
    assert request_id.get() == ""  # the engine's thread is left as it was
    threads = {name: {t for m, t, _, _ in store.calls if m == name} for name in PER_REQUEST}
    assert threads["put_many"] and all(t.startswith("kv-save") for t in threads["put_many"])
    assert threads["get_many_into"] and all(t.startswith("kv-load") for t in threads["get_many_into"])
    for method, _, rid, call_keys in store.calls:
        assert rid.startswith("rid-"), (method, call_keys)

    # Under each id, the decode instance loaded exactly the blocks the prefill instance saved for
    # that prompt: no call ran under another request's id.
    def keys(method: str, rid: str) -> set[str]:
        return {k for m, _, r, ks in store.calls if m == method and r == rid for k in ks}

    for rid in prompts:
        assert keys("put_many", f"{rid}-p") and keys("put_many", f"{rid}-p") == keys("get_many_into", f"{rid}-d")
